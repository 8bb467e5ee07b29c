"""NVIDIA Xid lines in the kernel log, decoded by NVIDIA's Xid catalog, and grouped per GPU and
code.

Why: an Xid line in the kernel log is the GPU driver's only word on a failure, but the number
alone means nothing to most on-call engineers, and a flapping GPU logs the same Xid thousands of
times. NVIDIA's catalog ("Analyzing Xid Errors with the Xid Catalog",
https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html) gives each code a
mnemonic, a description and a *resolution bucket* (the immediate action: RESTART_APP,
RESET_GPU, RESTART_BM, CONTACT_SUPPORT, IGNORE, or a named workflow); the table is in
node_probe/protocol/xid_catalog.py (the client decodes other monitors' Xid codes with it too)
and re-exported here. `group()` folds a stream of Xid lines into one record per (GPU PCI bus
id, code) with a count and first/last time. Both are pure: the kmsg check and the watch-mode
agent (node_probe/watch) call them.
"""
from __future__ import annotations

import dataclasses
import re
from collections import Counter
from itertools import compress
from typing import Hashable, Iterable, Sequence

from node_probe.protocol.xid_catalog import (  # noqa: F401 -- the catalog, re-exported
    BUCKET_TEXT, CATALOG_URL, CONTACT_SUPPORT, IGNORE, REBOOT, RESET_GPU, RESTART_APP, SEVERITY,
    XIDS, Xid, describe, known)

# Xid 154 (R565+) states the recovery the driver wants for the Xids around it, in words
RECOVERY_154 = {"none": IGNORE, "drain p2p": RESET_GPU, "drain and reset": RESET_GPU,
                "gpu reset required": RESET_GPU, "node reboot required": REBOOT}
_RE_154 = re.compile(r"recovery action changed from 0x[0-9a-f]{1,8} \(([^)]{1,40})\) to "
                     r"0x[0-9a-f]{1,8} \(([^)]{1,40})\)", re.I)


def recovery_154(message: str) -> str | None:
    """The bucket Xid 154's message asks for ("... to 0x2 (Node Reboot Required)"), or None."""
    m = _RE_154.search(message)
    return RECOVERY_154.get(m.group(2).strip().lower()) if m else None


# -- kernel log lines --------------------------------------------------------------------------

# numbers are bounded ASCII digits: a --kmsg-file (or a forged record) with a 5,000-digit pid
# must not raise in int(), and `\d` would also take non-ASCII digits
# the message may be missing: `NVRM: Xid (PCI:0000:3b:00): 79,` or `...: 79` (a cut line)
XID_RE = re.compile(r"NVRM: Xid \((?:PCI:)?([^)]{0,64})\):\s*([0-9]{1,6})(?:,\s*(.*)|\s*$)")
# "NVRM: GPU at PCI:0000:3b:00: GPU-2f815c32-..." (logged when the driver binds a GPU)
GPU_AT_RE = re.compile(r"NVRM: GPU at PCI:([0-9a-fA-F:.]{7,16}):\s*(GPU-[0-9a-fA-F-]{8,64})")
PID_RE = re.compile(r"pid='?([0-9]{1,10})'?(?:, name='?([^',]{0,64})'?)?")


def short_bus(bus: str | None) -> str | None:
    """`00000000:3B:00.0` and `0000:3b:00` alike -> `3b:00` (domain 0 dropped)."""
    if not bus:
        return None
    parts = bus.strip().lower().split(":")
    if len(parts) < 2:
        return None
    dom = parts[0] if len(parts) == 3 else "0"
    tail = ":".join(parts[-2:]).split(".")[0]
    return tail if dom.strip("0") == "" else f"{dom.lstrip('0')}:{tail}"



@dataclasses.dataclass(frozen=True)
class XidEvent:
    """One `NVRM: Xid (PCI:<bus>): <code>, <message>` line."""
    ts: float | None        # seconds since boot (None when the log has no time)
    pci: str
    code: int
    message: str


def parse(ts: float | None, msg: str) -> XidEvent | None:
    m = XID_RE.search(msg)
    if not m:
        return None
    return XidEvent(ts, m.group(1).strip(), int(m.group(2)), m.group(3) or "")


@dataclasses.dataclass(frozen=True)
class XidGroup:
    """Every occurrence of one Xid code on one GPU."""
    pci: str
    code: int
    count: int
    first_s: float | None
    last_s: float | None
    last_message: str
    pids: tuple[str, ...]
    recovery: str | None    # Xid 154 only: the bucket its last message asks for
    fatal: int = 0          # NVLink5 (144-150): lines that said `Fatal`
    nonfatal: int = 0       # NVLink5 (144-150): lines that said `Nonfatal`
    caused_by: int | None = None   # Xid 45: "... caused by previous Xid N"

    @property
    def bucket(self) -> str:
        """What NVIDIA says to do for this group (resolution bucket), from the catalog and the
        message: Xid 154 states it; NVLink5 Xids 144-150 say `Fatal` (reset the GPU) or
        `Nonfatal` (informational); Xid 45 "caused by previous Xid N" follows Xid N."""
        if self.recovery:
            return self.recovery
        if self.code in NVLINK5:
            if self.fatal:
                return RESET_GPU
            return IGNORE if self.nonfatal else describe(self.code).bucket
        if self.code == 45 and self.caused_by is not None and self.caused_by != 45:
            return describe(self.caused_by).bucket
        return describe(self.code).bucket


MAX_GROUPS = 1024       # distinct (gpu, code) pairs kept; a node has <= 16 GPUs
MAX_PIDS = 10
MAX_RAW_KEYS = 1 << 16  # distinct Xid keys as written (bus id and code) add_run remembers
MAX_MESSAGE = 300       # one sample line per group, cut: memory is bounded by bytes too
NVLINK5 = frozenset(range(144, 151))
# NVLink5 Xids carry the fatality in words: "NETIR_LINK_EVT Fatal XC0 i0 Link 00 (...)",
# "RLW_RXPIPE Nonfatal XC0 i0 Link 13 (...)" (gpud PR #1160/#1174 quote the driver's lines)
_FATALITY_RE = re.compile(r"\b(Fatal|Nonfatal)\b")
_CAUSED_BY_RE = re.compile(r"caused by previous Xid ([0-9]{1,6})")


def in_order(times: Sequence) -> bool:
    """Whether times (numbers, or their decimal texts as bytes: `1021.339512`) never go back.
    Texts of one shape (one length, the dot at one place, as the kernel writes them) sort as
    their numbers do, so those are compared as bytes: no float made a line (a storm's 2,000,000
    lines). Any other run is compared as numbers."""
    if times and isinstance(times[0], bytes):
        lengths = set(map(len, times))
        dot = times[0].find(b".")
        if len(lengths) == 1 and dot >= 0:
            width = lengths.pop()
            if b"".join(times)[dot::width].count(b".") == len(times):
                order = list(times)
                return order == sorted(order)
        times = list(map(float, times))
    return list(times) == sorted(times)


class _Firsts:
    """The index of each raw key's first (and, asked, last) line in a run, made once, when
    first asked: a dict of ints is a new object a line (positions past 256)."""

    def __init__(self, raws) -> None:
        self.raws = raws
        self._first: dict | None = None
        self._last: dict | None = None

    def __call__(self) -> dict:
        if self._first is None:
            n = len(self.raws)
            self._first = dict(zip(reversed(self.raws), range(n - 1, -1, -1)))
        return self._first

    def last(self) -> dict:
        if self._last is None:
            self._last = dict(zip(self.raws, range(len(self.raws))))
        return self._last


def _note_pid(pids: list, message: str) -> None:
    """The process an Xid message names (PID_RE), added to a group's
    `pids` once, while fewer than MAX_PIDS are kept (the line path and a bulk run's both)."""
    if len(pids) < MAX_PIDS:
        pm = PID_RE.search(message)
        if pm:
            entry = pm.group(1) + (f" ({pm.group(2)})" if pm.group(2) else "")
            if entry not in pids:
                pids.append(entry)


class Grouper:
    """Fold Xid events one at a time into one group per (PCI bus id, code), in order of first
    appearance: memory bounded by `max_groups` and by MAX_MESSAGE bytes a group whatever the
    number of events (a flood of 200,000 lines is 1 group; a bulk run's last message is kept
    as read, one line, until groups() reads it); events of pairs beyond it are only counted
    (`dropped`). add_run() folds a run of lines at once, with the same result."""

    def __init__(self, max_groups: int = MAX_GROUPS) -> None:
        self.max_groups = max_groups
        self.acc: dict[tuple[str, int], dict] = {}
        self.dropped = 0
        self.events = 0
        # add_run's: raw key as written -> (pci, code); those of Xid 79; raw keys of kept
        # groups (once the groups are full); a group's last message, not yet read
        self.norm: dict[str, tuple[str, int]] = {}
        self.raw79: set[str] = set()
        self._live: dict[str, bool] = {}
        self._sorted = False            # _live holds every raw key of norm whose group is kept
        self._raw_msg: dict[tuple[str, int], str] = {}
        self._text = str

    def add(self, ev: XidEvent) -> None:
        self.add_fields(ev.ts, ev.pci, ev.code, ev.message)

    def add_fields(self, ts: float | None, pci: str, code: int, message: str) -> None:
        """add() without building an XidEvent (the kernel-log check's hot path: a storm is
        millions of calls, so the common case -- a known group, a later time, its pids
        already full -- does the least)."""
        self.events += 1
        key = (pci[:64], code)
        d = self.acc.get(key)
        if d is None:
            if len(self.acc) >= self.max_groups:
                self.dropped += 1
                return
            d = self.acc[key] = {"count": 0, "first_s": ts, "last_s": ts, "pids": [],
                                 "fatal": 0, "nonfatal": 0, "caused_by": None}
        d["count"] += 1
        if ts is not None:
            last = d["last_s"]
            if last is None or ts > last:
                d["last_s"] = ts
            first = d["first_s"]
            if first is None or ts < first:
                d["first_s"] = ts
        if len(message) > MAX_MESSAGE:
            message = message[:MAX_MESSAGE]
        d["message"] = message
        if self._raw_msg:
            self._raw_msg.pop(key, None)
        if code in NVLINK5:
            fm = _FATALITY_RE.search(message)
            if fm:
                d["fatal" if fm.group(1) == "Fatal" else "nonfatal"] += 1
        elif code == 45:
            cm = _CAUSED_BY_RE.search(message)
            if cm:
                d["caused_by"] = int(cm.group(1))
        _note_pid(d["pids"], message)

    def add_run(self, tss: Sequence, raws: Sequence[Hashable], rests: Sequence, parse_key,
                text) -> tuple[Counter, "_Firsts"]:
        """add_fields(float(ts), *parse_key(raw), text(rest)) for each line of a run of Xid
        lines, in order, with the same result, in bulk (a storm's 2,000,000 lines). `tss` are
        the lines' times (numbers, or their texts as bytes: see in_order); `raws` their
        keys as written (`PCI:0000:3b:00): 79`), parsed once per distinct one (`norm`, at most
        MAX_RAW_KEYS); `rests` their raw messages. Counts and first/last times come from C-level
        Counter and dict passes, then one step per distinct key of a kept group; a message is
        read (`text`) only for the groups that still collect pids or whose code reads it
        (NVLink5, 45), and for each group's last line only when groups() is asked.
        Returns ({raw key: lines}, firsts) of the whole run: firsts() is {raw key: index of
        its first line}, made when asked (a storm's steady blocks never need it)."""
        self._text = text
        count = len(raws)
        cnt = Counter(raws)
        firsts = _Firsts(raws)
        norm, acc, live_raw = self.norm, self.acc, self._live
        if not norm.keys() >= cnt.keys():   # new raw keys (a lookup each; no set is made)
            missing = set(cnt).difference(norm)
            if len(norm) + len(missing) > MAX_RAW_KEYS:
                norm.clear()
                self.raw79.clear()
                live_raw.clear()
                self._sorted = False
                missing = set(cnt)
            for raw in missing:
                pci, code = parse_key(raw)
                key = norm[raw] = (pci[:64], code)
                if code == 79:
                    self.raw79.add(raw)
                if self._sorted and key in acc:
                    live_raw[raw] = True
        if not in_order(tss):               # times out of order: min/max line by line
            for ts, raw, rest in zip(tss, raws, rests):
                pci, code = norm[raw]
                self.add_fields(float(ts), pci, code, text(rest))
            return cnt, firsts
        self.events += count
        if len(acc) < self.max_groups:      # new groups, in order of first appearance
            new: dict = {}
            first = firsts()
            for raw, i in first.items():
                key = norm[raw]
                if key not in acc and i < new.get(key, count):
                    new[key] = i
            for key in sorted(new, key=new.__getitem__):
                if len(acc) >= self.max_groups:
                    break
                acc[key] = {"count": 0, "first_s": None, "last_s": None, "pids": [],
                            "fatal": 0, "nonfatal": 0, "caused_by": None}
            live = [raw for raw in cnt if norm[raw] in acc]
        else:       # full for good: the raw keys of kept groups, sorted out once, then as read
            if not self._sorted:
                live_raw.update(dict.fromkeys([raw for raw, key in norm.items() if key in acc],
                                              True))
                self._sorted = True
            live = cnt.keys() & live_raw.keys()
        # the last line of each raw key; its first only where it can be a group's first time
        # (the run's times are sorted: none is before tss[0])
        last = firsts.last()
        t0 = float(tss[0]) if tss else None
        raw_msg, slow, seen = self._raw_msg, [], {}
        for raw in live:
            key = norm[raw]
            d = acc[key]
            d["count"] += cnt[raw]
            j = last[raw]
            hi = float(tss[j])
            if d["last_s"] is None or hi > d["last_s"]:
                d["last_s"] = hi
            if d["first_s"] is None or t0 < d["first_s"]:
                lo = float(tss[firsts()[raw]])
                if d["first_s"] is None or lo < d["first_s"]:
                    d["first_s"] = lo
            if key not in seen or j > last[seen[key]]:     # 2+ raw keys of one group: the later
                seen[key] = raw
                raw_msg[key] = rests[j]
            if len(d["pids"]) < MAX_PIDS or key[1] in NVLINK5 or key[1] == 45:
                slow.append(raw)
        self.dropped += count - sum(map(cnt.__getitem__, live))
        if slow:
            self._read_messages(raws, rests, set(slow), text)
        return cnt, firsts

    def _read_messages(self, raws, rests, slow: set, text) -> None:
        """The messages of the lines of `slow` raw keys: each distinct (group, message) once,
        in order of first appearance, with its lines (pids, NVLink5 fatality, Xid 45's cause)."""
        acc, norm = self.acc, self.norm
        rows = list(compress(range(len(raws)), map(slow.__contains__, raws)))   # in C
        pairs = Counter([(norm[raws[i]], rests[i]) for i in rows])
        latest = {(norm[raws[i]], rests[i]): i for i in rows} \
            if any(norm[raw][1] == 45 for raw in slow) else {}
        caused: dict = {}                   # Xid 45 group -> (its last line naming a cause, N)
        for (key, rest), lines in pairs.items():
            d, code = acc[key], key[1]
            if code not in NVLINK5 and code != 45 and len(d["pids"]) >= MAX_PIDS:
                continue
            msg = text(rest)[:MAX_MESSAGE]
            if code in NVLINK5:
                fm = _FATALITY_RE.search(msg)
                if fm:
                    d["fatal" if fm.group(1) == "Fatal" else "nonfatal"] += lines
            elif code == 45:
                cm = _CAUSED_BY_RE.search(msg)
                if cm and latest[key, rest] > caused.get(key, (-1, 0))[0]:
                    caused[key] = (latest[key, rest], int(cm.group(1)))
            _note_pid(d["pids"], msg)
        for key, (_line, cause) in caused.items():
            acc[key]["caused_by"] = cause

    def message(self, key: tuple[str, int]) -> str:
        """The last message of a group (a bulk run's is read only now)."""
        rest = self._raw_msg.get(key)
        if rest is not None:
            return self._text(rest)[:MAX_MESSAGE]
        return self.acc[key]["message"]

    def groups(self) -> list[XidGroup]:
        out = []
        for (pci, code), d in self.acc.items():
            msg = self.message((pci, code))
            out.append(XidGroup(pci, code, d["count"], d["first_s"], d["last_s"], msg,
                                tuple(d["pids"]), recovery_154(msg) if code == 154 else None,
                                d["fatal"], d["nonfatal"], d["caused_by"]))
        return out


# worst first: what a GPU's severity and headline follow when it has several codes
_BUCKET_RANK = {REBOOT: 5, CONTACT_SUPPORT: 4, RESET_GPU: 3, RESTART_APP: 2, IGNORE: 1}


def worst_first(groups: Iterable[XidGroup]) -> list[XidGroup]:
    """The groups of one GPU, the one that decides what to do first (reboot before reset
    before restart-app before informational; then the most recent)."""
    return sorted(groups, key=lambda g: (-_BUCKET_RANK.get(g.bucket, 0),
                                         -(g.last_s if g.last_s is not None else -1.0),
                                         g.code))


def per_gpu(groups: Iterable[XidGroup]) -> list[tuple[str, list[XidGroup]]]:
    """Every group, gathered per GPU (PCI bus id as logged, first appearance order), worst
    code first: one GPU with Xid 13 and Xid 79 is one GPU whose verdict is Xid 79's, with
    both codes kept."""
    out: dict[str, list[XidGroup]] = {}
    for g in groups:
        out.setdefault(short_bus(g.pci) or g.pci, []).append(g)
    return [(gpu, worst_first(gs)) for gpu, gs in out.items()]


def group(events: Iterable[XidEvent], max_groups: int = MAX_GROUPS) -> tuple[list[XidGroup], int]:
    """Every event folded by a fresh Grouper: (groups, events dropped beyond max_groups).
    Pure and linear in the events; the watch-mode agent calls it on each batch."""
    g = Grouper(max_groups)
    for ev in events:
        g.add(ev)
    return g.groups(), g.dropped

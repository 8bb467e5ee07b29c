"""Kernel log: NVIDIA Xid errors, NVSwitch SXid errors, NVIDIA driver errors without an Xid,
and hung tasks.

Why: when a GPU falls off the bus or a task sits in D state inside the driver, the kernel log
is the only witness. Reads /dev/kmsg without blocking (the whole ring buffer, then stops), or a
saved log given with --kmsg-file (raw kmsg records, `dmesg`, `dmesg -T`/`-H`, journal or syslog
lines) for offline use. Both are streamed, folded into grouped counts (per GPU and code: count,
first/last time, one sample line), so a 200,000-line Xid storm costs the groups, not the log
(issue 28, X-02). /dev/kmsg is read a record at a time, a record without an NVIDIA or
kernel-hang marker only counted (KmsgLog); a saved log in 1 MiB blocks, where
runs of Xid lines are folded in bulk, so that a 2,000,000-line storm is read to its end within
the check's deadline (issue 41.2, SavedLog). The log is read once: what gpu_lost and the trace
verdicts need from it is published as the fact KMSG_LOG (Summary).

This module reads and folds (analyze); the readers of the log are host/kernel_log.py, the
wording of each finding checks/_kmsg_findings.py.
"""
from __future__ import annotations

import dataclasses
import gc
import re
import time
from collections import OrderedDict, deque
from pathlib import Path
from typing import Iterable, Iterator

from node_probe.host import aer, hostfs, lockup, nvrm, sxid, xid
# the readers of a kernel log, and what tests and other checks used to find here
from node_probe.host.kernel_log import (  # noqa: F401 -- re-exported
    BLOCK_BYTES, LINE, LINES, MARK_RE, MAX_FILE_BYTES, MAX_LINE, MAX_RECORDS, SKIP, XIDS,
    KmsgLog, SavedLog, Stats, iter_kmsg, iter_log_file, kernel_log, xid_key, xid_text,
    parse_kmsg_record, parse_line, parse_log_file, read_kmsg, uptime_s)
from node_probe.checks import _kmsg_findings as words
from node_probe.checks._kmsg_findings import HUNG_CRITICAL_COMMS  # noqa: F401 -- re-exported
from node_probe.engine.context import Skipped
from node_probe.deviceplugin import podresources
from node_probe.engine.facts import KMSG_LOG, KMSG_XIDS, NVML, PODRESOURCES
from node_probe.engine.registry import check

# numbers are bounded ASCII digits: a --kmsg-file (or a forged record) with a 5,000-digit pid
# must not raise in int(), and `\d` would also take non-ASCII digits
XID_RE = xid.XID_RE
# `INFO: task kworker/1:2:345 blocked for more than 120 seconds.`; kernels and pastes also give
# it without the `INFO: ` and with `120s` (gpud's cpu tests, components/cpu)
HUNG_RE = re.compile(r"(?:INFO: )?task (.+):([0-9]{1,10}) blocked for more than ([0-9]{1,12}) ?"
                     r"(?:seconds|secs|s)\b")
MAX_XID_LINES = 4096            # newest Xid lines kept for the trace verdicts
KMSG_TIMEOUT_S = 5.0            # the check's deadline
READ_RESERVE_S = 1.2            # stop reading this long before it: findings, facts, output
# `task:python3.11      state:D stack:    0 pid:15277 ppid: 15257 flags:0x00000002` (the
# kernel's sched_show_task since 5.14); `dmesg -H` pastes often start here, without the header
STATE_RE = re.compile(r"task:(\S{1,64})\s+state:(\w)\b.*?(?<![a-z])pid:\s*([0-9]{1,10})\b")
# a stack frame's module: `uvm_ioctl+0x13e0/0x16f0 [nvidia_uvm]`
FRAME_MODULE_RE = re.compile(r"\+0x[0-9a-f]{1,16}/0x[0-9a-f]{1,16} \[([a-z0-9_]{1,32})\]")
NVIDIA_MODULES = ("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm", "nvidia_peermem",
                  "nvidia_fs")
MAX_HUNG = 64                   # distinct hung tasks kept
MAX_FRAMES = 64                 # stack lines read after one hung task


class _Hung:
    """Hung-task reports: the `INFO: task NAME:PID blocked` header, or (pasted with `dmesg
    -H`) the `task:NAME state:D ... pid:PID` line alone, then the stack's modules."""

    def __init__(self) -> None:
        self.tasks: "OrderedDict[tuple[str, int], dict]" = OrderedDict()
        self.current: tuple[str, int] | None = None
        self.frames = 0

    def _task(self, comm: str, pid: int, ts) -> dict | None:
        key = (comm, pid)
        d = self.tasks.get(key)
        if d is None:
            if len(self.tasks) >= MAX_HUNG:
                return None
            d = self.tasks[key] = {"comm": comm, "pid": pid, "blocked_s": None, "count": 0,
                                   "state": None, "last_s": ts, "modules": []}
        self.current, self.frames = key, 0
        return d

    def feed(self, ts, msg: str) -> bool:
        m = HUNG_RE.search(msg)
        if m:
            d = self._task(m.group(1)[:64], int(m.group(2)), ts)
            if d is not None:
                d["count"] += 1
                d["blocked_s"] = max(d["blocked_s"] or 0, int(m.group(3)))
                d["last_s"] = ts
            return True
        m = STATE_RE.search(msg)
        if m:
            comm, state, pid = m.group(1), m.group(2), int(m.group(3))
            cur = self.tasks.get(self.current) if self.current else None
            if cur is not None and cur["pid"] == pid and cur["state"] is None:
                cur["state"] = state
                self.frames = 0
            elif state == "D":       # a report whose header was not pasted
                d = self._task(comm, pid, ts)
                if d is not None:
                    d["state"], d["last_s"] = state, ts
                    d["count"] = max(d["count"], 1)
            else:
                self.current = None
            return True
        if self.current is not None:
            self.frames += 1
            if self.frames > MAX_FRAMES:
                self.current = None
                return False
            fm = FRAME_MODULE_RE.search(msg)
            if fm and fm.group(1) in NVIDIA_MODULES:
                mods = self.tasks[self.current]["modules"]
                if fm.group(1) not in mods:
                    mods.append(fm.group(1))
                return True
        return False


class Summary:
    """What the other checks need from the one read of the kernel log (fact KMSG_LOG), so
    that gpu_lost and the trace verdicts do not read it again (issue 41): the newest Xid lines
    and, per GPU, the signs it is gone (Xid 79, the driver's off-the-bus line, a fatal AER)."""

    def __init__(self) -> None:
        self.xid_lines: deque = deque(maxlen=MAX_XID_LINES)   # (uptime_s, pci, code, text)
        self._run: tuple | None = None      # the newest lines of the last run, not yet read
        self.lost: dict[str, dict] = {}     # full bus id -> {"xid79": n, "off_the_bus": n, ...}

    def keep(self, line: tuple) -> None:
        """One Xid line (uptime_s, pci, code, text), newest last."""
        if self._run is not None:
            self._flush()
        self.xid_lines.append(line)

    def keep_run(self, tss: list, raws: tuple, rests: tuple, norm: dict) -> None:
        """The newest lines of a run of Xid lines (kmsg's block reader: raw keys, parsed by
        `norm`, and raw messages), read only if they are still among the newest when read: a
        storm's runs push each other out."""
        if len(tss) >= MAX_XID_LINES:
            self.xid_lines.clear()
        elif self._run is not None:
            self._flush()
        self._run = (tss, raws, rests, norm)

    def _flush(self) -> None:
        tss, raws, rests, norm = self._run
        self._run = None
        keys = {}
        for raw in set(raws):       # `norm` may have been emptied since (its bound): read again
            key = norm.get(raw)
            if key is None:
                pci, code = xid_key(raw)
                key = (pci[:64], code)
            keys[raw] = key
        self.xid_lines.extend([(float(t), *keys[r], xid_text(x)) for t, r, x in
                               zip(tss, raws, rests)])

    def mark_lost(self, bus: str, key: str, n: int = 1) -> None:
        full = aer.full_bdf(bus)
        if full is None or (full not in self.lost and len(self.lost) >= xid.MAX_GROUPS):
            return
        e = self.lost.setdefault(full, {"xid79": 0, "off_the_bus": 0, "aer_fatal": None})
        if key == "aer_fatal":
            e["aer_fatal"] = e["aer_fatal"] or n
        else:
            e[key] += n

    def as_fact(self, source: str) -> dict:
        if self._run is not None:
            self._flush()
        return {"source": source, "lost": {k: dict(v) for k, v in self.lost.items()},
                "xid_lines": tuple({"uptime_s": t, "pci": p, "xid": c, "text": x[:200]}
                                   for t, p, c, x in self.xid_lines)}


def analyze(records: Iterable[tuple[float | None, str]], now_s: float | None = None,
            now_wall: float | None = None, grouper: xid.Grouper | None = None,
            summary: Summary | None = None, sys_pci: Path | None = None,
            stop_at: float | None = None, stats: Stats | None = None):
    """Findings from kernel log records (any iterable: a stream is read once, in bounded
    memory). `now_s` (seconds since boot) adds ages, and with `now_wall` (epoch seconds at the
    same instant) the wall-clock first/last times. The Xid groups are folded into `grouper`
    (a fresh one when None), which the caller may keep, and what other checks need into
    `summary`. `sys_pci` (the host's /sys/bus/pci/devices) joins AER reports of a port to the
    GPUs below it. `stop_at` (time.monotonic()) stops reading there, so that a storm larger
    than the check's deadline still ends with the findings of what was read (`stats.cut`
    says so)."""
    hung = _Hung()
    grouper = grouper if grouper is not None else xid.Grouper()
    summary = summary if summary is not None else Summary()
    driver = nvrm.Reader()
    switches = sxid.Grouper()
    pcie = aer.Reader()
    locks = lockup.Reader()
    uuids: dict[str, str] = {}
    first_xid_at: dict[str, int] = {}       # bus id as logged -> line of its first Xid
    first_lost_line: dict[str, int] = {}    # short bus -> line of its first Xid 79/off-bus
    x79: dict[str, int] = {}                # bus id as logged -> Xid 79 lines
    first79: dict[str, int] = {}
    mark, xid_re, add = MARK_RE.search, XID_RE.search, grouper.add_fields
    keep = summary.keep

    def line(n: int, ts, msg: str) -> None:
        """One record: decoded only when it can matter."""
        if "NVRM: Xid" in msg:                      # the storm's line: decoded first, once
            m = xid_re(msg)
            if m:
                pci, code, text = m.group(1).strip(), int(m.group(2)), m.group(3) or ""
                add(ts, pci, code, text)
                keep((ts, pci, code, text))
                if pci not in first_xid_at and len(first_xid_at) < xid.MAX_GROUPS:
                    first_xid_at[pci] = n
                if code == 79:             # per bus id as logged: normalised once, below
                    x79[pci] = x79.get(pci, 0) + 1
                    if pci not in first79:
                        first79[pci] = n
                hung.current = None
                return
        if hung.current is None and locks._cur is None and pcie._left <= 0 \
                and not driver.busy and not mark(msg):
            return
        if pcie.feed(ts, msg, n):
            return
        if switches.feed(ts, msg):
            hung.current = None
            return
        m = xid.GPU_AT_RE.search(msg)
        if m:
            if len(uuids) < xid.MAX_GROUPS:
                uuids[xid.short_bus(m.group(1)) or ""] = m.group(2)
            return
        if hung.feed(ts, msg):
            return
        if locks.feed(ts, msg):
            return
        before = driver.off_bus_count()
        driver.feed(ts, msg)
        if driver.off_bus_count() != before:
            bus = driver.last_off_bus
            if bus:
                summary.mark_lost(bus, "off_the_bus")
                first_lost_line.setdefault(xid.short_bus(bus) or bus, n)

    known_raw: set[str] = set()     # raw Xid keys whose bus id is in first_xid_at

    def xid_run(n: int, rows: list) -> None:
        """A run of dmesg Xid lines (FAST_XID_RE's groups), lines n+1..n+len(rows): what
        line() does to each, in bulk."""
        ts_text, raws, rests = zip(*rows)
        counts, firsts = grouper.add_run(ts_text, raws, rests, xid_key, xid_text)
        norm = grouper.norm
        summary.keep_run(ts_text[-MAX_XID_LINES:], raws[-MAX_XID_LINES:], rests[-MAX_XID_LINES:],
                         norm)
        if len(first_xid_at) < xid.MAX_GROUPS:
            fresh = set(counts).difference(known_raw)
            if fresh:
                first = firsts()
                for raw in sorted(fresh, key=first.__getitem__):   # a bus id's first line
                    pci = norm[raw][0]
                    if pci not in first_xid_at and len(first_xid_at) < xid.MAX_GROUPS:
                        first_xid_at[pci] = n + 1 + first[raw]
                    if pci in first_xid_at:
                        known_raw.add(raw)
                if len(known_raw) > xid.MAX_RAW_KEYS:
                    known_raw.clear()
        lost = counts.keys() & grouper.raw79
        if lost:
            if any(norm[raw][0] not in first79 for raw in lost):    # a new GPU: in log order
                first = firsts()
                lost = sorted(lost, key=first.__getitem__)
                for raw in lost:
                    first79.setdefault(norm[raw][0], n + 1 + first[raw])
            for raw in lost:
                pci = norm[raw][0]
                x79[pci] = x79.get(pci, 0) + counts[raw]
        hung.current = None

    n = 0
    clock = time.monotonic
    if isinstance(records, (SavedLog, KmsgLog)):
        def busy() -> bool:
            return (hung.current is not None or locks._cur is not None or pcie._left > 0
                    or driver.busy)

        # a storm's block makes 100,000 tuples, each block would run the cyclic collector
        # 150 times for nothing (they are freed by reference counts): off while reading
        gc_on = gc.isenabled()
        gc.disable()
        try:
            for item in records.items(busy):
                kind = item[0]
                if kind == LINE:        # the clock every 1,024 lines, as for a stream
                    n += 1
                    if stop_at is not None and not n & 1023 and clock() > stop_at:
                        if stats is not None:
                            stats.cut = f"stopped at the check's deadline after {n - 1} lines"
                        break
                    line(n, item[1], item[2])
                    continue
                if stop_at is not None and clock() > stop_at:   # a block: before each
                    if stats is not None:
                        stats.cut = f"stopped at the check's deadline after {n} lines"
                    break
                if kind == SKIP:
                    n += item[1]
                elif kind == LINES:
                    for ts, msg in item[1]:
                        n += 1
                        line(n, ts, msg)
                else:
                    xid_run(n, item[1])
                    n += len(item[1])
        finally:
            if gc_on:
                gc.enable()
    else:
        for ts, msg in records:
            n += 1
            if stop_at is not None and not n & 4095 and clock() > stop_at:
                if stats is not None:
                    stats.cut = f"stopped at the check's deadline after {n - 1} lines"
                break
            line(n, ts, msg)

    def age(ts):
        return round(now_s - ts, 1) if now_s is not None and ts is not None else None

    def wall(ts):
        if now_s is None or now_wall is None or ts is None:
            return None
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now_wall - (now_s - ts)))

    for pci, count in list(x79.items())[:xid.MAX_GROUPS]:
        summary.mark_lost(pci, "xid79", count)
        bus = xid.short_bus(pci) or pci
        first_lost_line[bus] = min(first79[pci], first_lost_line.get(bus, first79[pci]))
    groups = grouper.groups()
    first_xid_line: dict[str, int] = {}     # short bus -> line of its first Xid
    for pci, line in first_xid_at.items():
        bus = xid.short_bus(pci) or pci
        first_xid_line[bus] = min(line, first_xid_line.get(bus, line))
    joins = _aer_joins(pcie.devices(), uuids, groups, driver.errors(), first_lost_line, sys_pci)
    for dev, gpus, how in joins:
        if dev.worst == aer.FATAL or dev.cant_recover:
            for g in gpus:
                summary.mark_lost(g, "aer_fatal", dev.first_fatal_line or 1)
    aer_cause: dict[str, tuple[aer.AerDevice, int]] = {}
    for dev, gpus, how in joins:
        if dev.first_fatal_line is None:
            continue
        for g in gpus:
            bus = xid.short_bus(g) or g
            first = first_xid_line.get(bus)
            if first is not None and dev.first_fatal_line < first and bus not in aer_cause:
                aer_cause[bus] = (dev, first)
    for gpu, gs in xid.per_gpu(groups):
        yield words.xid_finding(gs, uuids.get(gpu), age, wall, grouper.dropped,
                           (aer_cause.get(gpu) or (None,))[0])
    for _pci, gs in sxid.per_switch(switches.groups()):
        yield words.sxid_finding(gs, age, wall, switches.dropped)
    for dev, gpus, how in joins:
        f = words.aer_finding(dev, gpus, how, age, wall)
        if f is not None:
            yield f
    xid_codes = {g.code for g in groups}
    for e in driver.errors():
        if e.xid_like in xid_codes and e.kind != "reset_required":
            continue          # the same state already has its Xid line (gpu.xid says it)
        yield words.driver_finding(e, age, wall)
    if driver.mismatch:
        yield words.mismatch_finding(driver.mismatch, age, wall)
    unknown = driver.unrecognized()
    if unknown:
        yield words.unrecognized_finding(unknown, driver.unknown_dropped, age)
    for (comm, pid), d in hung.tasks.items():
        yield words.hung_finding(comm, pid, d, age)
    xid_pids = {p.split(" ")[0] for g in groups for p in g.pids}
    for r in locks.reports():
        f = words.lockup_finding(r, xid_pids, age)
        if f is not None:
            yield f


def _aer_joins(devices: list[aer.AerDevice], uuids: dict[str, str], groups, driver_errors,
               first_lost_line: dict[str, int], sys_pci: Path | None):
    """Each AER device with the GPUs (full bus ids) it concerns and how that was known:
    the GPU itself (`nvidia <bdf>`), the report's broadcast to an nvidia device, sysfs
    topology, or an Xid 79 / off-the-bus line on a GPU right after a fatal report."""
    gpus: set[str] = set()
    for bus in list(uuids) + [g.pci for g in groups] + [e.gpu for e in driver_errors]:
        full = aer.full_bdf(bus) if bus else None
        if full:
            gpus.add(full)
    for d in devices:
        if d.driver == "nvidia":
            gpus.add(d.bdf)
    above = {g: aer.upstream_ports(sys_pci, g) for g in sorted(gpus)} if sys_pci else {}
    out = []
    for d in devices:
        found: list[str] = []
        how = None
        if d.driver == "nvidia":
            found, how = [d.bdf], "the GPU itself"
        elif d.gpus:
            found, how = list(d.gpus), "the report's broadcast to the nvidia driver"
        else:
            below = [g for g, ports in above.items() if d.bdf in ports]
            if below:
                found, how = below, "sysfs topology (the GPU's upstream port)"
            elif d.first_fatal_line is not None:
                after = [b for b, line in first_lost_line.items()
                         if 0 < line - d.first_fatal_line <= 64]
                if len(after) == 1:
                    full = aer.full_bdf(after[0])
                    if full:
                        found, how = [full], "an Xid 79 on the GPU right after it"
        out.append((d, tuple(found), how))
    return out


def log_source(opts, stats: Stats) -> tuple[str, Iterator[tuple[float | None, str]], bool]:
    """(name, stream, live) of the kernel log this run reads: --kmsg-file (a saved log, no
    clock to age it against), else the host's /dev/kmsg. The one place the input is chosen,
    so another source (a bug report's log) plugs in here."""
    if opts.kmsg_file is not None:
        return str(opts.kmsg_file), iter_log_file(opts.kmsg_file, stats), False
    dev = hostfs.resolve(opts.host_root, "dev/kmsg") or Path("/dev/kmsg")
    return str(dev), KmsgLog(dev, stats), True


@check("kmsg", title="Kernel log: NVIDIA Xid and driver errors, PCIe AER, hung tasks, lockups",
       timeout_s=KMSG_TIMEOUT_S, provides=(KMSG_XIDS, KMSG_LOG), uses=(PODRESOURCES, NVML))
def kmsg_check(ctx):
    opts = ctx.options
    stats = Stats()
    grouper, summary = xid.Grouper(), Summary()
    sys_pci = hostfs.resolve(opts.host_root, "sys/bus/pci/devices")
    source = "the kernel log"
    try:
        source, stream, live = log_source(opts, stats)
        now = uptime_s() if live else None
        stop_at = min(ctx.started + KMSG_TIMEOUT_S, ctx.run_deadline) - READ_RESERVE_S
        found = list(analyze(stream, now, time.time() if now is not None else None, grouper,
                             summary, sys_pci, stop_at, stats))
    except OSError as exc:
        for key in (KMSG_XIDS, KMSG_LOG):
            ctx.facts.fail(key, f"cannot read {source}")
        if opts.kmsg_file is not None:
            return Skipped(f"cannot read the kernel log file {source}: {exc.strerror}")
        return Skipped(f"cannot read the kernel log {source}: {exc.strerror} (needs root or "
                       "CAP_SYSLOG): no Xid or hung-task verdict")
    ctx.progress(message=f"kernel log: {stats.records} records from {source}")
    if stats.cut:
        ctx.log("warning", f"kernel log {source}: {stats.cut}; later lines were not read")
    ctx.publish(KMSG_XIDS, tuple(grouper.groups()))
    ctx.publish(KMSG_LOG, summary.as_fact(source))
    if any(f.id in FAULT_IDS and f.severity.value != "info" for f in found):
        found = with_pods(ctx, found, ctx.started + KMSG_TIMEOUT_S - 0.4)
    yield from found


# the findings about one GPU that name the pods on it (issue 40.6): on demand, only when a GPU
# fault was found, in the probe, so `node X` without the agent names them too
FAULT_IDS = frozenset({"gpu.xid", "gpu.driver_error", "gpu.pcie_aer", "gpu.lost"})


def with_pods(ctx, found: list, until: float) -> list:
    """`found` with `pods` (ns/pod/container on the GPU each fault names, from the kubelet's
    pod-resources joined to NVML's GPUs by bus id, UUID and MIG devices) in the evidence of
    each GPU fault, and the first pods in its title. Waits for the two facts until `until`
    (time.monotonic()); a fault whose pods could not be read says why (`pods_note`)."""
    rows = ctx.fact(PODRESOURCES, timeout=max(0.05, until - time.monotonic()), default=None)
    inv = ctx.fact(NVML, timeout=max(0.05, until - time.monotonic()), default=None)
    hit = podresources.gpu_users(rows or (), getattr(inv, "gpus", ()) or ())
    note = None if rows is not None else "the kubelet's pod-resources were not read in time"
    out = []
    for f in found:
        if f.id not in FAULT_IDS:
            out.append(f)
            continue
        ev = f.evidence
        pods = podresources.users_of(f.subject, hit, str(ev.get("gpu_uuid") or ""),
                                     *(str(g) for g in (ev.get("gpus") or ())))
        new_ev = {**ev, "pods": list(pods)}
        if note:
            new_ev["pods_note"] = note
        title = f.title
        if pods:
            more = f" (+{len(pods) - 3} more)" if len(pods) > 3 else ""
            title = f"{title}; pods on it: {', '.join(pods[:3])}{more}"
        out.append(dataclasses.replace(f, title=title, evidence=new_ev))
    return out

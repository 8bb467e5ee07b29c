"""Reading a kernel log, in bounded memory: the host's /dev/kmsg a record at a time, a saved
log (--kmsg-file: raw kmsg records, `dmesg`, `dmesg -T`/`-H`, journal or syslog lines) in
blocks, as (seconds since boot or None, message).

Why a module of its own: the kmsg check decides what the lines mean; this one only reads
them, and it is where a storm's cost is paid. A saved log of 2,000,000 Xid lines is too many
lines for Python to touch one at a time within the check's deadline, so SavedLog.items() gives
analyze() a run of plain dmesg Xid lines as one findall's rows (issue 41.2), and every other
line as before.
"""
from __future__ import annotations

import errno
import os
import re
from pathlib import Path
from typing import Iterator

from node_probe.host import hostfs

# a line none of the readers can use is skipped before any decoding: NVIDIA driver lines
# (NVRM, nvidia-nvswitch, nvidia <bdf>, [nvidia] frames), hung tasks, AER, lockups
MARK_RE = re.compile(r"NVRM|nvidia|task|AER|PCIe Bus Error|pciehp|BUG:|LOCKUP|rcu: INFO")
MAX_RECORDS = 200_000           # records of /dev/kmsg read in one pass
MAX_LINE = 4096                 # a longer line is read in part (its rest is skipped)
MAX_FILE_BYTES = 1 << 30        # a saved log is read up to this many bytes


class Stats:
    """What one read saw: records, bytes, and whether it stopped at a bound."""

    def __init__(self) -> None:
        self.records = 0
        self.bytes = 0
        self.cut: str | None = None


def _lines(fd: int, stats: Stats, max_bytes: int, max_lines: int) -> Iterator[bytes]:
    """Lines of an open fd, each at most MAX_LINE bytes, in bounded memory. One read of
    /dev/kmsg is one record; a regular file gives many lines a read: both are split here."""
    pending = b""           # the unfinished last line (at most MAX_LINE bytes kept)
    skipping = False        # the unfinished line was already cut: drop the rest of it
    lines = 0
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError as exc:
            if exc.errno == errno.EAGAIN:
                break
            if exc.errno == errno.EPIPE:  # /dev/kmsg overwritten while reading: go on
                continue
            raise
        if not chunk:
            break
        stats.bytes += len(chunk)
        parts = chunk.split(b"\n")
        parts[0] = pending + parts[0]
        for line in parts[:-1]:
            if skipping:
                skipping = False
                continue
            lines += 1
            yield line[:MAX_LINE]
            if lines >= max_lines:
                stats.cut = f"stopped after {max_lines} lines"
                return
        pending = parts[-1]
        if len(pending) > MAX_LINE:        # a line without end yet: keep its head only
            if not skipping:
                lines += 1
                yield pending[:MAX_LINE]
            skipping, pending = True, b""
        if stats.bytes >= max_bytes:
            stats.cut = f"stopped after {max_bytes} bytes"
            break
    if pending and not skipping:
        yield pending[:MAX_LINE]


def iter_kmsg(path: Path, stats: Stats | None = None) -> Iterator[tuple[float | None, str]]:
    """The kernel ring buffer's records as (seconds since boot, message), streamed;
    non-blocking: stops when the buffer is drained. Dictionary lines (` SUBSYSTEM=pci`) are
    skipped; a message's own newlines (`\\x0a` in the record) become spaces."""
    stats = stats if stats is not None else Stats()
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        for raw in _lines(fd, stats, MAX_FILE_BYTES, MAX_RECORDS * 4):
            if raw.startswith(b" "):
                continue
            stats.records += 1
            yield parse_kmsg_record(raw.decode("utf-8", "replace"))
            if stats.records >= MAX_RECORDS:
                stats.cut = f"stopped after {MAX_RECORDS} records"
                return
    finally:
        os.close(fd)


def read_kmsg(path: Path) -> list[tuple[float | None, str]]:
    """All records in the kernel ring buffer (a list: for callers that want one)."""
    return list(iter_kmsg(path))


def kernel_log(opts, stats: Stats | None = None) -> Iterator[tuple[float | None, str]]:
    """The kernel log a run reads (--kmsg-file, else the host's /dev/kmsg), streamed as
    (seconds since boot or None, message): every reader of it keeps what it needs, never the
    log (a 200,000-line Xid storm is 19 MB of text). Raises OSError when it cannot be read."""
    if opts.kmsg_file is not None:
        return iter_log_file(opts.kmsg_file, stats)
    return iter_kmsg(hostfs.resolve(opts.host_root, "dev/kmsg") or Path("/dev/kmsg"), stats)


def parse_kmsg_record(text: str) -> tuple[float | None, str]:
    head, sep, msg = text.partition(";")
    if not sep:
        return None, text.strip()
    fields = head.split(",")
    ts = None
    if len(fields) >= 3 and fields[2].isdigit() and len(fields[2]) <= 18:
        ts = int(fields[2]) / 1e6
    msg = msg.split("\n", 1)[0].replace("\\x0a", " ").strip()
    return ts, msg


# `[ 1021.339512] msg` (dmesg), `[  +0.000049] msg` (dmesg -H), `[Wed Jan 27 23:04:35 2021]
# msg` (dmesg -T), `Feb 17 08:02:06 host kernel: msg` / `2024-01-01T00:00:00+00:00 host kernel:
# msg` (journal, syslog), `4,1234,2200100000,-;msg` (raw kmsg)
_DMESG_TS = re.compile(r"^\[\s*([0-9]{1,12}\.[0-9]{1,9})\]\s?(.*)$")
_DMESG_REL = re.compile(r"^\[\s*[+-]?[0-9]{1,12}\.[0-9]{1,9}\]\s?(.*)$")
_DMESG_T = re.compile(r"^\[[A-Z][a-z]{2} [A-Z][a-z]{2} [ 0-9][0-9] [0-9:]{8} [0-9]{4}\]\s?(.*)$")
_JOURNAL = re.compile(r"^(?:[A-Z][a-z]{2} [ 0-9][0-9] [0-9:]{8}|[0-9]{4}-[0-9]{2}-[0-9]{2}T\S+) "
                      r"\S+ kernel: (.*)$")
_KMSG_REC = re.compile(r"^[0-9]{1,3},[0-9]{1,20},[0-9]{1,20},[^;]{0,16};")


def parse_line(line: str) -> tuple[float | None, str]:
    """One line of a saved kernel log as (seconds since boot or None, message)."""
    line = line.rstrip()
    if line[:1] == "[":                 # `[ 1021.339512] msg` (dmesg), without a regex
        close = line.find("]", 1, 40)
        if close > 0:
            try:
                return float(line[1:close]), line[close + 1:].lstrip(" ")
            except ValueError:
                pass
    if not line.startswith("["):
        if _KMSG_REC.match(line):
            return parse_kmsg_record(line)
        m = _JOURNAL.match(line)
        if not m:
            return None, line
        line = m.group(1)
    m = _DMESG_TS.match(line)
    if m:
        return float(m.group(1)), m.group(2)
    m = _DMESG_REL.match(line) or _DMESG_T.match(line)
    if m:
        return None, m.group(1)
    return None, line


def iter_log_file(path: Path, stats: Stats | None = None) -> "SavedLog":
    """A saved kernel log, streamed a line at a time (bounded by MAX_LINE a line and
    MAX_FILE_BYTES in all); analyze() reads it in blocks (SavedLog.items)."""
    return SavedLog(path, stats)


# -- a saved log read a block at a time (issue 41.2) --------------------------------------------
# A 2,000,000-line storm is too many lines for Python to touch one at a time within the check's
# deadline. So a saved log is read in 1 MiB blocks, as bytes: one regex finds the lines that
# carry a marker (the rest are only counted), and a run of plain dmesg Xid lines is split by one
# findall and folded in bulk (xid.Grouper.add_run). Every other line is decoded and goes through
# the same per-line path as before, and so does every line while a multi-line report is read.
# Why bytes: decoding a storm's block costs as much as folding it, and a line's parts that these
# patterns cut at ASCII bytes (`[`, `]`, `(`, `)`, `,`, newline) decode exactly as they do inside
# the decoded line (UTF-8 restarts at any ASCII byte; "replace" works inside the part alone). So a
# part is decoded only when it is used: a distinct key once, a message when it is read.
# `[ 1021.339512] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, ...`: XID_RE on the message of a dmesg
# line, written for a block (no group crosses a line; the line's trailing whitespace is not part
# of the message, as parse_line's rstrip has it): a line this matches gives exactly what
# parse_line + XID_RE give (tests/core/test_kmsg_blocks.py compares the two on every form). It
# is stricter than the decoded line's regex, never looser: its blanks are ASCII only, and its
# bus id is at most 64 bytes, not characters; a line it refuses is read line by line.
_FAST_PREFIX = rb"\[ {0,8}([0-9]{1,12}\.[0-9]{1,9})\] *NVRM: Xid \("
# (time, key, rest): key is `PCI:0000:3b:00): 79` (read once per distinct key, xid_key), rest
# `, message` or blanks (read only for the lines that need their message, xid_text)
# (The bus id's optional `PCI:` is not written out: the 64 bytes include it, stricter than
# XID_RE; sre pays for an optional group on every line. One blank at most before the code, as
# the driver writes it.)
FAST_XID_RE = re.compile(rb"\n" + _FAST_PREFIX + rb"([^)\n]{0,64}\): ?[0-9]{1,6})"
                         rb"(,[^\n]*|[ \t\r\f\v]*)(?=\n)")
_XID_KEY_RE = re.compile(r"(?:PCI:)?([^)\n]{0,64})\):[^\S\n]*([0-9]{1,6})")


def _xid_key(key: str) -> tuple[str, int]:
    """(bus id, code) of a decoded FAST_XID_RE key, as line() reads them with XID_RE."""
    m = _XID_KEY_RE.fullmatch(key)
    return m.group(1).strip(), int(m.group(2))


def _xid_text(rest: str) -> str:
    """The message of a decoded FAST_XID_RE rest, as line() reads it with XID_RE (`or ""`)."""
    return rest[1:].strip() if rest[:1] == "," else ""


def xid_key(raw: bytes) -> tuple[str, int]:
    """(bus id, code) of FAST_XID_RE's key."""
    return _xid_key(raw.decode("utf-8", "replace"))


def xid_text(rest: bytes) -> str:
    """The message of FAST_XID_RE's rest."""
    return _xid_text(rest.decode("utf-8", "replace"))


FAST_START_RE = re.compile(_FAST_PREFIX)
# the end of a run of lines that start like a dmesg Xid line: a line that does not
FAST_RUN_END_RE = re.compile(rb"\n(?!" + _FAST_PREFIX + rb")")
# a line that may matter (MARK_RE's words, anywhere in the line; `\x0a`, which a raw kmsg
# record's message turns into a space); a blank line (not a record): in ASCII text, else decoded
BLOCK_MARK_RE = re.compile(MARK_RE.pattern.encode() + rb"|\\x0a")
_BLANK_RE = re.compile(r"\n[^\S\n]*(?=\n)")
_ASCII_BLANK_RE = re.compile(rb"\n[\t\x0b\x0c\r\x1c-\x1f ]*(?=\n)")   # str.isspace()'s ASCII
BLOCK_BYTES = 1 << 20
SKIP, LINE, XIDS, LINES = 0, 1, 2, 3      # what SavedLog.items() and KmsgLog.items() yield


def _blanks(text: bytes, start: int, end: int) -> int:
    """Blank lines (only whitespace, as str.strip() has it) among the lines of text[start:end],
    which is "\n" + whole lines each ending in "\n"."""
    part = text[start:end]
    if part.isascii():
        return len(_ASCII_BLANK_RE.findall(part))
    return len(_BLANK_RE.findall(part.decode("utf-8", "replace")))


def _cut_long(whole: bytes) -> bytes:
    """`whole` (lines each ending in "\n") with each line cut to MAX_LINE bytes. Only a line
    that holds a newline-free stretch of MAX_LINE // 2 bytes where the scan looks can be that
    long, so a block is looked at every MAX_LINE // 2 bytes, not split into its lines."""
    step = MAX_LINE // 2
    out: list[bytes] = []
    done = pos = 0                  # whole[:done] is in out; pos: where to look next
    while pos + step <= len(whole):
        if whole.find(b"\n", pos, pos + step) >= 0:
            pos += step
            continue
        start = whole.rfind(b"\n", 0, pos) + 1
        end = whole.find(b"\n", pos + step)
        if end - start > MAX_LINE:
            out.append(whole[done:start + MAX_LINE])
            done = end
        pos = end + 1
    if not out:
        return whole
    out.append(whole[done:])
    return b"".join(out)


def _blocks(fd: int, stats: Stats, max_bytes: int) -> Iterator[bytes]:
    """The lines of an open file in blocks of about BLOCK_BYTES, each block "\n" + whole lines
    each ending in "\n", each line cut to MAX_LINE bytes (the same lines _lines gives)."""
    pending = b""
    skipping = False        # the rest of a line already cut
    while True:
        chunk = os.read(fd, BLOCK_BYTES)
        if not chunk:
            break
        stats.bytes += len(chunk)
        if skipping:
            nl = chunk.find(b"\n")
            if nl < 0:
                chunk = b""
            else:
                chunk, skipping = chunk[nl + 1:], False
        data = pending + chunk if pending else chunk
        end = data.rfind(b"\n") + 1
        whole, pending = data[:end], data[end:]
        if len(pending) > MAX_LINE:         # a line without end yet: keep its head only
            whole += pending[:MAX_LINE] + b"\n"
            pending, skipping = b"", True
        if whole:
            yield b"\n" + _cut_long(whole)
        if stats.bytes >= max_bytes:
            stats.cut = f"stopped after {max_bytes} bytes"
            break
    if pending and not skipping:
        yield b"\n" + pending[:MAX_LINE] + b"\n"


class SavedLog:
    """A saved kernel log (--kmsg-file). Iterated, it is (seconds since boot or None, message)
    a line at a time, as iter_log_file was; `items()` is the same log for analyze(), in
    bulk where it can be (see above)."""

    def __init__(self, path: Path, stats: Stats | None = None) -> None:
        self.path = path
        self.stats = stats if stats is not None else Stats()

    def __iter__(self) -> Iterator[tuple[float | None, str]]:
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            for raw in _lines(fd, self.stats, MAX_FILE_BYTES, 1 << 40):
                text = raw.decode("utf-8", "replace")
                if not text.strip():
                    continue
                self.stats.records += 1
                yield parse_line(text)
        finally:
            os.close(fd)

    def items(self, busy) -> Iterator[tuple]:
        """(SKIP, records), (LINE, ts, message) or (XIDS, rows) in log order, where rows are
        FAST_XID_RE's groups (bytes: xid_key, xid_text read them) of a run of dmesg Xid
        lines. `busy()` (asked before each step) says a reader is inside a multi-line report:
        then every line is given, one at a time."""
        stats = self.stats
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            for text in _blocks(fd, stats, MAX_FILE_BYTES):
                pos, end = 1, len(text)
                whole = True        # try once a block: is the rest of it all Xid lines?
                slow_until = 0      # a run with a line that is not a plain Xid line ends here
                while pos < end:
                    # inside a multi-line report (busy) or such a run: one line at a time
                    if pos >= slow_until and not busy():
                        m = BLOCK_MARK_RE.search(text, pos)
                        start = end if m is None else text.rfind(b"\n", 0, m.start()) + 1
                        if start > pos:
                            k = text.count(b"\n", pos, start) - _blanks(text, pos - 1, start)
                            if k:
                                stats.records += k
                                yield (SKIP, k)
                            pos = start
                            if m is None:
                                break
                        if FAST_START_RE.match(text, pos):
                            if whole:       # a storm's block: one findall, no run scan
                                whole = False
                                rows = FAST_XID_RE.findall(text, pos - 1)
                                if len(rows) == text.count(b"\n", pos):
                                    stats.records += len(rows)
                                    pos = end
                                    yield (XIDS, rows)
                                    break
                            stop = FAST_RUN_END_RE.search(text, pos).end()
                            rows = FAST_XID_RE.findall(text, pos - 1, stop)
                            if len(rows) == text.count(b"\n", pos, stop):
                                stats.records += len(rows)
                                pos = stop
                                yield (XIDS, rows)
                                continue
                            slow_until = stop
                    nl = text.index(b"\n", pos)
                    line = text[pos:nl].decode("utf-8", "replace")
                    pos = nl + 1
                    if line.strip():
                        stats.records += 1
                        yield (LINE, *parse_line(line))
        finally:
            os.close(fd)


class KmsgLog:
    """The host's /dev/kmsg. Iterated, it is (seconds since boot, message) a record at a time,
    as iter_kmsg; `items()` is the same records for analyze(), where a record that carries no
    marker (BLOCK_MARK_RE, on its bytes) while no multi-line report is being read is only
    counted, never decoded or parsed: most of a node's kernel log is not the GPUs' (41.2)."""

    def __init__(self, path: Path, stats: Stats | None = None) -> None:
        self.path = path
        self.stats = stats if stats is not None else Stats()

    def __iter__(self) -> Iterator[tuple[float | None, str]]:
        return iter_kmsg(self.path, self.stats)

    def items(self, busy) -> Iterator[tuple]:
        """(SKIP, records) or (LINES, [(ts, message), ...]) in log order. A record with a
        marker is always read, so those come in batches (up to 1,024: no generator step a
        record); `busy()` is asked for a record without one, once the lines before it are read."""
        stats = self.stats
        search = BLOCK_MARK_RE.search
        skipped, batch = 0, []
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            for raw in _lines(fd, stats, MAX_FILE_BYTES, MAX_RECORDS * 4):
                if raw.startswith(b" "):
                    continue
                stats.records += 1
                if b"NVRM: Xid" not in raw and search(raw) is None:
                    if batch:
                        yield (LINES, batch)
                        batch = []
                    if busy():
                        batch.append(parse_kmsg_record(raw.decode("utf-8", "replace")))
                    else:
                        skipped += 1
                        if skipped >= 4096:
                            yield (SKIP, skipped)
                            skipped = 0
                else:
                    if skipped:
                        yield (SKIP, skipped)
                        skipped = 0
                    batch.append(parse_kmsg_record(raw.decode("utf-8", "replace")))
                    if len(batch) >= 1024:
                        yield (LINES, batch)
                        batch = []
                if stats.records >= MAX_RECORDS:
                    stats.cut = f"stopped after {MAX_RECORDS} records"
                    break
            if skipped:
                yield (SKIP, skipped)
            if batch:
                yield (LINES, batch)
        finally:
            os.close(fd)


def parse_log_file(text: str) -> list[tuple[float | None, str]]:
    """Every line of a saved kernel log given as text (tests, small inputs)."""
    return [parse_line(line) for line in text.splitlines() if line.strip()]


def uptime_s() -> float | None:
    try:
        return float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None

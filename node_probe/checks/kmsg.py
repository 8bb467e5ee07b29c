"""Kernel log: NVIDIA Xid errors and hung-task reports.

Why: when a GPU falls off the bus or a task sits in D state inside the driver, the kernel log
is the only witness. Reads /dev/kmsg without blocking (the whole ring buffer, then stops), or a
saved log given with --kmsg-file (raw kmsg, `dmesg` or journal format) for offline use.
"""
from __future__ import annotations

import errno
import os
import re
import time
from collections import OrderedDict
from pathlib import Path

from node_probe.protocol import catalog
from node_probe.host import hostfs, xid
from node_probe.engine.context import Skipped
from node_probe.engine.facts import KMSG_XIDS
from node_probe.engine.registry import check

# numbers are bounded ASCII digits: a --kmsg-file (or a forged record) with a 5,000-digit pid
# must not raise in int(), and `\d` would also take non-ASCII digits
XID_RE = xid.XID_RE
HUNG_RE = re.compile(r"INFO: task (.+):([0-9]{1,10}) blocked for more than ([0-9]{1,12}) seconds")
STATE_RE = re.compile(r"task:(\S+)\s+state:(\w)\b.*?pid:\s*([0-9]{1,10})\b")
HUNG_CRITICAL_COMMS = ("kubelet", "containerd", "dockerd", "crio", "nvidia", "runc")
MAX_RECORDS = 200_000


def read_kmsg(path: Path) -> list[tuple[float | None, str]]:
    """All records in the kernel ring buffer as (seconds since boot, message); non-blocking."""
    out: list[tuple[float | None, str]] = []
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        while len(out) < MAX_RECORDS:
            try:
                chunk = os.read(fd, 8192)
            except OSError as exc:
                if exc.errno == errno.EAGAIN:
                    break
                if exc.errno == errno.EPIPE:  # overwritten while reading: continue
                    continue
                raise
            if not chunk:
                break
            out.append(parse_kmsg_record(chunk.decode("utf-8", "replace")))
    finally:
        os.close(fd)
    return out


def parse_kmsg_record(text: str) -> tuple[float | None, str]:
    head, sep, msg = text.partition(";")
    if not sep:
        return None, text.strip()
    fields = head.split(",")
    ts = None
    if len(fields) >= 3 and fields[2].isdigit():
        ts = int(fields[2]) / 1e6
    return ts, msg.split("\n", 1)[0].strip()


_DMESG_TS = re.compile(r"^\[\s*(\d+\.\d+)\]\s?(.*)$")


def parse_log_file(text: str) -> list[tuple[float | None, str]]:
    out = []
    for line in text.splitlines():
        line = line.rstrip()
        if not line:
            continue
        m = _DMESG_TS.match(line)
        if m:
            out.append((float(m.group(1)), m.group(2)))
        elif re.match(r"^\d+,\d+,\d+,[^;]*;", line):
            out.append(parse_kmsg_record(line))
        else:
            out.append((None, line))
    return out


def uptime_s() -> float | None:
    try:
        return float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def analyze(records: list[tuple[float | None, str]], now_s: float | None = None,
            now_wall: float | None = None, grouper: xid.Grouper | None = None):
    """Findings from kernel log records. `now_s` (seconds since boot) adds ages, and with
    `now_wall` (epoch seconds at the same instant) the wall-clock first/last times. The Xid
    groups are folded into `grouper` (a fresh one when None), which the caller may keep."""
    hung: "OrderedDict[tuple[str, int], dict]" = OrderedDict()
    last_hung = None
    grouper = grouper if grouper is not None else xid.Grouper()
    uuids: dict[str, str] = {}
    for ts, msg in records:
        ev = xid.parse(ts, msg)
        if ev is not None:
            grouper.add(ev)
            continue
        m = xid.GPU_AT_RE.search(msg)
        if m:
            uuids[xid.short_bus(m.group(1))] = m.group(2)
            continue
        m = HUNG_RE.search(msg)
        if m:
            key = (m.group(1), int(m.group(2)))
            d = hung.setdefault(key, {"comm": m.group(1), "pid": int(m.group(2)),
                                      "blocked_s": 0, "count": 0, "state": None,
                                      "last_s": ts})
            d["count"] += 1
            d["blocked_s"] = max(d["blocked_s"], int(m.group(3)))
            d["last_s"] = ts
            last_hung = key
            continue
        m = STATE_RE.search(msg)
        if m and last_hung is not None and int(m.group(3)) == last_hung[1]:
            hung[last_hung]["state"] = m.group(2)
            last_hung = None

    def age(ts):
        return round(now_s - ts, 1) if now_s is not None and ts is not None else None

    def wall(ts):
        if now_s is None or now_wall is None or ts is None:
            return None
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now_wall - (now_s - ts)))

    for g in grouper.groups():
        yield _xid_finding(g, uuids.get(xid.short_bus(g.pci)), age, wall, grouper.dropped)
    for (comm, pid), d in hung.items():
        # by prefix (containerd-shim, runc:[2:INIT], nvidia-device-p), not substring: a task
        # named `prunc-job` or `my-kubelet-test` is not a node daemon
        critical = comm.lower().startswith(HUNG_CRITICAL_COMMS)
        yield catalog.make(
            "kernel.hung_task", "critical" if critical else "warning", f"{comm}:{pid}",
            f"Task {comm} (pid {pid}) blocked for more than {d['blocked_s']} s"
            + (f" in state {d['state']}" if d["state"] else ""),
            {"comm": comm, "pid": pid, "blocked_s": d["blocked_s"], "state": d["state"],
             "reports": d["count"], "last_age_s": age(d["last_s"])},
            "A task stuck in uninterruptible sleep (D) is waiting in the kernel, often on a "
            "driver (nvidia ioctl), storage or memory reclaim. Its kernel stack is in "
            "/proc/<pid>/stack; a node whose kubelet/containerd/driver tasks hang usually needs "
            "draining and a reboot.",
            ("https://www.kernel.org/doc/html/latest/admin-guide/sysctl/kernel.html#hung-task-timeout-secs",))


def _xid_finding(g: xid.XidGroup, uuid: str | None, age, wall, dropped: int):
    info = xid.describe(g.code)
    bucket = g.recovery or info.bucket
    gpu = f"GPU {uuid} (pci {g.pci})" if uuid else f"the GPU at pci {g.pci}"
    times = "once" if g.count == 1 else f"{g.count} times"
    name = f"{info.mnemonic}, " if info.mnemonic else ""
    return catalog.make(
        "gpu.xid", xid.SEVERITY[bucket], f"pci {g.pci}" if g.pci else "gpu",
        f"Xid {g.code} ({name}{info.meaning}) {times} on {gpu}: "
        f"NVIDIA says {bucket.replace('_', ' ')}",
        {"xid": g.code, "pci": g.pci, "gpu_uuid": uuid, "mnemonic": info.mnemonic,
         "meaning": info.meaning, "resolution_bucket": bucket,
         "nvidia_resolution_bucket": info.nvidia_bucket, "usual_cause": info.blame,
         "count": g.count, "last_message": g.last_message, "pids": list(g.pids),
         "first_s_since_boot": g.first_s, "last_s_since_boot": g.last_s,
         "first_seen": wall(g.first_s), "last_seen": wall(g.last_s),
         "last_age_s": age(g.last_s), "groups_dropped_events": dropped},
        f"{xid.BUCKET_TEXT[bucket][0].upper()}{xid.BUCKET_TEXT[bucket][1:]}. {info.action}",
        (xid.CATALOG_URL,))



@check("kmsg", title="Kernel log: NVIDIA Xid errors, hung tasks", timeout_s=5.0,
       provides=(KMSG_XIDS,))
def kmsg_check(ctx):
    opts = ctx.options
    if opts.kmsg_file is not None:
        source = str(opts.kmsg_file)
        try:
            records = parse_log_file(opts.kmsg_file.read_text(errors="replace"))
        except OSError as exc:
            ctx.facts.fail(KMSG_XIDS, f"cannot read {source}")
            return Skipped(f"cannot read the kernel log file {source}: {exc.strerror}")
        now = None
    else:
        dev = hostfs.resolve(opts.host_root, "dev/kmsg") or Path("/dev/kmsg")
        source = str(dev)
        try:
            records = read_kmsg(dev)
        except OSError as exc:
            ctx.facts.fail(KMSG_XIDS, f"cannot read {dev}")
            return Skipped(f"cannot read the kernel log {dev}: {exc.strerror} (needs root or "
                           "CAP_SYSLOG): no Xid or hung-task verdict")
        now = uptime_s()
    ctx.progress(message=f"kernel log: {len(records)} records from {source}")
    grouper = xid.Grouper()
    found = list(analyze(records, now, time.time() if now is not None else None, grouper))
    ctx.publish(KMSG_XIDS, tuple(grouper.groups()))
    yield from found

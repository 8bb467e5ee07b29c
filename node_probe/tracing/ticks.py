"""The kernel tick (jiffies) as the clock of the ioctl timings: its rate, and where it is now.

Why: reading a precise clock (bpf_ktime_get_ns) on entry and exit of every device ioctl was
most of what tracing cost a GPU process per call; bpf_jiffies64() is a load. The judgements
made on these times (an ioctl slow at >= 1 s, stalled at >= 2 s) are far above a tick, so the
tick is enough, and the loader reports the resolution with the numbers. Its rate (CONFIG_HZ) is
read from the kernel config when the node ships it, otherwise inferred from /proc/timer_list,
which also gives "now" in both clocks at once; where neither works, the precise clock is used.
"""
from __future__ import annotations

import gzip
import os
import re
from pathlib import Path

from node_probe.host import hostfs, procfs

CANDIDATE_HZ = (100, 250, 300, 1000)
TIMER_LIST_CAP = 256 << 10
_NOW = re.compile(r"^now at (\d+) nsecs$", re.M)
_JIFFIES = re.compile(r"^jiffies: (\d+)$", re.M)
_CONFIG_HZ = re.compile(rb"^CONFIG_HZ=(\d+)$", re.M)


def sample(proc: Path = procfs.PROC) -> tuple[int, int] | None:
    """(CLOCK_MONOTONIC ns, jiffies) read together from /proc/timer_list, or None."""
    text = procfs.read_str(proc / "timer_list", TIMER_LIST_CAP)
    if not text:
        return None
    now, jif = _NOW.search(text), _JIFFIES.search(text)
    if not now or not jif:
        return None
    return int(now.group(1)), int(jif.group(1))


def _config_hz(host_root: Path, proc: Path) -> int | None:
    release = os.uname().release
    for path in (proc / "config.gz", hostfs.resolve(host_root, f"boot/config-{release}")):
        if path is None:
            continue
        try:
            raw = hostfs.read_file(path, 1 << 20).data
        except OSError:
            continue
        if raw[:2] == b"\x1f\x8b":
            try:
                raw = gzip.decompress(raw)[: 8 << 20]
            except (OSError, EOFError):
                continue
        m = _CONFIG_HZ.search(raw)
        if m:
            return int(m.group(1))
    return None


def infer_hz(now_ns: int, jiffies: int) -> int | None:
    """The tick rate that fits one (monotonic, jiffies) pair: jiffies start at
    2**32 - 300*HZ (include/linux/jiffies.h, INITIAL_JIFFIES) at boot. None when two rates fit
    within 5 s (only in the seconds around 300 s of uptime)."""
    up = now_ns / 1e9
    errs = sorted((abs((jiffies - ((1 << 32) - 300 * hz)) / hz - up), hz) for hz in CANDIDATE_HZ)
    if errs[0][0] < 5.0 and errs[1][0] > 5.0:
        return errs[0][1]
    return None


def tick_hz(host_root: Path = Path("/"), proc: Path = procfs.PROC) -> int | None:
    """CONFIG_HZ of the running kernel, or None (then time with the precise clock)."""
    s = sample(proc)
    if s is None:
        return None   # no way to read "now" in ticks at the end of the window
    return _config_hz(host_root, proc) or infer_hz(*s)

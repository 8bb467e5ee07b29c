"""Safe reads of live processes under /proc (the debug pod runs with hostPID).

Why one module: several checks look at processes (the device plugin, GPU containers, memory
hogs), and two rules must hold everywhere (DESIGN.md section 9): the environment of a process
is read only for NVIDIA/CUDA/HAMi/device-plugin keys and nothing else is ever returned, and
a process that exits mid-read is normal, not an error.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterator

from node_probe.host import hostfs

PROC = Path("/proc")
# Caps for reads of tenant-controlled /proc files (a process can make its environ or cmdline
# as long as ARG_MAX allows); beyond them a read is truncated, never unbounded.
ENVIRON_CAP = 1 << 20
CMDLINE_CAP = 1 << 18
SMALL_CAP = 1 << 16


def read_bytes(path: Path, cap: int = SMALL_CAP) -> bytes | None:
    """At most `cap` bytes of a /proc file (None when gone or unreadable; never blocks)."""
    try:
        return hostfs.read_pseudo(path, cap).data
    except OSError:
        return None


def read_str(path: Path, cap: int = SMALL_CAP) -> str | None:
    """A /proc file as text, decoded with replacement (comm and paths need not be UTF-8)."""
    raw = read_bytes(path, cap)
    return None if raw is None else raw.decode("utf-8", "replace")

# Environment keys we may read (and show). Everything else in /proc/PID/environ is a secret.
ENV_PREFIXES = ("NVIDIA_", "CUDA_", "HAMI_", "GPU_CORE_")
ENV_KEYS = frozenset({
    # NVIDIA k8s-device-plugin configuration
    "PASS_DEVICE_SPECS", "DEVICE_LIST_STRATEGY", "DEVICE_ID_STRATEGY", "MIG_STRATEGY",
    "FAIL_ON_INIT_ERROR", "DEVICE_DISCOVERY_STRATEGY", "CONFIG_FILE", "LD_PRELOAD",
    # HAMi
    "LIBCUDA_LOG_LEVEL", "HOOK_PATH",
})


def env_key_allowed(key: str) -> bool:
    return key in ENV_KEYS or key.startswith(ENV_PREFIXES)


def read_environ(pid: int, proc: Path = PROC) -> dict[str, str]:
    """The allowed subset of a process's environment ({} if gone or unreadable)."""
    raw = read_bytes(proc / str(pid) / "environ", ENVIRON_CAP)
    if raw is None:
        return {}
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if not sep:
            continue
        k = key.decode("utf-8", "replace")
        if env_key_allowed(k):
            out[k] = value.decode("utf-8", "replace")
    return out


def read_cmdline(pid: int, proc: Path = PROC) -> list[str]:
    raw = read_bytes(proc / str(pid) / "cmdline", CMDLINE_CAP)
    if raw is None:
        return []
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def read_comm(pid: int, proc: Path = PROC) -> str:
    return (read_str(proc / str(pid) / "comm") or "").strip()


def pids(proc: Path = PROC) -> Iterator[int]:
    try:
        names = os.listdir(proc)
    except OSError:
        return
    for n in names:
        if n.isdigit():
            yield int(n)


def tids(pid: int, proc: Path = PROC) -> list[int]:
    try:
        return sorted(int(t) for t in os.listdir(proc / str(pid) / "task") if t.isdigit())
    except OSError:
        return []


_STAT_RE = re.compile(rb"^(\d+) \((.*)\) (\S) (.*)$", re.S)


def read_stat(pid: int, tid: int | None = None, proc: Path = PROC) -> dict | None:
    """Parsed /proc/PID[/task/TID]/stat: comm, state, ppid, minflt, majflt, utime, stime,
    starttime (clock ticks). The comm may contain spaces and parentheses."""
    path = proc / str(pid) / ("stat" if tid is None else f"task/{tid}/stat")
    raw = read_bytes(path)
    if raw is None:
        return None
    m = _STAT_RE.match(raw.strip())
    if not m:
        return None
    rest = m.group(4).split()
    # rest[0] is field 4 (ppid); field N is rest[N - 4]
    def f(n: int) -> int:
        try:
            return int(rest[n - 4])
        except (IndexError, ValueError):
            return 0
    return {"pid": int(m.group(1)), "comm": m.group(2).decode("utf-8", "replace"),
            "state": m.group(3).decode(), "ppid": f(4), "minflt": f(10), "majflt": f(12),
            "utime": f(14), "stime": f(15), "starttime": f(22)}


def read_cgroups(pid: int, proc: Path = PROC) -> dict[str, str]:
    """controller(s) -> path from /proc/PID/cgroup; the v2 entry has key ''."""
    text = read_str(proc / str(pid) / "cgroup")
    if text is None:
        return {}
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, ctrls, path = parts
        if not ctrls:
            out[""] = path
        for c in ctrls.split(","):
            if c:
                out[c] = path
    return out

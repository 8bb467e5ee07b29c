"""Does the device plugin see the same /dev/nvidia* nodes as the host?

Why (seed 002): a plugin container that started before /dev/nvidia-uvm existed keeps a /dev
without it and silently leaves it out of the device specs it hands to GPU containers, whose
device cgroup then denies it (CUDA error 30, EPERM on open). The plugin's view is its mount
namespace's /dev, read through /proc/PID/root/dev; the host's is <host-root>/dev. Creation
times say which came first: the host node's ctime against the plugin's start time.
"""
from __future__ import annotations

import os
import re
import stat
import time
from pathlib import Path

from node_probe.host import procfs

NVIDIA_PREFIX = "nvidia"
CAPS_DIR = "nvidia-caps"
CLOCK_SLACK_S = 1.0
# Nodes a compute container (and so the plugin's device specs) needs. nvidia-modeset and the
# NVSwitch nodes exist on hosts but are not injected for compute: their absence is normal.
RELEVANT = re.compile(r"^(nvidiactl|nvidia-uvm|nvidia-uvm-tools|nvidia\d+|nvidia-caps/.+)$")


def nvidia_nodes(dev_dir: Path) -> dict[str, os.stat_result]:
    """nvidia* entries of a /dev (and nvidia-caps/*), name -> stat (files or device nodes)."""
    out: dict[str, os.stat_result] = {}
    try:
        names = os.listdir(dev_dir)
    except OSError:
        return out
    for n in names:
        if not n.startswith(NVIDIA_PREFIX):
            continue
        p = dev_dir / n
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            if n == CAPS_DIR:
                for c in _listdir(p):
                    try:
                        out[f"{n}/{c}"] = os.lstat(p / c)
                    except OSError:
                        pass
            continue
        out[n] = st
    return out


def _listdir(p: Path) -> list[str]:
    try:
        return os.listdir(p)
    except OSError:
        return []


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def boot_time(proc: Path = procfs.PROC) -> float | None:
    for line in (procfs.read_str(proc / "stat", 1 << 20) or "").splitlines():
        if line.startswith("btime "):
            try:
                return float(line.split()[1])
            except (IndexError, ValueError):
                return None
    return None


def process_start_time(pid: int, proc: Path = procfs.PROC) -> float | None:
    st = procfs.read_stat(pid, proc=proc)
    bt = boot_time(proc)
    if st is None or bt is None:
        return None
    return bt + st["starttime"] / os.sysconf("SC_CLK_TCK")


def compare(host_dev: Path, pid: int, proc: Path = procfs.PROC) -> dict | None:
    """Missing nodes in the plugin's /dev, with times; None if either view is unreadable or
    nothing is missing."""
    host = {n: st for n, st in nvidia_nodes(host_dev).items() if RELEVANT.match(n)}
    plugin_dev = proc / str(pid) / "root" / "dev"
    if not host or not os.path.isdir(plugin_dev):
        return None
    mine = {n: st for n, st in nvidia_nodes(plugin_dev).items() if RELEVANT.match(n)}
    missing = sorted(set(host) - set(mine))
    if not missing:
        return None
    started = process_start_time(pid, proc)
    try:
        plugin_dev_ctime = os.stat(plugin_dev).st_ctime
    except OSError:
        plugin_dev_ctime = None
    nodes = []
    for n in missing:
        st = host[n]
        d = {"name": n, "host_path": str(host_dev / n), "host_ctime": _iso(st.st_ctime),
             "kind": "char" if stat.S_ISCHR(st.st_mode) else "other"}
        if stat.S_ISCHR(st.st_mode):
            d["major"], d["minor"] = os.major(st.st_rdev), os.minor(st.st_rdev)
        if started is not None:
            # start time is known to ~1 s (boot time has 1 s resolution): say so when closer
            gap = st.st_ctime - started
            d["created_after_plugin_start"] = None if abs(gap) < CLOCK_SLACK_S else gap > 0
        nodes.append(d)
    return {"missing": nodes, "plugin_sees": sorted(mine), "host_has": sorted(host),
            "plugin_started_at": _iso(started), "plugin_dev_ctime": _iso(plugin_dev_ctime)}

"""NUMA: which node each CPU is on, and which CPUs a container may run on (its cpuset).

Why: a pod whose CPUs sit on another NUMA node than its GPU pays the socket interconnect on
every host<->GPU copy (checks/slow/placement.py). The kernel says which CPUs belong to each
node in /sys/devices/system/node/node<N>/cpulist, and a cgroup's allowed CPUs in
cpuset.cpus.effective (v2; cpuset.effective_cpus on v1's cpuset hierarchy). Reads are capped.
"""
from __future__ import annotations

import re
from pathlib import Path

from node_probe.host import hostfs

CAP = 16384
MAX_NODES = 64
MAX_CPUS = 8192
_NODE = re.compile(r"^node(\d+)$")


def parse_cpulist(text: str, limit: int = MAX_CPUS) -> list[int]:
    """`0-3,8,10-11` -> [0, 1, 2, 3, 8, 10, 11] (bounded; junk parts are skipped)."""
    out: list[int] = []
    for part in (text or "").strip().split(","):
        a, _, b = part.strip().partition("-")
        try:
            lo, hi = int(a), int(b or a)
        except ValueError:
            continue
        if lo < 0 or hi < lo:
            continue
        out.extend(range(lo, min(hi, lo + limit) + 1))
        if len(out) >= limit:
            break
    return out[:limit]


def cpu_nodes(root: Path) -> dict[int, int]:
    """{cpu: NUMA node} (empty when sysfs has no node directory: not known)."""
    base = hostfs.resolve(root, "sys/devices/system/node")
    out: dict[int, int] = {}
    if base is None:
        return out
    try:
        names = sorted(p.name for p in base.iterdir() if _NODE.match(p.name))[:MAX_NODES]
    except OSError:
        return out
    for name in names:
        node = int(_NODE.match(name).group(1))
        text = hostfs.read_text(root, f"sys/devices/system/node/{name}/cpulist", CAP)
        for cpu in parse_cpulist(text or ""):
            out[cpu] = node
    return out


def cpuset(cgroup_dir: Path) -> list[int] | None:
    """The CPUs a cgroup may run on (v2 cpuset.cpus.effective, v1 cpuset.effective_cpus);
    None when neither file is there."""
    for name in ("cpuset.cpus.effective", "cpuset.effective_cpus"):
        try:
            text = hostfs.read_file(cgroup_dir / name, CAP).text
        except OSError:
            continue
        return parse_cpulist(text)
    return None

"""PCIe links as sysfs shows them: each PCI function's current and maximum link speed and width,
the bridge above it, and its NUMA node.

Why: NVML reports only the GPU's own end of the link; a PCIe switch uplink trained at Gen1 above
a healthy-looking GPU throttles it just the same, and NUMA placement needs the GPU's
`numa_node`. The kernel exports all of it under /sys/bus/pci/devices/<bdf>/
(Documentation/ABI/testing/sysfs-bus-pci: current_link_speed "16.0 GT/s PCIe",
current_link_width "16", max_link_speed, max_link_width, numa_node "-1" when unknown). The
device's sysfs path (…/pci0000:00/0000:00:01.0/0000:01:00.0) names the bridges above it.

Records are contract (b) of node_probe/checks/slow: {"bdf", "speed_cur_gts", "width_cur",
"speed_max_gts", "width_max", "upstream", "numa_node"}; a file that is missing or unreadable
gives None (not known). Every read is capped; the walk up stops after MAX_DEPTH bridges.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from node_probe.host import hostfs

BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
SPEED = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*GT/s")
MAX_DEPTH = 8
CAP = 256


def _read_at(dirfd: int, name: str) -> str | None:
    """One attribute file of an already resolved device directory (no symlink followed)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                     dir_fd=dirfd)
    except OSError:
        return None
    try:
        return os.read(fd, CAP).decode("ascii", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def speed_gts(text: str | None) -> float | None:
    """`16.0 GT/s PCIe`, `8 GT/s`, `2.5 GT/s` -> GT/s; `Unknown` (a link that is down) -> None."""
    m = SPEED.match(text or "")
    return float(m.group(1)) if m else None


def _int(text: str | None) -> int | None:
    try:
        return int((text or "").strip())
    except ValueError:
        return None


def link(root: Path, bdf: str) -> dict | None:
    """Contract (b) for one function, or None when sysfs has no such device. The device's
    directory is resolved once under the host root (hostfs: no symlink leaves it); its
    attribute files, which sysfs makes regular files, are read relative to it."""
    bdf = bdf.lower()
    if not BDF.match(bdf):
        return None
    real = hostfs.resolve(root, f"sys/bus/pci/devices/{bdf}")
    if real is None:
        return None
    try:
        dirfd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        node = _int(_read_at(dirfd, "numa_node"))
        rec = {"bdf": bdf,
               "speed_cur_gts": speed_gts(_read_at(dirfd, "current_link_speed")),
               "width_cur": _int(_read_at(dirfd, "current_link_width")),
               "speed_max_gts": speed_gts(_read_at(dirfd, "max_link_speed")),
               "width_max": _int(_read_at(dirfd, "max_link_width")),
               "upstream": real.parent.name if BDF.match(real.parent.name) else None,
               "numa_node": None if node is None or node < 0 else node}
    finally:
        os.close(dirfd)
    return rec


def chain(root: Path, bdf: str, cache: dict | None = None) -> list[dict]:
    """The function's record and every bridge's above it, nearest first (bounded). `cache`
    (bdf -> record) shares the bridges GPUs have in common across calls of one pass."""
    out: list[dict] = []
    cache = {} if cache is None else cache
    cur = bdf
    while cur and len(out) <= MAX_DEPTH:
        rec = cache[cur] if cur in cache else cache.setdefault(cur, link(root, cur))
        if rec is None:
            break
        out.append(rec)
        cur = rec["upstream"]
    return out

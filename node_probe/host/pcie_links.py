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

import re
from pathlib import Path

from node_probe.host import hostfs

BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
SPEED = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*GT/s")
MAX_DEPTH = 8
CAP = 256


def _read(root: Path, bdf: str, name: str) -> str | None:
    return hostfs.read_text(root, f"sys/bus/pci/devices/{bdf}/{name}", CAP)


def speed_gts(text: str | None) -> float | None:
    """`16.0 GT/s PCIe`, `8 GT/s`, `2.5 GT/s` -> GT/s; `Unknown` (a link that is down) -> None."""
    m = SPEED.match(text or "")
    return float(m.group(1)) if m else None


def _int(text: str | None) -> int | None:
    try:
        return int((text or "").strip())
    except ValueError:
        return None


def upstream_of(root: Path, bdf: str) -> str | None:
    """The bdf of the bridge above `bdf`: the parent directory of its real sysfs path."""
    real = hostfs.resolve(root, f"sys/bus/pci/devices/{bdf}")
    if real is None:
        return None
    parent = real.parent.name
    return parent if BDF.match(parent) else None


def link(root: Path, bdf: str) -> dict | None:
    """Contract (b) for one function, or None when sysfs has no such device."""
    bdf = bdf.lower()
    if not BDF.match(bdf) or not hostfs.exists_under(root, f"sys/bus/pci/devices/{bdf}"):
        return None
    node = _int(_read(root, bdf, "numa_node"))
    return {"bdf": bdf,
            "speed_cur_gts": speed_gts(_read(root, bdf, "current_link_speed")),
            "width_cur": _int(_read(root, bdf, "current_link_width")),
            "speed_max_gts": speed_gts(_read(root, bdf, "max_link_speed")),
            "width_max": _int(_read(root, bdf, "max_link_width")),
            "upstream": upstream_of(root, bdf),
            "numa_node": None if node is None or node < 0 else node}


def chain(root: Path, bdf: str) -> list[dict]:
    """The function's record and every bridge's above it, nearest first (bounded)."""
    out: list[dict] = []
    cur = bdf
    while cur and len(out) <= MAX_DEPTH:
        rec = link(root, cur)
        if rec is None:
            break
        out.append(rec)
        cur = rec["upstream"]
    return out


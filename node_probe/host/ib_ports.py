"""InfiniBand and RoCE ports as sysfs shows them: each port's logical state, physical state,
rate and link layer.

Why: a multi-node job's collectives run over these ports; one port down on one node hangs the
whole job while every GPU looks healthy. The kernel exports each port under
/sys/class/infiniband/<device>/ports/<port-num>/ (Documentation/ABI/stable/
sysfs-class-infiniband: "state: (RO) Port state (DOWN, INIT, ARMED, ACTIVE or ACTIVE_DEFER)",
"phys_state: (RO) Port physical state (Sleep, Polling, LinkUp, etc)", "rate: (RO) Port data
rate (active width * active speed)", "link_layer: (RO) Link layer type information (Infiniband
or Ethernet type)"). drivers/infiniband/core/sysfs.c writes them as "4: ACTIVE",
"5: LinkUp" / "3: Disabled" / "2: Polling" ("%u: %s") and "400 Gb/sec (4X NDR)".

Records: {"device", "port", "state", "state_code", "phys_state", "phys_state_code", "rate",
"link_layer"}; an unreadable file gives None. Bounded: MAX_DEVICES devices, MAX_PORTS ports
each, CAP bytes per file; names are kept only when they look like sysfs names.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from node_probe.host import procfs

CLASS_DIR = "sys/class/infiniband"
MAX_DEVICES = 64
MAX_PORTS = 64
CAP = 128
NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
CODED = re.compile(r"^\s*([0-9]{1,3})\s*:\s*(.{0,40}?)\s*$")


def parse_coded(text: str | None) -> tuple[int | None, str | None]:
    """"4: ACTIVE" -> (4, "ACTIVE"); "3: Disabled" -> (3, "Disabled"); None when unreadable."""
    if text is None:
        return None, None
    m = CODED.match(text.strip().splitlines()[0] if text.strip() else "")
    if not m:
        return None, (text.strip()[:40] or None)
    return int(m.group(1)), m.group(2)


def _names(d: Path, limit: int) -> list[str] | None:
    """Sorted entry names of `d` (None when it is not there), at most `limit`."""
    try:
        with os.scandir(d) as it:
            out = []
            for e in it:
                if len(out) >= limit:
                    break
                if NAME.match(e.name):
                    out.append(e.name)
    except OSError:
        return None
    return sorted(out, key=lambda n: (len(n), n))


def ports(host_root: Path) -> list[dict] | None:
    """Every port of every RDMA device under the host root; None when the node has no
    /sys/class/infiniband (no RDMA driver loaded: nothing to look at)."""
    base = Path(host_root) / CLASS_DIR
    devices = _names(base, MAX_DEVICES)
    if devices is None:
        return None
    out = []
    for dev in devices:
        pdir = base / dev / "ports"
        for port in _names(pdir, MAX_PORTS) or ():
            d = pdir / port
            state_code, state = parse_coded(procfs.read_str(d / "state", CAP))
            phys_code, phys = parse_coded(procfs.read_str(d / "phys_state", CAP))
            rate = procfs.read_str(d / "rate", CAP)
            layer = procfs.read_str(d / "link_layer", CAP)
            out.append({"device": dev, "port": int(port) if port.isdigit() else port,
                        "state": state, "state_code": state_code, "phys_state": phys,
                        "phys_state_code": phys_code,
                        "rate": rate.strip()[:40] if rate else None,
                        "link_layer": layer.strip()[:20] if layer else None})
    return out

"""`nvidia-smi nvlink --status` (`-s`) text: each GPU's links, active or `<inactive>`.

Why: the bug report carries it (`nvidia-smi nvlink --status` after `--query`), and a link down
is a slow-GPU cause the `-q` text does not show. Each link becomes {"link", "active",
"errors": {}} (contract a's "nvlink"; the error counters are another command's, left unknown).
"""
from __future__ import annotations

import re
from typing import Iterable

GPU_RE = re.compile(r"^GPU ([0-9]{1,4}): (.{0,200}?)(?: \(UUID: (GPU-[0-9A-Za-z-]{1,64}|[^)]*)\))?"
                    r"\s*$")       # a UUID not of the GPU-... shape is taken as unknown
LINK_RE = re.compile(r"^\s+Link ([0-9]{1,3}): (.{0,64})$")
MAX_LINKS = 64


def parse(lines: Iterable[str]) -> list[dict]:
    """[{"index", "uuid", "nvlink": [...]}] per GPU block, in file order."""
    out: list[dict] = []
    cur: dict | None = None
    for line in lines:
        m = GPU_RE.match(line)
        if m:
            uuid = m.group(3) if m.group(3) and m.group(3).startswith("GPU-") else None
            cur = {"index": int(m.group(1)), "uuid": uuid, "nvlink": []}
            out.append(cur)
            continue
        m = LINK_RE.match(line)
        if m and cur is not None and len(cur["nvlink"]) < MAX_LINKS:
            state = m.group(2).strip()
            active = False if state == "<inactive>" else True if "GB/s" in state else None
            cur["nvlink"].append({"link": int(m.group(1)), "active": active, "errors": {}})
    return out


def attach(gpus: list[dict], status: list[dict]) -> None:
    """Give each GPU record its links: matched by UUID; by index only where the status block
    names no UUID (a block naming another UUID is another GPU, never this one)."""
    by_uuid = {s["uuid"]: s for s in status if s.get("uuid")}
    by_index = {s["index"]: s for s in status if not s.get("uuid")}
    for g in gpus:
        s = by_uuid.get(g.get("uuid")) or by_index.get(g.get("index"))
        if s is not None and s["nvlink"]:
            g["nvlink"] = s["nvlink"]

"""`nvidia-smi -q` (`--query`) text into GPU records shaped like the NVML child's.

Why: the text is what people paste. It is an indented outline of `Key : Value` lines and
section titles; one linear pass builds the outline (a stack by indentation, bounded depth), and
the fields are then read by their names, old and new (`Clocks Throttle Reasons` became `Clocks
Event Reasons`, `Power Readings` became `GPU Power Readings`, `Single Bit` / `Double Bit` ECC
totals became `SRAM/DRAM Correctable/Uncorrectable`). A value nvidia-smi prints as N/A, or a
field it does not print, stays None: nothing is guessed.
"""
from __future__ import annotations

import re
from typing import Any, Iterable

from node_probe.host.offline import UnknownFormat, values

HEADER = "==============NVSMI LOG=============="
GPU_RE = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")
KV_RE = re.compile(r"^(\s*)(\S[^:]*?)\s*:\s?(.*)$")
MAX_DEPTH = 16
MAX_GPUS = 1024
MAX_NODES = 1_000_000          # outline entries kept in one file


class Node:
    """One outline entry: a title (value None) or a `Key : Value` line, with its children."""

    __slots__ = ("key", "value", "children")

    def __init__(self, key: str, value: str | None) -> None:
        self.key = key
        self.value = value
        self.children: list[Node] = []

    def get(self, *path: str) -> "Node | None":
        """The first child named path[0], then its child path[1], ... (case-insensitive)."""
        node: Node | None = self
        for name in path:
            low = name.lower()
            node = next((c for c in node.children if c.key.lower() == low), None) \
                if node is not None else None
            if node is None:
                return None
        return node

    def val(self, *path: str) -> str | None:
        n = self.get(*path)
        return None if n is None else n.value

    def walk(self) -> Iterable["Node"]:
        stack = list(reversed(self.children))
        while stack:
            n = stack.pop()
            yield n
            stack.extend(reversed(n.children))


def looks_like(lines: list[str]) -> bool:
    """Whether the head of a file is `nvidia-smi -q` text."""
    return any(line.strip() == HEADER or GPU_RE.match(line) for line in lines)


def outline(lines: Iterable[str]) -> list[tuple[str, Node]]:
    """(bus id, outline) of each `GPU <bus id>` block, in file order."""
    gpus: list[tuple[str, Node]] = []
    stack: list[tuple[int, Node]] = []
    count = 0
    for line in lines:
        m = GPU_RE.match(line)
        if m:
            if len(gpus) >= MAX_GPUS:
                break
            root = Node("GPU", m.group(1))
            gpus.append((m.group(1), root))
            stack = [(-1, root)]
            continue
        if not stack or not line.strip():
            continue
        if not line[:1].isspace():      # a line at column 0 ends the GPU block
            stack = []
            continue
        indent = len(line) - len(line.lstrip())
        m = KV_RE.match(line)
        node = Node(m.group(2).strip(), m.group(3).strip()) if m else Node(line.strip(), None)
        while len(stack) > 1 and stack[-1][0] >= indent:
            stack.pop()
        if len(stack) >= MAX_DEPTH:
            continue
        count += 1
        if count > MAX_NODES:
            break
        stack[-1][1].children.append(node)
        stack.append((indent, node))
    return gpus


# clock event reason lines under "Clocks Event Reasons" / "Clocks Throttle Reasons" (nvml.h
# nvmlClocksEventReason*, the same bits as nvmlClocksThrottleReason*)
REASON_LINES = {"idle": 0x1, "applications clocks setting": 0x2, "sw power cap": 0x4,
                "hw slowdown": 0x8, "sync boost": 0x10, "sw thermal slowdown": 0x20,
                "hw thermal slowdown": 0x40, "hw power brake slowdown": 0x80,
                "display clock setting": 0x100}


def _reasons(g: Node) -> int | None:
    sec = g.get("Clocks Event Reasons") or g.get("Clocks Throttle Reasons") \
        or g.get("Clocks Throttle Reasons Active")
    if sec is None:
        return None
    states = {n.key.lower(): n.value for n in sec.walk()}
    return values.reason_mask(states, REASON_LINES)


def _ecc(g: Node) -> dict | None:
    vol = g.get("ECC Errors", "Volatile")
    sec = g.get("Retired Pages")
    sbe = dbe = None
    if vol is not None:
        sbe = values.total([vol.val("SRAM Correctable"), vol.val("DRAM Correctable")])
        dbe = values.total([vol.val("SRAM Uncorrectable"), vol.val("DRAM Uncorrectable"),
                            vol.val("SRAM Uncorrectable Parity"),
                            vol.val("SRAM Uncorrectable SEC-DED")])
        if sbe is None:
            sbe = values.integer(vol.val("Single Bit", "Total"))
        if dbe is None:
            dbe = values.integer(vol.val("Double Bit", "Total"))
    pending = None
    if sec is not None:
        pending = values.yes_no(sec.val("Pending Page Blacklist")
                                or sec.val("Pending Page Retirement") or sec.val("Pending"))
    if sbe is None and dbe is None and pending is None:
        return None
    return {"sbe_volatile": sbe, "dbe_volatile": dbe, "retired_pending": pending}


def _remapped(g: Node) -> dict | None:
    sec = g.get("Remapped Rows")
    if sec is None or not sec.children:
        return None
    out = {"correctable": values.integer(sec.val("Correctable Error")),
           "uncorrectable": values.integer(sec.val("Uncorrectable Error")),
           "pending": values.yes_no(sec.val("Pending")),
           "failure": values.yes_no(sec.val("Remapping Failure Occurred"))}
    if all(v is None for v in out.values()):
        return None
    hist = sec.get("Bank Remap Availability Histogram")
    if hist is not None:
        h = {k.lower(): values.integer(hist.val(k)) for k in ("Max", "High", "Partial", "Low",
                                                              "None")}
        if all(v is not None for v in h.values()):
            out["histogram"] = h
    return out


def _processes(g: Node) -> list[dict] | None:
    sec = g.get("Processes")
    if sec is None:
        return None
    if not sec.children:
        return [] if (sec.value or "").strip().lower() == "none" else None
    procs = []
    for n in sec.walk():
        if n.key.lower() == "process id":
            pid = values.integer(n.value)
            if pid is None:
                continue
            kind = (n.val("Type") or "C").upper()
            if "C" not in kind:         # graphics-only (G): NVML's compute list omits them
                continue
            mem = n.get("Used GPU Memory")
            procs.append({"pid": pid,
                          "used_memory_bytes": values.mib_bytes(mem.value if mem else None)})
    return procs


def _pcie(g: Node) -> dict:
    link = g.get("PCI", "GPU Link Info")
    gen = link.get("PCIe Generation") if link else None
    width = link.get("Link Width") if link else None
    return {"gen_cur": values.integer(gen.val("Current")) if gen else None,
            "gen_max": values.integer(gen.val("Max")) if gen else None,
            "gen_gpu_max": values.integer(gen.val("Device Max")) if gen else None,
            "gen_host_max": values.integer(gen.val("Host Max")) if gen else None,
            "width_cur": values.integer(width.val("Current")) if width else None,
            "width_max": values.integer(width.val("Max")) if width else None,
            "width_gpu_max": None}


def record(index: int, bus: str, g: Node) -> dict:
    """One GPU record (contract a of node_probe/checks/slow)."""
    power = g.get("GPU Power Readings") or g.get("Power Readings")
    temp = g.get("Temperature")
    clocks, maxc = g.get("Clocks"), g.get("Max Clocks")
    rec: dict[str, Any] = {
        "index": index,
        "uuid": values.uuid(g.val("GPU UUID")),
        "pci_bus_id": values.bus_id(g.val("PCI", "Bus Id")) or bus,
        "name": g.val("Product Name"),
        "pcie": _pcie(g),
        "utilization_gpu_pct": values.integer(g.val("Utilization", "Gpu")),
        "clocks": {"event_reasons": _reasons(g),
                   "sm_mhz": values.integer(clocks.val("SM")) if clocks else None,
                   "sm_max_mhz": values.integer(maxc.val("SM")) if maxc else None,
                   "mem_mhz": values.integer(clocks.val("Memory")) if clocks else None,
                   "mem_max_mhz": values.integer(maxc.val("Memory")) if maxc else None},
        "temperature": {
            "gpu_c": values.number(temp.val("GPU Current Temp")) if temp else None,
            "slowdown_c": values.number(temp.val("GPU Slowdown Temp")) if temp else None,
            "shutdown_c": values.number(temp.val("GPU Shutdown Temp")) if temp else None},
        "power": {
            "draw_w": values.number(power.val("Instant Power Draw") or power.val("Power Draw")
                                    or power.val("Average Power Draw")) if power else None,
            "limit_w": values.number(power.val("Current Power Limit")
                                     or power.val("Enforced Power Limit")
                                     or power.val("Power Limit")) if power else None,
            "default_limit_w": values.number(power.val("Default Power Limit"))
            if power else None},
        "ecc": _ecc(g),
        "remapped_rows": _remapped(g),
        "processes": _processes(g),
    }
    return rec


def parse(lines: Iterable[str]) -> list[dict]:
    """GPU records of `nvidia-smi -q` text; UnknownFormat when it holds no GPU block."""
    gpus = outline(lines)
    if not gpus:
        raise UnknownFormat("no `GPU <bus id>` block of `nvidia-smi -q`")
    return [record(i, bus, g) for i, (bus, g) in enumerate(gpus)]

"""`nvidia-smi -q -x` XML into GPU records shaped like the NVML child's.

Why expat by hand and not ElementTree: the file is hostile input, so the parser refuses what
XML can do beyond data -- an internal DTD subset, entity declarations (the billion-laughs
expansion), external entities -- while the plain `<!DOCTYPE nvidia_smi_log SYSTEM
"nvsmi_device_v13.dtd">` that every real file carries is accepted and never fetched. The tree
is built with a cap on depth and on elements, in one linear pass.
"""
from __future__ import annotations

import xml.parsers.expat
from typing import Any, Iterable

from node_probe.host.offline import UnknownFormat, values

MAX_DEPTH = 32
MAX_ELEMENTS = 1_000_000
MAX_TEXT = 4096                 # characters kept of one element's text


class El:
    __slots__ = ("tag", "attrs", "children", "text")

    def __init__(self, tag: str, attrs: dict) -> None:
        self.tag = tag
        self.attrs = attrs
        self.children: list[El] = []
        self.text = ""

    def find(self, *path: str) -> "El | None":
        node: El | None = self
        for name in path:
            node = next((c for c in node.children if c.tag == name), None) \
                if node is not None else None
            if node is None:
                return None
        return node

    def val(self, *path: str) -> str | None:
        n = self.find(*path)
        return None if n is None else n.text.strip()

    def first(self, *paths: tuple[str, ...]) -> str | None:
        """The first of several paths that is present (a field renamed across versions)."""
        for p in paths:
            v = self.val(*p)
            if v is not None:
                return v
        return None


class Refused(UnknownFormat):
    """XML that declares entities or an internal DTD subset: refused, never expanded."""


def looks_like(lines: list[str]) -> bool:
    text = "\n".join(lines).lstrip("\ufeff \t\r\n")
    return text.startswith("<?xml") or text.startswith("<nvidia_smi_log")


def tree(lines: Iterable[str]) -> El:
    """The document's root element; UnknownFormat (Refused) for a DTD subset or entities,
    malformed XML or a document past the caps."""
    p = xml.parsers.expat.ParserCreate()
    p.SetParamEntityParsing(xml.parsers.expat.XML_PARAM_ENTITY_PARSING_NEVER)
    stack: list[El] = []
    root: list[El] = []
    count = [0]

    def doctype(name, sysid, pubid, has_internal_subset):
        if has_internal_subset:
            raise Refused("an XML DOCTYPE with an internal subset (refused: entities are "
                          "never expanded)")

    def entity(*_a):
        raise Refused("an XML entity declaration (refused: entities are never expanded)")

    def external(*_a):
        raise Refused("an XML external entity reference (refused)")

    def start(tag, attrs):
        count[0] += 1
        if count[0] > MAX_ELEMENTS or len(stack) >= MAX_DEPTH:
            raise UnknownFormat(f"XML past {MAX_ELEMENTS} elements or {MAX_DEPTH} levels")
        el = El(tag, attrs)
        if stack:
            stack[-1].children.append(el)
        else:
            root.append(el)
        stack.append(el)

    def end(tag):
        stack.pop()

    def chars(data):
        if stack and len(stack[-1].text) < MAX_TEXT:
            stack[-1].text += data[:MAX_TEXT - len(stack[-1].text)]

    p.StartDoctypeDeclHandler = doctype
    p.EntityDeclHandler = entity
    p.UnparsedEntityDeclHandler = entity
    p.ExternalEntityRefHandler = external
    p.StartElementHandler = start
    p.EndElementHandler = end
    p.CharacterDataHandler = chars
    try:
        for line in lines:
            p.Parse(line + "\n", False)
        p.Parse(b"", True)
    except xml.parsers.expat.ExpatError as exc:
        raise UnknownFormat(f"not well-formed XML ({exc})") from None
    if not root:
        raise UnknownFormat("no XML element")
    return root[0]


# <clocks_event_reasons>/<clocks_throttle_reasons> children, by the name after the prefix
REASON_TAGS = {"gpu_idle": 0x1, "applications_clocks_setting": 0x2, "sw_power_cap": 0x4,
               "hw_slowdown": 0x8, "sync_boost": 0x10, "sw_thermal_slowdown": 0x20,
               "hw_thermal_slowdown": 0x40, "hw_power_brake_slowdown": 0x80,
               "display_clocks_setting": 0x100}


def _reasons(g: El) -> int | None:
    sec = g.find("clocks_event_reasons") or g.find("clocks_throttle_reasons")
    if sec is None:
        return None
    states = {}
    for c in sec.children:
        for prefix in ("clocks_event_reason_", "clocks_throttle_reason_"):
            if c.tag.startswith(prefix):
                states[c.tag[len(prefix):]] = c.text.strip()
    return values.reason_mask(states, REASON_TAGS)


def _ecc(g: El) -> dict | None:
    vol = g.find("ecc_errors", "volatile")
    sbe = dbe = None
    if vol is not None:
        sbe = values.total([vol.val("sram_correctable"), vol.val("dram_correctable")])
        dbe = values.total([vol.val("sram_uncorrectable"), vol.val("dram_uncorrectable"),
                            vol.val("sram_uncorrectable_parity"),
                            vol.val("sram_uncorrectable_secded")])
        if sbe is None:
            sbe = values.integer(vol.val("single_bit", "total"))
        if dbe is None:
            dbe = values.integer(vol.val("double_bit", "total"))
    pending = values.yes_no(g.first(("retired_pages", "pending_retirement"),
                                    ("retired_pages", "pending_blacklist")))
    if sbe is None and dbe is None and pending is None:
        return None
    return {"sbe_volatile": sbe, "dbe_volatile": dbe, "retired_pending": pending}


def _remapped(g: El) -> dict | None:
    sec = g.find("remapped_rows")
    if sec is None or not sec.children:
        return None
    out = {"correctable": values.integer(sec.val("remapped_row_corr")),
           "uncorrectable": values.integer(sec.val("remapped_row_unc")),
           "pending": values.yes_no(sec.val("remapped_row_pending")),
           "failure": values.yes_no(sec.val("remapped_row_failure"))}
    if all(v is None for v in out.values()):
        return None
    hist = sec.find("row_remapper_histogram")
    if hist is not None:
        h = {k: values.integer(hist.val(f"row_remapper_histogram_{k}"))
             for k in ("max", "high", "partial", "low", "none")}
        if all(v is not None for v in h.values()):
            out["histogram"] = h
    return out


def _processes(g: El) -> list[dict] | None:
    sec = g.find("processes")
    if sec is None:
        return None
    procs = []
    for p in sec.children:
        if p.tag != "process_info":
            continue
        if "C" not in (p.val("type") or "C").upper():
            continue
        pid = values.integer(p.val("pid"))
        if pid is not None:
            procs.append({"pid": pid, "used_memory_bytes": values.mib_bytes(p.val("used_memory"))})
    return procs


def record(index: int, g: El) -> dict:
    """One GPU record (contract a of node_probe/checks/slow)."""
    link = ("pci", "pci_gpu_link_info")
    power = g.find("gpu_power_readings") or g.find("power_readings")
    rec: dict[str, Any] = {
        "index": index,
        "uuid": values.uuid(g.val("uuid")),
        "pci_bus_id": values.bus_id(g.val("pci", "pci_bus_id")) or values.bus_id(g.attrs.get("id")),
        "name": g.val("product_name"),
        "pcie": {
            "gen_cur": values.integer(g.val(*link, "pcie_gen", "current_link_gen")),
            "gen_max": values.integer(g.val(*link, "pcie_gen", "max_link_gen")),
            "gen_gpu_max": values.integer(g.val(*link, "pcie_gen", "max_device_link_gen")),
            "gen_host_max": values.integer(g.val(*link, "pcie_gen", "max_host_link_gen")),
            "width_cur": values.integer(g.val(*link, "link_widths", "current_link_width")),
            "width_max": values.integer(g.val(*link, "link_widths", "max_link_width")),
            "width_gpu_max": None},
        "utilization_gpu_pct": values.integer(g.val("utilization", "gpu_util")),
        "clocks": {"event_reasons": _reasons(g),
                   "sm_mhz": values.integer(g.val("clocks", "sm_clock")),
                   "sm_max_mhz": values.integer(g.val("max_clocks", "sm_clock")),
                   "mem_mhz": values.integer(g.val("clocks", "mem_clock")),
                   "mem_max_mhz": values.integer(g.val("max_clocks", "mem_clock"))},
        "temperature": {
            "gpu_c": values.number(g.val("temperature", "gpu_temp")),
            "slowdown_c": values.number(g.val("temperature", "gpu_temp_slow_threshold")),
            "shutdown_c": values.number(g.val("temperature", "gpu_temp_max_threshold"))},
        "power": {
            "draw_w": None if power is None else values.number(
                power.first(("instant_power_draw",), ("power_draw",), ("average_power_draw",))),
            "limit_w": None if power is None else values.number(
                power.first(("current_power_limit",), ("enforced_power_limit",),
                            ("power_limit",))),
            "default_limit_w": None if power is None else values.number(
                power.val("default_power_limit"))},
        "ecc": _ecc(g),
        "remapped_rows": _remapped(g),
        "processes": _processes(g),
    }
    return rec


def parse(lines: Iterable[str]) -> list[dict]:
    """GPU records of `nvidia-smi -q -x`; UnknownFormat for anything else."""
    root = tree(lines)
    if root.tag != "nvidia_smi_log":
        raise UnknownFormat(f"XML whose root is <{root.tag[:40]}>, not <nvidia_smi_log>")
    return [record(i, g) for i, g in enumerate(c for c in root.children if c.tag == "gpu")]

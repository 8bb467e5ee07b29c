"""One entry point for every source (probe, offline parsers, agent): all slow-GPU judges over a
node's GPU records. See the package docstring for the record contract."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from node_probe.checks.slow import clocks, memory, nvlink, pcie
from node_probe.protocol import Finding


def norm_bdf(bus_id: Any) -> str | None:
    """`00000000:3B:00.0` (NVML) and `0000:3b:00.0` (sysfs, lspci with -D) as one key."""
    if not bus_id:
        return None
    parts = str(bus_id).strip().lower().split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    if len(parts) != 3:
        return str(bus_id).strip().lower()
    dom, bus, devfn = parts
    try:
        dev, _, fn = devfn.partition(".")
        return f"{int(dom, 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{int(fn or '0', 16)}"
    except ValueError:
        return str(bus_id).strip().lower()


def judge_gpus(gpus: Sequence[Mapping[str, Any]],
               links: Mapping[str, Mapping[str, Any]] | Sequence[Mapping[str, Any]] | None = None,
               holders: Mapping[str, Sequence[str]] | None = None,
               previous: Sequence[Mapping[str, Any]] | None = None) -> list[Finding]:
    """Every slow-GPU finding for a node's GPU records (contract a), link records (contract b:
    a list, or a mapping by bdf), holders (GPU UUID -> pods) and an earlier sample."""
    if links is not None and not isinstance(links, Mapping):
        links = {norm_bdf(r.get("bdf")): r for r in links if r.get("bdf")}
    if links:
        links = {norm_bdf(k): {**v, "bdf": norm_bdf(v.get("bdf") or k),
                               "upstream": norm_bdf(v.get("upstream"))}
                 for k, v in links.items()}
    before = {str(p.get("uuid")): p for p in previous or () if p.get("uuid")}
    out: list[Finding] = []
    for g in gpus:
        if g.get("mig_mode") is None and g.get("uuid") is None and g.get("pci_bus_id") is None:
            continue
        prev = before.get(str(g.get("uuid")))
        out += pcie.judge(g, links, holders, norm_bdf(g.get("pci_bus_id")))
        out += clocks.judge(g, holders)
        out += nvlink.judge(g, gpus, holders, prev)
        out += memory.judge(g, holders, prev)
    return out

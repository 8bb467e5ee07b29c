"""The NVML child's GPU records as the checks beyond the seed incidents read them.

Why one accessor: fabric, persistence, lost-GPU, memory and MIG-pending checks all read the
same fields of the `nvml` fact (which the NVML child fills; NVML runs nowhere else). Reading it
in one place keeps the "NVML could not look" rule the same for all of them.
"""
from __future__ import annotations

from typing import Any

from node_probe.engine import facts
from node_probe.engine.context import FactUnavailable

NVML = facts.NVML


def nvml(ctx, want_s: float = 13.0) -> tuple[dict[str, Any] | None, str | None]:
    """(the nvml fact as the NVML child's record, None) when NVML answered; (record or None,
    why not) otherwise. GPU records keep every field the child reported (fabric, processes...)."""
    try:
        inv = ctx.fact(NVML, timeout=ctx.budget(want_s))
    except FactUnavailable as exc:
        return None, f"the NVML inventory is not available ({exc})"
    nv = inv.to_dict()
    if nv.get("status") != "ok":
        return nv, f"NVML status is {nv.get('status')!r}"
    return nv, None


def nvml_or_skip(ctx, want_s: float = 13.0) -> dict[str, Any]:
    """The nvml fact as the NVML child's record; ends the calling check as `skipped` with the
    reason when NVML could not look."""
    nv, why = nvml(ctx, want_s)
    if why is not None:
        ctx.skip(why)
    return nv


def gpu_subject(g: dict[str, Any]) -> str:
    return str(g.get("uuid") or g.get("pci_bus_id") or f"gpu{g.get('index')}")


def norm_bus_id(bus_id: str | None) -> str | None:
    """PCI bus ids compared across NVML (`00000000:3B:00.0`) and procfs (`0000:3b:00.0`)."""
    if not bus_id:
        return None
    parts = bus_id.strip().lower().split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    if len(parts) != 3:
        return bus_id.strip().lower()
    dom, bus, devfn = parts
    try:
        dev, _, fn = devfn.partition(".")
        return f"{int(dom, 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{int(fn or '0', 16)}"
    except ValueError:
        return bus_id.strip().lower()

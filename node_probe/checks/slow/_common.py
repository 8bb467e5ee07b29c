"""What every slow-GPU judge shares: is the GPU busy, how to name it, its base evidence.

Why: "judge the link generation only while busy" and "clocks held down only under load" are one
rule, and each finding names the GPU the same way (index, bus id, UUID, the pods holding it).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence


def busy(g: Mapping[str, Any]) -> bool | None:
    """True: utilisation above 0 % (or, where NVML gives no utilisation, compute processes
    running); False: NVML said 0 %, or no process and no utilisation; None: it could not say.
    Utilisation wins over processes when both are known: a process that holds a context but
    does no work (an idle notebook) lets the GPU drop to an idle P-state, and its link to
    Gen1, exactly like an empty GPU (desktop GPUs show Gen1 with Xorg running) -- judging
    that as downtrained would be wrong."""
    util = g.get("utilization_gpu_pct")
    procs = g.get("processes")
    if isinstance(util, (int, float)) and not isinstance(util, bool):
        return util > 0
    if procs:
        return True
    if procs == []:
        return False
    return None


def subject(g: Mapping[str, Any]) -> str:
    return str(g.get("uuid") or g.get("pci_bus_id") or f"gpu{g.get('index')}")


def label(g: Mapping[str, Any]) -> str:
    """`GPU 2 (00000000:3B:00.0)`: how a finding's title names the GPU."""
    bus = g.get("pci_bus_id")
    idx = g.get("index")
    name = f"GPU {idx}" if idx is not None else "GPU"
    return f"{name} ({bus})" if bus else name


def evidence(g: Mapping[str, Any], holders: Mapping[str, Sequence[str]] | None) -> dict:
    pods = list((holders or {}).get(str(g.get("uuid")), ()))
    return {"index": g.get("index"), "uuid": g.get("uuid"), "pci_bus_id": g.get("pci_bus_id"),
            "name": g.get("name"), "pods": pods,
            "utilization_gpu_pct": g.get("utilization_gpu_pct"),
            "processes": None if g.get("processes") is None else len(g.get("processes") or ())}


def held_by(ev: Mapping[str, Any]) -> str:
    """"; held by NS/POD, ..." (the first three pods of `evidence`), or "" when none does."""
    return f"; held by {', '.join(ev['pods'][:3])}" if ev.get("pods") else ""


def num(v: Any) -> float | None:
    """A number from a record field (bools are not numbers here)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return v

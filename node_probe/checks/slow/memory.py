"""Memory health that slows a GPU or will stop it: single-bit ECC rising, pages pending
retirement. Rows pending remap are the existing gpu.row_remap_pending finding (nvml check):
this family joins it and does not say it twice.

Why: corrected (single-bit) errors cost nothing one at a time, but a fast-rising count means a
failing memory cell the driver keeps correcting, and pages waiting for retirement (pre-Ampere
GPUs; Ampere and later remap rows instead) are only retired at the next driver reload: until
then the bad page stays in use. One sample says the volatile count since the driver loaded;
"rising" needs the previous sample.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from node_probe.checks.slow import _common
from node_probe.protocol import Finding, catalog

FID = "gpu.memory_degrading"
SBE_RISING = 100      # corrected errors between two samples that count as "rising fast"
REFS = ("https://docs.nvidia.com/deploy/dynamic-page-retirement/index.html",
        "https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/")


def judge(g: Mapping[str, Any], holders: Mapping[str, Sequence[str]] | None = None,
          previous: Mapping[str, Any] | None = None) -> list[Finding]:
    if g.get("lost"):
        return []
    ecc = g.get("ecc") or {}
    sbe = _common.num(ecc.get("sbe_volatile"))
    pending = ecc.get("retired_pending") is True
    before = _common.num(((previous or {}).get("ecc") or {}).get("sbe_volatile"))
    delta = None if sbe is None or before is None else sbe - before
    rising = delta is not None and delta >= SBE_RISING
    if not (pending or rising):
        return []
    ev = _common.evidence(g, holders)
    ev.update({"sbe_volatile": sbe, "sbe_rise": delta, "dbe_volatile": ecc.get("dbe_volatile"),
               "retired_pages_pending": pending,
               "remap_pending": bool((g.get("remapped_rows") or {}).get("pending"))})
    said = []
    if pending:
        said.append("memory pages are waiting for retirement (applied at the next driver "
                    "reload)")
    if rising:
        said.append(f"corrected ECC errors rose by {delta:.0f} between two samples")
    pods = _common.held_by(ev)
    return [catalog.make(
        FID, "warning", _common.subject(g),
        f"{_common.label(g)}: {'; '.join(said)}{pods}", ev,
        "Drain the GPU's pods, then reset the GPU (nvidia-smi -r) or reboot so the pending "
        "pages are retired; if corrected errors keep rising, have the GPU replaced.", REFS)]

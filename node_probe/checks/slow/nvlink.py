"""NVLink: links down, fewer active than the GPU's peers, error counters that rise.

Why: a GPU with an NVLink down silently falls back to PCIe (or to fewer links) for
peer-to-peer traffic: all-reduce runs at a fraction of its speed, NCCL logs nothing by default
(NVIDIA/nccl#2329). Peers are the other GPUs of the same node: they were built with the same
number of links, so a GPU with fewer active links than the most any peer has is degraded.
Error counters (replay, recovery, CRC) count since the driver loaded: one sample says how many,
never whether they rise; rising needs two samples (the agent passes `previous`).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from node_probe.checks.slow import _common
from node_probe.protocol import Finding, catalog

FID = "gpu.nvlink_degraded"
COUNTERS = ("replay", "recovery", "crc_flit", "crc_data")
REFS = ("https://docs.nvidia.com/deploy/nvml-api/group__NvLink.html",
        "https://github.com/NVIDIA/nccl/issues/2329")


def active(g: Mapping[str, Any]) -> int | None:
    links = g.get("nvlink")
    if not links:
        return None
    return sum(1 for x in links if x.get("active") is True)


def totals(g: Mapping[str, Any]) -> dict[str, int]:
    out = {k: 0 for k in COUNTERS}
    for x in g.get("nvlink") or ():
        for k in COUNTERS:
            v = _common.num((x.get("errors") or {}).get(k))
            if v is not None:
                out[k] += int(v)
    return out


def judge(g: Mapping[str, Any], peers: Sequence[Mapping[str, Any]] = (),
          holders: Mapping[str, Sequence[str]] | None = None,
          previous: Mapping[str, Any] | None = None) -> list[Finding]:
    """gpu.nvlink_degraded for one GPU record against its peers (the node's other GPUs), and
    the same GPU's earlier record when there is one."""
    if g.get("lost") or not g.get("nvlink"):
        return []
    n = active(g) or 0
    most = max((active(p) or 0 for p in peers if p is not g), default=0)
    down = [x.get("link") for x in g["nvlink"] if x.get("active") is False]
    now = totals(g)
    rising = {}
    if previous is not None and previous.get("nvlink"):
        before = totals(previous)
        rising = {k: now[k] - before[k] for k in COUNTERS if now[k] > before[k]}
    ev = _common.evidence(g, holders)
    ev.update({"links_active": n, "links_reported": len(g["nvlink"]), "links_down": down,
               "peer_links_active_most": most, "error_counts": now,
               "errors_rising": rising, "samples": 2 if previous is not None else 1})
    pods = f"; held by {', '.join(ev['pods'][:3])}" if ev["pods"] else ""
    if n < most:
        return [catalog.make(
            FID, "warning", _common.subject(g),
            f"{_common.label(g)}: {n} of {most} NVLink links active (its peers have {most})"
            f"{pods}", ev,
            "Peer-to-peer traffic of this GPU falls back to fewer links or to PCIe: collective "
            "operations (NCCL all-reduce) slow down. Drain the node, reset the GPU or reboot "
            "to retrain the links; if they stay down, have the NVLink bridge/baseboard "
            "checked. `nvidia-smi nvlink -s` shows each link.", REFS)]
    if rising:
        said = ", ".join(f"{k} +{v}" for k, v in rising.items())
        return [catalog.make(
            FID, "warning", _common.subject(g),
            f"{_common.label(g)}: NVLink error counters rising between two samples ({said})"
            f"{pods}", ev,
            "Replays and recoveries retransmit data and stall the link. Watch whether it "
            "keeps rising (`nvidia-smi nvlink -e`); drain and reset the GPU, then have the "
            "NVLink hardware checked if it continues.", REFS)]
    if previous is None and any(now.values()):
        said = ", ".join(f"{k} {v}" for k, v in now.items() if v)
        return [catalog.make(
            FID, "info", _common.subject(g),
            f"{_common.label(g)}: NVLink error counters are non-zero since the driver loaded "
            f"({said}); one sample cannot say whether they are rising", ev,
            "Sample again (the agent compares its passes; or `nvidia-smi nvlink -e` twice a "
            "minute apart): counters that stay still are history, counters that rise slow the "
            "link.", REFS)]
    return []

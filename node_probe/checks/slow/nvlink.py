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
    pods = _common.held_by(ev)
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


MAX_PODS = 512


def judge_p2p(pairs: Sequence[Mapping[str, Any]], gpus: Sequence[Mapping[str, Any]],
              holders: Mapping[str, Sequence[str]] | None) -> list[Finding]:
    """gpu.nvlink_degraded for a pod holding two GPUs that NVLink connects (the NVML child
    asked only such pairs: contract d) whose NVLink P2P NVML says is not available: NCCL then
    refuses the pair ("P2P is disabled between NVLINK connected GPUs", NVIDIA/nccl#2329) or,
    with NCCL_IGNORE_DISABLED_P2P=1, sends its traffic through host memory. Judged per pod:
    one finding per pod and pair. A pair NVLink does not connect was never asked (nothing);
    a status NVML refused (None) says nothing."""
    by_uuid = {str(g.get("uuid")): g for g in gpus if g.get("uuid")}
    pods: dict[str, set[str]] = {}
    for uuid, names in (holders or {}).items():
        for p in list(names)[:MAX_PODS]:
            pods.setdefault(str(p), set()).add(str(uuid))
    out: list[Finding] = []
    for pair in pairs:
        a, b = str(pair.get("a")), str(pair.get("b"))
        status = pair.get("nvlink")
        if status in (None, "ok") or a not in by_uuid or b not in by_uuid:
            continue
        for pod in sorted(p for p, held in pods.items() if a in held and b in held):
            ga, gb = by_uuid[a], by_uuid[b]
            ev = _common.evidence(ga, holders)
            ev.update({"pod": pod, "peer_uuid": b, "peer_index": gb.get("index"),
                       "peer_pci_bus_id": gb.get("pci_bus_id"), "p2p_nvlink": status,
                       "p2p_read": pair.get("read")})
            out.append(catalog.make(
                FID, "warning", _common.subject(ga),
                f"{_common.label(ga)} and {_common.label(gb)} of pod {pod}: NVLink connects "
                f"them but NVLink P2P is not available (NVML: {status})", ev,
                "NCCL stops with \"P2P is disabled between NVLINK connected GPUs\" (or, with "
                "NCCL_IGNORE_DISABLED_P2P=1, moves this pair's traffic through host memory, "
                "far slower). `nvidia-smi topo -p2p n` shows the pair. Drain the node, reset "
                "the GPUs or reboot; if it stays, have the NVLink bridge/baseboard checked and "
                "move the pod meanwhile.", REFS))
    return out

"""The lead of a Running pod's verdict: its GPU's slow-down first, with the cause and action.

Why: on a Running pod the question is "is it slow, and why", and the node's own headline (a
persistence warning, another GPU's Xid) must not hide the answer. A slow finding leads when it
names this pod (evidence `pods`, from the kubelet's pod-resources; `pod` for placement) and
nothing critical is on the node. Every word of the headline comes from validated evidence
(numbers, `GenN xW` strings, bus ids matching their pattern), never from a finding's title,
which a node could word.
"""
from __future__ import annotations

import dataclasses
import re
import shlex
from typing import Any, Mapping, Sequence

from node_probe.protocol import Finding, Severity

from ...params import name_problem

PCIE, CLOCKS, NVLINK, MEMORY = ("gpu.pcie_downtrained", "gpu.clocks_throttled",
                                "gpu.nvlink_degraded", "gpu.memory_degrading")
NUMA, SHARED, REMAP = "pod.numa_misplaced", "gpu.time_shared", "gpu.row_remap_pending"
# which slow-down leads when a pod has several: the biggest loss first
ORDER = (PCIE, CLOCKS, NVLINK, NUMA, MEMORY, REMAP, SHARED)
_LINK = re.compile(r"Gen[1-6?] x[0-9?]{1,2}")
_SHARE = re.compile(r"1/[0-9]{1,3}|[0-9]{1,3} %")
_BUS = re.compile(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]")
_REASON = {"hw_thermal": "HW thermal slowdown", "sw_thermal": "SW thermal slowdown",
           "hw_power_brake": "HW power brake", "hw_slowdown": "HW slowdown",
           "sw_power_cap": "SW power cap"}
MAX_PODS = 64


# the fix of each slow-down when a node is the target (`node X`, `nodes`): verdict.FIXES
NODE_FIXES = {
    PCIE: "drain the node, then retrain the GPU's PCIe link: reset the GPU (nvidia-smi -r) or "
          "reboot; reseat the GPU and its riser if it comes back downtrained",
    CLOCKS: "cooling (thermal) or power (a lowered limit, the PSU) as the finding says; drain "
            "the node if it stays hot",
    NVLINK: "drain the node and reset the GPU or reboot to retrain the NVLink links; have the "
            "NVLink hardware checked if they stay down",
    MEMORY: "drain the GPU's pods and reset the GPU or reboot so pending pages are retired",
    NUMA: "move the pod to a node whose kubelet aligns CPUs and GPUs (topologyManagerPolicy "
          "single-numa-node)",
}


@dataclasses.dataclass(frozen=True)
class Lead:
    headline: str
    root_cause: str | None
    severity: str
    actions: tuple[tuple[str, str, str | None, str], ...]   # (step, text, command, risk)
    chain: tuple[str, ...] = ()


def _ev(f: Finding) -> Mapping[str, Any]:
    return f.evidence if isinstance(f.evidence, Mapping) else {}


def _num(v: Any) -> float | None:
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _pods_of(f: Finding) -> list[str]:
    ev = _ev(f)
    if f.id == NUMA:
        return [ev["pod"]] if isinstance(ev.get("pod"), str) else []
    pods = ev.get("pods")
    out = []
    for p in (pods if isinstance(pods, list) else [])[:MAX_PODS]:
        name = p.get("pod") if isinstance(p, Mapping) else p
        if isinstance(name, str):
            out.append(name)
    return out


def _gpu(ev: Mapping[str, Any]) -> str:
    idx = ev.get("index")
    bus = ev.get("pci_bus_id")
    name = f"GPU {idx}" if isinstance(idx, int) and not isinstance(idx, bool) else "its GPU"
    return f"{name} ({bus})" if isinstance(bus, str) and _BUS.fullmatch(bus) else name


def _bus(ev: Mapping[str, Any]) -> str:
    bus = ev.get("pci_bus_id")
    return bus if isinstance(bus, str) and _BUS.fullmatch(bus) else "<bus id>"


def _what(f: Finding) -> str:
    """The slow-down in numbers, from evidence only."""
    ev = _ev(f)
    if f.id == PCIE:
        link, top = ev.get("link"), ev.get("link_max")
        share = ev.get("bandwidth_share")
        if isinstance(link, str) and _LINK.fullmatch(link) and isinstance(top, str) \
                and _LINK.fullmatch(top):
            s = f"PCIe {link} of {top}"
            if isinstance(share, str) and _SHARE.fullmatch(share):
                s += f": {share} of host bandwidth"
            at = " at the bridge above it" if ev.get("at") == "bridge" else ""
            return s + f" (link downtrained{at})"
        return "PCIe link downtrained"
    if f.id == CLOCKS:
        names = [_REASON[r] for r in ev.get("reasons") or () if r in _REASON][:3]
        s = "clocks held down" + (f" by {', '.join(names)}" if names else "")
        sm, top = _num(ev.get("sm_mhz")), _num(ev.get("sm_max_mhz"))
        if sm is not None and top:
            s += f": SM {sm:.0f} of {top:.0f} MHz"
        margin = _num(ev.get("thermal_margin_c"))
        if margin is not None and ev.get("cause") == "thermal":
            s += f", {margin:.0f} C from slowdown"
        return s
    if f.id == NVLINK:
        n, most = _num(ev.get("links_active")), _num(ev.get("peer_links_active_most"))
        if n is not None and most and n < most:
            return f"{n:.0f} of {most:.0f} NVLink links active"
        return "NVLink error counters rising"
    if f.id == NUMA:
        g, c = _num(ev.get("gpu_numa_node")), ev.get("cpu_numa_nodes")
        nodes = ",".join(str(int(x)) for x in (c if isinstance(c, list) else [])[:8]
                         if _num(x) is not None)
        policy = ev.get("topology_manager_policy")
        pol = policy if isinstance(policy, str) and re.fullmatch(r"[a-z-]{1,32}", policy) \
            else "unknown"
        if g is not None:
            return (f"its CPUs on NUMA node {nodes}, its GPU on node {g:.0f} (topology "
                    f"manager policy {pol})")
        return "its CPUs on another NUMA node than its GPU"
    if f.id == MEMORY:
        return "GPU memory pages pending retirement or corrected errors rising"
    if f.id == REMAP:
        return "a memory row remapping waits for a GPU reset"
    if f.id == SHARED:
        n = len(_pods_of(f))
        return f"its GPU is shared by {n} pods (time-slicing or MPS): about 1/{n} each"
    return f.id


def _actions(f: Finding, node: str | None, pod: str, ns: str | None
             ) -> tuple[tuple[str, str, str | None, str], ...]:
    ev = _ev(f)
    q = shlex.quote
    drain = (("mitigate", f"move the workload off {node}",
              f"kubectl drain {q(node)} --ignore-daemonsets --delete-emptydir-data "
              f"--timeout=10m", "every pod on the node restarts elsewhere")
             if node else None)
    again = ("verify", "after the fix, under load",
             f"kubectl gpu-doctor pod {q(pod)}" + (f" -n {q(ns)}" if ns else ""),
             "none (read-only)")
    acts: list = []
    if f.id == PCIE:
        acts = [drain, ("fix", f"retrain the link: reset the GPU (nvidia-smi -r -i "
                               f"{_bus(ev)}) or reboot the node; if it comes back "
                               "downtrained, reseat the GPU and its riser or cable and check "
                               "the slot's BIOS link setting", None,
                        "the reset kills the GPU's processes; a reboot restarts the node's "
                        "pods")]
    elif f.id == CLOCKS:
        cause = ev.get("cause")
        if cause == "thermal":
            fix = "cooling: check the node's fans, inlet temperature and airflow"
        elif cause == "power" and ev.get("power_limit_lowered"):
            d = _num(ev.get("power_default_limit_w"))
            fix = (f"power: restore the default power limit (nvidia-smi -i {_bus(ev)} -pl "
                   f"{d:.0f}) and find what lowered it" if d else
                   "power: restore the default power limit and find what lowered it")
        elif cause == "power":
            fix = "power: check the node's PSUs and power budget (the GPU is at its limit)"
        else:
            fix = "hardware slowdown: have the node's PSU and board checked"
        acts = [drain if cause != "power" else None,
                ("fix", fix, None, "depends on the repair; the drain moved the pods")]
    elif f.id in (NVLINK, MEMORY, REMAP):
        acts = [drain, ("fix", f"reset the GPU (nvidia-smi -r -i {_bus(ev)}) or reboot the "
                               "node; have the GPU checked if it comes back", None,
                        "the reset kills the GPU's processes")]
    elif f.id == NUMA:
        acts = [("fix", "move the pod: delete it so its controller recreates it (a bare pod "
                        "must be recreated from its manifest)",
                 f"kubectl delete pod {q(pod)}" + (f" -n {q(ns)}" if ns else ""),
                 "the pod restarts"),
                ("prevent", "align CPUs and GPUs at admission: kubelet topologyManagerPolicy "
                            "single-numa-node with cpuManagerPolicy static", None,
                 "a kubelet restart; pods that cannot be aligned are rejected")]
    elif f.id == SHARED:
        acts = [("fix", "if the pod needs the whole GPU, request an unshared GPU resource",
                 None, "the pod restarts")]
    return tuple(a for a in (*acts, again) if a is not None)


def _target(target: Mapping[str, Any]) -> tuple[str | None, str | None, str | None]:
    if str(target.get("kind") or "") != "pod":
        return None, None, None
    ns, _, name = str(target.get("name") or "").rpartition("/")
    pod = name if name_problem("pod", name) is None else None
    ns = ns if ns and name_problem("namespace", ns) is None else None
    node = target.get("node")
    node = node if isinstance(node, str) and name_problem("node", node) is None else None
    return pod, ns, node


def pod_lead(findings: Sequence[Finding], target: Mapping[str, Any], phase: Any = None, *,
             looked: bool = False) -> Lead | None:
    """The lead for a Running pod (`phase`: its status.phase, as `pod` read it), or None (not a
    Running pod, something critical on the node, or nothing to say). `looked`: the run is
    complete and the node's gpu.slow check looked (the healthy answer is given only then, and
    only when NVML answered)."""
    pod, ns, node = _target(target)
    if pod is None or phase != "Running":
        return None
    if any(f.severity.rank >= Severity.CRITICAL.rank for f in findings):
        return None
    who = f"{ns}/{pod}" if ns else pod
    mine = [f for f in findings if f.id in ORDER and who in _pods_of(f)]
    # a warning about this pod that is not a slow-down (its own status) leads elsewhere
    other = [f for f in findings if f.id.startswith("pod.") and f.id != NUMA
             and f.severity.rank >= Severity.WARNING.rank]
    if other:
        return None
    if mine:
        f = sorted(mine, key=lambda x: (-x.severity.rank, ORDER.index(x.id)))[0]
        ev = _ev(f)
        slow = f.severity.rank >= Severity.WARNING.rank
        head = (f"Pod {who} runs slow: {_gpu(ev)}: {_what(f)}" if slow else
                f"Pod {who} is Running; {_what(f)}")
        rest = len({x.id for x in mine}) - 1
        if rest > 0:
            head += f" (and {rest} more slow-down{'s' if rest > 1 else ''} below)"
        return Lead(head, f.id, f.severity.value, _actions(f, node, pod, ns),
                    tuple(x.id for x in sorted(mine, key=lambda x: ORDER.index(x.id))))
    ids = {f.id for f in findings}
    unnamed = [f for f in findings if f.id in ORDER and not _pods_of(f)
               and f.severity.rank >= Severity.WARNING.rank]
    if looked and "nvml.inventory" in ids and not unnamed:
        warn = [f for f in findings if f.severity.rank >= Severity.WARNING.rank]
        head = (f"Pod {who} is Running and its GPUs are not slowed (PCIe link, clocks, "
                f"NVLink, memory and placement looked)")
        if warn:
            head += f"; node {node or '?'} has {len(warn)} other warning(s) below"
        return Lead(head, None, Severity.OK.value if not warn else Severity.INFO.value, ())
    return None

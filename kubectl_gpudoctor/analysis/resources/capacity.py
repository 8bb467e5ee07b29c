"""node.gpu_capacity_mismatch: GPUs the node has vs GPUs the scheduler may hand out.

Why: when a device plugin marks devices Unhealthy, allocatable drops below capacity and pods
stay Pending with `Insufficient nvidia.com/gpu` on a node that "has 8 GPUs"; when the plugin is
not registered at all, the GPU feature-discovery labels say 8 GPUs while the node advertises
none. Both are visible in the Node object alone, so `nodes` can flag them across a fleet.

Pure function over a raw Node dict; no I/O.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from node_probe.protocol import catalog
from node_probe.protocol import Finding

from ..common import is_gpu_resource
from ..quantity import count

GFD_COUNT_LABEL = "nvidia.com/gpu.count"
GFD_PRESENT_LABEL = "nvidia.com/gpu.present"
REF_HEALTH = "https://github.com/NVIDIA/k8s-device-plugin#health-checks"
FIX_GONE = (
    "The kubelet keeps a resource's capacity after its device plugin exits and sets allocatable "
    "to 0, so this is the plugin gone (exited, crash-looping, its socket removed), not the GPUs "
    "(a plugin that marks every device Unhealthy looks the same here; the node side tells them "
    "apart: deviceplugin.missing vs deviceplugin.unhealthy). Check the plugin pod on the node "
    "(`kubectl -n gpu-operator get pods -o wide --field-selector spec.nodeName={name}`) and its "
    "log; run `kubectl gpu-doctor node {name}`.")
FIX_SICK = (
    "The device plugin reports these devices Unhealthy (Xid errors, lost GPU, NVML failure). Run "
    "`kubectl gpu-doctor node {name}` to see gpu.xid / gpu.health / deviceplugin.unhealthy on "
    "the node, and the plugin's log for the health events. NVIDIA's plugin never marks a device "
    "Healthy again by itself: when the node side says deviceplugin.unhealthy_stale (NVML and the "
    "kernel log say the GPU is fine now), restarting the plugin re-advertises it.")
REF_DP = "https://kubernetes.io/docs/concepts/extend-kubernetes/compute-storage-net/device-plugins/"


def gpu_resources(node: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """{resource: (capacity, allocatable)} for extended GPU resources (incl. MIG slices)."""
    st = node.get("status") or {}
    cap, alloc = st.get("capacity") or {}, st.get("allocatable") or {}
    return {k: (count(cap.get(k)), count(alloc.get(k)))
            for k in sorted(set(cap) | set(alloc)) if is_gpu_resource(k)}


def is_gpu_node(node: Mapping[str, Any]) -> bool:
    labels = (node.get("metadata") or {}).get("labels") or {}
    if labels.get(GFD_PRESENT_LABEL) == "true" or count(labels.get(GFD_COUNT_LABEL)) > 0:
        return True
    return any(c > 0 or a > 0 for c, a in gpu_resources(node).values())


def analyze_node(node: Mapping[str, Any]) -> list[Finding]:
    name = (node.get("metadata") or {}).get("name", "")
    labels = (node.get("metadata") or {}).get("labels") or {}
    res = gpu_resources(node)
    gfd_count = count(labels.get(GFD_COUNT_LABEL))
    short = {k: {"capacity": c, "allocatable": a} for k, (c, a) in res.items() if a < c}
    total_cap = sum(c for c, _ in res.values())
    out: list[Finding] = []
    if gfd_count > 0 and total_cap == 0:
        out.append(catalog.make(
            "node.gpu_capacity_mismatch", "critical", f"node/{name}",
            f"the node has {gfd_count} GPU(s) by its labels but advertises no GPU resource",
            {"label_gpu_count": gfd_count, "resources": {k: {"capacity": c, "allocatable": a}
                                                         for k, (c, a) in res.items()}},
            "The device plugin is not registered with this kubelet (not running, crashing, or "
            "its socket is gone). Check `kubectl -n gpu-operator get pods -o wide "
            f"--field-selector spec.nodeName={name}` and the plugin's log; run "
            "`kubectl gpu-doctor node " + name + "` for deviceplugin.* findings.", (REF_DP,)))
    elif short:
        out.extend(_short(name, short, gfd_count))
    return out


def _short(name: str, short: dict, gfd_count: int) -> list[Finding]:
    """Capacity kept with allocatable 0 for every device of a resource is the kubelet's trace
    of a plugin that is gone (after a plugin exits the kubelet keeps the capacity and zeroes
    allocatable); allocatable lower but not 0 is the plugin reporting devices Unhealthy."""
    gone = {k: v for k, v in short.items() if v["allocatable"] == 0}
    sick = {k: v for k, v in short.items() if v["allocatable"] > 0}
    out: list[Finding] = []
    if gone:
        out.append(_finding(name, "critical", "plugin_not_registered", gone, gfd_count,
                            f"no device plugin is registered for {', '.join(gone)}: the node "
                            f"keeps the capacity but nothing is allocatable ({_pairs(gone)})",
                            FIX_GONE.format(name=name), REF_DP))
    if sick:
        lost = sum(v["capacity"] - v["allocatable"] for v in sick.values())
        out.append(_finding(name, "warning", "devices_unhealthy", sick, gfd_count,
                            f"{lost} GPU device(s) are in capacity but not allocatable "
                            f"({_pairs(sick)}): the device plugin reports them Unhealthy",
                            FIX_SICK.format(name=name), REF_HEALTH))
    return out


def _pairs(res: dict) -> str:
    return ", ".join(f"{k} {v['allocatable']}/{v['capacity']}" for k, v in res.items())


def _finding(name: str, severity: str, cause: str, resources: dict, gfd_count: int,
             title: str, fix: str, ref: str) -> Finding:
    return catalog.make("node.gpu_capacity_mismatch", severity, f"node/{name}", title,
                        {"cause": cause, "resources": resources,
                         "label_gpu_count": gfd_count or None}, fix, (ref,))


def driver_not_seen(node: Mapping[str, Any], findings: Sequence[Finding],
                    reached: str = "") -> list[Finding]:
    """probe.driver_not_seen: the node advertises GPUs (capacity of an nvidia.com/* resource,
    or GPU Feature Discovery's labels) while the node probe that ran there reported no NVIDIA
    driver library (nvml.unavailable). The probe's GPU checks could not look, so a quiet
    report would say nothing about those GPUs: a warning, never "no problem found". `reached`:
    how the probe ran (the agent pod, the debug pod), for the title."""
    # the probe's own nvml.unavailable is a warning when the kernel module is loaded: it says
    # the same thing already (one finding for one cause); info means it saw no driver at all
    nvml = [f for f in findings if f.id == "nvml.unavailable" and f.severity.value == "info"]
    if not nvml or not is_gpu_node(node):
        return []
    name = (node.get("metadata") or {}).get("name", "")
    res = {k: c for k, (c, _) in gpu_resources(node).items() if c}
    gpus = ", ".join(f"{c} {k}" for k, c in sorted(res.items())) or "GPUs (by its labels)"
    return [catalog.make(
        "probe.driver_not_seen", "warning", f"node/{name}",
        f"node {name} advertises {gpus}, but the node probe{' ' + reached if reached else ''} "
        f"found no NVIDIA driver library: its GPU checks could not look",
        {"gpu_capacity": res or None, "nvml": nvml[0].title,
         "searched": nvml[0].evidence.get("searched") if isinstance(nvml[0].evidence, Mapping)
         else None},
        "Either the driver is where the probe does not look (a driver container's root other "
        "than /run/nvidia/driver, a host root not mounted at /host) or it is gone from the node "
        "while the device plugin still advertises the GPUs (a driver upgrade in progress, a "
        "failed driver pod). On the node: `nvidia-smi`, and the GPU Operator's driver pod "
        f"(`kubectl get pods -A -o wide --field-selector spec.nodeName={name}`); then run "
        f"`kubectl gpu-doctor node {name}` again.",
        ("https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/troubleshooting.html",))]

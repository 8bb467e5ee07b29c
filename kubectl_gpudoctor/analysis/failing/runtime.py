"""Container runtime wiring from the API side: pods naming a RuntimeClass that does not exist,
sandboxes failing because the node's runtime lacks the handler, and unresolvable CDI devices.

Why: these failures show up only as kubelet events on the pod (FailedCreatePodSandBox, Failed)
with the runtime's own wording; grouping them by handler and node, and naming the RuntimeClass
objects involved, turns "ContainerCreating forever" into "node X's containerd has no nvidia
runtime". Pure functions over raw API dicts; no I/O.
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

from node_probe.protocol import Finding, catalog

from ..common import events_by_uid, pod_ref, pod_uid

HANDLER_PATTERNS = (
    re.compile(r'no runtime for "([^"]+)" is configured'),                     # containerd
    re.compile(r'failed to find runtime handler (\S+) from runtime list'),     # CRI-O
    re.compile(r'RuntimeHandler "([^"]+)" not supported'),                     # CRI-O, older
)
CDI_PATTERN = re.compile(r"unresolvable CDI devices:? ([^:\n]+?)(?::|$| \(|\")")
RUNTIME_REFS = ("https://github.com/NVIDIA/gpu-operator/issues/413",
                "https://github.com/NVIDIA/gpu-operator/issues/730",
                "https://kubernetes.io/docs/concepts/containers/runtime-class/")
CDI_REFS = ("https://github.com/NVIDIA/nvidia-container-toolkit/issues/1239",
            "https://github.com/NVIDIA/nvidia-container-toolkit/issues/146",
            "https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/cdi-support.html")
MAX_PODS = 10


def analyze(pods: Sequence[Mapping[str, Any]], events: Sequence[Mapping[str, Any]],
            runtime_classes: Sequence[Mapping[str, Any]] | None) -> list[Finding]:
    out: list[Finding] = []
    by_uid = events_by_uid(events)
    rcs = None if runtime_classes is None else {
        (rc.get("metadata") or {}).get("name"): rc for rc in runtime_classes}
    missing_handler: dict[tuple[str, str], dict] = {}
    for pod in pods:
        spec = pod.get("spec") or {}
        rc_name = spec.get("runtimeClassName")
        if rc_name and rcs is not None and rc_name not in rcs:
            out.append(catalog.make(
                "runtime.class_missing", "warning", f"pod/{pod_ref(pod)}",
                f"Pod {pod_ref(pod)} names RuntimeClass {rc_name!r}, which does not exist",
                {"pod": pod_ref(pod), "runtime_class": rc_name,
                 "runtime_classes": sorted(k for k in rcs if k)},
                "Create the RuntimeClass (the GPU Operator creates `nvidia` when its toolkit is "
                "enabled) or remove runtimeClassName from the pod spec.", RUNTIME_REFS))
        node = spec.get("nodeName") or "?"
        for ev in by_uid.get(pod_uid(pod), ()):
            msg = str(ev.get("message") or "")
            for pat in HANDLER_PATTERNS:
                m = pat.search(msg)
                if m:
                    d = missing_handler.setdefault((node, m.group(1)), {
                        "pods": [], "all_pods": set(), "count": 0, "message": msg[:300],
                        "runtime_class": rc_name})
                    d["all_pods"].add(pod_ref(pod))
                    if pod_ref(pod) not in d["pods"] and len(d["pods"]) < MAX_PODS:
                        d["pods"].append(pod_ref(pod))
                    d["count"] += int(ev.get("count") or 1)
                    break
            m = CDI_PATTERN.search(msg)
            if m and "unresolvable CDI devices" in msg:
                devices = [d.strip() for d in m.group(1).split(",") if d.strip()]
                out.append(catalog.make(
                    "cdi.unresolvable_devices", "warning", f"pod/{pod_ref(pod)}",
                    f"The runtime on {node} cannot resolve CDI device(s) "
                    f"{', '.join(devices[:3])} for pod {pod_ref(pod)}",
                    {"pod": pod_ref(pod), "node": node, "devices": devices[:10],
                     "reason": ev.get("reason"), "message": msg[:400],
                     "count": int(ev.get("count") or 1)},
                    "No CDI spec on the node defines these devices: the spec was not generated, "
                    "is stale (driver upgrade, MIG change), lives in a directory the runtime does "
                    "not read, or names devices differently (UUID vs index). Regenerate it on the "
                    "node (`nvidia-ctk cdi generate`, or restart the toolkit pod) and run "
                    "`kubectl gpu-doctor node " + node + "` (cdi.spec_version_mismatch).",
                    CDI_REFS))
                break
    for (node, handler), d in missing_handler.items():
        rc = (rcs or {}).get(d["runtime_class"]) if d["runtime_class"] else None
        out.append(catalog.make(
            "runtime.handler_missing", "warning", f"node/{node}",
            f"The container runtime on {node} has no handler {handler!r}: "
            f"{len(d['all_pods'])} pod(s) cannot create their sandbox",
            {"node": node, "handler": handler, "runtime_class": d["runtime_class"],
             "runtime_class_handler": (rc or {}).get("handler"), "pods": d["pods"],
             "pod_count": len(d["all_pods"]),
             "count": d["count"], "message": d["message"]},
            f"Configure the {handler!r} runtime on {node} (`nvidia-ctk runtime configure` and "
            "restart the runtime; with the GPU Operator, the toolkit daemonset must run on the "
            f"node) or point the RuntimeClass at a handler the node has. `kubectl gpu-doctor "
            f"node {node}` shows the handlers its runtime config has.", RUNTIME_REFS))
    return out

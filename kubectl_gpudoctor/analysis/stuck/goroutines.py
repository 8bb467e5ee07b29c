"""kubelet.blocked_in_device_plugin: read the kubelet's goroutine dump for device-manager waits.

Why (seed 000): the proof that admission is wedged in a device plugin is in the kubelet's own
stacks: goroutines parked for minutes under devicemanager.(*ManagerImpl).
callGetPreferredAllocationIfAvailable -> (*endpointImpl).getPreferredAllocation -> the
v1beta1 devicePluginClient's gRPC call. The API server proxies the kubelet's pprof endpoint
(`/api/v1/nodes/X/proxy/debug/pprof/goroutine?debug=2`), so this works from a laptop even when
no pod can start on the node. `/healthz?verbose` adds `[-]syncloop failed` once the sync loop
has been stuck for minutes.

Pure functions over the dump text; no I/O.
"""
from __future__ import annotations

import datetime as dt
from typing import Any, Mapping, Sequence

from node_probe.protocol import catalog
from node_probe.protocol import Finding

from ..common import fmt_duration, gpu_requests, pod_ref
from .admission import REFS, untouched_pending
from .goroutine_dump import Goroutine, func_name, parse_dump  # noqa: F401  (parse_dump, func_name: API)


# Frames that mean "inside the device manager / a device plugin call". Matched as substrings of
# the function line, so vendored paths and receiver spellings all match.
DEVICE_FRAMES = (
    "devicemanager.(*ManagerImpl).callGetPreferredAllocationIfAvailable",
    "devicemanager.(*ManagerImpl).devicesToAllocate",
    "devicemanager.(*ManagerImpl).allocateContainerResources",
    "devicemanager.(*ManagerImpl).Allocate",
    "devicemanager.(*endpointImpl).getPreferredAllocation",
    "devicemanager.(*endpointImpl).allocate",
    "devicemanager.(*endpointImpl).preStartContainer",
    "deviceplugin/v1beta1.(*devicePluginClient).GetPreferredAllocation",
    "deviceplugin/v1beta1.(*devicePluginClient).Allocate",
    "deviceplugin/v1beta1.(*devicePluginClient).PreStartContainer",
)
SYNC_LOOP_FRAMES = ("(*Kubelet).syncLoop",)  # also matches syncLoopIteration
# A healthy admission's plugin call takes milliseconds: a sync loop seen in one while a pod
# has waited this long for admission is stuck, not caught mid-call.
SNAPSHOT_GRACE_S = 10.0


def device_plugin_waits(goroutines: Sequence[Goroutine]) -> list[Goroutine]:
    return [g for g in goroutines if g.has(DEVICE_FRAMES)]


def parse_healthz(text: str) -> dict[str, Any]:
    """`/healthz?verbose`: [+]name ok / [-]name failed: reason ..."""
    ok, failed = [], []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("[+]"):
            ok.append(line[3:].split(" ")[0])
        elif line.startswith("[-]"):
            failed.append(line[3:].split(" ")[0])
    return {"ok": ok, "failed": failed,
            "passed": "healthz check passed" in text and not failed}


def admitting_pods(pods: Sequence[Mapping[str, Any]] | None, now: dt.datetime | None
                   ) -> list[dict]:
    """Pods bound to the node that the kubelet has not touched, oldest first, with their GPU
    requests. The kubelet admits pods in creation order, so the oldest one asking for a
    device-plugin resource is the one whose admission sits in the plugin call: its request
    names the plugin's resource (the goroutine dump's arguments are only addresses)."""
    if not pods or now is None:
        return []
    out = []
    for p in pods:
        waited = untouched_pending(p, (), now)
        if waited is None:
            continue
        out.append({"pod": pod_ref(p), "waiting_s": round(waited),
                    "gpu": gpu_requests(p) or None,
                    "_created": str((p.get("metadata") or {}).get("creationTimestamp") or "")})
    out.sort(key=lambda x: (x["_created"], x["pod"]))
    for x in out:
        del x["_created"]
    return out


def analyze(node_name: str, dump_text: str,
            healthz: Mapping[str, Any] | None = None,
            pods: Sequence[Mapping[str, Any]] | None = None,
            now: dt.datetime | None = None) -> list[Finding]:
    """`pods` (the pods bound to the node) and `now` name the resource being admitted and
    tell a sync loop caught mid-call (a healthy admission takes milliseconds) from one that
    is stuck: with them, a sync loop in a plugin call is critical as soon as a pod has waited
    SNAPSHOT_GRACE_S for it, long before the stall threshold."""
    goroutines = parse_dump(dump_text)
    from ..scheduling.dra import analyze_goroutines as dra_waits  # the DRA form of the same wedge
    dra = dra_waits(node_name, goroutines)
    waits = device_plugin_waits(goroutines)
    if not waits:
        return dra
    longest = max((g.wait_minutes or 0) for g in waits)
    by_call: dict[str, int] = {}
    for g in waits:
        by_call[g.call] = by_call.get(g.call, 0) + 1
    in_sync_loop = sum(1 for g in waits if g.has(SYNC_LOOP_FRAMES))
    waiting = admitting_pods(pods, now)
    gpu_waiting = [p for p in waiting if p["gpu"]]
    admitting = gpu_waiting[0] if gpu_waiting else None
    resources = sorted(admitting["gpu"]) if admitting else []
    evidence: dict[str, Any] = {
        "goroutines": len(waits),
        "longest_wait_min": longest,
        "calls": by_call,
        "in_sync_loop": in_sync_loop,
        "total_goroutines": len(goroutines),
        "examples": [{"goroutine": g.id, "state": g.state, "wait_min": g.wait_minutes,
                      "top": [func_name(f) for f in g.frames if "devicemanager" in f
                              or "deviceplugin" in f][:3]} for g in waits[:3]],
    }
    if pods is not None:
        evidence["resource"] = resources or None
        evidence["admitting_pod"] = admitting["pod"] if admitting else None
        evidence["pods_waiting"] = waiting[:10]
    if healthz is not None:
        evidence["healthz_failed"] = list(healthz.get("failed") or ())
    calls = ", ".join(f"{n} in {c}" for c, n in sorted(by_call.items()))
    # A sync loop parked in a plugin call blocks every admission behind it: critical at once,
    # unless the pod list shows nobody waiting yet (a dump taken during a normal, quick call).
    corroborated = pods is None or any(p["waiting_s"] >= SNAPSHOT_GRACE_S for p in waiting)
    if longest >= 1 or (in_sync_loop and corroborated):
        severity = "critical"
        title = (f"{len(waits)} kubelet goroutine(s) wait in device plugin calls ({calls})"
                 + (f", the longest for {fmt_duration(longest * 60)}" if longest >= 1 else ""))
    elif in_sync_loop:
        severity = "warning"
        title = (f"the kubelet's pod sync loop is inside a device plugin call ({calls}) "
                 f"right now, though no pod has waited {SNAPSHOT_GRACE_S:.0f}s for it yet")
    else:
        severity = "info"
        title = f"{len(waits)} kubelet goroutine(s) in device plugin calls ({calls}) right now"
    if resources:
        title += (f", for {', '.join(resources)} (admitting pod {admitting['pod']}, "
                  f"waiting {fmt_duration(admitting['waiting_s'])})")
    if in_sync_loop and severity == "critical":
        title += "; the pod sync loop is among them, so no pod on this node can be admitted"
    plugin = (f"the plugin serving {', '.join(resources)}" if resources
              else "the device plugin")
    remediation = (
        f"kubelet calls the device plugin without a timeout, so {plugin} hanging (typically "
        "in nvmlInit) wedges pod admission for every pod on the node, GPU or not. Find out why "
        "it hangs: run `kubectl gpu-doctor local` on the node (deviceplugin.blocked_in_nvml, "
        "nvml.init_hang, driver.known_bad). Restarting the plugin pod releases the waiting "
        "goroutines until the next call hangs.")
    return [catalog.make("kubelet.blocked_in_device_plugin", severity, f"node/{node_name}",
                         title, evidence, remediation, REFS)] + dra


def unavailable(node_name: str, status: int | None, message: str,
                healthz: Mapping[str, Any] | None = None) -> Finding:
    """kubelet.goroutines_unavailable: say what would have made the dump readable.

    The kubelet's own health checks (when readable) still say whether its sync loop is
    stuck, so they ride along in the evidence and the title."""
    if status == 403:
        why = "forbidden by RBAC"
        fix = ("Grant `get` on the `nodes/proxy` subresource (ClusterRole rule: apiGroups [\"\"], "
               "resources [\"nodes/proxy\"], verbs [\"get\"]) to read the kubelet's goroutine "
               "dump, /configz and /healthz through the API server (`kubectl gpu-doctor rbac "
               "nodes-proxy` prints that ClusterRole and its binding). nodes/proxy is powerful "
               "(it reaches the kubelet API); grant it to on-call humans, not to workloads.")
    elif status in (404, 501):
        why = "the kubelet does not serve it (debugging or profiling handlers disabled)"
        fix = ("The kubelet serves /debug/pprof only with enableDebuggingHandlers: true and "
               "enableProfilingHandler: true (defaults). Without it, use "
               "`kubectl gpu-doctor local` on the node.")
    else:
        why = f"the kubelet did not answer ({status or 'no status'})"
        fix = "Retry, or run `kubectl gpu-doctor local` on the node."
    failed = list((healthz or {}).get("failed") or ())
    title = f"kubelet goroutine dump not readable: {why}"
    if "syncloop" in failed:
        title += "; the kubelet's /healthz?verbose reports [-]syncloop failed (its pod sync " \
                 "loop is stuck)"
    evidence: dict[str, Any] = {
        "status": status, "message": message[:300],
        "path": f"/api/v1/nodes/{node_name}/proxy/debug/pprof/goroutine?debug=2",
        "needs": "get nodes/proxy"}
    if healthz is not None:
        evidence["healthz_failed"] = failed
    return catalog.make(
        "kubelet.goroutines_unavailable", "info", f"node/{node_name}", title, evidence,
        fix, ("https://kubernetes.io/docs/reference/access-authn-authz/kubelet-authn-authz/",))

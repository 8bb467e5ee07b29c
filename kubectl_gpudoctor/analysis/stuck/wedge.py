"""A wedged kubelet, decided from the API side: skip the doomed debug pod, name the likely cause.

Why (seed 000, and a real 1.35 kubelet wedged in nvmlInit): once the goroutine dump shows the
pod sync loop parked in a device-plugin call (or pods have waited past the stall threshold),
a debug pod on that node can only sit Pending beside the others; creating it costs the
on-call engineer the start timeout and leaves one more stuck pod. The API side already knows
enough to say so, which resource's plugin the admission waits in (the Pending GPU pod's
request), and, on GPU Operator nodes, which driver runs there (GPU Feature Discovery labels):
when that driver is in the known-bad table and the node meets its trigger, that is the likely
root cause, with the labels as evidence (the node side confirms it when it can run).

Pure functions over findings and raw API dicts; no I/O. The caller (diagnose) asks `decide()`
before creating the pod; a standing agent, when one runs on the node, is a way in that needs
no new pod and is offered first.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from node_probe.protocol import Finding, catalog, known_drivers

from ..common import pod_ref
from ..resources.capacity import gpu_resources

# GPU Feature Discovery labels (NVIDIA GPU Operator / k8s-device-plugin's gpu-feature-discovery)
DRIVER_MAJOR = "nvidia.com/cuda.driver.major"
DRIVER_MINOR = "nvidia.com/cuda.driver.minor"
DRIVER_REV = "nvidia.com/cuda.driver.rev"
DRIVER_FULL = "nvidia.com/cuda.driver-version.full"   # newer GFD releases
MIG_STRATEGY = "nvidia.com/mig.strategy"
MIG_CAPABLE = "nvidia.com/mig.capable"
GPU_PRODUCT = "nvidia.com/gpu.product"
GFD_LABELS = (DRIVER_MAJOR, DRIVER_MINOR, DRIVER_REV, DRIVER_FULL, MIG_STRATEGY, MIG_CAPABLE,
              GPU_PRODUCT, "nvidia.com/gpu.count")
FORCE_FLAG = "--force-pod"


@dataclasses.dataclass(frozen=True)
class Decision:
    """Whether to create the debug pod on a node, and why."""
    create_pod: bool
    blocked: bool                      # the API side says the kubelet admits no pod
    reason: str
    caused_by: tuple[str, ...] = ()    # finding ids that say so
    ways_in: tuple[str, ...] = ()      # ways to run the node side without a new pod
    forced: bool = False


def blocking_findings(findings: Sequence[Finding], node_name: str) -> list[Finding]:
    """API-side findings about `node_name` that mean its kubelet admits no new pod:
    the sync loop parked in a device-plugin call, pods untouched past the stall threshold on a
    Ready node, or the kubelet's own `[-]syncloop failed`."""
    subject = f"node/{node_name}"
    out = []
    for f in findings:
        if f.subject != subject:
            continue
        ev = f.evidence or {}
        if "syncloop" in (ev.get("healthz_failed") or ()):
            out.append(f)   # the kubelet itself says its sync loop is stuck (any severity)
        elif f.severity.value != "critical":
            continue
        elif f.id == "kubelet.blocked_in_device_plugin" and ev.get("in_sync_loop"):
            out.append(f)
        elif f.id == "kubelet.admission_stalled":
            out.append(f)
    return out


def ways_in(node_name: str, pods: Sequence[Mapping[str, Any]] = (),
            agent: str | None = None) -> list[str]:
    """Ways to run the node side on a node that admits no new pod, best first: exec through
    a standing agent already running there, SSH + `local`, exec into privileged pods already
    running (the device plugin's own pod first: it sees what the plugin sees)."""
    out = []
    if agent:
        out.append(f"the standing agent {agent} (exec into a pod that is already running)")
    out.append(f"ssh {node_name} and run `kubectl-gpu_doctor local` (or `python3 -m node_probe`)")
    return out + exec_ways(pods)


def exec_ways(pods: Sequence[Mapping[str, Any]]) -> list[str]:
    """`kubectl exec` into up to three Running pods on the node that see what the probe needs:
    the device plugin's own pod first, then privileged / hostPID pods."""
    out = []
    scored = []
    for p in pods:
        spec, st = p.get("spec") or {}, p.get("status") or {}
        if st.get("phase") != "Running" or (p.get("metadata") or {}).get("deletionTimestamp"):
            continue
        name = (p.get("metadata") or {}).get("name", "")
        plugin = "device-plugin" in name or "vgpu-device" in name
        priv = spec.get("hostPID") or any(
            (c.get("securityContext") or {}).get("privileged")
            for c in spec.get("containers") or ())
        if plugin or priv:
            scored.append((0 if plugin else 1, pod_ref(p)))
    for _, ref in sorted(scored)[:3]:
        ns, pname = ref.split("/", 1)
        out.append(f"kubectl -n {ns} exec -it {pname} -- sh  (already running on the node)")
    return out


def decide(node_name: str, findings: Sequence[Finding], pods: Sequence[Mapping[str, Any]] = (),
           *, force: bool = False, agent: str | None = None) -> Decision:
    """Create the debug pod only when it can start, or when asked to anyway (`--force-pod`)."""
    blocking = blocking_findings(findings, node_name)
    caused_by = tuple(sorted({f.id for f in blocking}))
    if not blocking:
        return Decision(True, False, "the API side shows nothing that would keep the pod from "
                                     "starting")
    ways = tuple(ways_in(node_name, pods, agent))
    if force:
        return Decision(True, True, f"{FORCE_FLAG} given: creating the debug pod although the "
                        f"kubelet admits no pod ({', '.join(caused_by)})", caused_by, ways,
                        forced=True)
    return Decision(False, True, f"the kubelet on {node_name} admits no pod "
                    f"({', '.join(caused_by)}): a debug pod would stay Pending like the others",
                    caused_by, ways)


def not_created_finding(node_name: str, decision: Decision) -> Finding:
    """probe.pod_not_started for the pod we chose not to create: the report says why and
    which ways in exist."""
    return catalog.make(
        "probe.pod_not_started", "warning", f"node/{node_name}",
        f"the debug pod was not created on {node_name}: {decision.reason}",
        {"created": False, "caused_by": list(decision.caused_by) or None,
         "ways_in": list(decision.ways_in), "override": FORCE_FLAG},
        "The node-side checks need a way onto the node that does not go through pod "
        "admission: " + "; ".join(decision.ways_in) + f". To try a debug pod anyway, pass "
        f"{FORCE_FLAG}.",
        ("https://kubernetes.io/docs/tasks/debug/debug-application/debug-pods/",))


# -- the likely root cause from node labels ------------------------------------------------

def driver_version(labels: Mapping[str, str]) -> str | None:
    """The NVIDIA driver version GFD labelled the node with (570.158.01), or None."""
    full = str(labels.get(DRIVER_FULL) or "").strip()
    if full:
        return full
    parts = [str(labels.get(k) or "").strip() for k in (DRIVER_MAJOR, DRIVER_MINOR, DRIVER_REV)]
    if not parts[0] or not parts[1]:
        return None
    return ".".join(p for p in parts if p)


def mig_mixed(node: Mapping[str, Any]) -> bool | None:
    """Does the node mix MIG slices with full GPUs? From the resources it advertises (full
    `nvidia.com/gpu` beside `nvidia.com/mig-*` is exactly that layout under the `mixed`
    strategy) and the GFD MIG labels; None when they cannot tell."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    res = gpu_resources(node)
    full = res.get("nvidia.com/gpu", (0, 0))[0] > 0
    mig = any(k.startswith("nvidia.com/mig-") and c > 0 for k, (c, _) in res.items())
    if full and mig:
        return True
    if labels.get(MIG_CAPABLE) == "false" or labels.get(MIG_STRATEGY) in ("none", "single"):
        return False
    if (full or mig) and labels.get(MIG_STRATEGY) == "mixed":
        return False       # the plugin advertises only one kind: not mixed right now
    return None


def known_bad_driver(node: Mapping[str, Any], findings: Sequence[Finding] = ()) -> list[Finding]:
    """driver.known_bad from GFD labels, as the LIKELY cause (no node access needed).

    Critical when the node meets the trigger (or it is unknown) and the API side already
    sees the symptom (admission blocked in the plugin); warning when the trigger is met and
    nothing is wedged yet; nothing when the trigger is absent (a healthy node stays quiet)."""
    md = node.get("metadata") or {}
    name = md.get("name", "")
    labels = md.get("labels") or {}
    version = driver_version(labels)
    matches = known_drivers.match(version)
    if not matches:
        return []
    blocking = blocking_findings(findings, name)
    resource = next((f.evidence.get("resource") for f in blocking
                     if f.evidence.get("resource")), None)
    mixed = mig_mixed(node)
    out = []
    for m in matches:
        issue = m.issue
        met = mixed if issue.condition == "mig_mixed" else None
        if met is False:
            continue
        if blocking:
            severity = "critical"
        elif met:
            severity = "warning"
        else:
            continue
        seen = ("; the API side sees its symptom: " + ", ".join(sorted({f.id for f in blocking}))
                + (f" (admission waits in the plugin for {', '.join(resource)})"
                   if resource else "")) if blocking else ""
        title = (f"likely root cause: NVIDIA driver {m.driver_version} (GPU Feature Discovery "
                 f"labels) is known to fail with {issue.condition_text} "
                 f"({issue.symptom.split(';')[0]})"
                 + ("; this node has that layout" if met else
                    "; whether this node has that layout is not visible from the API")
                 + seen)
        evidence = {
            "driver_version": m.driver_version, "source": "node labels (GPU Feature Discovery)",
            "confirmed_on_node": False,
            "labels": {k: labels[k] for k in GFD_LABELS if k in labels},
            "trigger": issue.condition_text, "trigger_present": met,
            "gpu_resources": {k: c for k, (c, _) in gpu_resources(node).items()},
            "symptom": issue.symptom, "fixed_in": list(issue.fixed_in),
            "caused": sorted({f.id for f in blocking}) or None,
            "resource": resource,
        }
        out.append(catalog.make(
            "driver.known_bad", severity, f"node/{name}", title, evidence,
            f"Likely, not yet confirmed on the node ({FORCE_FLAG} or `local` over SSH runs the "
            f"node side, which checks the plugin thread in nvmlInit). Fix: {issue.workaround}.",
            issue.refs))
    return out

"""kubelet.admission_stalled: pods the kubelet never touches while the node looks healthy.

Why (seed 000): kubelet admits pods one at a time in its sync loop and calls the device
plugin's GetPreferredAllocation with no timeout. When that call hangs, every pod bound to the
node afterwards (GPU or not) sits Pending with only the scheduler's `Scheduled` event, deleted
pods stay Terminating, yet the node stays Ready and its Lease keeps renewing (the heartbeat runs
in another goroutine). Nothing in `kubectl get nodes` is red. This analysis spots exactly that
pattern from plain API objects, so it works even when no pod can start on the node.

Pure function over raw API dicts; no I/O.
"""
from __future__ import annotations

import datetime as dt
from typing import Any, Iterable, Mapping, Sequence

from node_probe.protocol import catalog
from node_probe.protocol import Finding

from ..common import (age_s, events_by_uid, fmt_duration, gpu_requests, is_scheduler_event,
                      node_is_ready, pod_ref, pod_uid)

DEFAULT_THRESHOLD_S = 120.0
REFS = (
    "https://github.com/kubernetes/kubernetes/issues/117435",
    "https://github.com/kubernetes/kubernetes/issues/130855",
    "https://github.com/NVIDIA/gpu-operator/issues/1361",
)


def lease_renew_age_s(lease: Mapping[str, Any] | None, now: dt.datetime) -> float | None:
    if not lease:
        return None
    return age_s((lease.get("spec") or {}).get("renewTime"), now)


def lease_is_renewing(lease: Mapping[str, Any] | None, now: dt.datetime) -> bool | None:
    """True if the node Lease was renewed within its duration (default 40 s)."""
    age = lease_renew_age_s(lease, now)
    if age is None:
        return None
    duration = float((lease.get("spec") or {}).get("leaseDurationSeconds") or 40)
    return age <= duration


def untouched_pending(pod: Mapping[str, Any], pod_events: Sequence[Mapping[str, Any]],
                      now: dt.datetime) -> float | None:
    """Seconds a bound pod has waited with no kubelet action, or None if kubelet acted."""
    md = pod.get("metadata") or {}
    status = pod.get("status") or {}
    if md.get("deletionTimestamp") or status.get("phase") not in (None, "Pending"):
        return None
    if status.get("containerStatuses") or status.get("initContainerStatuses") \
            or status.get("ephemeralContainerStatuses"):
        return None
    conditions = status.get("conditions") or ()
    if any(c.get("type") != "PodScheduled" for c in conditions):
        return None  # kubelet wrote Initialized/Ready/...: it has seen the pod
    if status.get("startTime") or status.get("hostIP"):
        return None  # kubelet's status manager has written status for this pod
    if any(not is_scheduler_event(ev) for ev in pod_events):
        return None  # any kubelet (or other) event means the pod got past admission's wall
    since = None
    for c in conditions:
        if c.get("type") == "PodScheduled" and c.get("status") == "True":
            since = age_s(c.get("lastTransitionTime"), now)
    if since is None:
        sched = [ev for ev in pod_events if ev.get("reason") == "Scheduled"]
        for ev in sched:
            since = age_s(ev.get("lastTimestamp") or ev.get("eventTime")
                          or ev.get("firstTimestamp"), now)
    if since is None:
        since = age_s(md.get("creationTimestamp"), now)
    return since


def overdue_terminating(pod: Mapping[str, Any], now: dt.datetime) -> float | None:
    """Seconds past the pod's deletion deadline, or None if it is not (yet) overdue.

    The API server sets metadata.deletionTimestamp to the time of the delete request PLUS the
    grace period, so the grace period is already inside it.
    """
    md = pod.get("metadata") or {}
    if not md.get("deletionTimestamp"):
        return None
    if md.get("finalizers"):
        return None  # a finalizer holds it, not the kubelet
    overdue = age_s(md.get("deletionTimestamp"), now)
    return overdue


def stalled_nodes(pods: Iterable[Mapping[str, Any]], now: dt.datetime,
                  threshold_s: float = DEFAULT_THRESHOLD_S) -> dict[str, str]:
    """Nodes whose kubelet admits nothing, judged from pod status alone (no events needed):
    node name -> why, for every node with a bound pod untouched for `threshold_s` or more.
    One pass over the pods (the fit's list of bound, unfinished pods)."""
    waits: dict[str, list[float]] = {}
    for p in pods:
        node = (p.get("spec") or {}).get("nodeName")
        if not node or (p.get("status") or {}).get("phase") not in (None, "Pending"):
            continue
        waited = untouched_pending(p, (), now)
        if waited is not None and waited >= threshold_s:
            waits.setdefault(node, []).append(waited)
    return {n: f"{len(w)} pod(s) bound to it untouched by its kubelet for up to "
               f"{fmt_duration(max(w))}" for n, w in waits.items()}


def analyze_node(node: Mapping[str, Any], pods_on_node: Sequence[Mapping[str, Any]],
                 events: Sequence[Mapping[str, Any]] | Mapping[str, Sequence] | None,
                 lease: Mapping[str, Any] | None, now: dt.datetime,
                 threshold_s: float = DEFAULT_THRESHOLD_S,
                 events_known: bool = True) -> list[Finding]:
    """`events` is a list of events or an index {pod uid: [events]} (from events_by_uid)."""
    name = (node.get("metadata") or {}).get("name", "")
    index = events if isinstance(events, Mapping) else events_by_uid(events or ())
    pending, terminating = [], []
    for pod in pods_on_node:
        if (pod.get("status") or {}).get("phase") not in (None, "Pending") \
                and not (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue  # neither untouched (kubelet set a phase) nor Terminating: most pods
        ev = index.get(pod_uid(pod), ())
        waited = untouched_pending(pod, ev, now)
        if waited is not None and waited >= threshold_s:
            pending.append({"pod": pod_ref(pod), "waiting_s": round(waited),
                            "gpu": gpu_requests(pod) or None,
                            "events": sorted({e.get("reason", "") for e in ev}) or []})
            continue
        overdue = overdue_terminating(pod, now)
        if overdue is not None and overdue >= threshold_s:
            terminating.append({"pod": pod_ref(pod), "overdue_s": round(overdue),
                                "gpu": gpu_requests(pod) or None})
    if not pending and not terminating:
        return []
    ready = node_is_ready(node)
    renewing = lease_is_renewing(lease, now)
    renew_age = lease_renew_age_s(lease, now)
    pending.sort(key=lambda p: -p["waiting_s"])
    terminating.sort(key=lambda p: -p["overdue_s"])
    oldest = max([p["waiting_s"] for p in pending] + [p["overdue_s"] for p in terminating])
    non_gpu = sum(1 for p in pending + terminating if not p["gpu"])
    evidence: dict[str, Any] = {
        "pending_untouched": len(pending),
        "terminating_overdue": len(terminating),
        "oldest_wait_s": oldest,
        "threshold_s": threshold_s,
        "non_gpu_pods_affected": non_gpu,
        "node_ready": ready,
        "lease_renew_age_s": None if renew_age is None else round(renew_age, 1),
        "lease_renewing": renewing,
        "pods": (pending + terminating)[:20],
    }
    if not events_known:
        evidence["events"] = "not readable (RBAC); judged from pod status only"
    parts = []
    if pending:
        parts.append(f"{len(pending)} pod(s) bound to the node have had no kubelet action for "
                     f"up to {fmt_duration(max(p['waiting_s'] for p in pending))} "
                     f"(only the scheduler's event)")
    if terminating:
        parts.append(f"{len(terminating)} pod(s) stuck Terminating up to "
                     f"{fmt_duration(max(p['overdue_s'] for p in terminating))} past their "
                     f"deletion deadline")
    if ready is not False and renewing is not False:
        severity = "critical"
        title = ("kubelet admission is stalled: " + "; ".join(parts)
                 + ", while the node is Ready" + (" and its Lease renews" if renewing else ""))
        remediation = (
            "The kubelet's pod sync loop is blocked, most often inside a device plugin call "
            "(GetPreferredAllocation/Allocate has no timeout in kubelet). Confirm with the "
            "goroutine dump (kubelet.blocked_in_device_plugin) or on the node with "
            "`kubectl gpu-doctor local` over SSH. Restarting the device plugin or kubelet only "
            "helps until the next pod; fix the cause (e.g. NVIDIA driver 570.124.06-570.158.01 "
            "hangs in nvmlInit on nodes mixing MIG and full GPUs: upgrade to 570.172.08+). "
            "To stop the bleeding: `kubectl cordon " + name + "` (risk: none for running pods).")
    else:
        severity = "warning"
        title = ("; ".join(parts) + "; the node is "
                 + ("NotReady" if ready is False else "not renewing its Lease")
                 + ", so the kubelet itself is down or cut off")
        remediation = (f"Check the kubelet on {name}: `systemctl status kubelet`, "
                       "`journalctl -u kubelet --since -15m`.")
    return [catalog.make("kubelet.admission_stalled", severity, f"node/{name}", title,
                         evidence, remediation, REFS)]


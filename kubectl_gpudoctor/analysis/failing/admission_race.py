"""Which admission race rejected a GPU pod with UnexpectedAdmissionError, what clears it, and
whether anything recreates the pod.

Why: after a kubelet restart or a node reboot the kubelet re-admits every pod bound to the node,
and the device plugin has to register again first; until it has, and while its device
checkpoint disagrees with what the plugin reports, the device manager refuses GPU pods
(kubernetes/kubernetes #117955, #124345, #125579, #130145, #133382, #97131). The kubelet wraps
the device manager's error as `Allocate failed due to <err>, which is unexpected`
(pkg/kubelet/cm/admission/errors.go) and the errors are, verbatim, from
pkg/kubelet/cm/devicemanager/manager.go (devicesToAllocate):

- `cannot allocate unregistered device <resource>`: no plugin registered for the resource yet
- `no healthy devices present; cannot allocate unhealthy devices <resource>`: registered, but
  no device reported healthy (restored from the checkpoint before ListAndWatch, or all sick)
- `previously allocated devices are no longer healthy; cannot allocate unhealthy devices
  <resource>`: the checkpoint gave this container devices the plugin no longer reports healthy
- `requested number of devices unavailable for <resource>. Requested: N, Available: M`: the
  kubelet's own count of free devices is lower than the scheduler's

A pod rejected at admission is Failed for good: the kubelet never retries it, so whether its
controller recreates it decides whether the workload heals by itself.

Pure functions over raw API dicts; no I/O.
"""
from __future__ import annotations

import datetime as dt
import re
from typing import Any, Mapping, Sequence

from ..common import event_source, event_time, parse_time
from ..quantity import count

RACE_WINDOW_S = 600.0     # a rejection this soon after the kubelet started is part of its start
REFS = tuple(f"https://github.com/kubernetes/kubernetes/issues/{n}"
             for n in (117955, 124345, 125579, 130145, 133382, 97131))

_ERRORS = (
    ("plugin_not_registered", re.compile(r"cannot allocate unregistered device (\S+)")),
    ("no_healthy_devices",
     re.compile(r"no healthy devices present; cannot allocate unhealthy devices (\S+)")),
    ("checkpoint_disagrees", re.compile(r"previously allocated devices are no longer healthy; "
                                        r"cannot allocate unhealthy devices (\S+)")),
    ("devices_unavailable", re.compile(r"requested number of devices unavailable for (\S+?)\. "
                                       r"Requested: ([0-9]{1,6}), Available: ([0-9]{1,6})")),
)


def device_error(text: str) -> dict | None:
    """The device manager's error inside a rejection message, parsed."""
    for kind, rx in _ERRORS:
        m = rx.search(text[:4096])
        if m:
            out = {"kind": kind, "resource": m.group(1).rstrip(",.")}
            if kind == "devices_unavailable":
                out.update(requested=int(m.group(2)), available=int(m.group(3)))
            return out
    return None


def _owner(pod: Mapping[str, Any]) -> dict | None:
    refs = (pod.get("metadata") or {}).get("ownerReferences") or ()
    ref = next((r for r in refs if r.get("controller")), None) or (refs[0] if refs else None)
    return {"kind": ref.get("kind"), "name": ref.get("name")} if ref else None


RECREATE = {
    "ReplicaSet": (True, "its ReplicaSet has already created a replacement pod (a Failed pod "
                         "does not count as a replica); this Failed pod stays as a tombstone "
                         "until it is deleted"),
    "StatefulSet": (True, "the StatefulSet controller deletes the failed pod and recreates it "
                          "with the same name"),
    "DaemonSet": (True, "the DaemonSet controller deletes the failed pod and creates a new one"),
    "Job": (True, "the Job counts it as a failed attempt (towards backoffLimit) and creates a "
                  "new pod while attempts remain"),
}


def recreation(pod: Mapping[str, Any]) -> dict:
    owner = _owner(pod)
    if owner is None:
        return {"controller": None, "recreated": False,
                "how": "a bare pod with no controller: nothing recreates it; create it again "
                       "once the node is fixed"}
    known = RECREATE.get(str(owner["kind"]))
    if known:
        return {"controller": owner, "recreated": known[0], "how": known[1]}
    return {"controller": owner, "recreated": None,
            "how": f"owned by {owner['kind']} {owner['name']}: whether it recreates the pod is "
                   "up to that controller"}


def _last(times: Sequence[dt.datetime], before: dt.datetime | None) -> dt.datetime | None:
    ok = [t for t in times if before is None or t <= before + dt.timedelta(seconds=5)]
    return max(ok) if ok else None


def _plugin_started(node_pods: Sequence[Mapping[str, Any]]) -> dt.datetime | None:
    """When the GPU device plugin container on the node last started (it registers with the
    kubelet right after)."""
    out = []
    for p in node_pods:
        name = str((p.get("metadata") or {}).get("name") or "")
        if "device-plugin" not in name or "mps" in name:
            continue
        for cs in (p.get("status") or {}).get("containerStatuses") or ():
            t = parse_time(((cs.get("state") or {}).get("running") or {}).get("startedAt"))
            if t is not None:
                out.append(t)
    return max(out) if out else None


MAX_PEERS = 5000  # pods of the node looked at for the same rejection


def _rejected_at(pod: Mapping[str, Any]) -> dt.datetime | None:
    st = pod.get("status") or {}
    times = [parse_time(c.get("lastTransitionTime")) for c in st.get("conditions") or ()
             if isinstance(c, Mapping)]
    times = [t for t in times if t] or [parse_time(st.get("startTime")), parse_time(
        (pod.get("metadata") or {}).get("creationTimestamp"))]
    return max((t for t in times if t), default=None)


def _rejected_the_same_way(pod: Mapping[str, Any], node_pods: Sequence[Mapping[str, Any]],
                           kind: str, resource: str, after: dt.datetime | None) -> list[str]:
    """The other Failed pods on the node whose admission error is the same kind for the same
    resource, rejected after `after` (None: at any time)."""
    me = (pod.get("metadata") or {}).get("uid")
    out = []
    for p in list(node_pods)[:MAX_PEERS]:
        meta, st = p.get("metadata") or {}, p.get("status") or {}
        if meta.get("uid") == me or st.get("phase") != "Failed":
            continue
        err = device_error(str(st.get("message") or ""))
        if not err or err["kind"] != kind or err["resource"] != resource:
            continue
        at = _rejected_at(p)
        if after is not None and (at is None or at <= after):
            continue
        out.append(f"{meta.get('namespace')}/{meta.get('name')}")
    return out


def explain(pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]], now: dt.datetime,
            node: Mapping[str, Any] | None = None,
            node_events: Sequence[Mapping[str, Any]] = (),
            node_pods: Sequence[Mapping[str, Any]] = ()) -> dict | None:
    """The race behind a pod's UnexpectedAdmissionError, or None when it was not one."""
    st = pod.get("status") or {}
    texts = [str(st.get("message") or "")] + [
        str(e.get("message") or "") for e in events if e.get("reason") == "UnexpectedAdmissionError"]
    err = next((d for d in (device_error(t) for t in texts) if d), None)
    if err is None:
        return None
    rejected = [event_time(e) for e in events if e.get("reason") == "UnexpectedAdmissionError"]
    rejected_at = max((t for t in rejected if t), default=None)
    kubelet = [event_time(e) for e in node_events if e.get("reason") == "Starting"
               and event_source(e) == "kubelet"]
    reboots = [event_time(e) for e in node_events if e.get("reason") == "Rebooted"]
    started_at = _last([t for t in kubelet if t], rejected_at)
    rebooted_at = _last([t for t in reboots if t], rejected_at)
    plugin_at = _plugin_started(node_pods)
    after_start = (rejected_at is not None and started_at is not None
                   and (rejected_at - started_at).total_seconds() <= RACE_WINDOW_S)
    plugin_later = plugin_at is not None and rejected_at is not None and plugin_at > rejected_at
    restart = "node reboot" if rebooted_at and started_at and \
        abs((started_at - rebooted_at).total_seconds()) <= RACE_WINDOW_S else "kubelet restart"
    res = err["resource"]
    kind = err["kind"]
    if kind in ("plugin_not_registered", "no_healthy_devices") and (after_start or plugin_later):
        race = (f"{restart}: the kubelet re-admitted the pod before the device plugin had "
                f"registered {res} again and reported its devices healthy")
        clears = ("the plugin registering and reporting healthy devices; it clears by itself "
                  "for new pods, not for this one")
    elif kind == "checkpoint_disagrees":
        race = (f"the kubelet's device checkpoint gave this container {res} devices that the "
                "plugin does not report healthy now"
                + (f" (after a {restart})" if after_start else "")
                + ": device ids changed (device-id strategy, MIG or driver change) or the GPU "
                  "turned unhealthy")
        clears = ("deleting the pod (its checkpoint entry goes with it); if the ids changed, "
                  "drain the node and restart the kubelet so no pod keeps the old ids")
    elif kind == "devices_unavailable":
        race = (f"the kubelet counted {err['available']} free {res} device(s) for "
                f"{err['requested']} requested, fewer than the scheduler saw"
                + (f": right after a {restart} it still counts devices of pods whose "
                   "containers it has not cleaned up yet, or the plugin re-registered with "
                   "fewer healthy devices" if after_start else
                   ": devices held by pods the scheduler considers gone (terminating pods), "
                   "or devices that turned unhealthy after scheduling"))
        clears = ("the kubelet releasing the devices of finished pods (its next cleanup) or the "
                  "devices turning healthy again")
    elif kind == "plugin_not_registered":
        race = f"no device plugin is registered for {res} on this node"
        clears = "the device plugin running and registering (see the node's deviceplugin.* findings)"
    else:
        race = f"the plugin for {res} reports no healthy device"
        clears = "the node's GPUs turning healthy (see deviceplugin.unhealthy and gpu.xid)"
    alloc = count(((node or {}).get("status") or {}).get("allocatable", {}).get(res)) \
        if node else None
    need = err.get("requested") or 1
    # a rejection that lasts (issue 40): other pods on the node rejected the same way after the
    # device plugin last started (or, not known, after this one) -- the node still refuses
    later = plugin_at or rejected_at
    same = _rejected_the_same_way(pod, node_pods, kind, res, later)
    cleared_now = None if alloc is None else alloc >= need
    if same:
        cleared_now = False
        clears = (f"{len(same)} other pod(s) on the node were rejected the same way since: it "
                  f"lasts; " + clears)
    out = {"kind": kind, "resource": res, "race": race, "clears": clears,
           "rejected_at": rejected_at.isoformat() if rejected_at else None,
           "kubelet_started_at": started_at.isoformat() if started_at else None,
           "node_rebooted_at": rebooted_at.isoformat() if rebooted_at else None,
           "plugin_started_at": plugin_at.isoformat() if plugin_at else None,
           "cleared_now": cleared_now, "rejected_the_same_way": same[:10],
           "node_allocatable_now": alloc, **recreation(pod)}
    for k in ("requested", "available"):
        if k in err:
            out[k] = err[k]
    return out

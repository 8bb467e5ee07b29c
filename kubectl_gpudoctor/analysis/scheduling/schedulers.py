"""Why a Pending GPU pod waits, when a queueing system or another scheduler holds it: Kueue,
Volcano, KAI and the HAMi scheduler, each read in its own objects.

Why: for such a pod the node fit (fit.py) is not the answer, or not the first one. Kueue keeps
the pod behind its `kueue.x-k8s.io/admission` scheduling gate until its Workload gets quota
in a ClusterQueue (the Workload's QuotaReserved and Admitted conditions say why not); Volcano
enqueues a PodGroup only when its queue's capability has room (phase Pending until then) and
places the gang only when every member fits (the Unschedulable condition); KAI writes per node
pool scheduling conditions on its PodGroup (OverLimit, NonPreemptibleOverQuota...); the HAMi
scheduler's filter says per node why no GPU fits (FilteringFailed events). Each answer is joined
with the nodes' own GPU state (the fit: how many GPUs are free on nodes that would take the
pod), so "Kueue has not admitted it: ClusterQueue gpu-cq has 0 nvidia.com/gpu left, 8 used by A
and B" comes with whether the nodes could run it once admitted.

Shapes (field names, condition types and reasons, message formats) from each project's own
API types, docs and tests: kubernetes-sigs/kueue apis/kueue/v1beta2 (workload_types.go,
clusterqueue_types.go), pkg/controller/jobs/pod/constants, pkg/scheduler/flavorassigner;
volcano-sh/volcano staging/src/volcano.sh/apis/pkg/apis/scheduling/v1beta1/types.go,
pkg/scheduler/plugins/gang; NVIDIA/KAI-Scheduler pkg/apis/scheduling/v2alpha2/podgroup_types.go,
pkg/scheduler/api/unschedule_info.go; Project-HAMi/HAMi pkg/device/common/common.go,
pkg/scheduler/score.go. Every name and message in them is the cluster's (tenants can write
Workloads and PodGroups): quoted as evidence, cut, never put into a command. Pure; no I/O.
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Mapping, Sequence

from node_probe.protocol import Finding, catalog

from ..common import pod_ref
from ..quantity import count as qty
from ..quoting import word

KUEUE_GATE = "kueue.x-k8s.io/admission"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
KUEUE_PREBUILT_LABEL = "kueue.x-k8s.io/prebuilt-workload-name"
VOLCANO_SCHEDULER = "volcano"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
KAI_SCHEDULER = "kai-scheduler"
KAI_GROUP_ANNOTATION = "pod-group-name"
HAMI_SCHEDULER = "hami-scheduler"
MAX_MESSAGE = 400
MAX_USERS = 3

REFS = {
    "kueue": ("https://kueue.sigs.k8s.io/docs/tasks/troubleshooting/troubleshooting_jobs/",
              "https://kueue.sigs.k8s.io/docs/concepts/cluster_queue/"),
    "volcano": ("https://volcano.sh/en/docs/queue/", "https://volcano.sh/en/docs/podgroup/"),
    "kai": ("https://github.com/NVIDIA/KAI-Scheduler/blob/main/docs/queues/README.md",),
    "hami": ("https://github.com/Project-HAMi/HAMi/blob/master/docs/scheduler-event-log.md",),
}

# the HAMi scheduler's filter reasons (pkg/device/common/common.go), in our words
HAMI_REASONS = {
    "CardTypeMismatch": "no GPU of the requested type",
    "CardUuidMismatch": "no GPU with the requested UUID",
    "CardTimeSlicingExhausted": "every GPU's time-slicing share is used",
    "CardComputeUnitsExhausted": "every GPU's compute units are used",
    "CardInsufficientMemory": "no GPU has enough free memory",
    "CardInsufficientCore": "no GPU has enough free cores",
    "CardNotHealth": "GPUs unhealthy",
    "CardCordoned": "GPUs cordoned",
    "NumaNotFit": "the GPUs that fit are not on one NUMA node",
    "ExclusiveDeviceAllocateConflict": "a GPU is held exclusively",
    "CardNotFoundCustomFilterRule": "no GPU matches the custom filter",
    "CardMigTopologyInfeasible": "no MIG layout fits",
    "NodeInsufficientDevice": "the node has too few GPUs",
    "AllocatedCardsInsufficientRequest": "too few GPUs fit the request",
    "NodeUnfitPod": "the node does not fit the pod",
    "ResourceQuotaNotFit": "HAMi's resource quota is used up",
    "ModeNotFit": "no GPU in the requested mode",
}
_HAMI_EVENT = re.compile(r"^(\d+) nodes ([A-Za-z]+)\(([^)]{0,2000})\)$")


def system_of(pod: Mapping[str, Any]) -> str | None:
    """Which queueing system or scheduler holds this pod: kueue, volcano, kai, hami, or None
    (kube-scheduler alone)."""
    spec = pod.get("spec") or {}
    gates = {g.get("name") for g in spec.get("schedulingGates") or () if isinstance(g, Mapping)}
    if KUEUE_GATE in gates:
        return "kueue"
    name = spec.get("schedulerName") or ""
    if name == VOLCANO_SCHEDULER:
        return "volcano"
    if name == KAI_SCHEDULER:
        return "kai"
    if name == HAMI_SCHEDULER:
        return "hami"
    return None


def _cut(text: Any) -> str:
    return " ".join(str(text or "").split())[:MAX_MESSAGE]


def _cond(obj: Mapping[str, Any] | None, ctype: str) -> Mapping[str, Any] | None:
    for c in ((obj or {}).get("status") or {}).get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == ctype:
            return c
    return None


def _name(obj: Mapping[str, Any] | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("name") or "")


def nodes_phrase(free: Mapping[str, int] | None, nodes: int | None) -> str:
    """What the nodes could give the pod once its queue lets it go (from the fit)."""
    if free is None:
        return ""
    parts = ", ".join(f"{n} {r}" for r, n in sorted(free.items()))
    return (f"; the nodes that would take it have {parts} free" + (f" ({nodes} node(s))"
                                                                    if nodes else ""))


# -- Kueue ------------------------------------------------------------------------------------

def workload_of(pod: Mapping[str, Any], workloads: Iterable[Mapping[str, Any]]
                ) -> Mapping[str, Any] | None:
    """The Kueue Workload for the pod: the one named by its pod group or prebuilt-workload
    label, or the one whose job-uid label or owner is the pod or the pod's owner."""
    md = pod.get("metadata") or {}
    labels = md.get("labels") or {}
    uids = {md.get("uid")} | {o.get("uid") for o in md.get("ownerReferences") or ()
                              if isinstance(o, Mapping)}
    uids.discard(None)
    names = {labels.get(KUEUE_GROUP_LABEL), labels.get(KUEUE_PREBUILT_LABEL)} - {None}
    for wl in workloads:
        wmd = wl.get("metadata") or {}
        if wmd.get("name") in names:
            return wl
        if (wmd.get("labels") or {}).get(KUEUE_JOB_UID_LABEL) in uids:
            return wl
        if any(isinstance(o, Mapping) and o.get("uid") in uids
               for o in wmd.get("ownerReferences") or ()):
            return wl
    return None


def _quota(cq: Mapping[str, Any], resource: str) -> tuple[int | None, int, list[str]]:
    """(nominal quota of `resource` over the ClusterQueue's flavors or None when it covers
    none, quota reserved, the flavors)."""
    nominal, flavors = None, []
    for rg in (cq.get("spec") or {}).get("resourceGroups") or ():
        for fl in rg.get("flavors") or ():
            for r in fl.get("resources") or ():
                if r.get("name") == resource:
                    nominal = (nominal or 0) + qty(r.get("nominalQuota"))
                    flavors.append(str(fl.get("name") or ""))
    used = 0
    st = cq.get("status") or {}
    for fu in st.get("flavorsReservation") or st.get("flavorsUsage") or ():
        for r in fu.get("resources") or ():
            if r.get("name") == resource:
                used += qty(r.get("total"))
    return nominal, used, flavors


def _users(cq_name: str, resource: str, workloads: Iterable[Mapping[str, Any]]
           ) -> list[tuple[str, int]]:
    """Workloads holding quota of `resource` in the ClusterQueue, biggest first."""
    out = []
    for wl in workloads:
        adm = (wl.get("status") or {}).get("admission") or {}
        if adm.get("clusterQueue") != cq_name:
            continue
        reserved = _cond(wl, "QuotaReserved")
        if reserved is not None and reserved.get("status") != "True":
            continue
        n = sum(qty((a.get("resourceUsage") or {}).get(resource))
                for a in adm.get("podSetAssignments") or () if isinstance(a, Mapping))
        if n:
            md = wl.get("metadata") or {}
            owner = next((o for o in md.get("ownerReferences") or ()
                          if isinstance(o, Mapping) and o.get("controller")), None)
            who = (f"{owner.get('kind')} {md.get('namespace')}/{owner.get('name')}" if owner
                   else f"{md.get('namespace')}/{md.get('name')}")
            out.append((who, n))
    out.sort(key=lambda x: -x[1])
    return out


def kueue(pod: Mapping[str, Any], requests: Mapping[str, int],
          workloads: Sequence[Mapping[str, Any]] | None,
          local_queue: Mapping[str, Any] | None, local_queue_missing: bool,
          cluster_queue: Mapping[str, Any] | None,
          all_workloads: Sequence[Mapping[str, Any]] | None,
          free: Mapping[str, int] | None = None, fit_nodes: int | None = None,
          not_served: bool = False) -> list[Finding]:
    """kueue.not_admitted for a pod behind Kueue's admission gate. `workloads`: the pod's
    namespace's (None: could not be read); `local_queue`, `cluster_queue`: its queues (None:
    unknown or unreadable; `local_queue_missing`: the API said 404); `all_workloads`: every
    Workload, to name who holds the ClusterQueue's quota (None: not read); `not_served`: the
    API server does not serve Kueue's API at all."""
    ref = pod_ref(pod)
    labels = (pod.get("metadata") or {}).get("labels") or {}
    wl = workload_of(pod, workloads or ())
    lq_name = str(((wl or {}).get("spec") or {}).get("queueName")
                  or labels.get(KUEUE_QUEUE_LABEL) or "")
    cq_name = str((((wl or {}).get("status") or {}).get("admission") or {}).get("clusterQueue")
                  or ((local_queue or {}).get("spec") or {}).get("clusterQueue") or "")
    reserved, admitted = _cond(wl, "QuotaReserved"), _cond(wl, "Admitted")
    ev: dict = {"system": "kueue", "pod": ref, "gate": KUEUE_GATE,
                "workload": _name(wl) or None, "local_queue": lq_name or None,
                "cluster_queue": cq_name or None, "requested": dict(requests) or None,
                "nodes_free": dict(free) if free is not None else None}
    if reserved is not None:
        ev["quota_reserved"] = {"status": reserved.get("status"),
                                "reason": reserved.get("reason"),
                                "message": _cut(reserved.get("message"))}
    if admitted is not None:
        ev["admitted"] = {"status": admitted.get("status"), "reason": admitted.get("reason"),
                          "message": _cut(admitted.get("message"))}
    checks = [{"name": c.get("name"), "state": c.get("state"), "message": _cut(c.get("message"))}
              for c in ((wl or {}).get("status") or {}).get("admissionChecks") or ()
              if isinstance(c, Mapping)][:8]
    if checks:
        ev["admission_checks"] = checks
    nodes = nodes_phrase(free, fit_nodes)
    fix = ("`kubectl describe workload -n NS NAME` shows Kueue's view; free quota by finishing "
           "or deleting the workloads that hold it, or raise the ClusterQueue's nominalQuota "
           "(or let it borrow in its cohort).")
    if not_served:
        why = ("the gate is Kueue's, but this API server does not serve Kueue's API: nothing "
               "will remove it")
        fix = ("Install Kueue (or restore its CRDs and controller), or recreate the pod "
               "without the scheduling gate.")
    elif workloads is None:
        why = "its Workloads could not be read"
    elif wl is None:
        why = ("no Workload names it: Kueue's controller has not made one (is it running, and "
               "does the pod's queue-name label name a LocalQueue?)")
        fix = ("Check the Kueue controller (kueue-system) and the pod's "
               f"`{KUEUE_QUEUE_LABEL}` label.")
    elif local_queue_missing:
        why = f"LocalQueue {lq_name} does not exist in its namespace"
        fix = "Create the LocalQueue, or point the pod's queue-name label at one that exists."
    elif admitted is not None and admitted.get("status") == "True":
        why = ("Kueue admitted its Workload but the gate is still on: Kueue's controller has "
               "not removed it yet")
        fix = "Check the Kueue controller's logs (kueue-system)."
    elif reserved is not None and reserved.get("status") == "True":
        states = ", ".join(f"{c['name']}={c['state']}" for c in checks) or "none listed"
        why = (f"quota is reserved in ClusterQueue {cq_name}, but admission checks are not "
               f"ready ({states})")
        fix = "See the admission checks' messages (e.g. a ProvisioningRequest waiting for nodes)."
    else:
        why = _quota_why(cq_name, cluster_queue, requests, all_workloads, reserved, ev)
    inactive = _cond(cluster_queue, "Active") or _cond(local_queue, "Active")
    if inactive is not None and inactive.get("status") == "False":
        ev["queue_inactive"] = _cut(inactive.get("message"))
        why = f"{why}; the queue is inactive (its Active condition's message is in evidence)"
        fix = ("Fix the queue's configuration (`kubectl get clusterqueue NAME -o yaml`: the "
               "Active condition says what is missing). " + fix)
    return [catalog.make(
        "kueue.not_admitted", "warning", f"pod/{ref}",
        f"Kueue has not admitted it: {why}{nodes}", ev,
        fix + " The pod stays behind its scheduling gate, unseen by kube-scheduler, until "
        "Kueue admits it.", REFS["kueue"])]


def _quota_why(cq_name: str, cq: Mapping[str, Any] | None, requests: Mapping[str, int],
               all_workloads: Sequence[Mapping[str, Any]] | None,
               reserved: Mapping[str, Any] | None, ev: dict) -> str:
    said = _cut((reserved or {}).get("message"))
    if cq is None:
        return said or f"Kueue gave no reason yet (ClusterQueue {cq_name or 'unknown'})"
    parts = []
    for r, want in sorted(requests.items()):
        nominal, used, flavors = _quota(cq, r)
        if nominal is None:
            parts.append(f"ClusterQueue {cq_name} has no quota for {r}")
            ev.setdefault("quota", {})[r] = {"nominal": None, "flavors": []}
            continue
        left = max(0, nominal - used)
        users = _users(cq_name, r, all_workloads or ())
        ev.setdefault("quota", {})[r] = {"nominal": nominal, "reserved": used, "left": left,
                                         "flavors": flavors, "requested": want,
                                         "held_by": [{"workload": w, r: n}
                                                     for w, n in users[:10]]}
        if left < want:
            names = " and ".join(w for w, _ in users[:MAX_USERS]) + (
                f" and {len(users) - MAX_USERS} more" if len(users) > MAX_USERS else "")
            parts.append(f"ClusterQueue {cq_name} has {left} {r} left, {used} used"
                         + (f" by {names}" if names else ""))
    if parts:
        return "; ".join(parts)
    return said or f"ClusterQueue {cq_name} has room: Kueue has not tried it yet (StrictFIFO?)"


# -- Volcano ----------------------------------------------------------------------------------

def volcano(pod: Mapping[str, Any], requests: Mapping[str, int],
            podgroup: Mapping[str, Any] | None, queue: Mapping[str, Any] | None,
            podgroup_events: Sequence[Mapping[str, Any]] = (),
            free: Mapping[str, int] | None = None, fit_nodes: int | None = None,
            readable: bool = True) -> list[Finding]:
    """volcano.podgroup_pending for a pod of the volcano scheduler whose PodGroup is not
    running: not enqueued (its queue's capability) or its gang does not fit."""
    ref = pod_ref(pod)
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    pg_name = str(ann.get(VOLCANO_GROUP_ANNOTATION) or _name(podgroup) or "")
    st = (podgroup or {}).get("status") or {}
    phase = st.get("phase")
    q_name = str(((podgroup or {}).get("spec") or {}).get("queue") or "default")
    ev: dict = {"system": "volcano", "pod": ref, "podgroup": pg_name or None, "phase": phase,
                "queue": q_name, "requested": dict(requests) or None,
                "nodes_free": dict(free) if free is not None else None}
    if not readable:
        return []
    if podgroup is None:
        why = f"its PodGroup {pg_name or '(none named)'} was not found"
        fix = "The volcano controllers create a PodGroup per job: check that they run."
    elif phase in ("Running", "Completed"):
        return []
    else:
        unsched = _cond(podgroup, "Unschedulable")
        quota_events = [e for e in podgroup_events
                        if "queue resource quota insufficient" in str(e.get("message") or "")]
        minres = ((podgroup.get("spec") or {}).get("minResources") or {})
        ev["min_member"] = (podgroup.get("spec") or {}).get("minMember")
        if phase == "Pending":  # not enqueued: the queue's capability
            cap = (((queue or {}).get("spec") or {}).get("capability") or {})
            alloc = (((queue or {}).get("status") or {}).get("allocated") or {})
            parts = []
            for r in sorted(set(requests) | {k for k in minres if k in cap}):
                if r in cap:
                    need = qty(minres.get(r)) or requests.get(r, 0)
                    parts.append(f"{r}: capability {qty(cap[r])}, {qty(alloc.get(r))} allocated"
                                 f", it needs {need}")
            ev["queue_capability"] = {k: str(v) for k, v in cap.items()} or None
            ev["queue_allocated"] = {k: str(v) for k, v in alloc.items()} or None
            if quota_events:
                ev["events"] = [_cut(e.get("message")) for e in quota_events[-3:]]
            why = (f"Volcano has not enqueued PodGroup {pg_name}: queue {q_name} "
                   + ("; ".join(parts) if parts else "lacks room")
                   + (" (queue resource quota insufficient)" if quota_events else ""))
            fix = (f"Raise queue {q_name}'s capability or free it "
                   "(`kubectl get queue NAME -o yaml`: spec.capability, status.allocated).")
        else:
            msg = _cut((unsched or {}).get("message"))
            ev["condition"] = {"reason": (unsched or {}).get("reason"), "message": msg} \
                if unsched else None
            why = (f"Volcano enqueued PodGroup {pg_name} but cannot place its gang"
                   + (f": {msg}" if msg else ""))
            fix = ("The gang needs minMember pods placed at once: free GPUs on the nodes, or "
                   "lower minMember.")
    return [catalog.make(
        "volcano.podgroup_pending", "warning", f"pod/{ref}",
        why + nodes_phrase(free, fit_nodes), ev, fix, REFS["volcano"])]


# -- KAI --------------------------------------------------------------------------------------

def kai(pod: Mapping[str, Any], requests: Mapping[str, int],
        podgroup: Mapping[str, Any] | None, free: Mapping[str, int] | None = None,
        fit_nodes: int | None = None, readable: bool = True) -> list[Finding]:
    """kai.podgroup_unschedulable for a pod of the KAI scheduler whose PodGroup has
    scheduling conditions (per node pool: OverLimit, NonPreemptibleOverQuota, ...)."""
    if not readable:
        return []
    ref = pod_ref(pod)
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    pg_name = str(ann.get(KAI_GROUP_ANNOTATION) or _name(podgroup) or "")
    ev: dict = {"system": "kai", "pod": ref, "podgroup": pg_name or None,
                "requested": dict(requests) or None,
                "nodes_free": dict(free) if free is not None else None}
    if podgroup is None:
        why = f"its PodGroup {pg_name or '(none named)'} was not found"
        fix = "KAI's podgrouper creates a PodGroup per workload: check that it runs."
        conds: list[dict] = []
    else:
        ev["queue"] = (podgroup.get("spec") or {}).get("queue")
        conds = []
        for c in ((podgroup.get("status") or {}).get("schedulingConditions") or ())[:8]:
            if not isinstance(c, Mapping) or c.get("status") == "False":
                continue
            reasons = [r for r in c.get("reasons") or () if isinstance(r, Mapping)] or (
                [{"reason": c.get("reason"), "message": c.get("message")}]
                if c.get("reason") or c.get("message") else [])
            for r in reasons[:4]:
                conds.append({"node_pool": c.get("nodePool") or "default",
                              "reason": r.get("reason"), "message": _cut(r.get("message"))})
        if not conds:
            return []  # no condition: KAI has not judged it (yet): the fit says the rest
        ev["scheduling_conditions"] = conds
        first = conds[0]
        pool = "" if first["node_pool"] == "default" else f", node pool {first['node_pool']}"
        why = (f"KAI cannot schedule PodGroup {pg_name} ({word(first['reason'], '?')}{pool})"
               + (" (its message is in evidence)" if first["message"] else ""))
        fix = ("Free or raise the queue's quota and limit (`kubectl get queues.scheduling.run.ai "
               "NAME -o yaml`), or let the workload be preemptible.")
    return [catalog.make(
        "kai.podgroup_unschedulable", "warning", f"pod/{ref}",
        why + nodes_phrase(free, fit_nodes), ev, fix, REFS["kai"])]


# -- HAMi -------------------------------------------------------------------------------------

def hami(pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]],
         free: Mapping[str, int] | None = None, fit_nodes: int | None = None
         ) -> list[Finding]:
    """hami.filter_failed: the HAMi scheduler's FilteringFailed events name, per reason, the
    nodes it filtered out (`2 nodes CardInsufficientMemory(node-a,node-b)`)."""
    ref = pod_ref(pod)
    fails = [e for e in events if e.get("reason") == "FilteringFailed"]
    if not fails:
        return []
    reasons: dict[str, dict] = {}
    other: list[str] = []
    for e in fails[-20:]:
        msg = " ".join(str(e.get("message") or "").split())
        m = _HAMI_EVENT.match(msg)
        if m:
            code = m.group(2)
            nodes = [n for n in m.group(3).split(",") if n][:10]
            reasons[code] = {"nodes": int(m.group(1)), "named": nodes,
                             "meaning": HAMI_REASONS.get(code, "")}
        elif msg:
            other.append(msg[:200])
    if not reasons and not other:
        return []
    parts = [f"{d['nodes']} node(s) {code}" + (f" ({d['meaning']})" if d["meaning"] else "")
             for code, d in sorted(reasons.items(), key=lambda kv: -kv[1]["nodes"])]
    why = ("the HAMi scheduler found no node with a GPU that fits: "
           + ("; ".join(parts[:4]) if parts else other[-1]))
    return [catalog.make(
        "hami.filter_failed", "warning", f"pod/{ref}", why + nodes_phrase(free, fit_nodes),
        {"system": "hami", "pod": ref, "reasons": reasons or None,
         "messages": other[-3:] or None,
         "nodes_free": dict(free) if free is not None else None},
        "HAMi judges GPU memory and cores per device from its node annotations: lower the "
        "pod's nvidia.com/gpumem or gpucores, free the GPUs that hold them, or check the nodes' "
        "hami.* findings (`kubectl gpu-doctor node NAME`) when GPUs are unhealthy or cordoned.",
        REFS["hami"])]

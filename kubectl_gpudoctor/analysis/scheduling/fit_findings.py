"""pod.gpu_*: the finding for each case of a Pending GPU pod's fit (fit.py), worded with the
nodes and the numbers, and analyze_pending, the one call for an unscheduled pod (the fit's
finding, then the quota's: quota.py).

Why a module of its own: fit.py computes the case the way kube-scheduler filters; this module
says it to a person (which nodes, how many GPUs, who holds them, what would lift a rule) and
keeps the scheduler's own message as evidence.

Pure functions over raw API dicts; no I/O.
"""
from __future__ import annotations

import datetime as dt
from typing import Any, Iterable, Mapping, Sequence

from node_probe.protocol import catalog
from node_probe.protocol import Finding

from ..common import age_s, fmt_duration, pod_ref
from ..stuck.admission import stalled_nodes
from .fit import (DEVICES_MISSING, EXCLUDED, FITS, Fit, HELD, HELD_BY_OTHERS, NEVER_FITS,
                  NOT_ALLOCATABLE, NodeFit, TOO_SMALL, compute)
from .quota import quota_findings


MAX_NODES_SHOWN = 10
FRESH_S = 60.0  # a GPU pod that fits and is younger than this is merely waiting
CASE_IDS = {NEVER_FITS: "pod.gpu_never_fits", DEVICES_MISSING: "pod.gpu_devices_missing",
            HELD_BY_OTHERS: "pod.gpu_held_by_others", EXCLUDED: "pod.gpu_placement_excluded"}

REF_DP = "https://kubernetes.io/docs/concepts/extend-kubernetes/compute-storage-net/device-plugins/"
REF_TAINTS = "https://kubernetes.io/docs/concepts/scheduling-eviction/taint-and-toleration/"
REF_AFFINITY = "https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/"
REF_MIG = "https://docs.nvidia.com/datacenter/cloud-native/kubernetes/latest/index.html"
REF_TS = "https://github.com/NVIDIA/k8s-device-plugin#shared-access-to-gpus"
REF_PREEMPT = "https://kubernetes.io/docs/concepts/scheduling-eviction/pod-priority-preemption/"


# -- findings --------------------------------------------------------------------------------

def _req_str(requested: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {r}" for r, n in sorted(requested.items()))


def _one(requested: Mapping[str, int]) -> tuple[str, int]:
    return sorted(requested.items())[0]


def _pairs(f: NodeFit, requested: Mapping[str, int], field: str) -> str:
    if field == "free":
        return "+".join(str(f.free(r)) for r in sorted(requested))
    vals = getattr(f, field)
    return "+".join(str(vals.get(r, 0)) for r in sorted(requested))


def _not_offered_hint(missing: str, offered: Mapping[str, int]) -> tuple[str, str]:
    """(sub-case, advice) when the requested resource name exists on no node."""
    names = sorted(offered)
    mig = [k for k in names if k.startswith("nvidia.com/mig-")]
    shared = [k for k in names if k.startswith("nvidia.com/gpu.") or k.endswith(".shared")]
    if missing == "nvidia.com/gpu" and mig:
        return ("mig_mixed_strategy",
                f"the nodes run the NVIDIA device plugin with MIG strategy `mixed`, which "
                f"advertises each MIG profile as its own resource ({', '.join(mig[:4])}) and "
                f"full GPUs only when some GPU is not partitioned: ask for one of those "
                f"resources (e.g. `{mig[0]}: 1`), or switch the plugin to MIG strategy "
                f"`single` (MIG slices then appear as nvidia.com/gpu)")
    if missing == "nvidia.com/gpu" and shared:
        return ("time_slicing_renamed",
                f"GPU sharing (time-slicing or MPS) with `renameByDefault: true` advertises the "
                f"shared replicas as {shared[0]}: ask for `{shared[0]}`, or set "
                f"renameByDefault: false in the plugin's sharing config")
    if missing.startswith("nvidia.com/mig-"):
        if mig:
            return ("mig_profile_absent",
                    f"no node has MIG profile {missing[len('nvidia.com/mig-'):]}; the nodes "
                    f"offer {', '.join(mig[:4])}: ask for one of those, or repartition a GPU "
                    f"(nvidia.com/mig.config label with the MIG manager)")
        if "nvidia.com/gpu" in offered:
            return ("mig_single_or_disabled",
                    "the nodes advertise nvidia.com/gpu only (MIG disabled, or MIG strategy "
                    "`single`, which names MIG slices nvidia.com/gpu): ask for nvidia.com/gpu, "
                    "or enable MIG with strategy `mixed`")
    if missing.endswith(".shared") and "nvidia.com/gpu" in offered:
        return ("sharing_not_renamed",
                "the nodes' GPU sharing (if any) is not renamed: replicas are advertised as "
                "nvidia.com/gpu; ask for nvidia.com/gpu, or set renameByDefault: true")
    if names:
        return ("not_offered", f"the nodes offer {', '.join(names[:6])}: ask for one of "
                               f"those, or install the device plugin that serves {missing}")
    return ("not_offered", f"no node advertises any GPU resource: the device plugin "
                           f"serving {missing} is not running on any node")


def _rules_summary(fs: Sequence[NodeFit]) -> dict[str, int]:
    out: dict[str, int] = {}
    for f in fs:
        for rule in f.excluded_by:
            key = rule.split(" (", 1)[0] if rule.startswith(("nodeSelector", "required")) \
                else rule
            out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1])[:10])


def _top(fs: Sequence[NodeFit], key) -> list[NodeFit]:
    return sorted(fs, key=key)[:MAX_NODES_SHOWN]


def findings(pod: Mapping[str, Any], fit: Fit, events: Sequence[Mapping[str, Any]] = (),
             now: dt.datetime | None = None) -> list[Finding]:
    """The finding for the fit's case (for `fits`: pod.pending_explained, info when the pod is
    merely waiting, a warning when something other than GPUs keeps it Pending)."""
    now = now or dt.datetime.now(dt.timezone.utc)
    md, spec, st = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    subject = f"pod/{pod_ref(pod)}"
    req = fit.requested
    rs = sorted(req)
    sched = [e for e in events if e.get("reason") == "FailedScheduling"]
    sched_msg = str((sched[-1].get("message") if sched else None) or next(
        (c.get("message") for c in st.get("conditions") or ()
         if c.get("type") == "PodScheduled" and c.get("status") == "False"), "") or "")
    waited = age_s(md.get("creationTimestamp"), now)
    base: dict = {"case": fit.case, "requested": dict(req), "nodes_total": fit.total_nodes,
                  "nodes_offering": len(fit.nodes)}
    if fit.extender:
        base["judged_by_scheduler_extender"] = dict(fit.extender)
    if spec.get("resourceClaims"):
        # DRA claims are allocated by the scheduler's DynamicResources plugin, not counted here
        base["resource_claims"] = [c.get("name") for c in spec["resourceClaims"]][:8]
        if "dra.claim_unallocated" in catalog.CATALOG:
            base["claims_judged_by"] = "dra.claim_unallocated"
    if st.get("nominatedNodeName"):
        base["nominated_node"] = st["nominatedNodeName"]
    if sched_msg:
        base["scheduler_message"] = " ".join(sched_msg.split())[:400]
    if waited is not None:
        base["pending_s"] = round(waited)
    r0, q0 = _one(req)
    enough_cap = [f for f in fit.nodes if f.stage > TOO_SMALL]

    if fit.case == NEVER_FITS:
        missing = [r for r in rs if r not in fit.offered]
        if missing:
            subcase, advice = _not_offered_hint(missing[0], fit.offered)
            ev = dict(base, subcase=subcase, not_offered=missing,
                      offered={k: fit.offered[k] for k in sorted(fit.offered)[:12]})
            title = (f"asks for {_req_str(req)}, but no node offers {missing[0]}"
                     + (f"; the nodes offer {', '.join(sorted(fit.offered)[:4])}"
                        if fit.offered else "; no node advertises any GPU resource"))
            fix = f"The pod can never be scheduled as written: {advice}."
            refs = [REF_MIG] if "mig" in subcase else [REF_TS] if "sharing" in subcase or \
                "slicing" in subcase else [REF_DP]
        else:
            largest = _top(fit.nodes, lambda f: (-sum(f.capacity.values()), f.name))
            big = largest[0]
            ev = dict(base, subcase="request_exceeds_capacity",
                      largest_capacity={r: max(f.capacity.get(r, 0) for f in fit.nodes)
                                        for r in rs},
                      nodes=[f.doc(rs) for f in largest])
            title = (f"asks for {_req_str(req)}, more than any node has: the largest has "
                     f"{_pairs(big, req, 'capacity')} ({big.name}"
                     + (f", {_pairs(big, req, 'allocatable')} allocatable"
                        if big.allocatable != big.capacity else "") + ")")
            fix = (f"No node can ever hold this pod. Ask for at most "
                   f"{max(f.capacity.get(r0, 0) for f in fit.nodes)} {r0} per pod (split the "
                   f"work across pods, e.g. a multi-pod job), or add nodes with at least "
                   f"{q0} {r0}.")
            if any(f.allocatable != f.capacity for f in largest):
                fix += (" Some of these nodes also have fewer allocatable than capacity: see "
                        "node.gpu_capacity_mismatch.")
            refs = [REF_DP]
        return [catalog.make(CASE_IDS[NEVER_FITS], "critical", subject, title, ev, fix,
                             tuple(refs))]

    if fit.case == DEVICES_MISSING:
        cands = [f for f in fit.nodes if f.stage == NOT_ALLOCATABLE and not f.excluded_by]
        top = _top(cands, lambda f: (-sum(f.capacity.values()), f.name))
        ev = dict(base, nodes=[f.doc(rs) for f in top], nodes_affected=len(cands),
                  see="node.gpu_capacity_mismatch")
        shown = ", ".join(f"{f.name} {_pairs(f, req, 'allocatable')}/"
                          f"{_pairs(f, req, 'capacity')}" for f in top[:3])
        title = (f"asks for {_req_str(req)}; {len(cands)} node(s) have enough in capacity but "
                 f"not allocatable ({shown} allocatable/capacity): the devices are not there")
        fix = ("The GPUs exist but the device plugin does not offer them: its pod is gone or "
               "crash-looping, or it reports the devices Unhealthy (Xid errors, a GPU that fell "
               "off the bus). See node.gpu_capacity_mismatch and run `kubectl gpu-doctor node "
               f"{top[0].name}` for deviceplugin.* / gpu.* findings; once the plugin reports "
               "the devices healthy again the pod schedules by itself.")
        return [catalog.make(CASE_IDS[DEVICES_MISSING], "critical", subject, title, ev, fix,
                             (REF_DP, "https://github.com/NVIDIA/k8s-device-plugin#health-checks"))]

    if fit.case == HELD_BY_OTHERS:
        cands = [f for f in fit.nodes if f.stage == HELD and not f.excluded_by]
        top = _top(cands, lambda f: (-min(f.free(r) for r in rs), f.name))
        docs = [f.doc(rs, fit.holders(f.name)) for f in top]
        ev = dict(base, nodes=docs, nodes_affected=len(cands))
        first = top[0]
        who = ", ".join(f"{h['pod']} {sum(h['count'].values())}"
                        for h in docs[0]["holders"][:3])
        title = (f"asks for {_req_str(req)}; {len(cands)} node(s) could hold it but other pods "
                 f"hold the GPUs: {first.name} has {_pairs(first, req, 'free')} free of "
                 f"{_pairs(first, req, 'allocatable')} (held by {who or 'pods'})")
        fix = ("The pod schedules by itself once enough GPUs on one node are released: ask the "
               "owners of the holders listed in the evidence, wait for their jobs, or scale "
               "them down; or ask for fewer GPUs per pod, or add GPU nodes. A higher "
               "priorityClassName lets the scheduler preempt lower-priority holders.")
        if st.get("nominatedNodeName"):
            fix = (f"The scheduler is already preempting pods on {st['nominatedNodeName']} to "
                   f"make room (nominatedNodeName): wait for them to terminate. " + fix)
        return [catalog.make(CASE_IDS[HELD_BY_OTHERS], "warning", subject, title, ev, fix,
                             (REF_PREEMPT,))]

    if fit.case == EXCLUDED:
        cands = [f for f in enough_cap if f.excluded_by]
        order = {FITS: 0, HELD: 1, NOT_ALLOCATABLE: 2}
        # the nodes that would fit first, and of those the easiest to open up
        top = _top(cands, lambda f: (order.get(f.stage, 3), len(f.excluded_by), f.name))
        docs = [f.doc(rs, fit.holders(f.name) if f.stage == HELD else None) for f in top]
        placed = [f for f in enough_cap if not f.excluded_by]
        ev = dict(base, nodes=docs, nodes_excluded=len(cands),
                  excluded_by_rule=_rules_summary(cands),
                  would_fit_if_allowed=sum(1 for f in cands if f.stage == FITS))
        if placed:
            ev["allowed_nodes"] = [
                dict(f.doc(rs), why_not={NOT_ALLOCATABLE: "not allocatable",
                                         HELD: "held by other pods"}.get(f.stage, "?"))
                for f in _top(placed, lambda f: f.name)[:5]]
        shown = "; ".join(f"{f.name}: {', '.join(f.excluded_by[:2])}" for f in top[:3])
        free_n = ev["would_fit_if_allowed"]
        title = (f"asks for {_req_str(req)}; the {len(cands)} node(s) with enough are excluded "
                 f"by placement ({shown}" + ("; ..." if len(cands) > 3 else "") + ")"
                 + (f"; {free_n} of them have the GPUs free" if free_n else ""))
        best = top[0]
        steps = list(dict.fromkeys(best.unblock))[:4]
        fix = (f"To let it onto {best.name} ({_pairs(best, req, 'free')} of "
               f"{_pairs(best, req, 'allocatable')} free): " + "; ".join(steps) + ". "
               "Placement is part of the pod template: change it in the owning Deployment / "
               "Job / StatefulSet; the other nodes and their rules are in the evidence.")
        if placed:
            fix += (f" The {len(placed)} node(s) the pod may use have too few GPUs available "
                    f"(see allowed_nodes).")
        return [catalog.make(CASE_IDS[EXCLUDED], "warning", subject, title, ev, fix,
                             (REF_TAINTS, REF_AFFINITY))]

    # FITS: the GPUs are not what keeps it Pending
    ok = [f for f in fit.nodes if f.stage == FITS and not f.excluded_by]
    top = _top(ok, lambda f: (-min(f.free(r) for r in rs), f.name))
    ev = dict(base, nodes=[f.doc(rs) for f in top[:3]], nodes_fitting=len(ok))
    where = ", ".join(f"{f.name} {_pairs(f, req, 'free')} free" for f in top[:3])
    if sched:
        return [catalog.make(
            "pod.pending_explained", "warning", subject,
            f"the GPUs fit on {len(ok)} node(s) ({where}), yet the scheduler says: "
            + (" ".join(sched_msg.split())[:200] or "FailedScheduling"),
            ev, "The GPU request is not the problem (if the scheduler's message names GPUs it "
                "predates GPUs being released: it retries by itself). Fix what the message "
                "names: CPU/memory requests, pod (anti-)affinity, topology spread, volumes.",
            (REF_AFFINITY,))]
    gates = [str(g.get("name")) for g in spec.get("schedulingGates") or ()][:8]
    if gates:
        ev["scheduling_gates"] = gates
        return [catalog.make(
            "pod.pending_explained", "warning", subject,
            f"its GPUs fit on {len(ok)} node(s) ({where}), but scheduling gates keep it from "
            f"the scheduler: {', '.join(gates)}",
            ev, "The scheduler does not consider a pod until every entry of "
                "spec.schedulingGates is removed, by the controller that added it (a queueing "
                "system such as Kueue admitting the workload, or another operator). Ask that "
                "controller why it holds the pod (e.g. `kubectl get workloads -n "
                f"{md.get('namespace')}` for Kueue).",
            ("https://kubernetes.io/docs/concepts/scheduling-eviction/pod-scheduling-readiness/",))]
    sched_name = spec.get("schedulerName") or "default-scheduler"
    if waited is not None and waited >= FRESH_S:
        ev["scheduler_name"] = sched_name
        return [catalog.make(
            "pod.pending_explained", "warning", subject,
            f"not scheduled after {fmt_duration(waited)} though its GPUs fit on {len(ok)} "
            f"node(s) ({where}) and no scheduler has said anything",
            ev, f"No FailedScheduling event and no binding: is the scheduler `{sched_name}` "
                f"running (`kubectl -n kube-system get pods`)? A pod with a schedulerName "
                f"nobody serves waits forever; scheduler extenders (HAMi, Volcano) add their "
                f"own conditions (see hami.* findings).", (REF_AFFINITY,))]
    return [catalog.make(
        "pod.pending_explained", "info", subject,
        f"waiting for the scheduler; its GPUs fit on {len(ok)} node(s) ({where})",
        ev, "Nothing to do: the scheduler has not placed it yet.", ())]


def analyze_pending(pod: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]],
                    pods: Iterable[Mapping[str, Any]], events: Sequence[Mapping[str, Any]] = (),
                    quotas: Sequence[Mapping[str, Any]] = (), quota_events:
                    Sequence[Mapping[str, Any]] = (), now: dt.datetime | None = None
                    ) -> list[Finding]:
    """Findings for an unscheduled GPU pod ([] for a pod that is scheduled or asks no GPU)."""
    spec, st = pod.get("spec") or {}, pod.get("status") or {}
    if spec.get("nodeName") or (st.get("phase") or "Pending") != "Pending":
        return []
    pods = list(pods)
    fit = compute(pod, nodes, pods, now,
                  stalled_nodes(pods, now or dt.datetime.now(dt.timezone.utc)))
    if fit is None:
        return []
    out = findings(pod, fit, events, now)
    out += quota_findings(pod, fit, quotas, quota_events, now)
    return out

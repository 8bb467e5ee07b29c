"""pod.gpu_*: why a Pending GPU pod is not scheduled, computed the way kube-scheduler filters.

Why: the scheduler's own sentence ("0/12 nodes are available: 3 Insufficient nvidia.com/gpu,
9 node(s) had untolerated taint ...") counts nodes but names none, and it cannot tell "no node
is big enough" from "the plugin on the big node is gone" from "others hold the GPUs". All of
that is in the Node and Pod objects: capacity (what the devices are), allocatable (what the
device plugin reports healthy), the requests of pods bound to each node (what is held), taints,
labels and `unschedulable` (placement). This module replays the scheduler's GPU-relevant
filters (NodeResourcesFit for extended resources, TaintToleration, NodeAffinity/nodeSelector,
NodeUnschedulable) over every node and names the one case that applies, with nodes and
numbers: the requests and what is held come from gpu_held.py, the rules from placement.py;
fit_findings.py words the case, quota.py judges the namespace's ResourceQuota.

Pure functions over raw API dicts; no I/O. One pass over the pods and one over the nodes:
linear in nodes + pods (bench/fit_scale.py measures it).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any, Iterable, Mapping, Sequence

from ..common import age_s, fmt_duration, pod_ref
from .gpu_held import EXTENDER_ONLY, index_held, node_gpu_resources, pod_gpu_requests
# podfold.py and commands/nodes.py ask these of fit (fit.add_held, fit.node_free)
from .gpu_held import add_held, node_free  # noqa: F401
from .placement import no_room, placement_rules


MAX_HOLDERS_SHOWN = 10

# per-node stage: how far the node gets through the resource filters for this pod
TOO_SMALL, NOT_ALLOCATABLE, HELD, FITS = 0, 1, 2, 3

# pod-level cases (evidence["case"])
NEVER_FITS = "never_fits"
DEVICES_MISSING = "devices_missing"
HELD_BY_OTHERS = "held_by_others"
EXCLUDED = "excluded_by_placement"
FITS_CASE = "fits"


# -- the fit ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class NodeFit:
    name: str
    stage: int
    capacity: Mapping[str, int]
    allocatable: Mapping[str, int]
    held: Mapping[str, int]
    excluded_by: tuple[str, ...]
    unblock: tuple[str, ...] = ()  # per excluded_by entry: what would lift it

    def free(self, r: str) -> int:
        return max(0, self.allocatable.get(r, 0) - self.held.get(r, 0))

    def doc(self, requested: Iterable[str], holders: list[dict] | None = None) -> dict:
        d: dict = {"node": self.name,
                   "capacity": {r: self.capacity.get(r, 0) for r in requested},
                   "allocatable": {r: self.allocatable.get(r, 0) for r in requested},
                   "held": {r: self.held.get(r, 0) for r in requested},
                   "free": {r: self.free(r) for r in requested}}
        if self.excluded_by:
            d["excluded_by"] = list(self.excluded_by[:8])
        if holders is not None:
            d["holders"] = holders
        return d


@dataclasses.dataclass(frozen=True)
class Fit:
    """The outcome for one pod: its case, and the nodes that say so."""
    case: str
    requested: Mapping[str, int]          # node-resource requests (what the fit is about)
    extender: Mapping[str, int]           # HAMi shares the scheduler extender judges
    nodes: tuple[NodeFit, ...]            # every node that offers at least one requested resource
    total_nodes: int
    offered: Mapping[str, int]            # GPU resource name -> nodes offering it (capacity > 0)
    holder_pods: Mapping[str, list]       # node -> bound, unfinished pods holding a requested GPU
    now: dt.datetime

    def holders(self, node: str) -> list[dict]:
        """Who holds the requested GPUs on `node`, biggest first (built for shown nodes only)."""
        hs = [_holder(p, self.requested, self.now) for p in self.holder_pods.get(node, ())]
        hs.sort(key=lambda d: -sum(d["count"].values()))
        return hs[:MAX_HOLDERS_SHOWN]


def _holder(p: Mapping[str, Any], resources: Iterable[str], now: dt.datetime) -> dict:
    md, st = p.get("metadata") or {}, p.get("status") or {}
    reqs = pod_gpu_requests(p)
    age = age_s(st.get("startTime") or md.get("creationTimestamp"), now)
    d = {"pod": pod_ref(p), "count": {r: reqs[r] for r in resources if r in reqs},
         "age": fmt_duration(age), "phase": st.get("phase") or "Pending"}
    if md.get("deletionTimestamp"):
        d["terminating"] = True
    prio = (p.get("spec") or {}).get("priority")
    if prio:
        d["priority"] = prio
    owner = next((o for o in md.get("ownerReferences") or () if o.get("controller")), None)
    if owner:
        d["owner"] = f"{owner.get('kind')}/{owner.get('name')}"
    return d


def compute(pod: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]],
            pods: Iterable[Mapping[str, Any]], now: dt.datetime | None = None,
            admits_nothing: Mapping[str, str] | None = None) -> Fit | None:
    """The GPU fit of a pod against every node; None if the pod asks for no GPU resource.
    `admits_nothing`: nodes whose kubelet admits no pod (admission.stalled_nodes) -> why; they,
    NotReady and cordoned nodes never count as having room."""
    now = now or dt.datetime.now(dt.timezone.utc)
    allreq = pod_gpu_requests(pod)
    extender = {k: n for k, n in allreq.items() if k in EXTENDER_ONLY}
    requested = {k: n for k, n in allreq.items() if k not in EXTENDER_ONLY}
    if not requested:
        return None
    me = (pod.get("metadata") or {}).get("uid")
    held, holder_pods = index_held(
        (p for p in pods if (p.get("metadata") or {}).get("uid") != me or not me), requested)
    offered: dict[str, int] = {}
    fits: list[NodeFit] = []
    for n in nodes:
        cap, alloc = node_gpu_resources(n)
        for k, c in cap.items():
            if c > 0 and k not in EXTENDER_ONLY:
                offered[k] = offered.get(k, 0) + 1
        if not any(cap.get(r, 0) or alloc.get(r, 0) for r in requested):
            continue
        name = str((n.get("metadata") or {}).get("name") or "")
        h = held.get(name, {})
        if any(cap.get(r, 0) < q for r, q in requested.items()):
            stage = TOO_SMALL
        elif any(alloc.get(r, 0) < q for r, q in requested.items()):
            stage = NOT_ALLOCATABLE
        elif any(alloc.get(r, 0) - h.get(r, 0) < q for r, q in requested.items()):
            stage = HELD
        else:
            stage = FITS
        pl = placement_rules(pod, n) if stage > TOO_SMALL else []
        if stage > TOO_SMALL:
            pl += no_room(n, pl, admits_nothing or {})
        fits.append(NodeFit(name, stage, {r: cap.get(r, 0) for r in requested},
                            {r: alloc.get(r, 0) for r in requested},
                            {r: h.get(r, 0) for r in requested},
                            tuple(r for r, _ in pl), tuple(u for _, u in pl)))
    placed = [f for f in fits if not f.excluded_by]
    best_any = max((f.stage for f in fits), default=TOO_SMALL)
    best_placed = max((f.stage for f in placed), default=TOO_SMALL)
    if best_any == TOO_SMALL:
        case = NEVER_FITS
    elif best_placed == FITS:
        case = FITS_CASE
    elif any(f.stage == FITS and f.excluded_by for f in fits) or best_placed == TOO_SMALL:
        case = EXCLUDED
    elif best_placed == HELD:
        case = HELD_BY_OTHERS
    else:
        case = DEVICES_MISSING
    return Fit(case, requested, extender, tuple(fits), len(nodes), offered, holder_pods, now)

"""pod.gpu_*: why a Pending GPU pod is not scheduled, computed the way kube-scheduler filters.

Why: the scheduler's own sentence ("0/12 nodes are available: 3 Insufficient nvidia.com/gpu,
9 node(s) had untolerated taint ...") counts nodes but names none, and it cannot tell "no node
is big enough" from "the plugin on the big node is gone" from "others hold the GPUs". All of
that is in the Node and Pod objects: capacity (what the devices are), allocatable (what the
device plugin reports healthy), the requests of pods bound to each node (what is held), taints,
labels and `unschedulable` (placement), and the namespace's ResourceQuota. This module replays
the scheduler's GPU-relevant filters (NodeResourcesFit for extended resources, TaintToleration,
NodeAffinity/nodeSelector, NodeUnschedulable) over every node and names the one case that
applies, with nodes and numbers.

Pure functions over raw API dicts; no I/O. One pass over the pods and one over the nodes:
linear in nodes + pods (bench/fit_scale.py measures it).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import re
from typing import Any, Iterable, Mapping, Sequence

from node_probe.protocol import catalog
from node_probe.protocol import Finding

from .admission import stalled_nodes
from .common import GPU_RESOURCE_PREFIXES, ByIdentity, age_s, fmt_duration, pod_ref
from .quantity import count as qty

# HAMi's per-device memory/core shares: the HAMi scheduler extender judges them from the node's
# hami.io/node-nvidia-register annotation; no node has them in capacity.
EXTENDER_ONLY = ("nvidia.com/gpumem", "nvidia.com/gpucores", "nvidia.com/gpumem-percentage",
                 "nvidia.com/priority")
TERMINAL = ("Succeeded", "Failed")
NOSCHED_EFFECTS = ("NoSchedule", "NoExecute")
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
MAX_NODES_SHOWN = 10
MAX_HOLDERS_SHOWN = 10
FRESH_S = 60.0  # a GPU pod that fits and is younger than this is merely waiting

# per-node stage: how far the node gets through the resource filters for this pod
TOO_SMALL, NOT_ALLOCATABLE, HELD, FITS = 0, 1, 2, 3

# pod-level cases (evidence["case"])
NEVER_FITS = "never_fits"
DEVICES_MISSING = "devices_missing"
HELD_BY_OTHERS = "held_by_others"
EXCLUDED = "excluded_by_placement"
FITS_CASE = "fits"
CASE_IDS = {NEVER_FITS: "pod.gpu_never_fits", DEVICES_MISSING: "pod.gpu_devices_missing",
            HELD_BY_OTHERS: "pod.gpu_held_by_others", EXCLUDED: "pod.gpu_placement_excluded"}

REF_DP = "https://kubernetes.io/docs/concepts/extend-kubernetes/compute-storage-net/device-plugins/"
REF_TAINTS = "https://kubernetes.io/docs/concepts/scheduling-eviction/taint-and-toleration/"
REF_AFFINITY = "https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/"
REF_MIG = "https://docs.nvidia.com/datacenter/cloud-native/kubernetes/latest/index.html"
REF_TS = "https://github.com/NVIDIA/k8s-device-plugin#shared-access-to-gpus"
REF_QUOTA = ("https://kubernetes.io/docs/concepts/policy/resource-quotas/"
             "#resource-quota-for-extended-resources")
REF_PREEMPT = "https://kubernetes.io/docs/concepts/scheduling-eviction/pod-priority-preemption/"


def is_gpu_resource(name: str) -> bool:
    return name.startswith(GPU_RESOURCE_PREFIXES)  # one C call: this runs for every pod


def _node_gpu_resources(node: Mapping[str, Any]) -> tuple[dict[str, int], dict[str, int]]:
    st = node.get("status") or {}
    cap = {k: qty(v) for k, v in (st.get("capacity") or {}).items() if is_gpu_resource(k)}
    alloc = {k: qty(v) for k, v in (st.get("allocatable") or {}).items() if is_gpu_resource(k)}
    return cap, alloc


def _container_requests(c: Mapping[str, Any]) -> dict[str, int]:
    res = c.get("resources") or {}
    req, lim = res.get("requests") or {}, res.get("limits") or {}
    out = {}
    for k in set(req) | set(lim):
        if is_gpu_resource(k):
            # the API server defaults a missing request to the limit
            n = qty(req[k] if k in req else lim[k])
            if n:
                out[k] = n
    return out


def _requests(spec: Mapping[str, Any]) -> Mapping[str, int]:
    """pod_gpu_requests of a pod spec, not to be changed (it may be shared)."""
    if "initContainers" in spec or "overhead" in spec:
        return _gpu_requests(spec.get("containers"), spec.get("initContainers"),
                             spec.get("overhead"))
    return _gpu_requests_of(spec.get("containers"))


def pod_gpu_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    """The pod's effective GPU requests as kube-scheduler computes them: regular containers and
    sidecars (restartable init containers) add up; a plain init container runs alone, so the
    pod needs max(init + sidecars started before it, sum); plus spec.overhead."""
    return dict(_requests(pod.get("spec") or {}))


def _gpu_requests(containers: Any, init_containers: Any, overhead: Any) -> dict[str, int]:
    spec = {"containers": containers, "initContainers": init_containers, "overhead": overhead}
    reqs: dict[str, int] = {}
    for c in spec.get("containers") or ():
        for k, n in _container_requests(c).items():
            reqs[k] = reqs.get(k, 0) + n
    sidecars: dict[str, int] = {}
    init_max: dict[str, int] = {}
    for c in spec.get("initContainers") or ():
        cr = _container_requests(c)
        if c.get("restartPolicy") == "Always":
            for k, n in cr.items():
                reqs[k] = reqs.get(k, 0) + n
                sidecars[k] = sidecars.get(k, 0) + n
            cur = dict(sidecars)
        else:
            cur = {k: cr.get(k, 0) + sidecars.get(k, 0) for k in set(cr) | set(sidecars)}
        for k, n in cur.items():
            init_max[k] = max(init_max.get(k, 0), n)
    for k, n in init_max.items():
        reqs[k] = max(reqs.get(k, 0), n)
    for k, v in (spec.get("overhead") or {}).items():
        if is_gpu_resource(k) and qty(v):
            reqs[k] = reqs.get(k, 0) + qty(v)
    return {k: n for k, n in reqs.items() if n > 0}


# skeleton pods share their containers list (api/slim.PodCompactor); callers get a copy
_gpu_requests_of = ByIdentity(lambda containers: _gpu_requests(containers, None, None))


def holds(pod: Mapping[str, Any]) -> bool:
    """A pod bound to a node holds its requests until it is terminal (Succeeded/Failed)."""
    return bool((pod.get("spec") or {}).get("nodeName")) and \
        (pod.get("status") or {}).get("phase") not in TERMINAL


# -- placement: the scheduler's TaintToleration, NodeAffinity, NodeUnschedulable --------------

def _tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    for t in tolerations:
        eff = t.get("effect") or ""
        if eff and eff != taint.get("effect"):
            continue
        key = t.get("key") or ""
        op = t.get("operator") or "Equal"
        if key and key != taint.get("key"):
            continue
        if not key and op != "Exists":
            continue
        if op == "Exists" or (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _taint_str(t: Mapping[str, Any]) -> str:
    v = t.get("value")
    return f"{t.get('key')}{'=' + str(v) if v else ''}:{t.get('effect')}"


def _shown(vals: list, most: int = 5) -> str:
    """A selector's value list as evidence: the first few (a pod may list thousands)."""
    more = f", ... {len(vals) - most} more" if len(vals) > most else ""
    return "[" + ", ".join(repr(str(v)[:80]) for v in vals[:most]) + more + "]"


def _expr_matches(labels: Mapping[str, str], e: Mapping[str, Any]) -> tuple[bool, str]:
    key, op, vals = str(e.get("key") or ""), e.get("operator"), list(e.get("values") or ())
    have = labels.get(key)
    has = key in labels
    shown = f"node has {key}={have}" if has else f"node has no label {key}"
    if op == "In":
        ok = has and have in vals
    elif op == "NotIn":
        ok = not has or have not in vals
    elif op == "Exists":
        ok = has
    elif op == "DoesNotExist":
        ok = not has
    elif op in ("Gt", "Lt"):
        try:
            a, b = int(str(have)), int(str(vals[0]))
            ok = has and (a > b if op == "Gt" else a < b)
        except (ValueError, IndexError):
            ok = False
    else:
        ok = False
    want = f"{key} {op}" + (f" {_shown(vals)}" if op in ("In", "NotIn", "Gt", "Lt") else "")
    return ok, f"{want} ({shown})"


def _field_matches(node_name: str, e: Mapping[str, Any]) -> tuple[bool, str]:
    key, op, vals = e.get("key"), e.get("operator"), list(e.get("values") or ())
    if key != "metadata.name":
        return False, f"field {key} is not supported"
    ok = (node_name in vals) if op == "In" else (node_name not in vals) if op == "NotIn" \
        else False
    return ok, f"metadata.name {op} {_shown(vals)}"


def _term_failure(node_name: str, labels: Mapping[str, str],
                  term: Mapping[str, Any]) -> str | None:
    """None if the nodeSelectorTerm matches the node, else why not."""
    exprs, fields = term.get("matchExpressions") or (), term.get("matchFields") or ()
    if not exprs and not fields:
        return "empty term (matches no node)"
    for e in exprs:
        ok, why = _expr_matches(labels, e)
        if not ok:
            return why
    for e in fields:
        ok, why = _field_matches(node_name, e)
        if not ok:
            return why
    return None


def placement_failures(pod: Mapping[str, Any], node: Mapping[str, Any]) -> list[str]:
    """Every GPU-independent scheduler rule that keeps this pod off this node (empty: none)."""
    return [rule for rule, _ in _placement(pod, node)]


def _toleration_for(t: Mapping[str, Any]) -> str:
    if t.get("value"):
        return (f"{{key: {t.get('key')}, operator: Equal, value: {t.get('value')}, "
                f"effect: {t.get('effect')}}}")
    return f"{{key: {t.get('key')}, operator: Exists, effect: {t.get('effect')}}}"


def _placement(pod: Mapping[str, Any], node: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(rule that excludes the node, what would lift it) pairs."""
    spec, nspec = pod.get("spec") or {}, node.get("spec") or {}
    md = node.get("metadata") or {}
    name, labels = str(md.get("name") or ""), md.get("labels") or {}
    tol = list(spec.get("tolerations") or ())
    out: list[tuple[str, str]] = []
    uncordon = f"`kubectl uncordon {name}` if the cordon is not deliberate (drain, repair)"
    repair = f"repair the node (`kubectl gpu-doctor node {name}`)"
    taints = [t for t in nspec.get("taints") or () if t.get("effect") in NOSCHED_EFFECTS]
    keys = {t.get("key") for t in taints}
    if nspec.get("unschedulable") and UNSCHEDULABLE_TAINT not in keys and not _tolerates(
            tol, {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}):
        out.append(("cordoned (spec.unschedulable)", uncordon))
    ready = next((c.get("status") for c in (node.get("status") or {}).get("conditions") or ()
                  if c.get("type") == "Ready"), None)
    if ready not in (None, "True") and not keys & {NOT_READY_TAINT, UNREACHABLE_TAINT}:
        # the node lifecycle controller taints such nodes within seconds; until it does
        # the node is NotReady all the same
        taint_key = NOT_READY_TAINT if ready == "False" else UNREACHABLE_TAINT
        if not _tolerates(tol, {"key": taint_key, "effect": "NoSchedule"}):
            out.append((f"NotReady (Ready={ready})", repair))
    for t in taints:
        if not _tolerates(tol, t):
            key = t.get("key")
            what = {UNSCHEDULABLE_TAINT: " (cordoned)", NOT_READY_TAINT: " (NotReady)",
                    UNREACHABLE_TAINT: " (NotReady: unreachable)"}.get(key, "")
            hint = uncordon if key == UNSCHEDULABLE_TAINT else repair if key in (
                NOT_READY_TAINT, UNREACHABLE_TAINT) else (
                f"add the toleration `{_toleration_for(t)}` to the pod template (if the "
                f"taint's owner agrees: it reserves the node)")
            out.append((f"taint {_taint_str(t)} not tolerated{what}", hint))
    for k, v in (spec.get("nodeSelector") or {}).items():
        if labels.get(k) != v:
            have = f"node has {k}={labels[k]}" if k in labels else f"node has no label {k}"
            out.append((f"nodeSelector {k}={v} ({have})",
                        f"nodeSelector {k}: {labels[k]} to target it" if k in labels else
                        f"drop nodeSelector {k} or label the node (`kubectl label node {name} "
                        f"{k}={v}`)"))
    req = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
           .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if req is not None:
        terms = list(req.get("nodeSelectorTerms") or ())
        fails = [_term_failure(name, labels, t) for t in terms]
        hint = "change the pod's required nodeAffinity to match the node's labels"
        if not terms:
            out.append(("required nodeAffinity has no nodeSelectorTerms (matches no node)",
                        hint))
        elif all(f is not None for f in fails):
            if len(fails) == 1:
                out.append((f"required nodeAffinity {fails[0]}", hint))
            else:
                out.append((f"required nodeAffinity: none of {len(fails)} terms match ("
                            + "; ".join(f"term {i + 1}: {f}" for i, f in enumerate(fails[:3]))
                            + ")", hint))
    return out


def _no_room(node: Mapping[str, Any], placed: Sequence[tuple[str, str]],
             admits_nothing: Mapping[str, str]) -> list[tuple[str, str]]:
    """What keeps a node from having room whatever the pod tolerates: a NotReady kubelet runs
    no new pod, a cordoned node is being emptied, a kubelet that admits nothing leaves every
    new pod Pending. Only the reasons `placed` (the scheduler's rules) did not already name."""
    md = node.get("metadata") or {}
    name = str(md.get("name") or "")
    said = " ".join(r for r, _ in placed)
    repair = f"repair the node (`kubectl gpu-doctor node {name}`)"
    out: list[tuple[str, str]] = []
    ready = next((c.get("status") for c in (node.get("status") or {}).get("conditions") or ()
                  if c.get("type") == "Ready"), None)
    if ready not in (None, "True") and "NotReady" not in said:
        out.append((f"NotReady (Ready={ready}): its kubelet runs no new pod", repair))
    if (node.get("spec") or {}).get("unschedulable") and "cordoned" not in said:
        out.append(("cordoned (spec.unschedulable)",
                    f"`kubectl uncordon {name}` if the cordon is not deliberate (drain, repair)"))
    if name in admits_nothing and ready in (None, "True"):
        out.append((f"its kubelet admits no pod ({admits_nothing[name]})", repair))
    return out


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


def index_held(pods: Iterable[Mapping[str, Any]], resources: Iterable[str] | None = None
               ) -> tuple[dict[str, dict[str, int]], dict[str, list[Mapping[str, Any]]]]:
    """One pass over all pods: per node, the GPU requests held, and the pods holding them."""
    wanted = set(resources) if resources is not None else None
    held: dict[str, dict[str, int]] = {}
    by_node: dict[str, list[Mapping[str, Any]]] = {}
    for p in pods:
        spec = p.get("spec") or {}
        reqs = _requests(spec)
        if not reqs or not holds(p):  # most pods ask for no GPU at all
            continue
        if wanted is not None:
            reqs = {k: n for k, n in reqs.items() if k in wanted}
        if not reqs:
            continue
        nn = spec["nodeName"]
        h = held.setdefault(nn, {})
        for k, n in reqs.items():
            h[k] = h.get(k, 0) + n
        by_node.setdefault(nn, []).append(p)
    return held, by_node


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
        cap, alloc = _node_gpu_resources(n)
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
        pl = _placement(pod, n) if stage > TOO_SMALL else []
        if stage > TOO_SMALL:
            pl += _no_room(n, pl, admits_nothing or {})
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


# -- ResourceQuota ---------------------------------------------------------------------------

def _quota_keys(resource: str) -> tuple[str, str]:
    return (f"requests.{resource}", resource)


def quota_findings(pod: Mapping[str, Any], fit: Fit, quotas: Sequence[Mapping[str, Any]],
                   quota_events: Sequence[Mapping[str, Any]] = (),
                   now: dt.datetime | None = None) -> list[Finding]:
    """pod.gpu_quota_exhausted: a namespace quota on a requested GPU resource is used up.

    A quota is enforced when a pod is created, so an existing Pending pod already counts in
    `used`; what a used-up quota stops is the next pod: its controller's creates fail with
    `exceeded quota` (FailedCreate events). Warning when such events exist, info otherwise."""
    ns = (pod.get("metadata") or {}).get("namespace", "")
    all_req = dict(fit.requested)
    all_req.update(fit.extender)
    used_up = []
    for q in quotas:
        hard = (q.get("status") or {}).get("hard") or (q.get("spec") or {}).get("hard") or {}
        used = (q.get("status") or {}).get("used") or {}
        for r, n in sorted(all_req.items()):
            for key in _quota_keys(r):
                if key in hard:
                    h, u = qty(hard[key]), qty(used.get(key, 0))
                    if u >= h:
                        used_up.append({"quota": (q.get("metadata") or {}).get("name"),
                                        "resource": key, "hard": h, "used": u,
                                        "this_pod": n})
    if not used_up:
        return []
    blocked = []
    for e in quota_events:
        msg = str(e.get("message") or "")
        if "exceeded quota" in msg and any(u["resource"] in msg for u in used_up):
            obj = e.get("involvedObject") or e.get("regarding") or {}
            blocked.append({"object": f"{obj.get('kind')}/{obj.get('name')}",
                            "count": e.get("count") or 1, "message": " ".join(msg.split())[:300]})
    u = used_up[0]
    subject = f"pod/{pod_ref(pod)}"
    title = (f"namespace {ns}'s quota {u['quota']} is used up: {u['resource']} {u['used']}/"
             f"{u['hard']}" + (f"; {len(blocked)} controller(s) cannot create pods "
                               f"({blocked[0]['object']})" if blocked else
                               "; the next GPU pod here will be refused at creation"))
    return [catalog.make(
        "pod.gpu_quota_exhausted", "warning" if blocked else "info", subject, title,
        {"case": "quota", "namespace": ns, "quotas": used_up[:8], "failed_creates": blocked[:8]},
        f"ResourceQuota is checked when a pod is created: pods over it are refused (their "
        f"controller reports FailedCreate `exceeded quota`), and Pending pods count in `used` "
        f"as much as Running ones. Free quota (delete finished or stuck pods in {ns}: `kubectl "
        f"-n {ns} get pods --field-selector status.phase=Pending`) or ask the cluster admin to "
        f"raise `{u['resource']}` in `kubectl -n {ns} describe quota {u['quota']}`.",
        (REF_QUOTA,))]


# -- fleet ------------------------------------------------------------------------------------

def add_held(held: dict[str, int], pod: Mapping[str, Any]) -> None:
    """Add what `pod` holds on its node (index_held for one pod) to `held` (resource -> count):
    `nodes` adds up each node's pods as the list is read (analysis/podfold.py)."""
    spec = pod.get("spec") or {}
    reqs = _requests(spec)
    if reqs and holds(pod):
        for k, n in reqs.items():
            held[k] = held.get(k, 0) + n


def node_free(node: Mapping[str, Any], pods_on_node: Iterable[Mapping[str, Any]],
              held: Mapping[str, int] | None = None) -> int | None:
    """Free GPU devices on a node (allocatable minus what bound, non-terminal pods request),
    summed over its GPU resources; None if it advertises none. `held`: what its pods hold,
    already added up (add_held; then `pods_on_node` is not read)."""
    cap, alloc = _node_gpu_resources(node)
    res = [k for k in set(cap) | set(alloc) if k not in EXTENDER_ONLY
           and (cap.get(k) or alloc.get(k))]
    if not res:
        return None
    if held is not None:
        h: Mapping[str, int] = held
    else:
        by, _ = index_held(pods_on_node, res)
        h = by.get(str((node.get("metadata") or {}).get("name") or ""), {})
    return sum(max(0, alloc.get(k, 0) - h.get(k, 0)) for k in res)


# -- a pod its controller cannot create ---------------------------------------------------------

_QUOTA_MSG = re.compile(r"exceeded quota: ([^,]+), requested: (.*?), used: (.*?), "
                        r"limited: (\S+)")


def _kv(text: str) -> dict[str, int]:
    out = {}
    for part in text.split(","):
        k, sep, v = part.strip().partition("=")
        if sep:
            out[k] = qty(v)
    return out


def refused_creation(namespace: str, name: str, quotas: Sequence[Mapping[str, Any]],
                     events: Sequence[Mapping[str, Any]]) -> list[Finding]:
    """pod.gpu_quota_exhausted for a pod that does not exist because a GPU quota refuses its
    creation: a StatefulSet's `trainer-0` is never created, its controller records
    `FailedCreate ... exceeded quota` naming the pod (pure; [] when no such event)."""
    needle = f'pods "{name}"'
    refused, blocked = [], []
    for e in events:
        msg = " ".join(str(e.get("message") or "").split())
        m = _QUOTA_MSG.search(msg) if needle in msg else None
        if not m:
            continue
        req, used, lim = _kv(m.group(2)), _kv(m.group(3)), _kv(m.group(4))
        gpu = [k for k in lim if is_gpu_resource(k[len("requests."):] if
                                                 k.startswith("requests.") else k)]
        if not gpu:
            continue
        obj = e.get("involvedObject") or e.get("regarding") or {}
        blocked.append({"object": f"{obj.get('kind')}/{obj.get('name')}",
                        "count": e.get("count") or 1, "message": msg[:300]})
        for k in gpu:
            refused.append({"quota": m.group(1), "resource": k, "hard": lim[k],
                            "used": used.get(k, 0), "this_pod": req.get(k, 0)})
    if not refused:
        return []
    u = refused[-1]
    now_hard = next(((q.get("status") or {}) for q in quotas
                     if (q.get("metadata") or {}).get("name") == u["quota"]), None)
    if now_hard:  # the quota as it stands now, not as the last refusal saw it
        u = dict(u, hard=qty((now_hard.get("hard") or {}).get(u["resource"], u["hard"])),
                 used=qty((now_hard.get("used") or {}).get(u["resource"], u["used"])))
        refused[-1] = u
    return [catalog.make(
        "pod.gpu_quota_exhausted", "warning", f"pod/{namespace}/{name}",
        f"pod {namespace}/{name} does not exist: {blocked[-1]['object']} cannot create it, "
        f"quota {u['quota']} refuses {u['this_pod']} more {u['resource']} ({u['used']}/"
        f"{u['hard']} used)",
        {"case": "quota", "namespace": namespace, "pod_exists": False,
         "quotas": refused[-4:], "failed_creates": blocked[-8:]},
        f"The pod is not Pending: it was never created, because ResourceQuota {u['quota']} "
        f"in {namespace} has no room for its GPUs (pods count in `used` while Pending too). "
        f"Free quota (delete finished or stuck GPU pods: `kubectl -n {namespace} get pods "
        f"--field-selector status.phase=Pending`) or ask the cluster admin to raise "
        f"`{u['resource']}` (`kubectl -n {namespace} describe quota {u['quota']}`); the "
        f"controller retries by itself.", (REF_QUOTA,))]

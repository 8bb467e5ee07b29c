"""What GPUs a pod asks for, counted as kube-scheduler counts them, and what the pods bound to a
node hold of them.

Why a module of its own: the fit of a Pending pod (fit.py), the free GPUs of every node of a
fleet (`nodes`, podfold.py) and the black-hole verdict all add up the same requests (regular
containers and sidecars add up, a plain init container runs alone, plus spec.overhead), and a
pod holds them until it is terminal. One reading, so they never disagree.

Pure functions over raw API dicts; no I/O; one pass over the pods.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from ..common import GPU_RESOURCE_PREFIXES, ByIdentity
from ..quantity import count as qty


# HAMi's per-device memory/core shares: the HAMi scheduler extender judges them from the node's
# hami.io/node-nvidia-register annotation; no node has them in capacity.
EXTENDER_ONLY = ("nvidia.com/gpumem", "nvidia.com/gpucores", "nvidia.com/gpumem-percentage",
                 "nvidia.com/priority")
TERMINAL = ("Succeeded", "Failed")


def is_gpu_resource(name: str) -> bool:
    return name.startswith(GPU_RESOURCE_PREFIXES)  # one C call: this runs for every pod


def node_gpu_resources(node: Mapping[str, Any]) -> tuple[dict[str, int], dict[str, int]]:
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


# -- fleet ------------------------------------------------------------------------------------

def add_held(held: dict[str, int], pod: Mapping[str, Any]) -> None:
    """Add what `pod` holds on its node (index_held for one pod) to `held` (resource -> count):
    `nodes` adds up each node's pods as the list is read (analysis/resources/podfold.py)."""
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
    cap, alloc = node_gpu_resources(node)
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

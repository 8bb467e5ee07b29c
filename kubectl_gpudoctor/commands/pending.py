"""`pod Y` for an unscheduled GPU pod: the three lists the fit needs, fetched at once.

Why a module of its own: the fit (analysis/fit.py) needs every node, every pod bound to a node
and the namespace's ResourceQuotas. That is three LIST calls whatever the cluster size
(resourceVersion=0: served from the API server's watch cache; the pod list is cut server-side
to bound, unfinished pods with the same field selector kube-scheduler's own informer uses), plus
one event list only when a quota is used up. A list we may not read is said so (a skipped
check and a log line) and the pod report falls back to the scheduler's own message.
"""
from __future__ import annotations

import datetime as dt
import time
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from node_probe.protocol import Finding

from .. import errors
from ..analysis import admission, fit
from ..api.kube import seg, worker_pool

if TYPE_CHECKING:
    from ..report.output import Output

CACHED = ("resourceVersion", "0")
BOUND_UNFINISHED = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
LIST_TIMEOUT_S = 30.0
# what degrades the fit instead of ending the run: an API answer we may not read, a list
# that times out (an unreachable API server ends the run anyway at the next call)
_API_ERRORS = (errors.ApiError,)


def applies(pod: Mapping[str, Any]) -> bool:
    """An unscheduled, Pending pod asking for a GPU resource."""
    spec, st = pod.get("spec") or {}, pod.get("status") or {}
    return (not spec.get("nodeName") and (st.get("phase") or "Pending") == "Pending"
            and bool(fit.pod_gpu_requests(pod)))


def _why(exc: errors.ApiError) -> str:
    return f"{exc.status} {exc.message}"[:200]


def _items(kube, path: str, query: Sequence[tuple[str, str]]) -> list[dict]:
    return list((kube.get_json(path, [CACHED, *query], LIST_TIMEOUT_S) or {}).get("items") or ())


def collect(kube, pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]], out: Output,
            now: dt.datetime | None = None) -> list[Finding] | None:
    """The fit findings for `pod`, or None when it does not apply or could not be computed."""
    if not applies(pod):
        return None
    now = now or dt.datetime.now(dt.timezone.utc)
    ns = (pod.get("metadata") or {}).get("namespace") or "default"
    t0 = time.monotonic()
    out.say("computing the GPU fit of the pod against every node")
    with worker_pool(3, "fit") as pool:   # a failed list does not wait for the others
        f_nodes = pool.submit(_items, kube, "/api/v1/nodes", ())
        f_pods = pool.submit(_items, kube, "/api/v1/pods", [("fieldSelector", BOUND_UNFINISHED)])
        f_quotas = pool.submit(_items, kube, f"/api/v1/namespaces/{seg(ns)}/resourcequotas", ())
        try:
            nodes, pods = f_nodes.result(), f_pods.result()
        except _API_ERRORS as exc:
            out.check("api.gpu_fit", "skipped", time.monotonic() - t0,
                      f"cannot list nodes and pods: {_why(exc)}")
            out.log("warning", f"the GPU fit was not computed (cannot list nodes and pods: "
                               f"{_why(exc)}); showing the scheduler's message instead")
            return None
        try:
            quotas = f_quotas.result()
        except _API_ERRORS as exc:
            quotas = []
            out.check("api.resource_quotas", "skipped", time.monotonic() - t0, _why(exc))
            out.log("warning", f"ResourceQuotas in {ns} not readable ({_why(exc)}); the quota "
                               f"case was not judged")
    quota_events: list[dict] = []
    # a node whose kubelet admits nothing has no room, whatever its free GPUs say
    f = fit.compute(pod, nodes, pods, now, admission.stalled_nodes(pods, now))
    if f is None:
        return None
    if fit.quota_findings(pod, f, quotas, (), now):
        try:  # who is refused by the used-up quota (controllers' FailedCreate events)
            quota_events = _items(kube, f"/api/v1/namespaces/{seg(ns)}/events",
                                  [("fieldSelector", "reason=FailedCreate")])
        except _API_ERRORS as exc:
            out.log("warning", f"events in {ns} not readable: {_why(exc)}")
    found = fit.findings(pod, f, events, now) + fit.quota_findings(pod, f, quotas,
                                                                   quota_events, now)
    out.check("api.gpu_fit", "ok", time.monotonic() - t0,
              f"{f.case}: {len(nodes)} nodes, {len(pods)} bound pods")
    return found


def not_created(kube, namespace: str, name: str, out: Output) -> list[Finding]:
    """For `pod NAME` that does not exist: is a GPU quota refusing its creation (a StatefulSet's
    `trainer-0`)? Two lists; [] when not, or when they may not be read (the caller then says
    "not found" as before)."""
    t0 = time.monotonic()
    try:
        evs = _items(kube, f"/api/v1/namespaces/{seg(namespace)}/events",
                     [("fieldSelector", "reason=FailedCreate")])
        if not any(f'pods "{name}"' in str(e.get("message") or "") for e in evs):
            return []
        quotas = _items(kube, f"/api/v1/namespaces/{seg(namespace)}/resourcequotas", ())
    except _API_ERRORS:
        return []
    found = fit.refused_creation(namespace, name, quotas, evs)
    if found:
        out.check("api.pod_creation", "ok", time.monotonic() - t0, "refused by quota")
    return found

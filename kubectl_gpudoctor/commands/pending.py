"""`pod Y` for an unscheduled GPU pod: the three lists the fit needs, fetched at once.

Why a module of its own: the fit (analysis/scheduling/fit.py) needs every node, every pod
bound to a node and the namespace's ResourceQuotas. That is three LIST calls whatever the
cluster size (resourceVersion=0: served from the API server's watch cache; the pod list is cut
server-side to bound, unfinished pods with the same field selector kube-scheduler's own
informer uses), plus one event list only when a quota is used up. A list we may not read is
said so (a skipped check and a log line) and the pod report falls back to the scheduler's own
message.
"""
from __future__ import annotations

import datetime as dt
import time
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from node_probe.protocol import Finding

from .. import errors
from ..analysis.scheduling import fit, fit_findings, gpu_held, quota, schedulers
from ..analysis.stuck import admission
from ..api import extra_lists
from ..api.kube import seg, worker_pool
from ..api.slim import slim_workload

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
            and bool(gpu_held.pod_gpu_requests(pod)))


def _why(exc: errors.ApiError) -> str:
    return f"{exc.status} {exc.message}"[:200]


def _items(kube, path: str, query: Sequence[tuple[str, str]]) -> list[dict]:
    return list((kube.get_json(path, [CACHED, *query], LIST_TIMEOUT_S) or {}).get("items") or ())


def collect(kube, pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]], out: Output,
            now: dt.datetime | None = None) -> list[Finding] | None:
    """The findings for `pod`: what its queueing system or scheduler says (Kueue, Volcano, KAI,
    HAMi: queue_findings), then the fit; None when it does not apply or neither could be
    computed."""
    if not applies(pod):
        return None
    got = _fit(kube, pod, events, out, now)
    found, f = got if got is not None else (None, None)
    queued = queue_findings(kube, pod, events, out, f)
    if found is None:
        return queued or None
    return queued + found


def _free(f: "fit.Fit | None") -> tuple[dict[str, int] | None, int | None]:
    """GPUs free on the nodes that would take the pod, and how many nodes (from the fit)."""
    if f is None:
        return None, None
    takers = [n for n in f.nodes if n.stage == fit.FITS and not n.excluded_by]
    return {r: sum(n.free(r) for n in takers) for r in f.requested}, len(takers)


def queue_findings(kube, pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]],
                   out: Output, f: "fit.Fit | None" = None) -> list[Finding]:
    """When a queueing system or another scheduler holds the pod, its reason, from its own
    objects (read only when their API is served: api/extra_lists.py), joined with the nodes'
    free GPUs from the fit. [] for a pod kube-scheduler alone handles."""
    system = schedulers.system_of(pod)
    if system is None:
        return []
    t0 = time.monotonic()
    free, takers = _free(f)
    requests = gpu_held.pod_gpu_requests(pod)
    md = pod.get("metadata") or {}
    ns = md.get("namespace") or "default"
    notes: list[str] = []
    found: list[Finding] = []
    if system == "kueue":
        found = _kueue(kube, pod, ns, requests, free, takers, notes)
    elif system in ("volcano", "kai"):
        group = {"volcano": "scheduling.volcano.sh", "kai": "scheduling.run.ai"}[system]
        _, served, note = extra_lists.discover(kube, group, LIST_TIMEOUT_S)
        if note:
            notes.append(note)
        ann = md.get("annotations") or {}
        if system == "volcano" and "v1beta1" in served:
            name = ann.get(schedulers.VOLCANO_GROUP_ANNOTATION)
            pg = q = None
            pg_events: list = []
            if name:
                pg, n1, _ = extra_lists.get_object(
                    kube, f"/apis/{group}/v1beta1/namespaces/{seg(ns)}/podgroups/{seg(name)}",
                    LIST_TIMEOUT_S)
                notes += [n1] if n1 else []
            if pg is not None:
                qname = (pg.get("spec") or {}).get("queue") or "default"
                q, n2, _ = extra_lists.get_object(
                    kube, f"/apis/{group}/v1beta1/queues/{seg(qname)}", LIST_TIMEOUT_S)
                notes += [n2] if n2 else []
                try:
                    pg_events = _items(kube, f"/api/v1/namespaces/{seg(ns)}/events",
                                       [("fieldSelector", "involvedObject.kind=PodGroup,"
                                                          f"involvedObject.name={name}")])
                except _API_ERRORS as exc:
                    notes.append(f"events of PodGroup {name}: {_why(exc)}")
            found = schedulers.volcano(pod, requests, pg, q, pg_events, free, takers)
        elif system == "kai" and "v2alpha2" in served:
            name = ann.get(schedulers.KAI_GROUP_ANNOTATION)
            pg = None
            if name:
                pg, n1, _ = extra_lists.get_object(
                    kube, f"/apis/{group}/v2alpha2/namespaces/{seg(ns)}/podgroups/{seg(name)}",
                    LIST_TIMEOUT_S)
                notes += [n1] if n1 else []
            found = schedulers.kai(pod, requests, pg, free, takers)
    elif system == "hami":
        found = schedulers.hami(pod, events, free, takers)
    for note in notes:
        out.log("debug", note)
    out.check(f"api.{system}", "ok" if not notes else "skipped", time.monotonic() - t0,
              "; ".join(notes)[:300])
    return found


def _kueue(kube, pod: Mapping[str, Any], ns: str, requests: Mapping[str, int],
           free: Mapping[str, int] | None, takers: int | None,
           notes: list[str]) -> list[Finding]:
    group = "kueue.x-k8s.io"
    v, _, note = extra_lists.discover(kube, group, LIST_TIMEOUT_S)
    if v is None:
        notes.append(note or "")
        return schedulers.kueue(pod, requests, None, None, False, None, None, free, takers,
                                not_served="not served" in str(note))
    base = f"/apis/{group}/{v}"
    wls, n1 = extra_lists.list_objects(kube, f"{base}/namespaces/{seg(ns)}/workloads",
                                       timeout=LIST_TIMEOUT_S, each=slim_workload)
    notes += [n1] if n1 else []
    wl = schedulers.workload_of(pod, wls or ())
    labels = (pod.get("metadata") or {}).get("labels") or {}
    lq_name = ((wl or {}).get("spec") or {}).get("queueName") or labels.get(
        schedulers.KUEUE_QUEUE_LABEL)
    lq = cq = everyone = None
    lq_missing = False
    if lq_name:
        lq, n2, lq_missing = extra_lists.get_object(
            kube, f"{base}/namespaces/{seg(ns)}/localqueues/{seg(lq_name)}", LIST_TIMEOUT_S)
        notes += [n2] if n2 and not lq_missing else []
    cq_name = (((wl or {}).get("status") or {}).get("admission") or {}).get("clusterQueue") \
        or ((lq or {}).get("spec") or {}).get("clusterQueue")
    if cq_name:
        cq, n3, _ = extra_lists.get_object(kube, f"{base}/clusterqueues/{seg(cq_name)}",
                                           LIST_TIMEOUT_S)
        notes += [n3] if n3 else []
    if cq is not None:  # who holds its quota: every Workload, bounded
        everyone, n4 = extra_lists.list_objects(kube, f"{base}/workloads",
                                                timeout=LIST_TIMEOUT_S, each=slim_workload,
                                                most=extra_lists.MAX_QUEUE_ITEMS)
        notes += [n4] if n4 else []
    return schedulers.kueue(pod, requests, wls, lq, lq_missing, cq, everyone, free, takers)


def lists(kube, pod: Mapping[str, Any], out: Output
          ) -> tuple[list[dict], list[dict], list[dict]] | None:
    """(every node, every bound unfinished pod, the namespace's ResourceQuotas): the three
    lists the fit needs, read at once; None (said as a skipped check) when nodes and pods
    cannot be listed."""
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
    return nodes, pods, quotas


def judge(kube, pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]], out: Output,
          nodes: Sequence[dict], pods: Sequence[dict], quotas: Sequence[dict],
          now: dt.datetime | None = None) -> tuple[list[Finding], "fit.Fit"] | None:
    """(the fit findings for `pod`, the fit) over lists already read; None when the fit does
    not apply."""
    now = now or dt.datetime.now(dt.timezone.utc)
    ns = (pod.get("metadata") or {}).get("namespace") or "default"
    t0 = time.monotonic()
    quota_events: list[dict] = []
    # a node whose kubelet admits nothing has no room, whatever its free GPUs say
    f = fit.compute(pod, nodes, pods, now, admission.stalled_nodes(pods, now))
    if f is None:
        return None
    if quota.quota_findings(pod, f, quotas, (), now):
        try:  # who is refused by the used-up quota (controllers' FailedCreate events)
            quota_events = _items(kube, f"/api/v1/namespaces/{seg(ns)}/events",
                                  [("fieldSelector", "reason=FailedCreate")])
        except _API_ERRORS as exc:
            out.log("warning", f"events in {ns} not readable: {_why(exc)}")
    found = fit_findings.findings(pod, f, events, now) + quota.quota_findings(pod, f, quotas,
                                                                   quota_events, now)
    out.check("api.gpu_fit", "ok", time.monotonic() - t0,
              f"{f.case}: {len(nodes)} nodes, {len(pods)} bound pods")
    return found, f


def _fit(kube, pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]], out: Output,
         now: dt.datetime | None = None) -> tuple[list[Finding], "fit.Fit"] | None:
    """(the fit findings for `pod`, the fit), or None when it could not be computed."""
    got = lists(kube, pod, out)
    if got is None:
        return None
    return judge(kube, pod, events, out, *got, now=now)


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
    found = quota.refused_creation(namespace, name, quotas, evs)
    if found:
        out.check("api.pod_creation", "ok", time.monotonic() - t0, "refused by quota")
    return found

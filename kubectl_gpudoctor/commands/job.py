"""`job NAME [--kind KIND]` / `job -l SELECTOR`: the node (or rank) that holds up a
multi-node GPU job.

Why: when one node of a 64-node job is bad, the whole job hangs in a collective or crawls at
its slowest rank, and nothing says which node. This resolves the job to its pods and their
nodes (analysis/job/kinds.py: batch Jobs, JobSets, Kubeflow jobs, MPIJobs, LeaderWorkerSets,
Ray, Volcano, Kueue Workloads), judges every node with the same API-side analysis as `nodes`
(commands/nodes.scan, restricted to the job's nodes: lists, not per-node calls), with --probe
also the node side (agent exec where one runs, else debug pods; bounded concurrency, one
deadline, a node that does not answer in time is named, not waited on), then compares the
nodes and the ranks and names the odd one out (analysis/job/).
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import threading
import time
from typing import Any, Callable, Mapping

from node_probe.protocol import ExitStatus, Finding, ProtocolError, Severity
from node_probe.protocol.catalog import make

from .. import errors
from ..analysis.scheduling import gpu_held
from ..analysis.common import node_is_ready, pod_ref
from ..analysis.job import kinds as jk
from ..analysis.job import nodes as jn
from ..analysis.job import ranks as jr
from ..analysis.job import verdict as jv
from ..api import pager
from ..api.kube import Kube, seg, worker_pool
from ..reach.probe_run import Settings, now_utc
from ..report import job_table
from ..report.output import Output
from ..session import Session
from . import nodes as fleet_scan
from . import pending as pending_fit
from .cluster import run_cluster

MAX_JOB_PODS = 20_000     # a job's pods read (a selector matching more is refused)
MAX_SUGGEST = 500         # names per kind read for "did you mean"


@dataclasses.dataclass(frozen=True)
class Resolved:
    kind: jk.Kind | None      # None: `-l SELECTOR`
    version: str | None
    obj: Mapping[str, Any] | None
    query: jk.PodQuery | None


def _get(kube: Kube, kind: jk.Kind, ns: str, name: str, out: Output
         ) -> tuple[str, dict] | None:
    """The object of `kind` named `name`, from the first version the cluster serves; None when
    there is none (404: not there, or the API not served -- both quiet)."""
    for v in kind.versions:
        try:
            return v, kube.get_json(kind.path(v, seg(ns), seg(name)))
        except errors.NotFound:
            continue
        except errors.Forbidden as exc:
            out.log("warning", f"cannot read {kind.qualified}: {exc.one_line()}")
            return None
    return None


def _names_of(kube: Kube, kind: jk.Kind, ns: str) -> list[str] | None:
    for v in kind.versions:
        try:
            doc = kube.get_json(kind.path(v, seg(ns)), [("limit", str(MAX_SUGGEST))])
        except errors.NotFound:
            continue  # this version (or the whole API) is not served
        except errors.ApiError:
            return None
        items = doc.get("items") if isinstance(doc, Mapping) else None
        return [str((i.get("metadata") or {}).get("name")) for i in items or ()
                if isinstance(i, Mapping) and isinstance(i.get("metadata"), Mapping)]
    return None


def _label(k: jk.Kind) -> str:
    return k.kind if k.group in ("batch",) else f"{k.kind}.{k.group}" if k.kind == "Job" \
        else k.kind


def resolve(kube: Kube, ns: str, name: str, kind_text: str | None, out: Output) -> Resolved:
    """Which job `name` is: --kind when given, else every kind the cluster serves."""
    candidates = list(jk.KINDS)
    if kind_text:
        candidates = jk.by_name(kind_text)
        if not candidates:
            raise errors.UsageError(f'unknown --kind "{kind_text}": one of '
                                    f'{", ".join(jk.kind_names())}')
    with worker_pool(min(8, len(candidates)), "kind") as pool:
        futs = [(k, pool.submit(_get, kube, k, ns, name, out)) for k in candidates]
        found = [(k, f.result()) for k, f in futs]
    found = [(k, r) for k, r in found if r is not None]
    if len(found) > 1:
        which = ", ".join(f"{_label(k)}" for k, _ in found)
        raise errors.UsageError(f'"{name}" in namespace {ns} is more than one kind of job '
                                f'({which}); say which with --kind')
    if not found:
        with worker_pool(8, "kind") as pool:
            lists = [(k, pool.submit(_names_of, kube, k, ns)) for k in candidates]
            names = {_label(k): f.result() or [] for k, f in lists}
        close = jk.suggestions(name, names)
        what = f"{candidates[0].kind} " if kind_text else "job "
        hint = f"did you mean {', '.join(close)}?" if close else ""
        raise errors.NotFound(f'no {what}named "{name}" in namespace {ns}', hint=hint)
    kind, (version, obj) = found[0]
    if kind.kind == "Workload":  # Kueue: the job that owns it
        owner = jk.owner_of(obj)
        if owner is not None:
            got = _get(kube, owner[0], ns, owner[1], out)
            if got is not None:
                out.log("info", f"workload {name} is {owner[0].kind} {owner[1]}")
                return Resolved(owner[0], got[0], got[1], jk.pod_query(owner[0], got[1]))
    return Resolved(kind, version, obj, jk.pod_query(kind, obj))


def _pending_fit(kube: Kube, pods: list, events: Mapping[str, Any], rank_fs: list,
                 out: Output) -> list:
    """The GPU fit `pod Y` gives an unscheduled GPU pod (analysis/fit: e.g. the only node left
    has 7 allocatable GPUs where 8 are asked), computed ONCE per job: for the first Pending
    rank asking for GPUs, over the node, pod and quota lists read once; the other Pending
    ranks asking for the same GPUs are named in its evidence. A node the job's own ranks fill
    is not "held by others" for its next rank: such nodes are left out of the fit (counted in
    the evidence). The fit's findings replace that rank's scheduler-message explanation."""
    pend = [p for p in pods if pending_fit.applies(p)]
    if not pend:
        return rank_fs
    first = pend[0]
    want = gpu_held.pod_gpu_requests(first)
    got = pending_fit.lists(kube, first, out)
    if got is None:
        return rank_fs
    nodes, bound, quotas = got
    own = {str((p.get("metadata") or {}).get("uid") or "") for p in pods}
    on: dict[str, list] = {}
    for p in bound:
        on.setdefault(str((p.get("spec") or {}).get("nodeName") or ""), []).append(p)
    need = sum(want.values())
    taken = set()
    for n in nodes:
        name = str((n.get("metadata") or {}).get("name") or "")
        here = on.get(name, ())
        if any(str((p.get("metadata") or {}).get("uid") or "") in own for p in here):
            free = gpu_held.node_free(n, here)
            if free is not None and free < need:
                taken.add(name)
    uid = str((first.get("metadata") or {}).get("uid") or "")
    judged = pending_fit.judge(kube, first, list(events.get(uid, ())), out,
                               [n for n in nodes if (n.get("metadata") or {}).get("name")
                                not in taken], bound, quotas)
    if judged is None:
        return rank_fs
    found, _ = judged
    same = [pod_ref(p) for p in pend if gpu_held.pod_gpu_requests(p) == want]
    subject = f"pod/{pod_ref(first)}"
    extra = {"pending_ranks": same[:jn.MAX_RANKS_SHOWN], "pending_ranks_total": len(same),
             "fit_computed_for": pod_ref(first), "requested_per_rank": dict(want),
             "nodes_filled_by_the_job": len(taken)}
    more = (f"; {len(same) - 1} more Pending rank(s) ask the same ({', '.join(same[1:3])}"
            f"{', ...' if len(same) > 3 else ''})") if len(same) > 1 else ""
    found = [dataclasses.replace(f, evidence={**f.evidence, **extra},
                                 title=f.title + (more if f.severity.rank >= Severity.WARNING.rank else ""))
             for f in found]
    covered = {f"pod/{r}" for r in same}   # each finding once: the fit speaks for them
    keep = [f for f in rank_fs
            if not (f.subject in covered and f.id == "pod.pending_explained")]
    return found + keep


def _job_pods(kube: Kube, ns: str, selector: str, out: Output) -> list[dict]:
    try:
        items, _ = pager.list_items(kube, f"/api/v1/namespaces/{seg(ns)}/pods",
                                    [("labelSelector", selector)], each=None)
    except errors.ApiError as exc:
        raise exc.about(f"pods -l {selector} in {ns}", "list") from None
    if len(items) > MAX_JOB_PODS:
        raise errors.UsageError(f"-l {selector} selects {len(items)} pods in {ns} (more than "
                                f"{MAX_JOB_PODS}): narrow it")
    return [p for p in items if isinstance(p, dict)]


WAITERS_SHOWN = 3   # nodes whose gpu.collective_spin records are shown (the rows count all)


class _JobNodeOut(fleet_scan._NodeOut):
    """One node's probe output in `job --probe`: as `nodes --probe`, except that the waiting
    signature (gpu.collective_spin, one per GPU on every node that waits for a peer: 4,096
    lines on a hung 512-node job) is held back; `_show_waiters` shows a few, once compared."""

    def __init__(self, out: Output) -> None:
        super().__init__(out)
        self.held: list[tuple[Mapping[str, Any], str | None]] = []

    def node_record(self, rec: Mapping[str, Any], node: str | None = None) -> None:
        if rec.get("kind") == "finding" and rec.get("id") in jn.WAITING:
            if len(self.held) < 64:
                self.held.append((rec, node))
            try:
                f = Finding.from_record(rec)
            except ProtocolError:
                return
            self.found.setdefault(f.key(), f)
            return
        super().node_record(rec, node)


def _show_waiters(outs: Mapping[str, "_JobNodeOut"], out: Output) -> None:
    """The held-back waiting records: the first GPU's of the first WAITERS_SHOWN nodes, and
    one line saying how many nodes wait (each node's row carries its signature)."""
    waiting = sorted(n for n, o in outs.items() if o.held)
    for n in waiting[:WAITERS_SHOWN]:
        rec, node = outs[n].held[0]
        outs[n]._out.node_record(rec, node=node)
    if len(waiting) > WAITERS_SHOWN or any(len(outs[n].held) > 1 for n in waiting):
        gpus = sum(len(outs[n].held) for n in waiting)
        out.log("info", f"gpu.collective_spin (a GPU waiting in a collective) on {gpus} GPU(s) "
                        f"of {len(waiting)} node(s); shown for "
                        f"{min(len(waiting), WAITERS_SHOWN)} node(s), one GPU each")


def _probe_job(kube: Kube, names: list[str], nodes: Mapping[str, dict],
               by_node: Mapping[str, list], settings: Settings, out: Output,
               node_findings: dict[str, list], on_pod: Callable, max_probes: int
               ) -> tuple[dict[str, str], list[str]]:
    """The node probe on each node of the job, `concurrency` at a time, all within ONE
    deadline (--timeout): by exec in the agent where one runs, else a debug pod. Returns
    (node -> path or failure, the nodes that did not answer in time)."""
    from ..reach.probe_run import NodeView, run_probe
    with_agent = fleet_scan._agent_nodes(kube, settings, out) & set(names) \
        if settings.agent else set()
    pods_needed = [n for n in names if n not in with_agent]
    if len(pods_needed) > max_probes:
        raise errors.UsageError(
            f"--probe would start debug pods on {len(pods_needed)} nodes of the job without "
            f"a running agent (more than --max-probes {max_probes}); raise --max-probes or "
            f"install the agent (`kubectl gpu-doctor agent install`)")
    deadline = time.monotonic() + settings.timeout_s
    stop = threading.Event()
    no_agent = dataclasses.replace(settings, agent=False)
    outs: dict[str, fleet_scan._NodeOut] = {}
    paths: dict[str, str] = {}

    def one(name: str) -> str:
        left = deadline - time.monotonic()
        if left < 2 or stop.is_set():
            return "not started"
        s = settings if name in with_agent else no_agent
        s = dataclasses.replace(s, timeout_s=max(2.0, left - 1),
                                trace_s=min(s.trace_s, max(0.0, left - 2)),
                                start_timeout_s=min(s.start_timeout_s, max(1.0, left - 1)))
        view = NodeView(nodes[name], by_node.get(name, []), None, None,
                        list(node_findings.get(name, ())))
        return run_probe(kube, view, s, outs[name], (), stop.is_set, on_pod, True)

    pool = cf.ThreadPoolExecutor(max_workers=max(1, settings.concurrency),
                                 thread_name_prefix="probe")
    futs = {}
    late: list[str] = []
    try:
        for name in names:
            if name in nodes:
                outs[name] = _JobNodeOut(out)
                futs[pool.submit(one, name)] = name
        try:
            for fut in cf.as_completed(futs, timeout=max(0.0, deadline - time.monotonic())):
                name = futs[fut]
                try:
                    paths[name] = str(fut.result())
                except errors.GpuDoctorError as exc:
                    paths[name] = "failed"
                    out.log("error", f"{name}: {exc.one_line()}")
        except cf.TimeoutError:
            pass
    finally:
        stop.set()
        pool.shutdown(wait=False, cancel_futures=True)
    late = sorted(n for f, n in futs.items() if n not in paths or paths[n] == "not started")
    for n in late:
        paths[n] = "no answer"
    if late:
        out.mark_incomplete(f"partial: {len(late)} of {len(futs)} nodes did not answer the "
                            f"probe within {settings.timeout_s:g}s: {', '.join(late[:8])}"
                            + (" ..." if len(late) > 8 else ""))
    for name, node_out in outs.items():
        if name not in late:
            node_findings.setdefault(name, []).extend(node_out.found.values())
    _show_waiters({n: o for n, o in outs.items() if n not in late}, out)
    return paths, late


def job(session: Session, o: dict, name: str | None, kind_text: str | None,
        selector: str | None, max_probes: int = 20) -> ExitStatus:
    if bool(name) == bool(selector):
        raise errors.UsageError("give a job NAME or -l SELECTOR (not both)")
    if selector and kind_text:
        raise errors.UsageError("--kind applies to a job NAME, not to -l SELECTOR")
    doc: dict[str, Any] = {}
    rows: list[dict] = []

    def preamble() -> str:
        return job_table.table(doc, rows) if doc else ""

    def run(kube: Kube, out: Output, s: Settings, reg: Callable) -> None:
        t0 = time.monotonic()
        ns = s.namespace
        if selector:
            r = Resolved(None, None, None, jk.PodQuery(selector))
            label = f"pods -l {selector} in {ns}"
        else:
            r = resolve(kube, ns, name, kind_text, out)
            label = f"{_label(r.kind)} {ns}/{(r.obj.get('metadata') or {}).get('name')}"
        out.report.target["name"] = label
        job = {"kind": r.kind.kind if r.kind else None,
               "group": r.kind.group if r.kind else None,
               "resource": r.kind.qualified if r.kind else None,
               "name": name, "namespace": ns, "selector": selector,
               "pod_selector": r.query.selector if r.query else None,
               "kind_flag": bool(kind_text), "label": label}
        pods = _job_pods(kube, ns, r.query.selector, out) if r.query else []
        if r.query:
            pods = jk.owned(pods, r.query)
        elif r.obj is not None:
            out.log("warning", f"{label} does not name its pods yet (no cluster, no owner "
                               f"of a known kind)")
        out.check("api.job_pods", "ok", time.monotonic() - t0, f"{len(pods)} pod(s)")
        by_node: dict[str, list[str]] = {}
        for p in pods:
            nn = (p.get("spec") or {}).get("nodeName")
            if isinstance(nn, str) and nn:
                by_node.setdefault(nn, []).append(pod_ref(p))
        keep: dict = {}
        no_probe = dataclasses.replace(s, probe=False)
        scan_rows = fleet_scan.scan(kube, None, no_probe, out, on_pod=reg,
                                    only=set(by_node), keep=keep) if by_node else []
        node_objs: dict = keep.get("nodes") or {}
        node_findings: dict[str, list] = keep.get("node_findings") or {}
        missing = sorted(set(by_node) - set(node_objs))
        for m in missing:  # pods bound to a node that is gone: the node differs
            node_findings.setdefault(m, []).append(make(
                "job.node_missing", "critical", f"node/{m}",
                f"{len(by_node[m])} pod(s) of the job are bound to node {m}, which is not in "
                f"the node list", {"node": m, "job_pods": by_node[m][:16],
                                   "job_pods_on_node": len(by_node[m])},
                "the node was deleted (autoscaler, repair) while the job's pods stayed bound: "
                "the pods are lost; restart the job from its checkpoint"))
            out.findings(node_findings[m][-1:])
        paths: dict[str, str] = {}
        if s.probe and node_objs:
            pods_on: dict[str, list] = {}
            for p in pods:
                pods_on.setdefault((p.get("spec") or {}).get("nodeName"), []).append(p)
            paths, _late = _probe_job(kube, sorted(node_objs), node_objs, pods_on, s, out,
                                      node_findings, reg, max_probes)
        views = [jn.view(n, node_objs.get(n), node_findings.get(n, ()), by_node[n],
                         node_is_ready(node_objs[n]) if n in node_objs else None)
                 for n in sorted(by_node)]
        cmp = jn.compare(label, views)
        out.findings(cmp.findings)
        rank_fs = jr.analyze(label, r.kind, pods, keep.get("events") or {}, now_utc(),
                             stall_threshold_s=s.stall_threshold_s)
        rank_fs = _pending_fit(kube, pods, keep.get("events") or {}, rank_fs, out)
        out.findings(rank_fs)
        v = jv.decide(job, cmp, node_findings, rank_fs, cmp.findings, pods=len(pods),
                      probed=s.probe, complete=not out.report.extra_incomplete_reason)
        out.verdict_of = v.to_dict
        by_row = {x["node"]: x for x in scan_rows}
        order = {n: i for i, n in enumerate(cmp.odd)}
        sev = {"critical": 0, "warning": 1, "info": 2, "ok": 3}
        for vw in sorted(views, key=lambda x: (order.get(x.name, len(order)),
                                               sev.get(x.worst, 3), x.name)):
            row = jn.signature(vw, cmp)
            sr = by_row.get(vw.name) or {}
            row["verdict"], row["root_cause"] = sr.get("verdict"), sr.get("root_cause")
            if vw.name in paths:
                row["probe"] = paths[vw.name]
            rows.append(row)
        doc.update({"kind": job["kind"], "group": job["group"], "name": name,
                    "namespace": ns, "selector": selector, "pod_selector": job["pod_selector"],
                    "pods": len(pods), "nodes": len(views), "differ": list(cmp.odd),
                    "shared": list(cmp.baseline) if cmp.shared else [],
                    "unscheduled": sum(1 for p in pods
                                       if not (p.get("spec") or {}).get("nodeName")),
                    "probed": s.probe})
        out.doc_extra["job"] = dict(doc)
        out.doc_extra["nodes"] = rows

    session.preamble = preamble
    target = {"kind": "job", "name": name or selector, "node": None}
    return run_cluster(session, o, target, run)

"""`nodes [-l SELECTOR]`: the API-side analysis of a whole fleet with a constant number of lists.

Why: on a 1,000-node cluster an on-call engineer needs "which GPU nodes are sick, and how" in
seconds. Per-node GETs would be thousands of calls; instead we LIST nodes, pods, events and node
Leases (paged where big: see _list), group by node in memory and run the same pure analyses as
`node X` (analysis.node_objects: readiness, admission, capacity, HAMi, memory, DRA, the watching
agent's conditions...), so the two never disagree. Only nodes the lists flag get per-node proxy
calls (goroutine dump, healthz), with a concurrency limit. Each node becomes a row with its
verdict (analysis/verdict/); report/fleet.py shows the sick ones first. Raw bytes are parsed into dicts item by item (pageparse.py, in child
processes for long lists): the client's model deserialization is far too slow here.
"""
from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from typing import Any, Callable, Mapping

from node_probe.protocol import Finding, ProtocolError, Severity

from .. import analysis, errors
from ..api import extra_lists
from ..api import pageparse
from ..api import pager
from ..api import slim
from ..api import watchlist
from ..analysis import verdict
from ..analysis.failing import black_hole
from ..analysis.monitors import agent_marks
from ..analysis.resources import capacity, podfold
from ..analysis.scheduling import fit
from ..analysis.stuck import goroutines, wedge
from ..analysis.common import events_by_uid, node_is_ready
from ..reach.probe_run import Settings, now_utc
from .node import _extra_lists
from ..api.kube import Kube, seg, worker_pool

INTERRUPT_GRACE_S = 5.0  # after Ctrl-C, how long to wait for creates still unanswered
from ..report import fleet
from ..report.output import Output
from node_probe.protocol import ExitStatus
from ..session import Session
from .cluster import run_cluster

FLAG_FOR_DUMP = ("kubelet.admission_stalled",)
CACHED = ("resourceVersion", "0")


def _list(kube: Kube, path: str, what: str, query: list | None = None,
          required: bool = True, paged: bool = False,
          parsers: pageparse.ParsePool | None = None,
          container_ids: bool = False, into: podfold.PodFold | None = None,
          memory: pager.Memory | None = None) -> list[dict] | None:
    """All items. Node Leases (~0.5 KB each) in one call from the API server's watch cache
    (resourceVersion=0, the cheapest list there is); nodes (10+ KB each on a real cluster:
    their image lists), pods and events paged with limit/continue and reduced item by item
    (pager.py: node images dropped, steady pods to a shared skeleton) -- a list that fits in
    one page is still one call. The pods go `into` their nodes' tallies page by page (and
    this returns []): memory grows with the nodes, not the pods
    (analysis/resources/podfold.py)."""
    try:
        if paged:
            each = slim.PodCompactor(container_ids) if path.endswith("/pods") else slim.slim
            # pods and events as streaming lists where the server serves them (api/watchlist.py)
            lists = watchlist if what in ("pods", "events") and watchlist.wanted() else pager
            items, _ = lists.list_items(kube, path, list(query or ()), each=each,
                                        parsers=parsers, into=into, memory=memory)
            return items
        doc = kube.get_json(path, [CACHED] + list(query or ()))
    except errors.ApiError as exc:
        if not required:
            return None
        raise exc.about(what, "list") from None
    return list(doc.get("items") or ())


def scan(kube: Kube, selector: str | None, settings: Settings, out: Output,
         all_nodes: bool = False, max_probes: int = 20,
         on_pod: Callable = lambda p: None, only: set[str] | None = None,
         keep: dict | None = None) -> list[dict]:
    """Analyse the selected nodes; return one summary row per node. `only`: these nodes by
    name (`job`: the job's nodes); `keep`: filled with each node's findings and the event
    index, for a caller that compares the nodes (`job`).

    With settings.probe, also run the node probe on every selected node, `concurrency` debug
    pods at a time (refused above `max_probes` nodes: narrow the selection instead)."""
    t0 = time.monotonic()
    q = [("labelSelector", selector)] if selector else []
    # all four lists at once: their transfer overlaps, and json.loads runs without the GC;
    # the pages of the big two are parsed in child processes (pageparse.py: the GIL would
    # keep that work on one core)
    mem = pager.Memory()  # the lists' memory bound, sized from the nodes
    with worker_pool(5, "list") as pool, pageparse.ParsePool(pageparse.default_workers()) as pp:
        # RuntimeClasses and the DRA lists (one paged list each; 404 without DRA is normal)
        f_extra = pool.submit(extra_lists.fetch, kube, tuple(extra_lists.LISTS), None, True)
        f_nodes = pool.submit(_list, kube, "/api/v1/nodes", "nodes", q, True, True, pp,
                              memory=mem)
        f_events = pool.submit(_list, kube, "/api/v1/events", "events",
                               [("fieldSelector", "involvedObject.kind=Pod")], False, True, pp,
                               memory=mem)
        # each pod page folded into its nodes' tallies, then dropped (the fold waits for the
        # events: it keeps the events of each node's pods); with --probe every pod is kept:
        # the probe's records name containers by id
        fold = podfold.PodFold(lambda: events_by_uid(f_events.result() or ()), now_utc(),
                               keep_all=settings.probe)
        f_pods = pool.submit(_list, kube, "/api/v1/pods", "pods", None, True, True, pp,
                             settings.probe, fold, mem)
        f_leases = pool.submit(_list, kube,
                               "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                               "node leases", None, False)
        nodes = f_nodes.result()
        f_pods.result()
        events, leases = f_events.result(), f_leases.result()
        extra = _extra_lists(out, f_extra, t0)
    if only is not None:
        nodes = [n for n in nodes if (n.get("metadata") or {}).get("name") in only]
    elif not selector and not all_nodes:
        nodes = [n for n in nodes if capacity.is_gpu_node(n)]
    names = {(n.get("metadata") or {}).get("name") for n in nodes}
    with_agent: set[str] = set()
    if settings.probe and settings.agent:
        with_agent = _agent_nodes(kube, settings, out) & names
    if settings.probe and len(names - with_agent) > max_probes:
        raise errors.UsageError(
            f"--probe would start debug pods on {len(names - with_agent)} nodes without a "
            f"running agent (more than --max-probes {max_probes}); narrow the selection with "
            f"-l, raise --max-probes, or install the agent (`kubectl gpu-doctor agent "
            f"install`)")
    out.check("api.list_pods_events_leases", "ok", time.monotonic() - t0)
    if events is None:
        out.log("warning", "events not readable; stalled pods judged from their status only")
    if leases is None:
        out.log("warning", "node Leases not readable; cannot tell whether kubelets renew them")
        out.mark_incomplete("the node Leases could not be read")
    ev_index = fold.events
    folds = {n: fold.nodes.get(n) or podfold.NodeFold() for n in names}
    # node -> the pods an analysis reads one by one (the others are in its tallies)
    by_node: dict[str, list[dict]] = {n: f.kept for n, f in folds.items()}
    claim_nodes = fold.claim_nodes    # nodes where a bound pod still waits on a DRA claim
    lease_by = {(le.get("metadata") or {}).get("name"): le for le in leases or ()}
    now = now_utc()
    gone, peers = _black_hole_context(list(fold.kept_pods()), ev_index, fold.listed, now)
    # the claim analysis only where a bound pod still waits on a claim: it reads every claim
    # and slice, so once per such node, not once per node
    no_claims = {"runtimeclasses": extra.get("runtimeclasses")} if extra else None
    rows, flagged = [], []
    node_findings: dict[str, list] = {}
    for n in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        name = n["metadata"]["name"]
        nf = folds[name]
        fs, errs = analysis.node_objects(n, nf.kept, nf.events or {},
                                         lease_by.get(name), now,
                                         threshold_s=settings.stall_threshold_s,
                                         events_known=events is not None,
                                         extra=extra if name in claim_nodes else no_claims,
                                         gone=gone.get(name, ()), peers=peers,
                                         memory_tally=nf.memory)
        fs += wedge.known_bad_driver(n, fs)  # GFD labels: a wedge waiting to happen
        for e in errs:
            if "failed" in e:
                out.log("warning", f"{name}: {e}")
        out.findings(fs)
        node_findings[name] = list(fs)
        if any(f.id in FLAG_FOR_DUMP for f in fs):
            flagged.append(name)
        rows.append(_row(n, nf, lease_by.get(name), fs, now))
    out.check("api.analysis", "ok", time.monotonic() - t0)
    if flagged:
        _dumps(kube, flagged, settings, out, rows, node_findings, by_node, now)
    if settings.probe and nodes:
        _probe_all(kube, nodes, by_node, settings, out, rows, on_pod, node_findings,
                   with_agent)
    for row in rows:
        _finish_row(row, node_findings.get(row["node"], []))
    if keep is not None:
        keep.update(node_findings=node_findings, events=ev_index,
                    nodes={n["metadata"]["name"]: n for n in nodes},
                    pods=by_node, pods_total=fold.total)
    return rows


# what `nodes --save` keeps of the lists it read (the pods are folded as they are read, and a
# fleet's 150,000 pods are not the evidence of its verdicts): the nodes with a finding, then
# the others, the pods the analyses read on those nodes, and those pods' events
SAVED_SUBSET = {
    "nodes": "the nodes with findings first, then the others",
    "pods": "the pods the verdicts read on the nodes with findings (pending, failing, "
            "terminating, HAMi, DRA and recent GPU pods); steady pods are only counted",
    "events": "the events of those pods"}


def _save_lists(recorder: Any, kept: Mapping[str, Any], rows: list[dict]) -> None:
    """The node, pod and event lists `nodes` read, as the --save bundle keeps them (S-18)."""
    from ..report.bundle import MAX_LIST_ITEMS
    nodes = kept.get("nodes") or {}
    sick = [r["node"] for r in fleet.ordered(rows)
            if r.get("critical") or r.get("warning")]
    first = set(sick)
    order = sick + [n for n in nodes if n not in first]
    recorder.keep_list("nodes", "/api/v1/nodes", [nodes[n] for n in order if n in nodes],
                       len(nodes), SAVED_SUBSET["nodes"])
    pods: list = []
    for n in sick:
        pods.extend((kept.get("pods") or {}).get(n) or ())
        if len(pods) >= MAX_LIST_ITEMS:
            break
    recorder.keep_list("pods", "/api/v1/pods", pods, kept.get("pods_total") or 0,
                       SAVED_SUBSET["pods"])
    ev_index = kept.get("events") or {}
    events = [e for p in pods[:MAX_LIST_ITEMS]
              for e in ev_index.get((p.get("metadata") or {}).get("uid"), ())]
    recorder.keep_list("events", "/api/v1/events", events,
                       sum(len(v) for v in ev_index.values()), SAVED_SUBSET["events"])


def _black_hole_context(pods: list[dict], ev_index: Mapping[str, list], listed: set[str],
                        now: Any) -> tuple[dict[str, list], dict]:
    """What the black-hole test needs beyond one node's pods, from the lists already read:
    the failed GPU pods that are gone (by node, from the kubelet's events), and for the
    controllers failing anywhere, how their GPU pods fare on every node (black_hole.peers).
    A healthy fleet costs one look at its non-steady pods."""
    since = now - black_hole.window()
    gone_all = black_hole.gone_attempts(
        (e for uid, evs in ev_index.items() if uid not in listed for e in evs), listed, since)
    failed = black_hole.node_attempts(pods, ev_index, gone_all, now, failed_only=True)
    failing = {a.controller for a in failed if a.failed}
    gone: dict[str, list] = {}
    for a in gone_all:
        gone.setdefault(a.node, []).append(a)
    if not failing:
        return gone, {}
    namespaces = {ns for ns, _ in failing}
    theirs = [p for p in pods if (p.get("metadata") or {}).get("namespace") in namespaces
              and black_hole.controller_of(p)[0] in failing]
    attempts = black_hole.node_attempts(theirs, ev_index, gone_all, now)
    return gone, black_hole.peer_table(attempts, only=failing)


def _agent_nodes(kube: Kube, settings: Settings, out: Output) -> set[str]:
    """Nodes with a Running agent pod (one list call); exec there needs no debug pod."""
    from ..reach import probens
    from ..reach import agent_exec
    try:
        pods = agent_exec.list_agent_pods(kube, settings.agent_namespace)
        running = {(p.get("spec") or {}).get("nodeName") for p in pods if agent_exec.pod_ready(p)}
        if running:
            probens.verify(kube, settings.agent_namespace)  # the agent's namespace is ours
    except errors.NotFound:
        return set()
    except errors.GpuDoctorError as exc:
        out.log("warning", f"not using the agents in {settings.agent_namespace}: "
                           f"{exc.one_line()}; using debug pods")
        return set()
    return running


def _probe_all(kube: Kube, nodes: list[dict], by_node: dict, settings: Settings, out: Output,
               rows: list[dict], on_pod: Callable,
               node_findings: dict[str, list] | None = None,
               with_agent: set[str] = frozenset()) -> None:
    """The node probe on many nodes, `concurrency` at a time: by exec in the agent where one
    runs (`with_agent`), else in a debug pod (each deleted). Each row says which path."""
    import dataclasses

    from ..reach.probe_run import NodeView, run_probe
    no_agent = dataclasses.replace(settings, agent=False)  # no lookup where none runs
    stop = threading.Event()
    pool = cf.ThreadPoolExecutor(max_workers=max(1, settings.concurrency),
                                 thread_name_prefix="probe")
    futs = {}
    pods: list = []  # every debug pod a worker made (to see which creates are unanswered)

    def track(pod) -> None:
        if pod is not None:
            pods.append(pod)
        on_pod(pod)

    outs: dict[str, _NodeOut] = {}
    try:
        for n in nodes:
            name = n["metadata"]["name"]
            view = NodeView(n, by_node.get(name, []), None, None,
                            list((node_findings or {}).get(name, ())))
            outs[name] = _NodeOut(out)
            futs[pool.submit(run_probe, kube, view,
                             settings if name in with_agent else no_agent, outs[name], (),
                             stop.is_set, track, True)] = name
        by_row = {r["node"]: r for r in rows}
        for fut in cf.as_completed(futs):
            try:
                path = fut.result()
                if futs[fut] in by_row:
                    by_row[futs[fut]]["probe"] = path
            except errors.GpuDoctorError as exc:  # one node's launch error: report, go on
                if futs[fut] in by_row:
                    by_row[futs[fut]]["probe"] = "failed"
                out.log("error", f"{futs[fut]}: {exc.one_line()}")
                out.mark_incomplete(f"the probe could not run on {futs[fut]}: "
                                    f"{exc.one_line()}")
    except BaseException:
        stop.set()  # workers waiting for their pod to start give up; the caller deletes pods
        pool.shutdown(wait=False, cancel_futures=True)
        # A create still with the API server (slow admission webhook) may land after a DELETE
        # sent now: wait for the answers (bounded) so the caller's DELETEs come after them.
        end = time.monotonic() + INTERRUPT_GRACE_S
        while any(p.in_doubt for p in list(pods)) and time.monotonic() < end:
            time.sleep(0.05)
        raise
    pool.shutdown(wait=True)
    by_name = {r["node"]: r for r in rows}
    for name, node_out in outs.items():  # API-side findings are already in their row
        row = by_name.get(name)
        if row is not None:
            for f in node_out.found.values():
                _count(row, f)
        if node_findings is not None:  # the node's verdict weighs the probe's findings too
            node_findings.setdefault(name, []).extend(node_out.found.values())


class _NodeOut:
    """`out` for one node's probe in `nodes --probe`: everything goes to the shared report,
    and the node-side findings it streamed are kept here for that node's row."""

    def __init__(self, out: Output) -> None:
        self._out = out
        self.found: dict[tuple, Any] = {}  # (id, subject) -> Finding, as the report dedupes

    def __getattr__(self, name: str) -> Any:
        return getattr(self._out, name)

    def node_record(self, rec: Mapping[str, Any], node: str | None = None) -> None:
        self._out.node_record(rec, node=node)
        if rec.get("kind") == "finding":
            try:
                f = Finding.from_record(rec)
            except ProtocolError:
                return  # refused by the report too (logged there)
            self.found.setdefault(f.key(), f)


def _dumps(kube: Kube, names: list[str], settings: Settings, out: Output,
           rows: list[dict], node_findings: dict[str, list],
           by_node: Mapping[str, list] | None = None, now: Any = None) -> None:
    """The goroutine dump (and /healthz) of each flagged node; with the node's pods, the
    verdict names the resource whose admission is stuck and the pod waiting for it."""
    t0 = time.monotonic()

    def one(name: str):
        base = f"/api/v1/nodes/{seg(name)}/proxy"
        health = None
        try:
            health = goroutines.parse_healthz(kube.get_text(
                f"{base}/healthz", [("verbose", "1")], settings.kubelet_timeout_s))
        except errors.InternalServerError as exc:  # /healthz?verbose: 500 lists the checks
            if exc.body:
                health = goroutines.parse_healthz(exc.body)
        except errors.ApiError:
            pass
        try:
            text = kube.get_text(f"{base}/debug/pprof/goroutine", [("debug", "2")],
                                 settings.kubelet_timeout_s)
        except errors.ApiError as exc:
            return [goroutines.unavailable(name, exc.status, exc.message, health)]
        pods = by_node.get(name) if by_node is not None else None
        return goroutines.analyze(name, text, health, pods=pods, now=now)

    by_name = {r["node"]: r for r in rows}
    with worker_pool(settings.concurrency, "proxy") as pool:
        futs = {pool.submit(one, n): n for n in names}
        for fut in cf.as_completed(futs):
            name = futs[fut]
            try:
                fs = fut.result()
            except errors.GpuDoctorError as exc:
                out.log("warning", f"{name}: goroutine dump: {exc.one_line()}")
                continue
            out.findings(fs)
            node_findings.setdefault(name, []).extend(fs)
            row = by_name.get(name)
            if row is not None:
                for f in fs:
                    _count(row, f)
    out.check("api.kubelet_goroutines", "ok", time.monotonic() - t0,
              f"{len(names)} flagged node(s)")


def _count(row: dict, f) -> None:
    """Add one finding to its node's row (counts, the worst finding, the ids)."""
    sev = f.severity.value
    row[sev] = row.get(sev, 0) + 1
    if f.id not in row.setdefault("findings", []):
        row["findings"].append(f.id)
    if sev in ("critical", "warning") and (
            row["top"] is None or (sev == "critical" and row["top_sev"] != "critical")):
        row["top"], row["top_sev"] = f.id, sev


def _row(node: Mapping[str, Any], pods: podfold.NodeFold, lease, fs, now) -> dict:
    from ..analysis.stuck.admission import lease_renew_age_s
    res = capacity.gpu_resources(node)
    age = lease_renew_age_s(lease, now)
    row = {"node": node["metadata"]["name"],
           "ready": node_is_ready(node),
           "schedulable": not (node.get("spec") or {}).get("unschedulable"),
           "gpu_allocatable": sum(a for _, a in res.values()) if res else None,
           "gpu_capacity": sum(c for c, _ in res.values()) if res else None,
           # allocatable minus what bound, unfinished pods request; gpu_free (room for a new
           # pod) is set by _finish_row once every finding of the node is in
           "gpu_unrequested": fit.node_free(node, (), pods.held),
           "gpu_free": None,
           "admits_pods": None,
           "pods": pods.pods,
           "lease_age_s": None if age is None else round(age),
           "agent": agent_marks.watch_of(node, now).to_dict(),
           "critical": 0, "warning": 0, "info": 0, "findings": [], "verdict": None,
           "root_cause": None,
           "top": None, "top_sev": None}
    for f in sorted(fs, key=lambda f: -f.severity.rank):
        _count(row, f)
    return row


def _finish_row(row: dict, fs: list) -> None:
    """What needs every finding of the node (API side, goroutine dump, probe): whether its
    kubelet admits pods, the GPUs a new pod could get there, the verdict's headline."""
    # a NotReady kubelet admits nothing either (node.not_ready)
    row["admits_pods"] = row["ready"] is not False and not wedge.blocking_findings(fs,
                                                                                  row["node"])
    usable = row["schedulable"] and row["admits_pods"]
    # a black hole admits pods but fails the GPU pods sent to it: no GPU there is free for
    # a new pod (audit round 5, N9: `FREE 7` on a node that rejects every GPU pod)
    hole = max((f.evidence.get("failed_pods") for f in fs if f.id == "node.gpu_black_hole"
                and f.severity.rank >= Severity.WARNING.rank
                and isinstance(f.evidence, Mapping)
                and isinstance(f.evidence.get("failed_pods"), int)), default=None)
    row["black_hole_failed"] = hole
    free = row["gpu_unrequested"]
    row["gpu_free"] = None if free is None else (free if usable and hole is None else 0)
    # without --probe the node side did not look: an all-clear row says "nothing found in
    # what could be checked", as `node X --no-probe` does, never "no problem found" (audit
    # round 5, N15)
    probed = row.get("probe") not in (None, "failed", "no answer")
    v = verdict.decide(fs, {"kind": "node", "name": row["node"], "node": row["node"]},
                       could_not_look=0 if probed else 1)
    row["verdict"], row["root_cause"] = v.headline, v.root_cause


def nodes(session: Session, o: dict, selector: str | None, all_nodes: bool,
          max_probes: int, show_healthy: bool = False, names_only: bool = False,
          headers: bool = True) -> ExitStatus:
    """`names_only` (-o name): `node/NAME` lines and nothing else; `headers` False:
    --no-headers."""
    rows: list = []
    wide = o.get("output") == "wide"

    def preamble() -> str:  # the fleet table (also what a --save bundle keeps of the view)
        if names_only:
            return fleet.names(rows, show_healthy)
        return fleet.table(rows, show_healthy, wide=wide, headers=headers) if rows else ""

    def run(kube: Kube, out: Output, s: Settings, reg: Callable) -> None:
        # the table is the preamble; no details per finding (-o name: no footer either)
        out.table_view = fleet.nothing if names_only else fleet.footer
        kept: dict | None = {} if session.bundle is not None else None
        rows.extend(scan(kube, selector, s, out, all_nodes=all_nodes, max_probes=max_probes,
                         on_pod=reg, keep=kept))
        if kept is not None:  # --save: the lists' evidence, bounded (S-18)
            _save_lists(session.bundle.recorder, kept, rows)
        out.doc_extra["nodes"] = [fleet.row_doc(r) for r in fleet.ordered(rows)]
        if not rows and out.fmt in ("table", "wide"):
            # as `kubectl get nodes -l nosuch=x`: one line on stderr and nothing else
            out.table_view = fleet.nothing
            out.err.write("No resources found" + ("" if selector or all_nodes else
                                                  " (no node has GPUs; --all shows every "
                                                  "node)") + "\n")

    session.preamble = preamble
    target = {"kind": "nodes", "name": selector or ("all nodes" if all_nodes else "GPU nodes"),
              "node": None}
    return run_cluster(session, o, target, run)

"""`node X` and `pod Y`: API-side collection + analysis, then the node probe in a debug pod.

Why this order: the API side needs no pod on the node and answers in about a second, and it is
the only view that still works when the kubelet admits nothing (seed 000). So it runs first
and its findings are shown at once; then the debug pod runs the node probe, whose records are
merged into the same report. If the debug pod never starts, that is reported as a consequence
of what the API side found (probe.pod_not_started), not as a failure of the tool.
"""
from __future__ import annotations

import concurrent.futures as cf
import sys
import time

import click
from typing import Any, Callable, Mapping

from node_probe.protocol import catalog
from node_probe.protocol import Finding
from node_probe.protocol.render import terminal_safe

from .. import analysis, errors
from ..api import extra_lists
from . import lookup, pending
from ..analysis import plugin_pods
from ..analysis.failing import black_hole, container_start, pod_status
from ..analysis.monitors import agent_seen
from ..analysis.resources import capacity, kubelet_config
from ..analysis.scheduling import dra
from ..analysis.stuck import admission, goroutines, wedge
from ..analysis.common import events_by_uid, pod_ref
from ..api.kube import Kube, seg, worker_pool
from ..report.output import Output
from node_probe.protocol import ExitStatus
from ..reach.probe_run import NodeView, Settings, now_utc, run_probe
from ..session import Session
from .cluster import run_cluster

MAX_EVENT_LOOKUPS = 20


def _timed(out: Output, check_id: str, fn: Callable[[], Any]) -> Any:
    t0 = time.monotonic()
    try:
        val = fn()
    except errors.GpuDoctorError as exc:
        out.check(check_id, "error", time.monotonic() - t0, exc.one_line())
        raise
    out.check(check_id, "ok", time.monotonic() - t0)
    return val


def get_node(kube: Kube, name: str) -> dict:
    try:
        return kube.get_json(f"/api/v1/nodes/{seg(name)}")
    except errors.ApiError as exc:
        raise exc.about(f"node {name}") from None


def get_pod(kube: Kube, namespace: str, name: str) -> dict:
    try:
        return kube.get_json(f"/api/v1/namespaces/{seg(namespace)}/pods/{seg(name)}")
    except errors.ApiError as exc:
        raise exc.about(f"pod {namespace}/{name}") from None


def pod_events(kube: Kube, pod: Mapping[str, Any]) -> list[dict]:
    md = pod.get("metadata") or {}
    doc = kube.get_json(f"/api/v1/namespaces/{seg(md.get('namespace'))}/events",
                        [("fieldSelector", f"involvedObject.uid={md.get('uid')}")])
    return list(doc.get("items") or ())


def collect_node(kube: Kube, name: str, settings: Settings, out: Output,
                 node: dict | None = None) -> NodeView:
    """Everything the API server knows about one node, analysed. Degrades on partial RBAC."""
    t0 = time.monotonic()
    out.say(f"reading {name}'s pods, Lease and kubelet state through the API server")
    node = node or _timed(out, "api.node", lambda: get_node(kube, name))
    now = now_utc()
    proxy = f"/api/v1/nodes/{seg(name)}/proxy"
    with worker_pool(8, "api") as pool:
        f_pods = pool.submit(kube.get_json, "/api/v1/pods",
                             [("fieldSelector", f"spec.nodeName={name}")])
        f_lease = pool.submit(kube.get_json,
                              f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/"
                              f"leases/{seg(name)}")
        kt = settings.kubelet_timeout_s
        f_configz = pool.submit(kube.get_json, f"{proxy}/configz", None, kt)
        f_gr = pool.submit(kube.get_text, f"{proxy}/debug/pprof/goroutine", [("debug", "2")],
                           kt)
        f_health = pool.submit(kube.get_text, f"{proxy}/healthz", [("verbose", "1")], kt)
        # RuntimeClasses and the DRA lists (claims, slices, classes): optional, one call each
        f_extra = pool.submit(extra_lists.fetch, kube, tuple(extra_lists.LISTS))
        # Warning events of all pods in one list (admission errors, HAMi's `device number not
        # matched`), kept for the pods on this node; optional
        f_warn = pool.submit(kube.get_json, "/api/v1/events",
                             [("fieldSelector", "type=Warning,involvedObject.kind=Pod"),
                              ("resourceVersion", "0")])
        # events about the Node object (recorded in namespace default): kubelet restarts and
        # reboots (admission races) and what other health monitors reported; optional
        f_nev = pool.submit(kube.get_json, "/api/v1/namespaces/default/events",
                            [("fieldSelector", f"involvedObject.kind=Node,involvedObject.name={name}")])
        pods = _result(out, "api.pods", f_pods, t0)
        if pods is None:  # the verdict below would judge a node without its pods
            out.mark_incomplete(f"the pods of node {name} could not be read")
        pods = list((pods or {}).get("items") or ())
        lease = _result(out, "api.lease", f_lease, t0, quiet_404=True)
        if lease is None and not isinstance(f_lease.exception(), errors.NotFound):
            out.mark_incomplete(f"the Lease of node {name} could not be read")
        # events only for pods that look untouched or overdue: a handful of calls at most
        candidates = [p for p in pods
                      if admission.untouched_pending(p, (), now) is not None
                      or admission.overdue_terminating(p, now) is not None][:MAX_EVENT_LOOKUPS]
        ev_futs = {pool.submit(pod_events, kube, p): p for p in candidates}
        index: dict[str, list] = {}
        events_known = True
        for fut, p in ev_futs.items():
            try:
                index[(p.get("metadata") or {}).get("uid", "")] = fut.result()
            except errors.GpuDoctorError as exc:
                events_known = False
                out.log("warning", f"cannot read events of {pod_ref(p)}: {_why(exc)}")
        warn = _result(out, "api.warning_events", f_warn, t0, quiet=True)
        uids = {(p.get("metadata") or {}).get("uid") for p in pods}
        # by event name, in one pass (a pod with 30,000 Warning events: linear, not quadratic)
        names = {(uid, (e.get("metadata") or {}).get("name"))
                 for uid, evs in index.items() for e in evs}
        for ev in (warn or {}).get("items") or ():
            uid = (ev.get("involvedObject") or {}).get("uid")
            key = (uid, (ev.get("metadata") or {}).get("name"))
            if uid in uids and key not in names:
                names.add(key)
                index.setdefault(uid, []).append(ev)
        configz = _result(out, "api.kubelet_configz", f_configz, t0, quiet=True)
        cfg = kubelet_config.extract(configz)
        health_text = _result(out, "api.kubelet_healthz", f_health, t0, quiet=True,
                              healthz=True)
        health = goroutines.parse_healthz(health_text) if health_text else None
        gr_text, gr_err = None, None
        try:
            gr_text = f_gr.result()
            out.check("api.kubelet_goroutines", "ok", time.monotonic() - t0)
        except errors.ApiError as exc:
            gr_err = exc
            out.check("api.kubelet_goroutines", "skipped", time.monotonic() - t0,
                      http_words(exc, 120))
        except errors.GpuDoctorError as exc:
            out.check("api.kubelet_goroutines", "error", time.monotonic() - t0,
                      exc.one_line())
        extra = _extra_lists(out, f_extra, t0)
        node_events = list((_result(out, "api.node_events", f_nev, t0, quiet=True) or {})
                           .get("items") or ())
    gone, peers = _black_hole_context(kube, name, pods, index, warn, now, out)
    findings, errs = analysis.node_objects(node, pods, index, lease, now,
                                           threshold_s=settings.stall_threshold_s,
                                           kubelet_cfg=cfg, events_known=events_known,
                                           extra=extra, node_events=node_events,
                                           agent_marks=False,  # agent_seen below reads them
                                           gone=gone, peers=peers)
    for e in errs:
        out.log("warning" if "failed" in e else "debug", e)
    findings += kubelet_config.analyze(name, cfg)
    if gr_text is not None:
        findings += goroutines.analyze(name, gr_text, health, pods=pods, now=now)
    elif gr_err is not None:
        findings.append(goroutines.unavailable(name, gr_err.status, gr_err.message, health))
    # the likely root cause from GPU Feature Discovery labels (no node access needed)
    findings += wedge.known_bad_driver(node, findings)
    # what the watching agent marked on the node, now or within the hour (even if cleared)
    findings += agent_seen.analyze(node, now)
    return NodeView(node, pods, lease, cfg, findings, events=node_events)


MAX_PEER_NAMESPACES = 5


def _black_hole_context(kube: Kube, name: str, pods: list[dict], index: Mapping[str, list],
                        warn: Mapping[str, Any] | None, now: Any, out: Output
                        ) -> tuple[list, dict | None]:
    """For the black-hole test on one node (analysis/failing/black_hole.py): the failed GPU pods
    sent there that are gone (the kubelet's Warning events, already read), and -- only when the node
    has enough failures to be one -- how the same controllers' GPU pods fare elsewhere, from the
    pods of their namespaces (one list each, at most MAX_PEER_NAMESPACES) and the Warning events.
    (gone, None) when those could not be read: the finding then says so."""
    from ..api import pager, slim
    if warn is None:
        return [], None
    items = list(warn.get("items") or ())
    listed = {(p.get("metadata") or {}).get("uid") for p in pods}
    since = now - black_hole.window()
    gone_all = black_hole.gone_attempts(items, listed, since)
    gone = [a for a in gone_all if a.node == name]
    failed = black_hole.node_attempts(pods, index, gone, now, failed_only=True)
    failing = {a.controller for a in failed if a.node == name}
    if len(failed) < black_hole.MIN_FAILED:
        return gone, None  # not one: nothing more to read
    namespaces = sorted({ns for ns, _ in failing})[:MAX_PEER_NAMESPACES]
    theirs: list[dict] = []
    t0 = time.monotonic()
    try:
        for ns in namespaces:
            got, _ = pager.list_items(kube, f"/api/v1/namespaces/{seg(ns)}/pods", timeout=30,
                                      each=slim.PodCompactor())
            theirs += [p for p in got if black_hole.controller_of(p)[0] in failing]
    except errors.ApiError as exc:
        out.check("api.black_hole_peers", "skipped", time.monotonic() - t0, _why(exc))
        return gone, None
    out.check("api.black_hole_peers", "ok", time.monotonic() - t0,
              f"{len(theirs)} pods of {len(failing)} controller(s) in {len(namespaces)} "
              f"namespace(s)")
    attempts = black_hole.node_attempts(theirs, events_by_uid(items), gone_all, now)
    return gone, black_hole.peer_table(attempts, only=failing)


def _extra_lists(out: Output, fut: cf.Future, t0: float) -> dict | None:
    """The optional lists (extra_lists.fetch); a list that could not be read is None and the
    analyses needing it do not run. 404 (no DRA API) is normal, not an error."""
    try:
        extra, notes = fut.result()
    except errors.GpuDoctorError as exc:
        out.check("api.extra_lists", "error", time.monotonic() - t0, exc.one_line())
        return None
    for note in notes:
        out.log("debug", note)
    out.check("api.extra_lists", "ok" if not notes else "skipped", time.monotonic() - t0,
              "; ".join(notes)[:300])
    return extra


def http_words(exc: errors.ApiError, limit: int = 160) -> str:
    """An API error in one short phrase, the status said once: `404 page not found` (the
    kubelet's body already starts with its status; `404: 404 page not found` was noise)."""
    msg = " ".join(str(exc.message or "").split())[:limit]
    status = str(exc.status or "")
    return msg if msg.startswith(status) else f"HTTP {status}: {msg}" if msg else f"HTTP {status}"


def _why(exc: BaseException) -> str:
    if isinstance(exc, errors.ApiError):
        return http_words(exc)
    if isinstance(exc, errors.GpuDoctorError):
        return exc.one_line()
    return str(exc)


def _result(out: Output, check_id: str, fut: cf.Future, t0: float, quiet: bool = False,
            quiet_404: bool = False, healthz: bool = False) -> Any:
    try:
        val = fut.result()
    except errors.InternalServerError as exc:
        if healthz and exc.body:
            # /healthz?verbose answers 500 with the per-check lines when a check fails
            out.check(check_id, "ok", time.monotonic() - t0, "unhealthy")
            return exc.body
        return _api_failed(out, check_id, exc, t0, quiet)
    except errors.NotFound as exc:
        return _api_failed(out, check_id, exc, t0, quiet or quiet_404)
    except errors.ApiError as exc:
        return _api_failed(out, check_id, exc, t0, quiet)
    except errors.GpuDoctorError as exc:
        out.check(check_id, "error", time.monotonic() - t0, exc.one_line())
        out.log("warning", f"{check_id}: {exc.one_line()}")
        return None
    out.check(check_id, "ok", time.monotonic() - t0)
    return val


def _api_failed(out: Output, check_id: str, exc: errors.ApiError, t0: float,
                quiet: bool) -> None:
    """An optional API read failed: the check is skipped (quiet) or an error, never fatal."""
    status = "skipped" if quiet else "error"
    out.check(check_id, status, time.monotonic() - t0, http_words(exc))
    if status == "error":
        out.log("warning", f"{check_id}: {http_words(exc, 200)}")


# -- the node probe in a debug pod ---------------------------------------------------------


def node_not_found(node_name: str, pod: Mapping[str, Any]) -> Finding:
    """The pod is bound to a node that no longer exists (deleted, or renamed on rejoin)."""
    md = pod.get("metadata") or {}
    ref = pod_ref(pod)
    return catalog.make(
        "node.not_found", "critical", f"node/{node_name}",
        f"pod {ref} is bound to node {node_name}, which does not exist",
        {"pod": ref, "phase": (pod.get("status") or {}).get("phase"),
         "deletionTimestamp": md.get("deletionTimestamp"),
         "owner": [o.get("kind") for o in md.get("ownerReferences") or ()] or None},
        f"The node object was deleted (scale-down, replaced machine, a node that rejoined under "
        f"another name). No kubelet will ever run or release this pod; kube-controller-manager's "
        f"pod garbage collector removes pods of deleted nodes after a while. To free it now: "
        f"`kubectl -n {md.get('namespace')} delete pod {md.get('name')} --grace-period=0 "
        f"--force` (risk: if the machine still runs the containers under another node name, "
        f"they keep running unmanaged until that kubelet cleans up).",
        ("https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-garbage-collection",))


# -- the commands ----------------------------------------------------------------------------

def resolve_plugin_pods(out: Output, pods: list[dict]) -> None:
    """The node's device plugin pods for the verdict's restart command: the one whose uid the
    node probe saw serving a plugin socket first, then the ones a known install labels."""
    uids = [str(f.evidence.get("pod_uid")) for f in out.report.findings
            if f.id.startswith("deviceplugin.") and isinstance(f.evidence, Mapping)
            and f.evidence.get("pod_uid")]
    out.context["plugin_pods"] = plugin_pods.candidates(pods, uids)


def diagnose_node(kube: Kube, name: str, settings: Settings, out: Output,
                  cancelled: Callable[[], bool] = lambda: False,
                  on_pod: Callable = lambda p: None) -> None:
    try:
        node = get_node(kube, name)  # unknown node: one line, exit 3, before anything else
    except errors.NotFound as exc:
        raise lookup.node_not_found(kube, name, exc) from None  # "did you mean gpu-0001?"
    out.check("api.node", "ok", 0.0)
    view = collect_node(kube, name, settings, out, node=node)
    out.findings(view.findings)
    resolve_plugin_pods(out, view.pods)
    if settings.probe:
        run_probe(kube, view, settings, out, cancelled=cancelled, on_pod=on_pod)
        resolve_plugin_pods(out, view.pods)  # the probe names the plugin's pod by its uid
        out.findings(capacity.driver_not_seen(view.node, out.report.findings))


def _same_start(f: Finding, mine: list[Finding], pod: Mapping[str, Any]) -> bool:
    """A node's pod.gpu_start_failed about this pod alone, for a cause the pod's own finding
    reports: said once."""
    if f.id != "pod.gpu_start_failed" or not str(f.subject).startswith("node/"):
        return False
    pods = [p.get("pod") for p in f.evidence.get("pods") or () if isinstance(p, Mapping)]
    causes = {g.evidence.get("cause") for g in mine}
    return pods == [pod_ref(pod)] and f.evidence.get("cause") in causes


def diagnose_pod(kube: Kube, namespace: str, name: str, settings: Settings, out: Output,
                 cancelled: Callable[[], bool] = lambda: False,
                 on_pod: Callable = lambda p: None) -> None:
    try:
        pod = get_pod(kube, namespace, name)
    except errors.NotFound as exc:
        # never created? a GPU quota refusing its controller's creates (StatefulSet trainer-0)
        refused = pending.not_created(kube, namespace, name, out)
        if not refused:
            raise lookup.pod_not_found(kube, namespace, name, exc) from None  # (use -n ml)
        out.findings(refused)
        return
    try:
        evs = pod_events(kube, pod)
        events_known = True
    except errors.ApiError as exc:
        evs, events_known = [], False
        out.log("warning", f"cannot read the pod's events: {http_words(exc)}")
    node_name = (pod.get("spec") or {}).get("nodeName")
    out.report.target["node"] = node_name
    phase = (pod.get("status") or {}).get("phase")   # a Running pod: is it slow (analysis/slow)
    out.context["pod_phase"] = phase if isinstance(phase, str) and len(phase) < 32 else None
    view = None
    if node_name:
        try:
            node = get_node(kube, node_name)
        except errors.NotFound:
            out.finding(node_not_found(node_name, pod))
            return
        view = collect_node(kube, node_name, settings, out, node=node)
        # the pod's own failed start is said once, by the pod's finding below (its fix names
        # the pod); the node's finding stays when other GPU pods there fail too
        mine = container_start.analyze_pod(pod, evs)
        out.findings([f for f in view.findings if not _same_start(f, mine, pod)])
        resolve_plugin_pods(out, view.pods)
    # an unscheduled GPU pod: its fit against every node names the case (pending.py)
    fit = None if node_name else pending.collect(kube, pod, evs, out, now_utc())
    if not node_name and (pod.get("spec") or {}).get("resourceClaims"):
        # unscheduled and waiting on DRA claims: why are they not allocated
        t0 = time.monotonic()
        with worker_pool(1, "dra") as one:
            extra = _extra_lists(out, one.submit(
                extra_lists.fetch, kube, ("resourceclaims", "resourceslices", "deviceclasses")),
                t0)
        if extra and extra.get("resourceclaims") is not None and \
                extra.get("resourceslices") is not None:
            out.findings(dra.analyze_claims([pod], extra["resourceclaims"],
                                            extra["resourceslices"],
                                            extra.get("deviceclasses") or (), evs, now_utc()))
    out.findings(container_start.analyze_pod(pod, evs))  # a GPU start the runtime refused
    st = pod.get("status") or {}
    out.context["pod_running"] = st.get("phase") == "Running" and bool(
        st.get("containerStatuses")) and all(
        isinstance(c, Mapping) and c.get("ready") is True for c in st["containerStatuses"])
    out.findings(pod_status.analyze_pod(pod, evs, now_utc(), settings.stall_threshold_s,
                                        fit=fit, node_findings=view.findings if view else (),
                                        node=view.node if view else None,
                                        node_events=view.events if view else (),
                                        node_pods=view.pods if view else ()))
    if not events_known:
        out.mark_incomplete("the pod's events were not readable")
    if view is not None and settings.probe:
        uid = (pod.get("metadata") or {}).get("uid")
        run_probe(kube, view, settings, out, focus_pods=(uid,) if uid else (),
                  cancelled=cancelled, on_pod=on_pod)
        # the slow-GPU check looked: a Running pod without a slow-down is said healthy
        out.context["slow_looked"] = any(c.id == "gpu.slow" and c.status == "ok"
                                         for c in out.report.checks)
        resolve_plugin_pods(out, view.pods)
        out.findings(capacity.driver_not_seen(view.node, out.report.findings))
def node(session: Session, o: dict, name: str) -> ExitStatus:
    if o.get("history") is not None:
        return history(session, o, name, o["history"])
    return run_cluster(session, o, {"kind": "node", "name": name, "node": name},
                    lambda kube, out, s, reg: diagnose_node(kube, name, s, out,
                                                                     on_pod=reg))


def pod(session: Session, o: dict, name: str) -> ExitStatus:
    return run_cluster(session, o, {"kind": "pod", "name": name, "node": None},
                    lambda kube, out, s, reg: diagnose_pod(kube, s.namespace, name, s,
                                                                    out, on_pod=reg),
                    pod_target=True)


def history(session: Session, o: dict, name: str, n: int) -> ExitStatus:
    """`node X --history`: the evidence bundles the watching agent kept on the node (read by
    exec of the read-only `agent-history` in its pod); `--history N` replays bundle N with the
    same renderer as `replay`; with `--save FILE` it is also copied out."""
    import json

    from ..reach import agent_exec
    from ..report import bundle
    from .cluster import connect

    kube = connect(o)
    ns = o.get("agent_namespace") or "gpu-doctor"
    pod, why = agent_exec.find_agent_pod(kube, ns, name)
    if pod is None:
        raise errors.ClusterError(
            f"no evidence history for node {name}: {why} (the watching agent keeps it: "
            f"`kubectl gpu-doctor agent install`)")
    if n == 0:
        raw = agent_exec.agent_history(kube, pod, ["list"], agent_exec.HISTORY_LIST_MAX)
        rows = []
        for line in raw.decode("utf-8", "replace").splitlines()[:100]:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if isinstance(r, dict) and _count(r.get("n")) is not None:
                rows.append({"n": r["n"], "captured_at": _utc(r.get("time")),
                             "condition": _cell(r.get("class")),
                             "bytes": _count(r.get("bytes"))})
        if o.get("output") in ("json", "jsonl"):
            click.echo(json.dumps({"node": name, "bundles": rows}, indent=2))
            return ExitStatus.OK
        if not rows:
            click.echo(f"no evidence kept on {name}: the agent captured no problem yet")
            return ExitStatus.OK
        from tabulate import tabulate
        click.echo(tabulate([[terminal_safe("?" if r[k] is None else r[k]) for k in
                              ("n", "captured_at", "condition", "bytes")] for r in rows],
                            headers=["N", "CAPTURED (UTC)", "CONDITION", "BYTES"],
                            tablefmt="plain", disable_numparse=True))
        click.echo(f"`kubectl gpu-doctor node {name} --history N` replays one "
                   f"(--save FILE keeps it)")
        return ExitStatus.OK
    raw = agent_exec.agent_history(kube, pod, ["get", str(n)], bundle.MAX_BUNDLE_BYTES + 1)
    doc = bundle.parse(raw, f"bundle {n} of {name}")
    if o.get("save"):
        bundle.write(o["save"], bundle.keep_node_bundle(doc), say=sys.stderr)
    return ExitStatus(bundle.replay(doc, o.get("output") or "table", None,
                                    source=f"bundle {n} the agent kept on {name}"))


def _utc(t: Any) -> str:
    ok = isinstance(t, (int, float)) and 0 <= t < 1e11
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) if ok else "?"


def _count(v: Any) -> int | None:
    """A whole number the agent reported (a bundle's number or size), else None: every other
    type or value from the agent (an escape sequence in `bytes`, HI-01) is dropped."""
    return v if type(v) is int and 0 <= v < 1 << 53 else None


def _cell(v: Any) -> str:
    return "".join(ch if ch.isalnum() else "?" for ch in str(v or ""))[:64]


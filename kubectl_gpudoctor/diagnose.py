"""`node X` and `pod Y`: API-side collection + analysis, then the node probe in a debug pod.

Why this order: the API side needs no pod on the node and answers in about a second, and it is
the only view that still works when the kubelet admits nothing (seed 000). So it runs first
and its findings are shown at once; then the debug pod runs the node probe, whose records are
merged into the same report. If the debug pod never starts, that is reported as a consequence
of what the API side found (probe.pod_not_started), not as a failure of the tool.
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import datetime as dt
import time
from typing import Any, Callable, Mapping

from node_probe.protocol import catalog
from node_probe.protocol import Finding

from . import analysis, debugpod, errors, extra_lists, pending, probens, stream
from .analysis import readiness
from .analysis import admission, dra, goroutines, kubelet_config, pod_status
from .analysis import subjects, wedge
from .analysis.common import pod_ref
from .kube import Kube, seg, worker_pool
from .output import Output

MAX_EVENT_LOOKUPS = 20
STALLED_START_TIMEOUT_S = 15.0
PROXY_TIMEOUT_S = 10.0


@dataclasses.dataclass
class Settings:
    namespace: str = "default"       # of `pod Y` only: never where the debug pod runs
    probe_namespace: str | None = None  # the debug pod's (probens.choose: flag, env, default)
    image: str = debugpod.DEFAULT_IMAGE
    timeout_s: float = 60.0          # node probe deadline (passed to the probe)
    trace_s: float = 5.0
    start_timeout_s: float = 60.0    # how long to wait for the debug pod to run
    stall_threshold_s: float = admission.DEFAULT_THRESHOLD_S
    probe: bool = True               # False: API-side analysis only
    probe_args: tuple[str, ...] = ()
    concurrency: int = 8
    kubelet_timeout_s: float = PROXY_TIMEOUT_S  # per proxied kubelet call (dump, healthz, configz)
    force_pod: bool = False          # create the debug pod even when the API side says it
                                     # cannot start (wedge.decide)
    agent: bool = True               # exec in a Running agent pod first (agent.py)
    agent_namespace: str = "gpu-doctor"


@dataclasses.dataclass
class NodeView:
    node: dict
    pods: list[dict]
    lease: dict | None
    kubelet_cfg: dict | None
    findings: list[Finding]
    agent_note: str = ""             # why the agent was not used on this node (report text)


def now_utc() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


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
        f_extra = pool.submit(extra_lists.fetch, kube, tuple(extra_lists.LISTS), 30)
        # Warning events of all pods in one list (admission errors, HAMi's `device number not
        # matched`), kept for the pods on this node; optional
        f_warn = pool.submit(kube.get_json, "/api/v1/events",
                             [("fieldSelector", "type=Warning,involvedObject.kind=Pod"),
                              ("resourceVersion", "0")], 30)
        pods = _result(out, "api.pods", f_pods, t0)
        pods = list((pods or {}).get("items") or ())
        lease = _result(out, "api.lease", f_lease, t0, quiet_404=True)
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
        for ev in (warn or {}).get("items") or ():
            uid = (ev.get("involvedObject") or {}).get("uid")
            if uid in uids:
                have = index.setdefault(uid, [])
                if all(e.get("metadata", {}).get("name") != ev.get("metadata", {}).get("name")
                       for e in have):
                    have.append(ev)
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
                      f"{exc.status}: {exc.message[:120]}")
        except errors.GpuDoctorError as exc:
            out.check("api.kubelet_goroutines", "error", time.monotonic() - t0,
                      exc.one_line())
        extra = _extra_lists(out, f_extra, t0)
    findings, errs = analysis.node_objects(node, pods, index, lease, now,
                                           threshold_s=settings.stall_threshold_s,
                                           kubelet_cfg=cfg, events_known=events_known,
                                           extra=extra)
    for e in errs:
        out.log("warning" if "failed" in e else "debug", e)
    findings += kubelet_config.analyze(name, cfg)
    if gr_text is not None:
        findings += goroutines.analyze(name, gr_text, health, pods=pods, now=now)
    elif gr_err is not None:
        findings.append(goroutines.unavailable(name, gr_err.status, gr_err.message, health))
    # the likely root cause from GPU Feature Discovery labels (no node access needed)
    findings += wedge.known_bad_driver(node, findings)
    return NodeView(node, pods, lease, cfg, findings)


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


def _why(exc: BaseException) -> str:
    if isinstance(exc, errors.ApiError):
        return f"{exc.status} {exc.message[:160]}"
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
    out.check(check_id, status, time.monotonic() - t0, f"{exc.status}: {exc.message[:160]}")
    if status == "error":
        out.log("warning", f"{check_id}: {exc.status} {exc.message[:200]}")


# -- the node probe in a debug pod ---------------------------------------------------------

PATH_NOT_READY = "none: NotReady"           # run_probe's answers when no way in was tried
PATH_BLOCKED = "none: admission blocked"


def run_probe(kube: Kube, view: NodeView, settings: Settings, out: Output,
              focus_pods: tuple[str, ...] = (), cancelled: Callable[[], bool] = lambda: False,
              on_pod: Callable[[debugpod.DebugPod | None], None] = lambda p: None,
              fleet: bool = False) -> str:
    """Run the node probe on the view's node -- by exec in the standing agent's pod when one
    runs there, else in a debug pod -- and merge its records into `out`. Returns the path
    taken: "agent", "debug pod", or why there was none: PATH_NOT_READY, PATH_BLOCKED.

    fleet=True: one of several nodes in one report (subjects and check ids get the node name).
    """
    name = view.node["metadata"]["name"]
    check_id = f"node.probe/{name}" if fleet else "node.probe"
    subject = f"node/{name}"
    if settings.agent:  # exec needs no new pod: it works on a node that admits none
        from . import agent
        apod, view.agent_note = agent.find_agent_pod(kube, settings.agent_namespace, name)
        if apod is not None and agent.run_probe(
                kube, name, apod, out, timeout_s=settings.timeout_s, trace_s=settings.trace_s,
                focus_pods=focus_pods, extra_args=settings.probe_args, fleet=fleet,
                check_id=check_id, pods=view.pods):
            return "agent"
    # A NotReady node starts no pod: say so plainly, do not wait and blame admission.
    nr = readiness.not_ready(view.node, view.lease, now_utc(),
                             [f"ssh {name} and run `kubectl-gpu_doctor local` (or `python3 -m "
                              f"node_probe`) there"])
    if nr is not None and not settings.force_pod:
        out.finding(nr)
        out.check(check_id, "skipped", 0.0, f"no debug pod: node {name} is NotReady")
        out.mark_incomplete(f"node {name} is NotReady: the node-side checks did not run")
        return PATH_NOT_READY
    # Decide from the API side first: on a kubelet that admits no pod, a debug pod could only
    # sit Pending beside the others (unless --force-pod).
    decision = wedge.decide(name, view.findings, view.pods, force=settings.force_pod)
    if view.agent_note and decision.blocked:  # say how the agent would have been the way in
        from . import agent
        decision = dataclasses.replace(
            decision, ways_in=decision.ways_in + (agent.way_in(view.agent_note),))
    if not decision.create_pod:
        out.finding(wedge.not_created_finding(name, decision))
        out.check(check_id, "skipped", 0.0, "no debug pod: " + decision.reason)
        out.mark_incomplete("the node-side checks did not run: the kubelet admits no pod, so "
                            "no debug pod was created" + (f" on {name}" if fleet else ""))
        return PATH_BLOCKED
    if decision.forced:
        out.say(decision.reason)
    names = subjects.PodIndex(view.pods)
    run_id = debugpod.new_run_id()
    probe_ns = probens.choose(settings.probe_namespace)  # never settings.namespace (-n)
    body = debugpod.manifest(name, probe_ns, run_id,
                             settings.image,
                             settings.timeout_s, settings.trace_s, focus_pods,
                             extra_args=settings.probe_args)
    pod = debugpod.DebugPod(kube, body, say=out.say)
    on_pod(pod)
    stalled = [f for f in view.findings  # the API side's verdict on this node
               if f.id in ("kubelet.admission_stalled", "kubelet.blocked_in_device_plugin")
               and f.severity.value in ("critical", "warning") and f.subject == subject]
    t0 = time.monotonic()
    start_timeout = settings.start_timeout_s
    if stalled:
        # The API side already says the kubelet admits nothing: try, but do not make the
        # on-call engineer wait a minute for a pod we expect to stay Pending.
        start_timeout = min(start_timeout, STALLED_START_TIMEOUT_S)
        out.say(f"the kubelet on {name} is not admitting pods; giving the debug pod "
                f"{start_timeout:.0f}s")
    try:
        if cancelled():  # `nodes --probe` interrupted before this worker began
            raise errors.Interrupted("interrupted")
        probens.verify(kube, probe_ns)  # a root pod goes only where the label says it may
        pod.create()
        try:
            pod.wait_running(start_timeout, cancelled=cancelled)
        except debugpod.PodNeverStarted as exc:
            _pod_not_started(out, name, pod, exc, stalled, view)
            out.check(check_id, "skipped", time.monotonic() - t0, "debug pod never started")
            return "debug pod"
        for note in pod.notes:   # fallbacks taken to start it (e.g. no mount propagation)
            out.log("info", note)
        out.say(f"probe running on {name}; following its output")
        deadline = time.monotonic() + settings.timeout_s + 30
        got_summary = False
        try:
            for rec in stream.records(pod.follow_log(read_timeout_s=settings.timeout_s + 30)):
                out.node_record(subjects.name_record(rec, names),
                                node=name if fleet else None)
                if rec.get("kind") == "summary":
                    got_summary = True
                if time.monotonic() > deadline:
                    out.mark_incomplete("the probe ran past its deadline")
                    break
        except errors.StreamBroken as exc:
            out.log("warning", f"{name}: {exc.one_line()}")
            out.mark_incomplete(f"{exc.one_line()}{' on ' + name if fleet else ''}")
        if not got_summary:
            reason = pod.terminated_reason()
            out.mark_incomplete(f"the probe's output{' on ' + name if fleet else ''} ended "
                                f"without a summary" + (f" ({reason})" if reason else ""))
        out.check(check_id, "ok" if got_summary else "error", time.monotonic() - t0,
                  f"via debug pod {pod.namespace}/{pod.name}")
        return "debug pod"
    finally:
        if pod.created or pod.in_doubt:
            if pod.delete():
                out.say(f"deleted debug pod {pod.namespace}/{pod.name}")
            else:
                out.log("warning", f"could not delete debug pod {pod.namespace}/{pod.name}; "
                                   f"run `kubectl gpu-doctor cleanup`")
        on_pod(None)


def _pod_not_started(out: Output, node: str, pod: debugpod.DebugPod,
                     exc: debugpod.PodNeverStarted, stalled: list[Finding],
                     view: NodeView) -> None:
    st = exc.pod.get("status") or {}
    untouched = admission.untouched_pending(exc.pod, (), now_utc()) is not None
    ways = [f"ssh {node} and run `kubectl-gpu_doctor local` (or `python3 -m node_probe`)"]
    if view.agent_note:
        from . import agent
        ways.append(agent.way_in(view.agent_note))
    ways += wedge.exec_ways(view.pods)
    evidence = {"pod": f"{pod.namespace}/{pod.name}", "waited_s": round(exc.waited_s, 1),
                "phase": st.get("phase") or "Pending", "kubelet_touched": not untouched,
                "caused_by": [f.id for f in stalled] or None, "ways_in": ways}
    rejected = readiness.rejection(exc.pod) if isinstance(exc, debugpod.PodRejected) else None
    hint = ""
    if rejected:
        reason, message, hint = rejected
        evidence.update(rejected_reason=reason, rejected_message=message or None,
                        node_pressure=readiness.pressures(view.node) or None)
        title = (f"the kubelet on {node} refused the debug pod at admission ({reason}"
                 f"{': ' + message if message else ''})")
        severity = "warning"
    elif stalled:
        title = (f"the debug pod did not start on {node} within {exc.waited_s:.0f}s, as "
                 f"expected: the kubelet is not admitting pods ({', '.join(sorted({f.id for f in stalled}))})")
        severity = "warning"
    elif untouched:
        title = (f"the kubelet on {node} did not act on the debug pod within "
                 f"{exc.waited_s:.0f}s (no status, no events): pod admission looks stalled")
        severity = "critical"
    else:
        cs = debugpod.container_status(exc.pod) or {}
        waiting = ((cs.get("state") or {}).get("waiting") or {}).get("reason") or "Pending"
        title = f"the debug pod did not start on {node} within {exc.waited_s:.0f}s ({waiting})"
        severity = "warning"
    out.finding(catalog.make(
        "probe.pod_not_started", severity, f"node/{node}", title, evidence,
        "The node-side checks could not run through a pod. " + (hint[:1].upper() + hint[1:]
                                                                + ". " if hint else "")
        + "Ways in that do not need a new pod: " + "; ".join(ways) + ".",
        ("https://kubernetes.io/docs/tasks/debug/debug-application/debug-pods/",)))
    out.mark_incomplete("the debug pod never started, so node-side checks did not run")


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

def diagnose_node(kube: Kube, name: str, settings: Settings, out: Output,
                  cancelled: Callable[[], bool] = lambda: False,
                  on_pod: Callable = lambda p: None) -> None:
    node = get_node(kube, name)  # unknown node: one line, exit 3, before anything else
    out.check("api.node", "ok", 0.0)
    view = collect_node(kube, name, settings, out, node=node)
    out.findings(view.findings)
    if settings.probe:
        run_probe(kube, view, settings, out, cancelled=cancelled, on_pod=on_pod)


def diagnose_pod(kube: Kube, namespace: str, name: str, settings: Settings, out: Output,
                 cancelled: Callable[[], bool] = lambda: False,
                 on_pod: Callable = lambda p: None) -> None:
    try:
        pod = get_pod(kube, namespace, name)
    except errors.NotFound:
        # never created? a GPU quota refusing its controller's creates (StatefulSet trainer-0)
        refused = pending.not_created(kube, namespace, name, out)
        if not refused:
            raise
        out.findings(refused)
        return
    try:
        evs = pod_events(kube, pod)
        events_known = True
    except errors.ApiError as exc:
        evs, events_known = [], False
        out.log("warning", f"cannot read the pod's events: {exc.status} {exc.message[:160]}")
    node_name = (pod.get("spec") or {}).get("nodeName")
    out.report.target["node"] = node_name
    view = None
    if node_name:
        try:
            node = get_node(kube, node_name)
        except errors.NotFound:
            out.finding(node_not_found(node_name, pod))
            return
        view = collect_node(kube, node_name, settings, out, node=node)
        out.findings(view.findings)
    # an unscheduled GPU pod: its fit against every node names the case (pending.py)
    fit = None if node_name else pending.collect(kube, pod, evs, out, now_utc())
    if not node_name and (pod.get("spec") or {}).get("resourceClaims"):
        # unscheduled and waiting on DRA claims: why are they not allocated
        t0 = time.monotonic()
        with worker_pool(1, "dra") as one:
            extra = _extra_lists(out, one.submit(
                extra_lists.fetch, kube, ("resourceclaims", "resourceslices", "deviceclasses"),
                30), t0)
        if extra and extra.get("resourceclaims") is not None and \
                extra.get("resourceslices") is not None:
            out.findings(dra.analyze_claims([pod], extra["resourceclaims"],
                                            extra["resourceslices"],
                                            extra.get("deviceclasses") or (), evs, now_utc()))
    out.findings(pod_status.analyze_pod(pod, evs, now_utc(), settings.stall_threshold_s,
                                        fit=fit, node_findings=view.findings if view else ()))
    if not events_known:
        out.mark_incomplete("the pod's events were not readable")
    if view is not None and settings.probe:
        uid = (pod.get("metadata") or {}).get("uid")
        run_probe(kube, view, settings, out, focus_pods=(uid,) if uid else (),
                  cancelled=cancelled, on_pod=on_pod)

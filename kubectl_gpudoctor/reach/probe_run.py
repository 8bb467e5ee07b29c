"""Run the node probe on one node and merge its records into the report: by exec in the standing
agent when one runs there, else in a debug pod -- unless the API side already knows no pod can
start (NotReady, or a kubelet that admits nothing), which is then reported instead.

Why apart from commands/node.py: `node`, `pod` and `nodes --probe` all reach nodes the same way.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import time
from typing import Callable

from node_probe.protocol import catalog
from node_probe.protocol import Finding

from .. import errors
from . import probens
from . import stream
from . import debugpod
from . import podspec
from ..analysis import subjects
from ..analysis.stuck import admission, readiness, wedge
from ..api.kube import Kube
from ..report.output import Output


STALLED_START_TIMEOUT_S = 15.0
PROXY_TIMEOUT_S = 10.0


@dataclasses.dataclass
class Settings:
    namespace: str = "default"       # of `pod Y` only: never where the debug pod runs
    probe_namespace: str | None = None  # the debug pod's (probens.choose: flag, env, default)
    image: str = podspec.DEFAULT_IMAGE
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
    agent: bool = True               # exec in a Running agent pod first (agent_exec.py)
    agent_namespace: str = "gpu-doctor"


@dataclasses.dataclass
class NodeView:
    node: dict
    pods: list[dict]
    lease: dict | None
    kubelet_cfg: dict | None
    findings: list[Finding]
    agent_note: str = ""             # why the agent was not used on this node (report text)
    events: list = dataclasses.field(default_factory=list)  # events about the Node object


def now_utc() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


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
        from . import agent_exec
        apod, view.agent_note = agent_exec.find_agent_pod(kube, settings.agent_namespace, name)
        if apod is None and agent_exec.REFUSED in view.agent_note:  # a lookalike: say so
            out.log("warning", f"{name}: {view.agent_note}; using a debug pod instead")
        if apod is not None and agent_exec.run_probe(
                kube, name, apod, out, timeout_s=settings.timeout_s, trace_s=settings.trace_s,
                focus_pods=focus_pods, extra_args=settings.probe_args, fleet=fleet,
                check_id=check_id, pods=view.pods):
            return "agent"
    # A NotReady node starts no pod: say so plainly, do not wait and blame admission.
    nr = readiness.not_ready(view.node, view.lease, now_utc())
    if nr is not None and not settings.force_pod:
        out.finding(nr)
        out.check(check_id, "skipped", 0.0, f"no debug pod: node {name} is NotReady")
        out.mark_incomplete(f"node {name} is NotReady: the node-side checks did not run")
        return PATH_NOT_READY
    # Decide from the API side first: on a kubelet that admits no pod, a debug pod could only
    # sit Pending beside the others (unless --force-pod).
    decision = wedge.decide(name, view.findings, view.pods, force=settings.force_pod)
    if view.agent_note and decision.blocked:  # say how the agent would have been the way in
        from . import agent_exec
        decision = dataclasses.replace(
            decision, ways_in=decision.ways_in + (agent_exec.way_in(view.agent_note),))
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
    pod = debugpod.DebugPod(kube, body, say=out.say, timed_say=out.say)
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
        deadline = time.monotonic() + settings.timeout_s + stream.PROBE_GRACE_S
        got_summary = False
        try:
            for rec in stream.records(pod.follow_log(
                    read_timeout_s=settings.timeout_s + stream.PROBE_GRACE_S)):
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
                                   f"run `kubectl gpu-doctor cleanup -n {pod.namespace}`")
        on_pod(None)


def _pod_not_started(out: Output, node: str, pod: debugpod.DebugPod,
                     exc: debugpod.PodNeverStarted, stalled: list[Finding],
                     view: NodeView) -> None:
    st = exc.pod.get("status") or {}
    untouched = admission.untouched_pending(exc.pod, (), now_utc()) is not None
    ways = [f"ssh {node} and run `kubectl-gpu_doctor local` (or `python3 -m node_probe`)"]
    if view.agent_note:
        from . import agent_exec
        ways.append(agent_exec.way_in(view.agent_note))
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



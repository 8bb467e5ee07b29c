"""How each channel's artifact reaches the tool, in one place (the feeding tests and
tests/realworld/score.py share it).

kmsg: the quote becomes /dev/kmsg records (`PRI,SEQ,USEC,-;message`, a message's continuation
lines joined with the kernel's `\\x0a` escape) in a host root, and a pasted file given as
--kmsg-file; the probe's kmsg check runs in-process through the engine's Runner (its
de-duplication included), once per way.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from node_probe.checks import kmsg
from node_probe.engine import registry
from node_probe.engine.context import ProbeOptions
from node_probe.engine.runner import Runner

from .artifact import Artifact

_CONT = re.compile(r"^\s+NVRM:")     # dmesg's continuation of a multi-line message


def kmsg_records(quote: str) -> bytes:
    """The quote as /dev/kmsg would hand it out: one record per kernel message."""
    recs: list[list] = []
    for line in quote.splitlines():
        if _CONT.match(line) and recs:
            recs[-1][1] += "\\x0a" + line.strip()
            continue
        ts, msg = kmsg.parse_line(line.strip())
        recs.append([ts, msg])
    out = []
    for seq, (ts, msg) in enumerate(recs):
        usec = int((ts if ts is not None else 100.0 + seq) * 1_000_000)
        out.append(f"4,{seq},{usec},-;{msg}\n SUBSYSTEM=pci\n")
    return "".join(out).encode()


def _run(opts: ProbeOptions):
    checks = registry.select(("kmsg",), ())
    return Runner(checks, opts, lambda rec: None, fail_on="never").run().findings


def probe_kmsg_host_root(a: Artifact, tmp: Path):
    root = tmp / "root"
    (root / "dev").mkdir(parents=True, exist_ok=True)
    (root / "dev/kmsg").write_bytes(kmsg_records(a.quote))
    return _run(ProbeOptions(host_root=root, trace_s=0.0, timeout_s=20.0))


def probe_kmsg_file(a: Artifact, tmp: Path):
    f = tmp / "pasted.log"
    f.write_text(a.quote + "\n")
    (tmp / "empty").mkdir(exist_ok=True)
    return _run(ProbeOptions(host_root=tmp / "empty", kmsg_file=f, trace_s=0.0,
                             timeout_s=20.0))


def answers(a: Artifact, findings) -> bool:
    """Did the tool name the source's cause: id, severity and the cause word (which the
    quote does not contain) in the finding's title, remediation or evidence?"""
    for f in findings:
        if f.id != a.expect_id or f.severity.value != a.expect_severity:
            continue
        text = " ".join((f.title, f.remediation, json.dumps(dict(f.evidence), default=str)))
        if a.cause_word.lower() in text.lower():
            return True
    return False


# -- the API channels: through the fake API server, read by `pod Y` / `node X` -----------------

API_CHANNELS = frozenset({"event", "pod_status", "node_condition", "node_status",
                          "runtime_message"})


def load_api(cluster, a: Artifact, i: int) -> tuple[str, str | None]:
    """Put the artifact where the API server shows it; (node, pod name or None)."""
    import datetime as dt
    node = f"gpu-{i}"
    n = cluster.add_node(node, gpus=ctx_int(a, "capacity", 8),
                         allocatable_gpus=ctx_int(a, "allocatable", None))
    now = dt.datetime.now(dt.timezone.utc)
    ctx = a.context
    if a.channel == "node_status":
        return node, None
    if a.channel == "node_condition":
        n["status"]["conditions"].append({
            "type": ctx["type"], "status": ctx["status"], "reason": ctx["reason"],
            "message": a.quote, "lastHeartbeatTime": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "lastTransitionTime": now.strftime("%Y-%m-%dT%H:%M:%SZ")})
        return node, None
    if ctx.get("plugin_pod"):
        cluster.add_pod("gpu-operator", ctx["plugin_pod"], node, phase="Running", extra_status={
            "containerStatuses": [{
                "name": "main", "ready": False, "restartCount": 7,
                "state": {"waiting": {"reason": "CrashLoopBackOff",
                                      "message": "back-off 5m0s restarting failed container"}},
                "lastState": {"terminated": {"reason": ctx["reason"], "exitCode": 128,
                                             "message": a.quote}}}]})
        return node, None
    name = f"train-{i}"
    phase = ctx.get("phase", "Pending")
    extra = {"reason": ctx["reason"], "message": a.quote} if a.channel == "pod_status" else {}
    creating = {"containerStatuses": [{"name": "main", "ready": False, "restartCount": 0,
                                       "state": {"waiting": {"reason": "ContainerCreating"}}}]}
    if (phase == "Pending" and ctx.get("reason") == "FailedPrepareDynamicResources") \
            or a.channel == "runtime_message":
        extra = creating      # the kubelet's event says why the container is not created
    elif a.channel == "pod_status" and ctx.get("state"):
        extra = {"containerStatuses": [_container_state(ctx, a.quote)]}
    pod = cluster.add_pod("default", name, node, phase=phase, gpus=1, age_s=120,
                          events="scheduled-only", extra_status=extra)
    if a.channel in ("event", "runtime_message"):
        cluster.add_event(pod, "Warning", ctx["reason"], a.quote, "kubelet",
                          now - dt.timedelta(seconds=60), host=node)
    return node, name


def _container_state(ctx: dict, quote: str) -> dict:
    """A container's status as the kubelet reports a runtime's refusal: `waiting` with the
    runtime's message (CreateContainerError, RunContainerError), or a failed start
    (`terminated` StartError, exit 128, the kubelet backing off)."""
    cs = {"name": "main", "ready": False, "restartCount": 4, "image": "registry.example/a:1"}
    if ctx["state"] == "waiting":
        cs["state"] = {"waiting": {"reason": ctx["reason"], "message": quote}}
    else:
        cs["state"] = {"waiting": {"reason": ctx.get("waiting", "CrashLoopBackOff"),
                                   "message": "back-off 40s restarting failed container"}}
        cs["lastState"] = {"terminated": {"reason": ctx["reason"], "exitCode": 128,
                                          "message": quote}}
    return cs


def ctx_int(a: Artifact, key: str, default):
    v = a.context.get(key)
    return default if v is None else int(v)


def diagnose(kubeconfig: Path, node: str, pod: str | None):
    """`pod Y` (when the artifact is about a pod) or `node X`, API side only, in-process
    through the real kubernetes client; the findings of the report."""
    import io
    from kubectl_gpudoctor.api.kube import Kube
    from kubectl_gpudoctor.commands import node as node_cmd
    from kubectl_gpudoctor.reach.probe_run import Settings
    from kubectl_gpudoctor.report.output import Output
    kube = Kube(str(kubeconfig))
    out = Output("json", "warning", {"kind": "pod" if pod else "node", "name": pod or node,
                                     "node": node}, out=io.StringIO(), err=io.StringIO(),
                 progress=False)
    settings = Settings(namespace="default", probe=False, kubelet_timeout_s=2.0)
    if pod:
        node_cmd.diagnose_pod(kube, "default", pod, settings, out)
    else:
        node_cmd.diagnose_node(kube, node, settings, out)
    return list(out.report.findings)

"""Reach a node through the standing agent: find its Running pod on the node, exec the probe in
it through the API server (deadlines on connect and run) and stream the records back.

Why: exec into a pod that was already running keeps working on a node whose kubelet admits no
new pod (the wedge the tool exists for, verified on a 1.35 kubelet), where a debug pod never
starts. Manifests: reach/agent_manifests.py; install/status: commands/agent.py.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Mapping, Sequence

from node_probe.protocol.version import __version__

from .. import errors
from . import probens
from . import podspec
from ..api.kube import Kube
from .agent_manifests import AGENT_NAME, DEFAULT_NAMESPACE, DS_PATH, INSTALL_COMMAND, LABEL_SELECTOR


# -- install / uninstall ---------------------------------------------------------------------


# -- finding the agent on a node ---------------------------------------------------------------

REFUSED = "not exec'd"  # in find_agent_pod's reason when a pod was there but not trusted

def pod_ready(pod: Mapping[str, Any]) -> bool:
    """Running, not being deleted, the probe container running: exec will reach it."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    st = pod.get("status") or {}
    if st.get("phase") != "Running":
        return False
    for cs in st.get("containerStatuses") or ():
        if cs.get("name") == podspec.CONTAINER:
            return "running" in (cs.get("state") or {})
    return False


def list_agent_pods(kube: Kube, namespace: str, node: str | None = None) -> list[dict]:
    q: list = [("labelSelector", LABEL_SELECTOR)]
    if node:
        q.append(("fieldSelector", f"spec.nodeName={node}"))
    doc = kube.get_json(f"/api/v1/namespaces/{namespace}/pods", q, timeout=10)
    return list(doc.get("items") or ())


def find_agent_pod(kube: Kube, namespace: str, node: str) -> tuple[dict | None, str]:
    """The Running agent pod on `node`, or None and why not (for the report)."""
    try:
        pods = list_agent_pods(kube, namespace, node)
    except errors.NotFound:
        return None, f"namespace {namespace} not found"
    except errors.ApiError as exc:
        return None, f"cannot list agent pods in {namespace} ({exc.status})"
    ready = [p for p in pods if pod_ready(p)]
    if ready:
        try:  # only gpu-doctor's labelled namespace is trusted to hold the agent (probens.py)
            probens.verify(kube, namespace)
        except errors.GpuDoctorError as exc:
            return None, exc.one_line()
        try:
            ds = kube.get_json(f"{DS_PATH.format(ns=namespace)}/{AGENT_NAME}", timeout=10)
        except errors.NotFound:
            ds = None
        except errors.ApiError as exc:
            return None, (f"cannot read daemonset {namespace}/{AGENT_NAME} to verify the agent "
                          f"pod ({exc.status}); {REFUSED}")
        why = ""
        for p in ready:  # the first that is really the agent (a lookalike may sit beside it)
            why = not_the_agent(p, ds, namespace)
            if not why:
                return p, ""
        md = ready[0].get("metadata") or {}
        return None, f"pod {namespace}/{md.get('name')} is not the gpu-doctor agent ({why}); {REFUSED}"
    if pods:
        st = (pods[0].get("status") or {}).get("phase") or "Pending"
        return None, f"the agent pod on {node} is {st}"
    return None, "no agent pod on this node"


def not_the_agent(pod: Mapping[str, Any], ds: Mapping[str, Any] | None, namespace: str) -> str:
    """Why `pod` is not the agent we installed ("" if it is): anyone who can create pods in the
    namespace can give a pod the agent's labels, so exec (root on the node) goes only to a pod
    whose controller is our DaemonSet (name, namespace, uid) running the DaemonSet's image (or,
    mid rolling update, another of its repository), and, when pinned by digest, whose running
    image (status imageID) has that digest."""
    if ds is None:
        return f"no daemonset {namespace}/{AGENT_NAME} owns it"
    ds_uid = (ds.get("metadata") or {}).get("uid")
    owners = [o for o in (pod.get("metadata") or {}).get("ownerReferences") or ()
              if isinstance(o, dict) and o.get("controller") is True]
    if not (len(owners) == 1 and owners[0].get("kind") == "DaemonSet"
            and owners[0].get("apiVersion") == "apps/v1" and owners[0].get("name") == AGENT_NAME
            and ds_uid and owners[0].get("uid") == ds_uid):
        return f"its controller is not daemonset {namespace}/{AGENT_NAME}"
    want = _probe_image(((ds.get("spec") or {}).get("template") or {}).get("spec") or {})
    have = _probe_image(pod.get("spec") or {})
    # the DaemonSet's image, or (a pod of an earlier revision, mid rolling update) another of
    # the same repository
    if not want or not have or (have != want and _repository(have) != _repository(want)):
        return "its image is not the daemonset's"
    digest = have.rpartition("@")[2] if "@sha256:" in have else ""
    if digest:
        cs = next((c for c in (pod.get("status") or {}).get("containerStatuses") or ()
                   if isinstance(c, dict) and c.get("name") == podspec.CONTAINER), {})
        if not str(cs.get("imageID") or "").endswith("@" + digest):
            return f"its running image is not {digest[:19]}..."
    return ""


def _repository(ref: str) -> str:
    """registry/path of an image reference, without tag or digest."""
    name = ref.split("@", 1)[0]
    head, _, last = name.rpartition("/")
    return f"{head}/{last.split(':', 1)[0]}" if head else last.split(":", 1)[0]


def _probe_image(spec: Mapping[str, Any]) -> str:
    for c in spec.get("containers") or ():
        if isinstance(c, dict) and c.get("name") == podspec.CONTAINER:
            return str(c.get("image") or "")
    return ""


def way_in(note: str) -> str:
    """The report's line about the agent when it could not be used on a node (`note` is
    find_agent_pod's reason)."""
    if note.startswith("namespace ") or note == "no agent pod on this node":
        return (f"the standing agent is not installed here ({note}): `{INSTALL_COMMAND}` makes "
                f"the next wedge reachable by exec (its pod cannot start on a node that "
                f"already admits nothing)")
    return f"the standing agent cannot be used: {note}"


# -- status ------------------------------------------------------------------------------------

@dataclasses.dataclass
class NodeAgent:
    node: str
    pod: str | None
    phase: str
    image: str | None
    version: str | None

    def skew(self, image: str) -> str | None:
        if self.pod is None:
            return None
        reasons = []
        if self.version and self.version != __version__:
            reasons.append(f"agent {self.version}, plugin {__version__}")
        if self.image and self.image != image:
            reasons.append(f"image {self.image}, plugin uses {image}")
        return "; ".join(reasons) or None


# -- the node probe by exec in the agent -----------------------------------------------------

def run_probe(kube: Kube, node: str, agent_pod: Mapping[str, Any], out: Any, *,
              timeout_s: float, trace_s: float, focus_pods: Sequence[str] = (),
              extra_args: Sequence[str] = (), fleet: bool = False,
              check_id: str = "node.probe",
              pods: Sequence[Mapping[str, Any]] = ()) -> bool:
    """Exec `python3 -m node_probe ...` in the agent pod; merge its records into `out`, live.
    `pods` (the node's pods from the API) name what the node could only identify by pod UID
    or container id, as on the debug pod's path (analysis/subjects.py).

    Returns False when the exec was refused or could not connect before the probe started
    (RBAC, the pod just went away, API server unreachable): the caller then uses a debug pod.
    Returns True when the probe ran, whether or not it completed (an incomplete run is marked
    in `out`, with the reason: stream cut, agent pod deleted mid-run, deadline)."""
    from . import execstream
    from . import stream
    from ..analysis import subjects

    names = subjects.PodIndex(pods)
    md = agent_pod.get("metadata") or {}
    ns, name = md.get("namespace") or DEFAULT_NAMESPACE, md.get("name") or ""
    cmd = podspec.probe_args(timeout_s, trace_s, node, focus_pods, extra_args)
    ex = execstream.ExecStream(kube, ns, name, podspec.CONTAINER, cmd,
                               connect_timeout_s=min(10.0, timeout_s),
                               deadline_s=timeout_s + stream.PROBE_GRACE_S)
    t0 = time.monotonic()
    try:
        ex.open()
    except (errors.ApiError, errors.ApiUnreachable) as exc:
        out.log("warning", f"{node}: cannot exec into agent pod {ns}/{name}: {exc.one_line()}"
                           f"; using a debug pod instead")
        return False
    where = f" on {node}" if fleet else ""
    out.say(f"probe running in agent pod {ns}/{name} on {node}; following its output")
    got_summary = False
    try:
        for rec in stream.records(ex.chunks()):
            out.node_record(subjects.name_record(rec, names), node=node if fleet else None)
            got_summary = got_summary or rec.get("kind") == "summary"
    except errors.StreamBroken as exc:
        out.log("warning", f"{node}: {exc.one_line()}")
        if not got_summary:
            out.mark_incomplete(f"{exc.one_line()}")
    end = ex.end
    if not got_summary:
        why = _why_no_summary(kube, ns, name, end)
        tail = (end.stderr_tail if end else b"").decode("utf-8", "replace").strip()
        if tail:
            out.log("warning", f"{node}: the probe's stderr ends with: {tail.splitlines()[-1][:300]}")
        out.mark_incomplete(f"the probe's output{where} (agent pod {ns}/{name}) ended without a "
                            f"summary" + (f" ({why})" if why else ""))
    out.check(check_id, "ok" if got_summary else "error", time.monotonic() - t0,
              f"via agent pod {ns}/{name}")
    return True


def _why_no_summary(kube: Kube, ns: str, name: str, end: Any) -> str:
    parts = []
    if end is not None and end.exit_code is not None:
        parts.append(f"exit code {end.exit_code}")
    elif end is not None and end.status:
        parts.append(" ".join(str(end.status.get("message") or end.reason).split())[:200])
    try:
        pod = kube.get_json(f"/api/v1/namespaces/{ns}/pods/{name}", timeout=5)
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            parts.append("the agent pod is being deleted")
    except errors.NotFound:
        parts.append("the agent pod was deleted while the probe ran")
    except errors.GpuDoctorError:
        pass
    return "; ".join(parts)


# -- the watching agent's evidence ring --------------------------------------------------------

HISTORY_COMMAND = ("python3", "-m", "node_probe", "agent-history")
HISTORY_LIST_MAX = 256 * 1024      # agent-history lists at most 100 one-line entries


def agent_history(kube: Kube, agent_pod: Mapping[str, Any], args: Sequence[str], limit: int,
                  deadline_s: float = 60.0) -> bytes:
    """Run the read-only `python3 -m node_probe agent-history ARGS` in the agent pod; its
    stdout, at most `limit` bytes. A refusal by the agent (no such bundle, no ring) is one
    UsageError with its message; a broken exec is a ClusterError."""
    from . import execstream

    md = agent_pod.get("metadata") or {}
    ns, name = md.get("namespace") or DEFAULT_NAMESPACE, md.get("name") or ""
    ex = execstream.ExecStream(kube, ns, name, podspec.CONTAINER,
                               [*HISTORY_COMMAND, *args], connect_timeout_s=10.0,
                               deadline_s=deadline_s)
    ex.open()
    buf = bytearray()
    for chunk in ex.chunks():
        buf += chunk
        if len(buf) > limit:
            ex.close()
            raise errors.StreamBroken(f"the agent in {ns}/{name} sent more than {limit} bytes "
                                      f"for `agent-history {' '.join(args)}`")
    end = ex.end
    if end is not None and end.exit_code not in (0, None):
        tail = end.stderr_tail.decode("utf-8", "replace").strip().splitlines()
        why = " ".join((tail[-1] if tail else f"exit code {end.exit_code}").split())[:300]
        why = "".join(ch if ch.isprintable() else "?" for ch in why)
        if end.exit_code == 2:
            raise errors.UsageError(f"agent {ns}/{name}: {why}")
        raise errors.ClusterError(f"agent {ns}/{name}: {why}")
    return bytes(buf)


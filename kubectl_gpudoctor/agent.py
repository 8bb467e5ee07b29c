"""The optional standing agent: a DaemonSet of the probe image, idle until `node X` execs into it.

Why: the flagship incident (seed 000) wedges the kubelet's pod admission, so the debug pod -- a
new pod -- never starts exactly when the node-side evidence matters most. Exec into a pod that
was already running keeps working on such a node (verified on a 1.35 kubelet). The agent is
that pod: `python3 -m node_probe agent-idle` sleeps (about 15 MiB RSS, no CPU) until
`node X` / `pod Y` / `nodes --probe` exec `python3 -m node_probe ...` in it.

What it may do is exactly what the debug pod may do: the pod spec comes from the same builder
(debugpod.node_pod_spec), plus what a daemon needs to stay put -- `system-node-critical`
priority so node pressure does not evict it, restartPolicy Always, every taint tolerated.
It runs only in the tool's own namespace (default `gpu-doctor`); exec into it is root on the
node, so `pods/exec` there is granted by its own opt-in Role (deploy/agent-rbac.yaml).

Manifests are generated here (so --image and the release digest pin apply) and printable with
`agent install --dry-run -o yaml` for GitOps.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Mapping, Sequence

from node_probe.protocol.version import __version__

from . import debugpod, errors, probens
from .kube import Kube

AGENT_NAME = "gpu-doctor-agent"
DEFAULT_NAMESPACE = "gpu-doctor"
COMPONENT_LABEL = "app.kubernetes.io/component"
COMPONENT = "agent"
VERSION_LABEL = "app.kubernetes.io/version"
MANAGED_BY = ("app.kubernetes.io/managed-by", "kubectl-gpu-doctor")
SELECTOR = {debugpod.APP_LABEL: debugpod.APP_NAME, COMPONENT_LABEL: COMPONENT}
LABEL_SELECTOR = ",".join(f"{k}={v}" for k, v in SELECTOR.items())
IDLE_COMMAND = ("python3", "-m", "node_probe", "agent-idle")
PRIORITY_CLASS = "system-node-critical"
# The agent only sleeps; the probe it runs on request shares its limits (the debug pod's).
IDLE_REQUESTS = {"cpu": "5m", "memory": "32Mi"}
INSTALL_COMMAND = "kubectl gpu-doctor agent install"
DS_PATH = "/apis/apps/v1/namespaces/{ns}/daemonsets"
QUOTA_NAME = "gpu-doctor-agent-critical-pods"


def default_image() -> str:
    return debugpod.DEFAULT_IMAGE


def namespace_manifest(namespace: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": namespace, "labels": {
                "app.kubernetes.io/part-of": debugpod.APP_NAME,
                # the client runs probes only in namespaces with this label (probens.py)
                probens.LABEL: probens.LABEL_VALUE,
                # the agent is privileged (hostPID, host / mounted), like the debug pod
                "pod-security.kubernetes.io/enforce": "privileged",
                "pod-security.kubernetes.io/warn": "privileged",
                "pod-security.kubernetes.io/audit": "privileged"}}}


def quota_manifest(namespace: str) -> dict:
    """Clusters that limit critical priority classes to kube-system by default (the
    ResourceQuota admission `limitedResources` setup, e.g. GKE) admit `system-node-critical`
    pods elsewhere only where a quota covers that class; one agent pod per node fits in it."""
    return {"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": QUOTA_NAME, "namespace": namespace,
                         "labels": {**SELECTOR, MANAGED_BY[0]: MANAGED_BY[1]}},
            "spec": {"hard": {"pods": "10000"},
                     "scopeSelector": {"matchExpressions": [{
                         "operator": "In", "scopeName": "PriorityClass",
                         "values": [PRIORITY_CLASS]}]}}}


def daemonset(namespace: str, image: str, node_selector: Mapping[str, str] | None = None
              ) -> dict:
    labels = {**SELECTOR, VERSION_LABEL: __version__, MANAGED_BY[0]: MANAGED_BY[1]}
    spec = debugpod.node_pod_spec(image, IDLE_COMMAND, requests=IDLE_REQUESTS)
    spec.update({"priorityClassName": PRIORITY_CLASS, "restartPolicy": "Always",
                 "terminationGracePeriodSeconds": 5})
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": AGENT_NAME, "namespace": namespace, "labels": labels,
                     "annotations": {"gpu-doctor/purpose":
                                     "idle until `kubectl gpu-doctor node X` execs the "
                                     "read-only node probe in it"}},
        "spec": {
            "selector": {"matchLabels": dict(SELECTOR)},
            "updateStrategy": {"type": "RollingUpdate",
                               "rollingUpdate": {"maxUnavailable": "10%"}},
            "template": {"metadata": {"labels": labels,
                                      "annotations": {"gpu-doctor/image": image}},
                         "spec": spec},
        },
    }


def manifests(namespace: str, image: str, node_selector: Mapping[str, str] | None = None
              ) -> list[dict]:
    """Everything `agent install` creates, in order (printable for GitOps)."""
    return [namespace_manifest(namespace), quota_manifest(namespace),
            daemonset(namespace, image, node_selector)]


def parse_selector(text: str | None) -> dict[str, str]:
    """`k=v,k2=v2` (equality only: a DaemonSet's nodeSelector has nothing else)."""
    out: dict[str, str] = {}
    for term in filter(None, (t.strip() for t in (text or "").split(","))):
        k, sep, v = term.partition("=")
        if not sep or not k.strip() or "!" in k:
            raise errors.UsageError(f"--node-selector takes key=value[,key=value]: {term!r}")
        out[k.strip()] = v.strip()
    return out


# -- install / uninstall ---------------------------------------------------------------------

def _path(m: Mapping[str, Any]) -> tuple[str, str]:
    """(collection path, object path) of a manifest."""
    kind, md = m["kind"], m["metadata"]
    if kind == "Namespace":
        return "/api/v1/namespaces", f"/api/v1/namespaces/{md['name']}"
    if kind == "ResourceQuota":
        coll = f"/api/v1/namespaces/{md['namespace']}/resourcequotas"
    elif kind == "DaemonSet":
        coll = DS_PATH.format(ns=md["namespace"])
    else:  # pragma: no cover - only the kinds above are generated
        raise ValueError(kind)
    return coll, f"{coll}/{md['name']}"


def install(kube: Kube, docs: Sequence[Mapping[str, Any]],
            say: Callable[[str], None] = lambda s: None) -> list[str]:
    """Create each object; replace it when it exists (a Namespace is left as it is).
    Returns one line per object."""
    done = []
    for m in docs:
        coll, obj = _path(m)
        what = f"{m['kind'].lower()}/{m['metadata']['name']}"
        try:
            try:
                kube.post_json(coll, m)
                done.append(f"{what} created")
            except errors.Conflict:
                if m["kind"] == "Namespace":
                    done.append(f"{what} unchanged (exists)")
                else:
                    kube.request("PUT", obj, body=dict(m))
                    done.append(f"{what} configured")
        except errors.Forbidden as exc:
            raise errors.Forbidden(
                f"not allowed to create {what}: {exc.message[:200]}", status=403,
                hint=f"installing the agent needs a cluster admin (or apply "
                     f"`{INSTALL_COMMAND} --dry-run -o yaml` through your GitOps pipeline)"
            ) from None
        except errors.ApiError as exc:
            raise exc.about(what, "create") from None
        say(done[-1])
    return done


def uninstall(kube: Kube, namespace: str) -> list[str]:
    """Delete the DaemonSet (its pods go with it) and the quota; the namespace stays (the
    debug pod's RBAC of deploy/rbac.yaml lives there too)."""
    done = []
    for m in (daemonset(namespace, default_image()), quota_manifest(namespace)):
        _, obj = _path(m)
        what = f"{m['kind'].lower()}/{m['metadata']['name']}"
        try:
            kube.request("DELETE", obj, [("propagationPolicy", "Background")])
            done.append(f"{what} deleted")
        except errors.NotFound:
            done.append(f"{what} not found")
        except errors.ApiError as exc:
            raise exc.about(what, "delete") from None
    return done


# -- finding the agent on a node ---------------------------------------------------------------

def pod_ready(pod: Mapping[str, Any]) -> bool:
    """Running, not being deleted, the probe container running: exec will reach it."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    st = pod.get("status") or {}
    if st.get("phase") != "Running":
        return False
    for cs in st.get("containerStatuses") or ():
        if cs.get("name") == debugpod.CONTAINER:
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
        return ready[0], ""
    if pods:
        st = (pods[0].get("status") or {}).get("phase") or "Pending"
        return None, f"the agent pod on {node} is {st}"
    return None, "no agent pod on this node"


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


def status(kube: Kube, namespace: str, image: str, node_selector: str | None = None
           ) -> dict:
    """Which nodes have a Running agent, and which agent image/version differs from ours."""
    ds = None
    try:
        ds = kube.get_json(f"{DS_PATH.format(ns=namespace)}/{AGENT_NAME}", timeout=10)
    except errors.NotFound:
        pass
    except errors.ApiError as exc:
        raise exc.about(f"daemonset {namespace}/{AGENT_NAME}") from None
    try:
        pods = list_agent_pods(kube, namespace)
    except errors.NotFound:
        pods = []
    except errors.ApiError as exc:
        raise exc.about(f"agent pods in {namespace}", "list") from None
    q = [("labelSelector", node_selector)] if node_selector else []
    if ds is not None and not node_selector:
        sel = ((ds.get("spec") or {}).get("template") or {}).get("spec", {}).get("nodeSelector")
        if sel:
            q = [("labelSelector", ",".join(f"{k}={v}" for k, v in sel.items()))]
    try:
        nodes = kube.get_json("/api/v1/nodes", q, timeout=30).get("items") or []
    except errors.ApiError as exc:
        raise exc.about("nodes", "list") from None
    by_node: dict[str, list[dict]] = {}
    for p in pods:
        by_node.setdefault((p.get("spec") or {}).get("nodeName") or "", []).append(p)
    rows = []
    for n in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        name = n["metadata"]["name"]
        cands = sorted(by_node.get(name, []), key=lambda p: not pod_ready(p))
        if not cands:
            rows.append(NodeAgent(name, None, "missing", None, None))
            continue
        p = cands[0]
        c = ((p.get("spec") or {}).get("containers") or [{}])[0]
        phase = "Running" if pod_ready(p) else ((p.get("status") or {}).get("phase") or "Pending")
        rows.append(NodeAgent(name, p["metadata"]["name"], phase, c.get("image"),
                              (p["metadata"].get("labels") or {}).get(VERSION_LABEL)))
    return {"installed": ds is not None, "namespace": namespace, "image": image,
            "plugin_version": __version__,
            "daemonset": None if ds is None else {
                "name": AGENT_NAME, "status": ds.get("status") or {},
                "image": (((ds.get("spec") or {}).get("template") or {}).get("spec") or {})
                .get("containers", [{}])[0].get("image")},
            "nodes": [{"node": r.node, "pod": r.pod, "phase": r.phase, "image": r.image,
                       "version": r.version, "skew": r.skew(image)} for r in rows]}


def status_ok(doc: Mapping[str, Any]) -> bool:
    return bool(doc["installed"]) and all(
        r["phase"] == "Running" and not r["skew"] for r in doc["nodes"])


def status_table(doc: Mapping[str, Any]) -> str:
    from tabulate import tabulate

    lines = []
    if not doc["installed"]:
        lines.append(f"the agent is not installed in namespace {doc['namespace']}: "
                     f"`{INSTALL_COMMAND}`")
    body = [[r["node"], r["pod"] or "-", r["phase"], r["version"] or "-", r["skew"] or "-"]
            for r in doc["nodes"]]
    if body:
        lines.append(tabulate(body, headers=["NODE", "AGENT POD", "STATUS", "VERSION", "SKEW"],
                              tablefmt="plain", disable_numparse=True))
    running = sum(1 for r in doc["nodes"] if r["phase"] == "Running")
    skewed = sum(1 for r in doc["nodes"] if r["skew"])
    lines.append(f"{len(doc['nodes'])} node(s): {running} with a Running agent, "
                 f"{len(doc['nodes']) - running} without; {skewed} with version skew "
                 f"(plugin {doc['plugin_version']}, image {doc['image']})")
    return "\n".join(lines) + "\n"


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
    from . import execstream, stream
    from .analysis import subjects

    names = subjects.PodIndex(pods)
    md = agent_pod.get("metadata") or {}
    ns, name = md.get("namespace") or DEFAULT_NAMESPACE, md.get("name") or ""
    cmd = debugpod.probe_args(timeout_s, trace_s, node, focus_pods, extra_args)
    ex = execstream.ExecStream(kube, ns, name, debugpod.CONTAINER, cmd,
                               connect_timeout_s=min(10.0, timeout_s),
                               deadline_s=timeout_s + 30)
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

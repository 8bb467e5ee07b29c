"""`agent install|status|uninstall`: apply and remove the standing agent's manifests, and report
which GPU nodes it runs on, with which image and whether it is ready.

The manifests themselves are built in reach/agent_manifests.py (shared with the debug pod's
spec builder); the exec path that uses a running agent is reach/agent_exec.py.
"""
from __future__ import annotations

import json
import sys
from typing import Any, Callable, Mapping, Sequence

from node_probe.protocol import ExitStatus, conditions
from node_probe.protocol.version import __version__

from .. import errors
from ..session import Session, echo
from ..api.kube import Kube, seg
from ..reach.agent_manifests import (AGENT_NAME, DS_PATH, INSTALL_COMMAND, VERSION_LABEL, daemonset,
                                     default_image, quota_manifest)
from ..reach import agent_policy
from ..reach.agent_exec import NodeAgent, list_agent_pods, not_the_agent, pod_ready
from .cluster import connect


# cluster-scoped kinds `agent install` applies: the admission policies (the probe namespace's
# and the watching agent's own) and the watching agent's grant
CLUSTER_PATHS = {
    "ValidatingAdmissionPolicy":
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding":
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
}
ADMISSION_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


def install_documents(namespace: str, image: str, node_selector: Mapping[str, str] | None,
                      watch=None) -> list[dict]:
    """What `agent install` applies, in order: the agent's manifests with the probe namespace's
    admission policy (admitting the image installed too, reach/admission.py) placed before the
    DaemonSet -- the policy is what confines `system-node-critical` and the agent's labels to
    the DaemonSet's own pods, so it is in force before the first agent pod is created."""
    from ..reach import admission, agent_manifests
    docs = agent_manifests.manifests(namespace, image, node_selector, watch)
    if admission.needs_annotation(image):
        # the policy is the same as `rbac admission-policy`'s; this image is admitted in this
        # namespace only, by the annotation (reach/admission.py policy)
        ns = next(d for d in docs if d["kind"] == "Namespace")
        ns["metadata"].setdefault("annotations", {})[admission.IMAGE_ANNOTATION] = image
    at = next(i for i, d in enumerate(docs) if d["kind"] == "DaemonSet")
    return docs[:at] + admission.manifests() + docs[at:]


# namespaced kinds: (API prefix, plural)
NAMESPACED = {
    "ResourceQuota": ("/api/v1", "resourcequotas"),
    "ServiceAccount": ("/api/v1", "serviceaccounts"),
    "DaemonSet": ("/apis/apps/v1", "daemonsets"),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies"),
}
FIELD_MANAGER = "kubectl-gpu-doctor"
APPLY_TYPE = "application/apply-patch+yaml"


def _path(m: Mapping[str, Any]) -> tuple[str, str]:
    """(collection path, object path) of a manifest."""
    kind, md = m["kind"], m["metadata"]
    if kind == "Namespace":
        return "/api/v1/namespaces", f"/api/v1/namespaces/{md['name']}"
    if kind in CLUSTER_PATHS:
        return CLUSTER_PATHS[kind], f"{CLUSTER_PATHS[kind]}/{md['name']}"
    if kind not in NAMESPACED:  # pragma: no cover - only the kinds above are generated
        raise ValueError(kind)
    prefix, plural = NAMESPACED[kind]
    coll = f"{prefix}/namespaces/{md['namespace']}/{plural}"
    return coll, f"{coll}/{md['name']}"


def _resource_version(kube: Kube, obj: str) -> str | None:
    """The object's resourceVersion, None when it does not exist."""
    try:
        return str((kube.get_json(obj, timeout=10).get("metadata") or {})
                   .get("resourceVersion") or "")
    except errors.NotFound:
        return None


def install(kube: Kube, docs: Sequence[Mapping[str, Any]],
            say: Callable[[str], None] = lambda s: None, server_dry_run: bool = False
            ) -> list[str]:
    """Server-side apply every object (`PATCH ?fieldManager=kubectl-gpu-doctor&force=true`,
    application/apply-patch+yaml), as `kubectl apply --server-side --force-conflicts` does:
    201 creates an absent object, 200 updates an existing one whoever wrote it (a POST, a
    `kubectl apply -f -` of `rbac` output), and fields an earlier install applied but this one
    does not are removed. Nothing needs a resourceVersion, so a second install, an upgrade
    or one over hand-applied objects converges; a run that failed midway is resumed by the
    next (captures k8s-1.35/admission-and-conditions a14-a21: a PUT without a
    resourceVersion is 422, a POST of an existing object 409). Returns one line per object
    (created, configured, unchanged). server_dry_run: every apply carries dryRun=All (the API
    server validates and admits, persists nothing), and each line says so, as kubectl does."""
    for m in docs:
        if m["kind"] == "Namespace":
            refuse_foreign_namespace(kube, m["metadata"]["name"])
        if m["kind"] == "ClusterRoleBinding" and m["metadata"]["name"] == agent_policy.ROLE_NAME:
            refuse_another_agents_grant(kube, m["subjects"][0]["namespace"])
    done: list[str] = []
    query = [("fieldManager", FIELD_MANAGER), ("force", "true")]
    if server_dry_run:
        query.append(("dryRun", "All"))
    tag = " (server dry run)" if server_dry_run else ""
    new_namespaces: set[str] = set()  # a server dry run creates nothing to put objects in
    for i, m in enumerate(docs):
        coll, obj = _path(m)
        what = f"{m['kind'].lower()}/{m['metadata']['name']}"
        if m["metadata"].get("namespace") in new_namespaces:
            done.append(f"{what} not checked (server dry run: namespace "
                        f"{m['metadata']['namespace']} does not exist yet)")
            say(done[-1])
            continue
        try:
            before = _resource_version(kube, obj)
            answer = _answer(kube.request("PATCH", obj, query,
                                          body=json.dumps(dict(m), separators=(",", ":")),
                                          content_type=APPLY_TYPE))
            md = answer.get("metadata")
            after = str((md if isinstance(md, dict) else {}).get("resourceVersion") or "")
            if before is None:
                done.append(f"{what} created{tag}")
                if server_dry_run and m["kind"] == "Namespace":
                    new_namespaces.add(m["metadata"]["name"])
            elif server_dry_run:
                done.append(f"{what} applied{tag}")
            else:
                done.append(f"{what} {'unchanged' if after == before else 'configured'}")
        except errors.NotFound as exc:
            if m["kind"] not in ADMISSION_KINDS:
                raise _midway(exc.about(what, "apply"), i, docs) from None
            if m["metadata"]["name"] in agent_policy.POLICY_NAMES:
                raise NoAdmissionApi(
                    f"cannot create {what}: this API server does not serve "
                    f"ValidatingAdmissionPolicy (Kubernetes 1.30+), so the watching agent's "
                    f"node-status grant cannot be kept to its own node; nothing was granted. "
                    f"Install the sleeping agent instead: `{INSTALL_COMMAND} --no-watch`"
                ) from None
            # an API server before 1.30 serves no ValidatingAdmissionPolicy (v1): the agent
            # still works; say that nothing confines the probe namespace
            done.append(f"{what} not installed: this API server does not serve "
                        f"{m['kind']} (Kubernetes >= 1.30 does), so admission does not confine "
                        f"the probe namespace")
        except errors.Forbidden as exc:
            raise _midway(errors.Forbidden(
                f"not allowed to apply {what}: {exc.message[:200]}", status=403,
                hint=f"installing the agent needs a cluster admin (or apply "
                     f"`{INSTALL_COMMAND} --dry-run=client -o yaml` through your GitOps "
                     f"pipeline)"), i, docs) from None
        except errors.ApiError as exc:
            raise _midway(exc.about(what, "apply"), i, docs) from None
        say(done[-1])
    return done


def _answer(raw: bytes) -> dict:
    """The applied object the API server answered; {} when it is not a JSON object (not
    JSON, nested past the decoder): only its resourceVersion is read."""
    try:
        doc = json.loads(raw or b"{}")
    except (ValueError, RecursionError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _midway(exc: errors.ApiError, i: int, docs: Sequence[Mapping[str, Any]]) -> errors.ApiError:
    """The error of a run that stopped at object i: what was applied, and that running the
    install again resumes (each step is an apply)."""
    if i:
        exc.hint = (f"{i} of {len(docs)} objects were applied before it; `{INSTALL_COMMAND}` "
                    f"again applies the rest (every step is a server-side apply)"
                    + (f"; {exc.hint}" if exc.hint else ""))
    return exc


def refuse_foreign_namespace(kube: Kube, namespace: str) -> None:
    """The agent is privileged (root on every node through exec), so like the debug pod it goes
    only into a gpu-doctor probe namespace (reach/probens.py): one that does not exist yet (install
    creates it labelled) or one that carries the label. An existing unlabelled namespace -- a
    tenant's, a typo -- is refused before anything is created."""
    from ..reach import probens
    try:
        probens.verify(kube, namespace, missing_ok=True)
    except probens.NotProbeNamespace as exc:
        raise probens.NotProbeNamespace(
            f"not installing the agent into namespace {namespace}: {exc.message}",
            hint=exc.hint) from None


class AnotherAgent(errors.ClusterError):
    """The watching agent's cluster-scoped objects belong to an agent of another namespace."""


def grant_namespace(kube: Kube) -> str | None:
    """The namespace whose agent holds the watching agent's cluster-scoped grant (the
    ClusterRoleBinding's ServiceAccount; its name and the policies' are the same whatever
    -n says), None when there is none."""
    path = f"{CLUSTER_PATHS['ClusterRoleBinding']}/{agent_policy.ROLE_NAME}"
    try:
        crb = kube.get_json(path, timeout=10)
    except errors.NotFound:
        return None
    subjects = crb.get("subjects") if isinstance(crb, dict) else None
    for sub in subjects if isinstance(subjects, list) else ():
        if isinstance(sub, dict) and sub.get("name") == agent_policy.SA_NAME and \
                isinstance(sub.get("namespace"), str):
            return sub["namespace"]
    return None


def refuse_another_agents_grant(kube: Kube, namespace: str) -> None:
    """The ClusterRole, its binding and the agent's policies have one name per cluster: an
    install with another -n would take them from the agent that has them (audit round 5,
    AG-01: `install -n B` rebound A's grant to B's ServiceAccount, silently). Refused, in one
    line, with the commands for the namespace that has them."""
    other = grant_namespace(kube)
    if other is None or other == namespace:
        return
    raise AnotherAgent(
        f"not installing the watching agent in namespace {namespace}: the agent of namespace "
        f"{other[:63]} holds its cluster-wide grant and policies "
        f"(clusterrolebinding/{agent_policy.ROLE_NAME})",
        hint=f"one watching agent per cluster: `kubectl gpu-doctor agent install -n "
             f"{other[:63]}`, or `kubectl gpu-doctor agent uninstall -n {other[:63]}` first")


def uninstall(kube: Kube, namespace: str, wait_s: float = 30.0) -> list[str]:
    """Delete the watching agent's grant first (so an agent pod still stopping can no longer
    write), the DaemonSet (its pods go with it), the quota and the rest of its identity
    (ServiceAccount, RBAC, admission policies, metrics NetworkPolicy); the namespace stays (the
    debug pod's RBAC of `kubectl gpu-doctor rbac` lives there too). Then, once its pods are
    gone (at most `wait_s`), remove every GpuDoctor condition from the nodes that carry one,
    so `node`/`nodes` never show a mark whose writer is gone as current (issue 31)."""
    done = []
    ident = agent_policy.manifests(namespace, {})
    from ..reach.agent_manifests import metrics_network_policy
    grant = [m for m in ident if m["kind"] == "ClusterRoleBinding"]
    rest = [m for m in ident if m["kind"] != "ClusterRoleBinding"]
    # the cluster-scoped objects have one name per cluster: another namespace's agent's are
    # left to it, and so are the conditions it writes (audit round 5, AG-01)
    other = grant_namespace(kube)
    other = other if other is not None and other != namespace else None
    for m in (*grant, daemonset(namespace, default_image()), quota_manifest(namespace), *rest,
              metrics_network_policy(namespace, 0)):
        _, obj = _path(m)
        what = f"{m['kind'].lower()}/{m['metadata']['name']}"
        if other is not None and m["kind"] in CLUSTER_PATHS:
            done.append(f"{what} left: it belongs to the watching agent of namespace "
                        f"{other[:63]}")
            continue
        try:
            kube.request("DELETE", obj, [("propagationPolicy", "Background")])
            done.append(f"{what} deleted")
        except errors.NotFound:
            done.append(f"{what} not found")
        except errors.ApiError as exc:
            raise exc.about(what, "delete") from None
    if not _agents_gone(kube, namespace, wait_s):
        done.append(f"agent pods in {namespace} still stopping after {wait_s:g}s: the "
                    f"conditions they write while stopping are removed by running "
                    f"`kubectl gpu-doctor agent uninstall` again")
    if other is not None:
        done.append(f"GpuDoctor conditions left on the nodes: the watching agent of namespace "
                    f"{other[:63]} writes them")
        return done
    done.append(clear_marks(kube))
    return done


def _agents_gone(kube: Kube, namespace: str, wait_s: float) -> bool:
    import time
    end = time.monotonic() + wait_s
    while True:
        try:
            if not list_agent_pods(kube, namespace):
                return True
        except errors.NotFound:
            return True
        except errors.ApiError:
            return False
        if time.monotonic() >= end:
            return False
        time.sleep(1.0)


def _marked(node: dict) -> dict:
    """A listed node reduced to its name and the GpuDoctor condition types it carries."""
    conds = (node.get("status") or {}).get("conditions")
    types = [c.get("type") for c in (conds if isinstance(conds, list) else ())[:256]
             if isinstance(c, dict) and c.get("type") in conditions.OWNED_TYPES]
    return {"metadata": {"name": str((node.get("metadata") or {}).get("name") or "")},
            "types": types}


def clear_marks(kube: Kube) -> str:
    """Remove the agent's conditions from every node that carries one: one strategic merge
    patch of nodes/NAME/status per node with a `$patch: delete` entry per GpuDoctor type,
    which removes exactly those types, present or not, and keeps the kubelet's (captures
    k8s-1.35/admission-and-conditions c09, c10, c14; the same patch to the node itself
    would be silently dropped, c16). Returns the line that says how many."""
    from ..api import pager
    try:
        nodes, _ = pager.list_items(kube, "/api/v1/nodes", each=_marked)
    except errors.ApiError as exc:
        raise exc.about("nodes", "list") from None
    marked = [n for n in nodes if n["types"]]
    body = {"status": {"conditions": [  # a dict: the client encodes +json bodies itself
        {"type": t, "$patch": "delete"} for t in conditions.OWNED_TYPES]}}
    cleared, count = 0, 0
    for n in marked:
        name = n["metadata"]["name"]
        try:
            kube.request("PATCH", f"/api/v1/nodes/{seg(name)}/status", body=body,
                         content_type="application/strategic-merge-patch+json")
        except errors.NotFound:
            continue  # the node went away meanwhile
        except errors.ApiError as exc:
            raise errors.ApiError(
                f"{exc.about(f'node {name}', 'clear the GpuDoctor conditions of').message}",
                status=exc.status,
                hint=f"{cleared} of {len(marked)} node(s) cleared; run `kubectl gpu-doctor "
                     f"agent uninstall` again for the rest") from None
        cleared += 1
        count += len(n["types"])
    return (f"GpuDoctor conditions removed from {cleared} node(s) ({count} condition(s))"
            if marked else "no node carries a GpuDoctor condition")


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
        nodes = kube.get_json("/api/v1/nodes", q).get("items") or []
    except errors.ApiError as exc:
        raise exc.about("nodes", "list") from None
    by_node: dict[str, list[dict]] = {}
    for p in pods:
        by_node.setdefault((p.get("spec") or {}).get("nodeName") or "", []).append(p)
    rows = []
    for n in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        name = n["metadata"]["name"]
        # a pod with the agent's labels that is not the DaemonSet's own is never "the agent"
        cands = sorted(by_node.get(name, []),
                       key=lambda p: (bool(not_the_agent(p, ds, namespace)), not pod_ready(p)))
        if not cands:
            rows.append(NodeAgent(name, None, "missing", None, None))
            continue
        p = cands[0]
        c = ((p.get("spec") or {}).get("containers") or [{}])[0]
        phase = "Running" if pod_ready(p) else ((p.get("status") or {}).get("phase") or "Pending")
        if not_the_agent(p, ds, namespace):
            phase = "NotTheAgent"
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


STATUS_ROWS = 20   # problem rows `agent status` lists before "+N more"
STATUS_NAMED = 5   # nodes named in a folded line before "+N more"


def status_table(doc: Mapping[str, Any]) -> str:
    """The summary first, then only what needs a look: not installed is one line and the
    command (never a row per node); nodes without an agent pod are one line naming a few;
    pods that do not run or run another version are rows, at most STATUS_ROWS (-o json has
    every node)."""
    from tabulate import tabulate

    from node_probe.protocol.render import terminal_safe

    ns, nodes = terminal_safe(doc["namespace"]), doc["nodes"]
    if not doc["installed"]:
        return (f"agent not installed in namespace {ns}"
                + (f" ({len(nodes)} node(s) without it)" if nodes else "")
                + f": `{INSTALL_COMMAND}`\n")
    running = [r for r in nodes if r["phase"] == "Running" and not r["skew"]]
    missing = [r for r in nodes if r["phase"] == "missing"]
    other = [r for r in nodes if r not in running and r["phase"] != "missing"]
    lines = [f"{len(nodes)} node(s): {len(running)} with a Running agent of this version"
             + (f", {len(other)} with an agent pod that needs a look" if other else "")
             + (f", {len(missing)} without an agent pod" if missing else "")
             + f" (plugin {doc['plugin_version']}, image {terminal_safe(doc['image'])})"]
    order = {"NotTheAgent": 0}
    other.sort(key=lambda r: (order.get(r["phase"], 1 if r["phase"] != "Running" else 2),
                              r["node"]))
    if other:
        body = [[terminal_safe(c) for c in (r["node"], r["pod"] or "-", r["phase"],
                                            r["version"] or "-", r["skew"] or "-")]
                for r in other[:STATUS_ROWS]]
        lines.append(tabulate(body, headers=["NODE", "AGENT POD", "STATUS", "VERSION", "SKEW"],
                              tablefmt="plain", disable_numparse=True))
        if len(other) > STATUS_ROWS:
            lines.append(f"+{len(other) - STATUS_ROWS} more (-o json lists every node)")
    if missing:
        named = ", ".join(terminal_safe(r["node"]) for r in missing[:STATUS_NAMED])
        more = f" (+{len(missing) - STATUS_NAMED} more)" if len(missing) > STATUS_NAMED else ""
        lines.append(f"no agent pod on: {named}{more}; the DaemonSet's node selector and "
                     f"the nodes' taints decide where it runs: `kubectl -n {ns} describe "
                     f"daemonset {AGENT_NAME}`")
    return "\n".join(lines) + "\n"


def _agent_kube(o: dict):
    return connect(o)


def agent_install(session: Session, o: dict) -> ExitStatus:
    from ..reach import agent_manifests
    from ..reach.podspec import DEFAULT_IMAGE
    namespace = o.get("namespace") or agent_manifests.DEFAULT_NAMESPACE
    kube = None if o.get("dry_run") in ("client", True) else _agent_kube(o)
    watch = _watch_mode(kube, namespace, o)
    docs = install_documents(namespace, o.get("image") or DEFAULT_IMAGE,
                             agent_manifests.parse_selector(o.get("node_selector")), watch)
    if o.get("dry_run") in ("client", True):
        import json
        from ..report.output import yaml_dump
        if o.get("output") == "json":
            echo(json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}, indent=2))
        else:
            echo(yaml_dump(docs, all_documents=True), nl=False)
        return ExitStatus.OK
    dry = o.get("dry_run") == "server"
    try:
        install(kube, docs, echo, server_dry_run=dry)
    except NoAdmissionApi:
        if o.get("watch") is not None or o.get("interval") is not None or \
                o.get("metrics_port"):
            raise  # watching was asked for: refused, nothing granted
        # the default on an API server before 1.30: the sleeping agent, said in one line
        echo("the watching agent needs ValidatingAdmissionPolicy (Kubernetes 1.30+) to keep "
             "its node-status grant to its own node, and this API server does not serve it: "
             "installing the sleeping agent (as --no-watch)")
        docs = install_documents(namespace, o.get("image") or DEFAULT_IMAGE,
                                 agent_manifests.parse_selector(o.get("node_selector")), None)
        install(kube, docs, echo, server_dry_run=dry)
    return ExitStatus.OK


class NoAdmissionApi(errors.ClusterError):
    """The API server does not serve ValidatingAdmissionPolicy: the watching agent's grant
    could not be confined, so it was not created."""


def _watch_mode(kube: Kube | None, namespace: str, o: dict):
    """--watch / --no-watch; neither: watch for a new install, keep what an installed agent
    does (an upgrade never turns a sleeping agent into a writing one unasked)."""
    from ..reach import agent_manifests
    want = o.get("watch")
    if want is None and kube is not None:
        try:
            ds = kube.get_json(f"{DS_PATH.format(ns=namespace)}/{AGENT_NAME}", timeout=10)
            want = agent_manifests.is_watching(ds)
            if not want:
                sys.stderr.write(f"daemonset/{AGENT_NAME}: keeps the sleeping agent it runs "
                                 f"now (--watch turns watching on)\n")
        except errors.NotFound:
            want = True
        except errors.ApiError as exc:
            raise exc.about(f"daemonset {namespace}/{AGENT_NAME}") from None
    if want is False:
        if o.get("interval") is not None or o.get("metrics_port"):
            raise errors.UsageError("--interval and --metrics-port need the watching agent "
                                    "(not --no-watch)")
        return None
    interval = 30.0 if o.get("interval") is None else float(o["interval"])
    if interval < 10:
        raise errors.UsageError(f"--interval {interval:g}s: the agent looks at most every 10s")
    return agent_manifests.Watch(interval, int(o.get("metrics_port") or 0))


def agent_status(session: Session, o: dict) -> ExitStatus:
    from ..reach import agent_manifests
    from ..reach.podspec import DEFAULT_IMAGE
    namespace = o.get("namespace") or agent_manifests.DEFAULT_NAMESPACE
    image = o.get("image") or DEFAULT_IMAGE
    try:
        doc = status(_agent_kube(o), namespace, image, o.get("selector"))
    except errors.GpuDoctorError as exc:
        # as `node`/`nodes`: a bot asking for a document gets one, with the error in it
        if o.get("output") in ("json", "yaml") and not isinstance(
                exc, (errors.UsageError, errors.Interrupted)):
            _print_status(o, {"installed": None, "namespace": namespace, "image": image,
                              "plugin_version": __version__, "daemonset": None, "nodes": [],
                              "error": {"type": type(exc).__name__, "message": exc.one_line()},
                              "exit_code": int(errors.exit_status_of(exc))})
        raise
    _print_status(o, doc)
    return ExitStatus.OK if status_ok(doc) else ExitStatus.FINDINGS


def _print_status(o: dict, doc: Mapping[str, Any]) -> None:
    if o.get("output") == "json":
        import json
        echo(json.dumps(doc, indent=2))
    elif o.get("output") == "yaml":
        from ..report.output import yaml_dump
        echo(yaml_dump(doc), nl=False)
    else:
        echo(status_table(doc), nl=False)


def agent_uninstall(session: Session, o: dict) -> ExitStatus:
    from ..reach import agent_manifests
    for line in uninstall(_agent_kube(o), o.get("namespace") or agent_manifests.DEFAULT_NAMESPACE):
        echo(line)
    return ExitStatus.OK



"""The probe namespace's admission policy, evaluated as the API server evaluates a
ValidatingAdmissionPolicy (cel-python): `object` is the pod after the API server's defaulting
(the fields a real 1.35 server added to our debug pod, captures/debugpod-private-root-status.json)
and, for the agent, after the DaemonSet controller made it from the template; `oldObject` is
null on CREATE; `request` carries the operation and the requester; `variables` are evaluated in
order and any evaluation error denies (failurePolicy Fail).

The pods admitted are derived from the builder (reach/debugpod.manifest, reach/agent_manifests
.daemonset): when the builder changes, these tests say which field the policy refuses. Every
variant the security audit of issue 21 found admitted is denied here.
"""
from __future__ import annotations

import copy
import json

import celpy
import kubernetes_validate
import pytest
import yaml

from kubectl_gpudoctor.reach import admission, agent_manifests, debugpod
from tests.packaging.conftest import REPO

PINNED = "ghcr.io/gpu-doctor/gpu-doctor-probe:0.9.0@sha256:" + "ab" * 32
NS = "gpu-doctor"
USER = "alice"                      # a member of gpu-doctor-users
DS_CONTROLLER = admission.DS_CONTROLLERS[0]
CAPTURE = REPO / "tests/data/captures/k8s-1.35/debugpod-private-root-status.json"
SCHEMAS = ("1.30.0", "1.35.0")


# -- the API server, as far as admission sees it ------------------------------------------------

def _capture_defaults() -> dict:
    """What the real API server added to the debug pod's spec (capture minus the builder)."""
    real = json.loads(CAPTURE.read_text())["spec"]
    built = debugpod.manifest("x", NS, "r", image=PINNED)["spec"]
    return {k: v for k, v in real.items() if k not in built}


SERVER_DEFAULTS = _capture_defaults()


def test_the_capture_shows_the_defaults_we_apply():
    # the real server added these and only these to a pod spec like ours
    assert set(SERVER_DEFAULTS) == {"preemptionPolicy", "priority", "schedulerName",
                                    "securityContext", "serviceAccount", "serviceAccountName"}
    cap = json.loads(CAPTURE.read_text())["spec"]
    assert {v["hostPath"]["type"] for v in cap["volumes"]} == {""}
    assert cap["containers"][0]["terminationMessagePolicy"] == "File"


def defaulted(pod: dict) -> dict:
    """The pod as validating admission sees it: the API server's defaults applied."""
    p = copy.deepcopy(pod)
    spec = p["spec"]
    for k, v in SERVER_DEFAULTS.items():
        spec.setdefault(k, copy.deepcopy(v))
    spec["serviceAccount"] = spec["serviceAccountName"]
    if spec.get("priorityClassName") == "system-node-critical":
        spec["priority"] = 2000001000
    for v in spec.get("volumes") or ():
        if "hostPath" in v:
            v["hostPath"].setdefault("type", "")
    for c in spec["containers"]:
        c.setdefault("terminationMessagePath", "/dev/termination-log")
        c.setdefault("terminationMessagePolicy", "File")
        for port in c.get("ports") or ():
            port.setdefault("protocol", "TCP")
    return p


def from_daemonset(ds: dict, node: str = "gpu-1") -> dict:
    """The pod the DaemonSet controller creates from the template for `node`."""
    tmpl = copy.deepcopy(ds["spec"]["template"])
    meta = tmpl["metadata"]
    meta["labels"].update({"controller-revision-hash": "6f7c9d", "pod-template-generation": "1"})
    meta.update({"generateName": f"{ds['metadata']['name']}-", "namespace": NS,
                 "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                      "name": ds["metadata"]["name"], "uid": "d5-uid",
                                      "controller": True, "blockOwnerDeletion": True}]})
    spec = tmpl["spec"]
    spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                                "values": [node]}]}]}}}
    spec["tolerations"] = spec.get("tolerations", []) + [
        {"key": f"node.kubernetes.io/{k}", "operator": "Exists", "effect": e}
        for k, e in (("not-ready", "NoExecute"), ("unreachable", "NoExecute"),
                     ("disk-pressure", "NoSchedule"), ("memory-pressure", "NoSchedule"),
                     ("pid-pressure", "NoSchedule"), ("unschedulable", "NoSchedule"))]
    return defaulted({"apiVersion": "v1", "kind": "Pod", **tmpl})


def denials(pod: dict, user: str = USER, operation: str = "CREATE", old: dict | None = None,
            policy: dict | None = None, ns_annotations: dict | None = None) -> list[str]:
    """The messages of the validations that deny `pod` ([] = admitted). `namespaceObject` is
    the pod's namespace, with `ns_annotations`."""
    policy = policy or admission.policy()
    env = celpy.Environment()
    ns_md = {"name": NS, "labels": {"gpu-doctor.io/probe-namespace": "true"}}
    if ns_annotations is not None:
        ns_md["annotations"] = ns_annotations
    act = {"object": celpy.json_to_cel(pod), "oldObject": celpy.json_to_cel(old),
           "namespaceObject": celpy.json_to_cel({"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": ns_md}),
           "request": celpy.json_to_cel({"operation": operation, "namespace": NS,
                                         "userInfo": {"username": user}})}
    variables: dict = {}
    for v in policy["spec"].get("variables") or ():  # in order; each sees the ones before
        act["variables"] = _var_map(variables)
        variables[v["name"]] = _eval(env, v["expression"], act)
    act["variables"] = _var_map(variables)
    failed = []
    for rule in policy["spec"]["validations"]:
        broken = [k for k, x in variables.items()
                  if isinstance(x, Exception) and f"variables.{k}" in rule["expression"]]
        result = None if broken else _eval(env, rule["expression"], act)
        if not (isinstance(result, celpy.celtypes.BoolType) and bool(result)):
            failed.append(rule["message"])
    return failed


def _var_map(variables: dict):
    return celpy.celtypes.MapType({celpy.celtypes.StringType(k): x
                                   for k, x in variables.items() if not isinstance(x, Exception)})


def _eval(env, expr: str, act: dict):
    try:
        out = env.program(env.compile(expr)).evaluate(act)
    except Exception as exc:  # noqa: BLE001 - an evaluation error is a denial
        return exc
    return out


# -- the tool's own pods ---------------------------------------------------------------------

def debug_pod(**kw) -> dict:
    return defaulted(debugpod.manifest("gpu-1", NS, "abcd1234", image=PINNED, **kw))


def agent_pod(**kw) -> dict:
    return from_daemonset(agent_manifests.daemonset(NS, PINNED, **kw))


@pytest.mark.parametrize("kw", [
    {}, {"propagation": "HostToContainer"}, {"focus_pods": ["uid-1", "uid-2"]},
    {"timeout_s": 120, "trace_s": 0}, {"timeout_s": 7.5, "trace_s": 2.5, "deadline_s": 300},
], ids=["default", "propagation", "focus-pods", "long-no-trace", "fractions"])
def test_the_debug_pod_is_admitted(kw):
    assert denials(debug_pod(**kw)) == []


@pytest.mark.parametrize("sel", [None, {"nvidia.com/gpu.present": "true"}],
                         ids=["every-node", "node-selector"])
def test_the_agent_pod_is_admitted(sel):
    assert denials(agent_pod(node_selector=sel), user=DS_CONTROLLER) == []
    # both identities the DaemonSet controller creates pods with
    assert denials(agent_pod(node_selector=sel), user=admission.DS_CONTROLLERS[1]) == []


def test_a_metadata_update_of_the_agent_pod_is_admitted():
    old = agent_pod()
    new = copy.deepcopy(old)
    new["metadata"].setdefault("annotations", {})["touched"] = "yes"
    assert denials(new, user="system:serviceaccount:kube-system:generic-garbage-collector",
                   operation="UPDATE", old=old) == []


def watching_agent_pod(metrics_port: int = 9400) -> dict:
    """The watching agent's pod (issue 23): from the builder once it has watch mode
    (agent_manifests.Watch, branch i23), else exactly what that builder emits today."""
    watch = getattr(agent_manifests, "Watch", None)
    if watch is not None:
        return from_daemonset(agent_manifests.daemonset(NS, PINNED, watch=watch(30.0,
                                                                                metrics_port)))
    pod = agent_pod()
    spec, c = pod["spec"], pod["spec"]["containers"][0]
    spec["serviceAccountName"] = spec["serviceAccount"] = "gpu-doctor-agent"
    evidence = admission.EVIDENCE_DIR
    spec["volumes"] += [
        {"name": "agent-token", "projected": {"sources": [
            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}},
            {"configMap": {"name": "kube-root-ca.crt",
                           "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}},
        {"name": "evidence", "hostPath": {"path": evidence, "type": "DirectoryOrCreate"}}]
    c["volumeMounts"] += [
        {"name": "agent-token", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
         "readOnly": True},
        {"name": "evidence", "mountPath": evidence, "readOnly": False}]
    c["env"].append({"name": "NODE_NAME", "valueFrom": {"fieldRef": {
        "apiVersion": "v1", "fieldPath": "spec.nodeName"}}})
    c["command"] = ["python3", "-m", "node_probe", "agent-watch", "--host-root", "/host",
                    "--interval", "30s", "--evidence-dir", evidence]
    if metrics_port:
        c["ports"] = [{"name": "metrics", "containerPort": metrics_port, "protocol": "TCP"}]
        c["command"] += ["--metrics-port", str(metrics_port)]
    return pod


@pytest.mark.parametrize("port", [9400, 0], ids=["metrics", "no-metrics"])
def test_the_watching_agent_is_admitted(port):
    assert denials(watching_agent_pod(port), user=DS_CONTROLLER) == []


def test_the_watching_agent_additions_are_admitted_on_the_agent_only():
    """Its service account, projected token, NODE_NAME, evidence dir, metrics port and
    agent-watch command: admitted on the agent, denied on anything else."""
    watch = watching_agent_pod()
    token = next(i for i, v in enumerate(watch["spec"]["volumes"]) if "projected" in v)
    assert denials(watch, user=DS_CONTROLLER) == []
    # the same additions on a pod a user creates (no agent labels, or forged ones): denied
    forged = copy.deepcopy(watch)
    assert denials(forged, user=USER)
    plain = copy.deepcopy(watch)
    plain["metadata"]["labels"].pop(agent_manifests.COMPONENT_LABEL)
    plain["metadata"].pop("ownerReferences")
    assert len(denials(plain, user=DS_CONTROLLER)) >= 5
    # a token for another audience, or a Secret in the projection: denied even on the agent
    aud = copy.deepcopy(watch)
    aud["spec"]["volumes"][token]["projected"]["sources"][0]["serviceAccountToken"][
        "audience"] = "vault"
    assert denials(aud, user=DS_CONTROLLER)
    sec = copy.deepcopy(watch)
    sec["spec"]["volumes"][token]["projected"]["sources"].append({"secret": {"name": "db"}})
    assert denials(sec, user=DS_CONTROLLER)
    api_file = copy.deepcopy(watch)
    api_file["spec"]["containers"][0]["command"] += ["--api-token-file", "/host/etc/x"]
    assert denials(api_file, user=DS_CONTROLLER)
    host_port = copy.deepcopy(watch)
    host_port["spec"]["containers"][0]["ports"][0]["hostPort"] = 9400
    assert denials(host_port, user=DS_CONTROLLER)


# -- every variant the audit found, and their cousins: denied -----------------------------------

def _c(pod):
    return pod["spec"]["containers"][0]


def _set(path: str, value):
    def mutate(pod):
        obj = pod
        *parents, last = path.split(".")
        for p in parents:
            obj = obj[int(p)] if p.isdigit() else obj.setdefault(p, {})
        obj[last] = value
    return mutate


def _container(key, value):
    def mutate(pod):
        _c(pod)[key] = value
    return mutate


def _env(*entries):
    def mutate(pod):
        _c(pod)["env"] = _c(pod)["env"] + list(entries)
    return mutate


def _host_root_rw(pod):
    for m in _c(pod)["volumeMounts"]:
        if m["name"] == "host-root":
            m["readOnly"] = False


def _extra_host_path(pod):
    pod["spec"]["volumes"].append({"name": "etc", "hostPath": {"path": "/etc", "type": ""}})
    _c(pod)["volumeMounts"].append({"name": "etc", "mountPath": "/etc-host"})


def _host_path_moved(pod):
    for v in pod["spec"]["volumes"]:
        if v["name"] == "modules":
            v["hostPath"]["path"] = "/"


def _mount_moved(pod):
    for m in _c(pod)["volumeMounts"]:
        if m["name"] == "dev":
            m["mountPath"] = "/usr/lib/python3"


def _sub_path(pod):
    for m in _c(pod)["volumeMounts"]:
        if m["name"] == "cgroup":
            m["subPath"] = "x"


def _bidirectional(pod):
    for m in _c(pod)["volumeMounts"]:
        if m["name"] == "host-root":
            m["mountPropagation"] = "Bidirectional"


def _projected_token(pod):
    pod["spec"]["volumes"].append({"name": "kube-api-access", "projected": {"sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}]}})
    _c(pod)["volumeMounts"].append({"name": "kube-api-access", "readOnly": True,
                                    "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"})


def _secret_volume(pod):
    pod["spec"]["volumes"].append({"name": "s", "secret": {"secretName": "x"}})


def _empty_dir(pod):
    pod["spec"]["volumes"].append({"name": "scratch", "emptyDir": {}})
    _c(pod)["volumeMounts"].append({"name": "scratch", "mountPath": "/scratch"})


def _extra_container(pod):
    pod["spec"]["containers"].append(copy.deepcopy(_c(pod)) | {"name": "sidecar"})


def _init_container(pod):
    pod["spec"]["initContainers"] = [copy.deepcopy(_c(pod)) | {"name": "init"}]


def _ephemeral(pod):
    pod["spec"]["ephemeralContainers"] = [{"name": "debugger", "image": PINNED,
                                           "command": ["sh"], "targetContainerName": "probe"}]


def _agent_labels(pod):
    pod["metadata"]["labels"].update(agent_manifests.SELECTOR)


def _forged_owner(pod):
    _agent_labels(pod)
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                           "name": agent_manifests.AGENT_NAME, "uid": "d5-uid",
                                           "controller": True}]


def _cmd(*tokens):
    def mutate(pod):
        _c(pod)["command"] = list(tokens)
    return mutate


def _cmd_append(*tokens):
    def mutate(pod):
        _c(pod)["command"] = _c(pod)["command"] + list(tokens)
    return mutate


def _cmd_replace(old, new):
    def mutate(pod):
        _c(pod)["command"] = [new if a == old else a for a in _c(pod)["command"]]
    return mutate


PROBE = ["python3", "-m", "node_probe"]
HOOK = {"exec": {"command": ["sh", "-c", "chroot /host sh -c 'id > /tmp/pwned'"]}}
DENIED = {
    "postStart hook": _container("lifecycle", {"postStart": HOOK}),
    "preStop hook": _container("lifecycle", {"preStop": HOOK}),
    "exec liveness probe": _container("livenessProbe", HOOK),
    "exec readiness probe": _container("readinessProbe", HOOK),
    "exec startup probe": _container("startupProbe", HOOK),
    "http probe": _container("livenessProbe", {"httpGet": {"path": "/", "port": 80}}),
    "sh -c": _cmd("sh", "-c", "chroot /host"),
    "python -c": _cmd("python3", "-c", "import os; os.system('id')"),
    "probe then args": _container("args", ["-c", "x"]),
    "agent-watch as debug pod": _cmd(*PROBE, "agent-watch", "--no-api"),
    "agent-idle as debug pod": _cmd(*agent_manifests.IDLE_COMMAND),
    "another module": _cmd("python3", "-m", "http.server", "-o", "jsonl", "--host-root", "/host",
                           "--timeout", "30", "--trace-seconds", "5", "--target-name", "gpu-1"),
    "an unknown flag": _cmd_append("--kmsg-file", "/host/etc/shadow"),
    "an abbreviated flag": _cmd_append("--kmsg", "/host/etc/shadow"),
    "flag=value": _cmd_append("--plugin-log=/host/etc/shadow"),
    "host root twice": _cmd_append("--host-root", "/"),
    "another node's name": _cmd_replace("gpu-1", "gpu-2"),
    "a word for a number": _cmd_replace("30", "x"),
    "LD_PRELOAD": _env({"name": "LD_PRELOAD", "value": "/host/tmp/x.so"}),
    "PYTHONPATH": _env({"name": "PYTHONPATH", "value": "/host/tmp"}),
    "PYTHONSTARTUP": _env({"name": "PYTHONSTARTUP", "value": "/host/tmp/x.py"}),
    "PYTHONUNBUFFERED from a secret": _set("spec.containers.0.env", [
        {"name": "PYTHONUNBUFFERED", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]),
    "NODE_NAME on a debug pod": _env({"name": "NODE_NAME", "valueFrom": {"fieldRef": {
        "fieldPath": "spec.nodeName"}}}),
    "envFrom": _container("envFrom", [{"configMapRef": {"name": "x"}}]),
    "workingDir": _container("workingDir", "/host/tmp"),
    "tty": _container("tty", True),
    "stdin": _container("stdin", True),
    "volumeDevices": _container("volumeDevices", [{"name": "d", "devicePath": "/dev/x"}]),
    "sidecar restartPolicy": _container("restartPolicy", "Always"),
    "a port": _container("ports", [{"containerPort": 8080}]),
    "extra container": _extra_container,
    "initContainer": _init_container,
    "ephemeral container": _ephemeral,
    "automounted token": _set("spec.automountServiceAccountToken", True),
    "token setting absent": lambda p: p["spec"].pop("automountServiceAccountToken"),
    "projected token": _projected_token,
    "other service account": _set("spec.serviceAccountName", "gpu-doctor-agent"),
    "secret volume": _secret_volume,
    "emptyDir": _empty_dir,
    "hostIPC": _set("spec.hostIPC", True),
    "hostNetwork": _set("spec.hostNetwork", True),
    "shareProcessNamespace": _set("spec.shareProcessNamespace", True),
    "runtimeClassName": _set("spec.runtimeClassName", "unconfined"),
    "sysctls": _set("spec.securityContext", {"sysctls": [{"name": "kernel.x", "value": "1"}]}),
    "hostAliases": _set("spec.hostAliases", [{"ip": "1.2.3.4", "hostnames": ["ghcr.io"]}]),
    "imagePullSecrets": _set("spec.imagePullSecrets", [{"name": "x"}]),
    "host / read-write": _host_root_rw,
    "extra hostPath": _extra_host_path,
    "hostPath moved": _host_path_moved,
    "mount path moved": _mount_moved,
    "subPath": _sub_path,
    "Bidirectional propagation": _bidirectional,
    "agent labels": _agent_labels,
    "agent labels + forged owner": _forged_owner,
    "system-node-critical": _set("spec.priorityClassName", "system-node-critical"),
    "system-cluster-critical": _set("spec.priorityClassName", "system-cluster-critical"),
    "other image": _container("image", "docker.io/library/busybox@sha256:" + "ab" * 32),
    "tag only": _container("image", "ghcr.io/gpu-doctor/gpu-doctor-probe:0.9.0"),
    "lookalike repository": _container(
        "image", "ghcr.io/gpu-doctor/gpu-doctor-probe-evil@sha256:" + "ab" * 32),
}


@pytest.mark.parametrize("name", list(DENIED))
def test_a_debug_pod_variant_is_denied(name):
    pod = debug_pod()
    DENIED[name](pod)
    assert denials(pod), f"{name} was admitted"


@pytest.mark.parametrize("name", [n for n in DENIED if n not in (
    "agent-watch as debug pod", "agent-idle as debug pod", "another node's name",
    "a word for a number", "an unknown flag", "an abbreviated flag", "flag=value",
    "host root twice", "NODE_NAME on a debug pod", "other service account", "a port",
    "agent labels", "agent labels + forged owner", "system-node-critical",
    "token setting absent")])
def test_an_agent_pod_variant_is_denied_too(name):
    """The agent's privileges do not open the rest: the same variants on the DaemonSet
    controller's own agent pod are denied."""
    pod = agent_pod()
    DENIED[name](pod)
    assert denials(pod, user=DS_CONTROLLER), f"{name} was admitted on the agent"


@pytest.mark.parametrize("user", [USER, "system:serviceaccount:gpu-doctor:default"])
def test_a_forged_agent_pod_is_denied(user):
    """The agent's exact pod, labels and owner reference included, created by anyone but the
    DaemonSet controller: denied (it would get system-node-critical and be exec'd as the agent)."""
    assert len(denials(agent_pod(), user=user)) >= 2


def test_a_user_cannot_turn_a_debug_pod_into_the_agent_by_update():
    old = debug_pod()
    new = copy.deepcopy(old)
    _forged_owner(new)
    assert denials(new, operation="UPDATE", old=old)
    # nor add an ephemeral container to the running agent
    agent = agent_pod()
    eph = copy.deepcopy(agent)
    _ephemeral(eph)
    assert denials(eph, operation="UPDATE", old=agent)
    # nor change the agent's owner reference by update
    moved = copy.deepcopy(agent)
    moved["metadata"]["ownerReferences"][0]["name"] = "other"
    assert denials(moved, operation="UPDATE", old=agent)


def test_a_pod_another_daemonset_makes_gets_no_agent_privileges():
    ds = agent_manifests.daemonset(NS, PINNED)
    ds["metadata"]["name"] = "not-the-agent"
    pod = from_daemonset(ds)
    assert denials(pod, user=DS_CONTROLLER)


def test_an_install_with_a_mirror_admits_exactly_that_image_too():
    """The policy is one (the deploy/ file's): a mirror is admitted in the namespace whose
    gpu-doctor.io/probe-image annotation names it exactly, nowhere else."""
    mirror = "registry.corp.example/mirror/gpu-doctor-probe:0.9.0@sha256:" + "cd" * 32
    named = {admission.IMAGE_ANNOTATION: mirror}
    assert denials(debug_pod(), ns_annotations=named) == []  # the tool's repository, by digest
    on_mirror = debug_pod()
    _c(on_mirror)["image"] = mirror
    assert denials(on_mirror, ns_annotations=named) == []
    assert denials(on_mirror)                               # a namespace without the annotation
    assert denials(on_mirror, ns_annotations={"other": mirror})
    other = debug_pod()
    _c(other)["image"] = mirror.replace("cd", "ee")
    assert denials(other, ns_annotations=named) == [
        "only the gpu-doctor probe image, pinned by digest, or the one the namespace's "
        "gpu-doctor.io/probe-image annotation names"]
    empty = debug_pod()
    _c(empty)["image"] = ""
    assert denials(empty, ns_annotations={admission.IMAGE_ANNOTATION: ""})


# -- field by field against the schema -----------------------------------------------------

def _schema_fields(version: str, name: str) -> set[str]:
    import os
    base = os.path.join(os.path.dirname(kubernetes_validate.__file__),
                        "kubernetes-json-schema", f"v{version}-local-strict")
    with open(os.path.join(base, f"{name}-v1.json")) as f:
        return set(json.load(f)["properties"])


def test_every_pod_and_container_field_is_classified():
    """Every field of the latest PodSpec/Container/VolumeMount schema is either allowed (the
    builder or the API server sets it, checked by value) or denied by name, or is newer than
    the oldest server the policy supports and listed with why it gives nothing; a new field in
    a future schema fails here until someone decides."""
    latest = kubernetes_validate.latest_version()
    newer = {k.split(".")[1] for k in admission.NEWER_FIELDS}
    for name, allowed, denied in (
            ("podspec", admission.ALLOWED_POD_FIELDS, admission.DENIED_POD_FIELDS),
            ("container", admission.ALLOWED_CONTAINER_FIELDS, admission.DENIED_CONTAINER_FIELDS),
            ("volumemount", ("name", "mountPath", "readOnly", "mountPropagation"),
             admission.DENIED_MOUNT_FIELDS)):
        fields = _schema_fields(latest, name)
        assert fields <= set(allowed) | set(denied) | newer, \
            f"{name}: unclassified {sorted(fields - set(allowed) - set(denied) - newer)}"
        # everything named by the policy exists on the oldest supported server (1.30)
        assert set(denied) <= _schema_fields("1.30.0", name)
    assert set(admission.DENIED_POD_SECURITY) == _schema_fields("1.30.0", "podsecuritycontext")
    # and what the builder emits is all allowed
    for pod in (debug_pod(propagation="HostToContainer"), agent_pod(node_selector={"a": "b"})):
        assert set(pod["spec"]) <= set(admission.ALLOWED_POD_FIELDS)
        assert set(_c(pod)) <= set(admission.ALLOWED_CONTAINER_FIELDS)


# -- shipped: the deploy file is this policy, valid against the schemas ------------------------

def test_deploy_file_is_the_generated_policy():
    assert (REPO / "deploy/admission-policy.yaml").read_text() == admission.render(), \
        "regenerate: python -m kubectl_gpudoctor.reach.admission > deploy/admission-policy.yaml"


@pytest.mark.parametrize("version", SCHEMAS)
def test_the_policy_and_the_admitted_pods_validate(version):
    for doc in admission.manifests():
        kubernetes_validate.validate(doc, version, strict=True)
    for pod in (debug_pod(), agent_pod()):
        kubernetes_validate.validate(pod, version, strict=True)


def test_agent_install_ships_the_policy_with_its_image():
    """`agent install` applies the very policy `rbac admission-policy` prints (issue 31:
    re-applying the `rbac` one by hand denied the DaemonSet's pods), and names another image
    on the namespace it installs into."""
    from kubectl_gpudoctor.commands.agent import install_documents
    docs = install_documents(NS, PINNED, None)
    kinds = [d["kind"] for d in docs]
    assert "ValidatingAdmissionPolicy" in kinds and "ValidatingAdmissionPolicyBinding" in kinds
    [pol] = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    assert pol == admission.policy()
    [ns] = [d for d in docs if d["kind"] == "Namespace"]
    assert admission.IMAGE_ANNOTATION not in (ns["metadata"].get("annotations") or {})
    mirror = "registry.corp.example/probe:1@sha256:" + "cd" * 32
    docs_m = install_documents(NS, mirror, None)
    [pol_m] = [d for d in docs_m if d["kind"] == "ValidatingAdmissionPolicy"]
    assert pol_m == pol == yaml.safe_load_all((REPO / "deploy/admission-policy.yaml")
                                              .read_text()).__next__()
    [ns_m] = [d for d in docs_m if d["kind"] == "Namespace"]
    assert ns_m["metadata"]["annotations"] == {admission.IMAGE_ANNOTATION: mirror}
    # the namespace the agent goes to is one the binding selects
    [ns] = [d for d in docs if d["kind"] == "Namespace"]
    sel = admission.binding()["spec"]["matchResources"]["namespaceSelector"]["matchLabels"]
    assert sel.items() <= ns["metadata"]["labels"].items()
    yaml.safe_dump_all(docs)


def test_the_critical_priority_quota_is_sized_to_one_agent_per_node():
    """At most one agent per node of the largest cluster Kubernetes supports (5,000 nodes); the
    policy, not the quota, keeps everyone else's pods off system-node-critical."""
    q = agent_manifests.quota_manifest(NS)
    assert int(q["spec"]["hard"]["pods"]) == 5000
    assert list(q["spec"]["hard"]) == ["pods"]
    crit = debug_pod()
    crit["spec"]["priorityClassName"] = agent_manifests.PRIORITY_CLASS
    assert denials(crit) == [f"{agent_manifests.PRIORITY_CLASS} priority only for the agent"]

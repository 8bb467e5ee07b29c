"""The admission policy of the probe namespace, generated from the one pod spec builder.

Why: `pods create` in a namespace that admits privileged pods is root on the node, and RBAC
cannot say "only this pod". A ValidatingAdmissionPolicy can, if it admits exactly what
reach/podspec.py builds (the debug pod, the agent's DaemonSet template) and nothing else. It is
generated here from the builder's own constants (host mounts, container name, command, env,
labels, priority class) so the two cannot drift; deploy/admission-policy.yaml is this module's
output (a test keeps them equal) and `agent install` applies it pinned to the installed image.

How it is written, so that a real API server (>= 1.30) evaluates it as the tests do:
- CEL over typed objects cannot list an object's keys, so every PodSpec/Container field the
  builder does not emit is named and refused (`!has(...)`); fields added to the API after 1.30
  cannot be named (the expression would not compile on 1.30) and are listed, with why they give
  nothing, in NEWER_FIELDS. Volumes, env and the command are allowed positively (one shape each).
- What the API server adds before validating admission is admitted: serviceAccountName
  `default`, schedulerName, priority, preemptionPolicy, an empty pod securityContext, hostPath
  type "", and the affinity/tolerations/ownerReferences the DaemonSet controller sets.
- The agent's extras (system-node-critical, its service account and token, its command) are
  allowed only on a pod carrying the agent's labels that the DaemonSet controller created for
  the `gpu-doctor-agent` DaemonSet (request.userInfo is the controller; ownerReferences name
  the DaemonSet); anyone else's pod with those labels is refused.
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Mapping, Sequence

from . import agent_manifests
from . import podspec
from . import probens

POLICY_NAME = "gpu-doctor-probe-only"
API = "admissionregistration.k8s.io/v1"
CRITICAL_CLASSES = ("system-node-critical", "system-cluster-critical")
# who creates a DaemonSet's pods: the controller's own service account (kube-controller-manager
# --use-service-account-credentials, kubeadm/GKE/EKS/AKS) or the controller manager's identity
DS_CONTROLLERS = ("system:serviceaccount:kube-system:daemon-set-controller",
                  "system:kube-controller-manager")
# the one other image a probe namespace admits (`agent install --image`), on its Namespace
IMAGE_ANNOTATION = "gpu-doctor.io/probe-image"
# the image of the deploy/ file: the tool's repository, pinned by digest
IMAGE_PATTERN = (f"^{podspec.DEFAULT_IMAGE_REPO.replace('.', '[.]')}"
                 r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?@sha256:[a-f0-9]{64}$")

# -- the debug pod's command: python3 -m node_probe, then these flags at these places ---------
DEBUG_FIXED = ((0, "python3"), (1, "-m"), (2, "node_probe"), (3, "-o"), (4, "jsonl"),
               (5, "--host-root"), (6, "/host"), (7, "--timeout"), (9, "--trace-seconds"),
               (11, "--target-name"))
DEBUG_NUMBERS = (8, 10)          # the values of --timeout and --trace-seconds (f"{x:g}")
DEBUG_NODE = 12                  # the value of --target-name: the pod's nodeName
DEBUG_REPEATED = ("--focus-pod",)  # then pairs of --focus-pod UID
NUMBER = r"^[0-9][0-9.e+]{0,15}$"

# -- fields the builder never emits, refused by name (all exist in the 1.30 schema) ----------
DENIED_POD_FIELDS = (
    "hostIPC", "hostUsers", "shareProcessNamespace", "initContainers", "ephemeralContainers",
    "runtimeClassName", "overhead", "hostAliases", "imagePullSecrets", "readinessGates",
    "resourceClaims", "os", "dnsConfig", "hostname", "subdomain", "setHostnameAsFQDN",
    "topologySpreadConstraints", "schedulingGates")
DENIED_POD_SECURITY = (
    "appArmorProfile", "fsGroup", "fsGroupChangePolicy", "runAsGroup", "runAsNonRoot",
    "runAsUser", "seLinuxOptions", "seccompProfile", "supplementalGroups", "sysctls",
    "windowsOptions")
DENIED_CONTAINER_FIELDS = (
    "args", "envFrom", "lifecycle", "livenessProbe", "readinessProbe", "startupProbe",
    "workingDir", "stdin", "stdinOnce", "tty", "volumeDevices", "restartPolicy",
    "resizePolicy")
DENIED_MOUNT_FIELDS = ("subPath", "subPathExpr", "recursiveReadOnly")
# fields the builder emits or the API server / DaemonSet controller sets, checked by value below
# or harmless whatever their value (scheduling, lifetime, resources: no privilege)
ALLOWED_POD_FIELDS = (
    "activeDeadlineSeconds", "affinity", "automountServiceAccountToken", "containers",
    "dnsPolicy", "enableServiceLinks", "hostNetwork", "hostPID", "nodeName", "nodeSelector",
    "preemptionPolicy", "priority", "priorityClassName", "restartPolicy", "schedulerName",
    "securityContext", "serviceAccount", "serviceAccountName", "terminationGracePeriodSeconds",
    "tolerations", "volumes")
ALLOWED_CONTAINER_FIELDS = (
    "name", "image", "imagePullPolicy", "command", "env", "ports", "resources",
    "securityContext", "terminationMessagePath", "terminationMessagePolicy", "volumeMounts")
# Added to the API after 1.30: a policy that names them does not compile on 1.30, so they are
# not refused by name. Why each gives nothing the probe does not already have:
NEWER_FIELDS = {
    "PodSpec.resources": "pod-level requests/limits (1.32): no privilege",
    "PodSpec.hostnameOverride": "the pod's hostname (1.34): no privilege",
    "PodSpec.workloadRef": "gang scheduling reference (1.35): no privilege",
    "PodSpec.schedulingGroup": "scheduling (1.36): no privilege",
    "PodSpec.evictionResponders": "eviction handling (1.37): no privilege",
    "Container.restartPolicyRules": "container restarts on exit codes (1.34): no privilege",
    "VolumeMount.bindMountOptions": "mount options of a bind mount (1.37): cannot widen a "
                                    "mount the policy already fixed (path, read-only)",
}


@dataclasses.dataclass(frozen=True)
class AgentExtras:
    """What the agent's pod may have beyond the debug pod's shape. The sleeping agent needs
    only its command and priority class; the watching agent (issue 23) adds an identity to write
    its node's conditions, its node name and a place for the evidence ring. Every item is
    allowed only on the real agent's pod (see the module docstring)."""
    commands: tuple[tuple[str, ...], ...] = (tuple(agent_manifests.IDLE_COMMAND),)
    # a command starting with this prefix whose flags are all in `flags` (values free)
    command_prefix: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    service_account: str | None = None
    token_volume: str | None = None            # a projected volume: SA token + cluster CA
    token_mount: str = "/var/run/secrets/kubernetes.io/serviceaccount"
    env_fields: Mapping[str, str] = dataclasses.field(default_factory=dict)  # NAME -> fieldPath
    host_mounts: tuple[tuple[str, str, str, bool], ...] = ()  # as podspec.HOST_MOUNTS
    metrics_port: bool = False                  # a containerPort named "metrics", no host port


# The watching agent of issue 23 (branch i23, reach/agent_manifests.py `_add_watch` and
# `watch_command`): its command and flags, its ServiceAccount's projected token with the
# cluster CA, NODE_NAME from the downward API, the evidence ring's host directory and the
# metrics port. Kept here as that builder emits them (WATCH_COMMAND, EVIDENCE_DIR,
# agent_policy.SA_NAME); tests/packaging/test_admission_policy.py admits the builder's own
# output once it is merged, and fails naming the field if the two drift.
EVIDENCE_DIR = "/var/lib/gpu-doctor/evidence"
WATCH = AgentExtras(
    commands=(tuple(agent_manifests.IDLE_COMMAND),),
    command_prefix=("python3", "-m", "node_probe", "agent-watch", "--host-root", "/host"),
    flags=("--interval", "--evidence-dir", "--metrics-port", "--clear-after", "--clear-quiet",
           "--events-namespace", "--evidence-max-count", "--evidence-max-bytes",
           "--evidence-min-gap", "--no-evidence", "--capture-trace-seconds",
           "--capture-timeout", "--provoke-min-gap", "--nvml-timeout", "--trusted-namespace"),
    service_account="gpu-doctor-agent",
    token_volume="agent-token",
    env_fields={"NODE_NAME": "spec.nodeName", "POD_IP": "status.podIP"},
    host_mounts=(("evidence", EVIDENCE_DIR, EVIDENCE_DIR, False),),
    metrics_port=True,
)
AGENT = WATCH


def _q(s: str) -> str:
    """A CEL string literal."""
    return json.dumps(s)


def _list(items: Sequence) -> str:
    return "[" + ", ".join(_q(i) if isinstance(i, str) else
                           ("true" if i is True else "false" if i is False else str(i))
                           for i in items) + "]"


def _map(pairs: Mapping) -> str:
    return "{" + ", ".join(f"{_q(k)}: " + (_q(v) if isinstance(v, str) else
                                           "true" if v is True else "false")
                           for k, v in pairs.items()) + "}"


# ResourceList (map[string]Quantity) fields: the API server's type checker does not know
# them and warns "undefined field" on every typed access (captures k8s-1.35/admission-and-
# conditions b-*: `overhead`), though they evaluate at run time (q01-q03). Reached through
# dyn() they are checked at run time only, so the policy compiles without warnings and still
# refuses them. dyn() is standard CEL, on 1.30 as on 1.35.
RESOURCE_LISTS = ("overhead",)


def _none_of(obj: str, fields: Sequence[str]) -> str:
    return " && ".join(f"!has(dyn({obj}).{f})" if f in RESOURCE_LISTS else f"!has({obj}.{f})"
                       for f in fields)


def _command_rules(agent: AgentExtras) -> tuple[str, str]:
    """(debug pod's command, agent's command) as CEL over variables.c.command."""
    cmd = "variables.c.command"
    fixed = [f"{cmd}[{i}] == {_q(v)}" for i, v in DEBUG_FIXED]
    flags = sorted({v for _, v in DEBUG_FIXED if v.startswith("-")} | set(DEBUG_REPEATED))
    once = [f"{cmd}.exists_one(a, a == {_q(f)})" for f in flags if f not in DEBUG_REPEATED]
    debug = " && ".join([
        f"size({cmd}) >= {DEBUG_NODE + 1}", f"size({cmd}) % 2 == {(DEBUG_NODE + 1) % 2}",
        *fixed, *(f"{cmd}[{i}].matches({_q(NUMBER)})" for i in DEBUG_NUMBERS),
        f"has(object.spec.nodeName) && {cmd}[{DEBUG_NODE}] == object.spec.nodeName",
        f"{cmd}.all(a, !a.startsWith('-') || a in {_list(flags)})", *once])
    alts = [f"{cmd} == {_list(list(c))}" for c in agent.commands]
    if agent.command_prefix:
        n = len(agent.command_prefix)
        alts.append(" && ".join(
            [f"size({cmd}) >= {n}",
             *(f"{cmd}[{i}] == {_q(v)}" for i, v in enumerate(agent.command_prefix)),
             f"{cmd}.all(a, !a.startsWith('-') || a in "
             f"{_list(['-m', '--host-root', *agent.flags])})",
             f"{cmd}.exists_one(a, a == '--host-root')"]))
    return debug, " || ".join(f"({a})" for a in alts)


def _env_rule(agent: AgentExtras) -> str:
    plain = ("(e.name == 'PYTHONUNBUFFERED' && has(e.value) && e.value == '1' && "
             "!has(e.valueFrom))")
    if not agent.env_fields:
        return f"!has(variables.c.env) || variables.c.env.all(e, {plain})"
    fields = _map(agent.env_fields)
    downward = (f"(variables.isAgent && e.name in {fields} && !has(e.value) && "
                f"has(e.valueFrom) && has(e.valueFrom.fieldRef) && "
                f"e.valueFrom.fieldRef.fieldPath == {fields}[e.name])")
    return f"!has(variables.c.env) || variables.c.env.all(e, {plain} || {downward})"


def _volume_rules(agent: AgentExtras) -> tuple[str, str]:
    """(volumes, volume mounts)."""
    host = {name: path for name, path, _, _ in podspec.HOST_MOUNTS}
    agent_host = {name: path for name, path, _, _ in agent.host_mounts}
    alts = [f"(v.name in {_map(host)} && has(v.hostPath) && v.hostPath.path == "
            f"{_map(host)}[v.name] && (!has(v.hostPath.type) || v.hostPath.type == ''))"]
    if agent_host:
        alts.append(f"(variables.isAgent && v.name in {_map(agent_host)} && has(v.hostPath) && "
                    f"v.hostPath.path == {_map(agent_host)}[v.name] && "
                    f"(!has(v.hostPath.type) || v.hostPath.type in ['', 'DirectoryOrCreate']))")
    if agent.token_volume:
        source = ("(has(s.serviceAccountToken) && s.serviceAccountToken.path == 'token' && "
                  "!has(s.serviceAccountToken.audience)) || "
                  "(has(s.configMap) && s.configMap.name == 'kube-root-ca.crt') || "
                  "(has(s.downwardAPI) && s.downwardAPI.items.all(i, has(i.fieldRef) && "
                  "i.fieldRef.fieldPath == 'metadata.namespace'))")
        alts.append(f"(variables.isAgent && v.name == {_q(agent.token_volume)} && "
                    f"has(v.projected) && v.projected.sources.all(s, {source}))")
    volumes = ("!has(object.spec.volumes) || object.spec.volumes.all(v, "
               + " || ".join(alts) + ")")
    mounts = {name: mp for name, _, mp, _ in podspec.HOST_MOUNTS + agent.host_mounts}
    ro = {name: r for name, _, _, r in podspec.HOST_MOUNTS + agent.host_mounts}
    if agent.token_volume:
        mounts[agent.token_volume] = agent.token_mount
        ro[agent.token_volume] = True
    mount = (f"m.name in {_map(mounts)} && m.mountPath == {_map(mounts)}[m.name] && "
             f"(!{_map(ro)}[m.name] || (has(m.readOnly) && m.readOnly)) && "
             f"{_none_of('m', DENIED_MOUNT_FIELDS)} && "
             "(!has(m.mountPropagation) || m.mountPropagation == 'None' || "
             "(m.name == 'host-root' && m.mountPropagation == 'HostToContainer'))")
    return volumes, f"!has(variables.c.volumeMounts) || variables.c.volumeMounts.all(m, {mount})"


def policy(agent: AgentExtras = AGENT) -> dict:
    """The ValidatingAdmissionPolicy, the same whoever applies it (`rbac admission-policy`,
    `agent install`), so one never undoes the other (issue 31: re-applying the `rbac` version
    made the DaemonSet's tag-only pods denied, captures d01-d05). Images: the tool's
    repository pinned by digest, and exactly the one image the pod's namespace names in its
    IMAGE_ANNOTATION (`agent install --image`, or a tag-only build's default, puts it there).
    Only who may update the Namespace object itself -- a cluster-scoped grant, not in the
    namespace `admin`/`edit` roles -- can name it."""
    labels = "object.metadata.labels"
    comp = agent_manifests.COMPONENT_LABEL
    owner = ("has(object.metadata.ownerReferences) && size(object.metadata.ownerReferences) == 1 "
             "&& object.metadata.ownerReferences.all(r, r.apiVersion == 'apps/v1' && "
             f"r.kind == 'DaemonSet' && r.name == {_q(agent_manifests.AGENT_NAME)} && "
             "has(r.controller) && r.controller)")
    variables = [
        ("c", "object.spec.containers[0]"),
        ("agentLabelled", f"has({labels}) && {_q(comp)} in {labels} && "
                          f"{labels}[{_q(comp)}] == {_q(agent_manifests.COMPONENT)}"),
        ("ownedByAgentDaemonSet", owner),
        ("byDaemonSetController", f"request.userInfo.username in {_list(DS_CONTROLLERS)}"),
        # an UPDATE (labels, finalizers) of a pod that was already the agent, same owner
        ("wasAgent", f"request.operation == 'UPDATE' && has(oldObject.metadata.labels) && "
                     f"{_q(comp)} in oldObject.metadata.labels && "
                     f"oldObject.metadata.labels[{_q(comp)}] == {_q(agent_manifests.COMPONENT)} "
                     "&& has(oldObject.metadata.ownerReferences) && "
                     "oldObject.metadata.ownerReferences == object.metadata.ownerReferences"),
        ("isAgent", "variables.agentLabelled && variables.ownedByAgentDaemonSet && "
                    "(variables.byDaemonSetController || variables.wasAgent)"),
        ("namespaceImage", f"has(namespaceObject.metadata.annotations) && "
                           f"{_q(IMAGE_ANNOTATION)} in namespaceObject.metadata.annotations ? "
                           f"namespaceObject.metadata.annotations[{_q(IMAGE_ANNOTATION)}] : ''"),
    ]
    # the tool's repository pinned by digest (a newer plugin's debug pod stays admitted after
    # an upgrade), plus exactly the image `agent install --image` installed (a mirror)
    image_rule = (f"variables.c.image.matches({_q(IMAGE_PATTERN)}) || "
                  f"(variables.namespaceImage != '' && "
                  f"variables.c.image == variables.namespaceImage)")
    debug_cmd, agent_cmd = _command_rules(agent)
    volumes, mounts = _volume_rules(agent)
    sa = ("!has(object.spec.serviceAccountName) || object.spec.serviceAccountName == 'default'"
          + (f" || (variables.isAgent && object.spec.serviceAccountName == "
             f"{_q(agent.service_account)})" if agent.service_account else ""))
    ports = ("!has(variables.c.ports) || (variables.isAgent && variables.c.ports.all(p, "
             "has(p.name) && p.name == 'metrics' && !has(p.hostPort) && !has(p.hostIP)))"
             ) if agent.metrics_port else "!has(variables.c.ports)"
    rules = [
        ("!variables.agentLabelled || variables.isAgent",
         f"the gpu-doctor agent's labels ({comp}={agent_manifests.COMPONENT}) only on pods the "
         f"DaemonSet controller creates for DaemonSet {agent_manifests.AGENT_NAME}"),
        (f"size(object.spec.containers) == 1 && variables.c.name == {_q(podspec.CONTAINER)} && "
         f"{_none_of('object.spec', ('initContainers', 'ephemeralContainers'))}",
         f"one container named {podspec.CONTAINER}, no init or ephemeral containers"),
        (image_rule, f"only the gpu-doctor probe image, pinned by digest, or the one the "
                     f"namespace's {IMAGE_ANNOTATION} annotation names"),
        (f"has(variables.c.command) && (variables.isAgent ? ({agent_cmd}) : ({debug_cmd}))",
         "only the command gpu-doctor runs (`python3 -m node_probe -o jsonl --host-root /host "
         "...` for this pod's node, or the agent's)"),
        (_none_of("variables.c", DENIED_CONTAINER_FIELDS),
         "no lifecycle hooks, probes, args, workingDir, envFrom, tty/stdin, devices or "
         "container restart policy"),
        (_env_rule(agent), "no environment beyond PYTHONUNBUFFERED=1 (and the agent's node name)"),
        (ports, "no ports (the agent's metrics port only, never a host port)"),
        (volumes, "only the probe's host paths (and the agent's own token and evidence dir)"),
        (mounts, "the probe's mounts only at their paths, the host's / read-only, no subPath"),
        ("(!has(object.spec.hostNetwork) || !object.spec.hostNetwork) && "
         + _none_of("object.spec", [f for f in DENIED_POD_FIELDS
                                    if f not in ("initContainers", "ephemeralContainers")]),
         "no host network or IPC, no shared process namespace, runtime class, host aliases, "
         "pull secrets, claims or DNS/hostname overrides"),
        ("!has(object.spec.securityContext) || ("
         + _none_of("object.spec.securityContext", DENIED_POD_SECURITY) + ")",
         "no pod-level security context (sysctls, groups, SELinux, seccomp)"),
        ("has(object.spec.automountServiceAccountToken) && "
         f"!object.spec.automountServiceAccountToken && ({sa})",
         "no service-account token (the agent's own projected token only)"),
        ("!has(object.spec.priorityClassName) || (variables.isAgent ? "
         f"object.spec.priorityClassName == {_q(agent_manifests.PRIORITY_CLASS)} : "
         f"!(object.spec.priorityClassName in {_list(CRITICAL_CLASSES)}))",
         f"{agent_manifests.PRIORITY_CLASS} priority only for the agent"),
    ]
    return {
        "apiVersion": API, "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": POLICY_NAME,
                     "labels": {"app.kubernetes.io/part-of": podspec.APP_NAME}},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                "resources": ["pods", "pods/ephemeralcontainers"]}]},
            "variables": [{"name": n, "expression": e} for n, e in variables],
            "validations": [{"expression": e, "message": m, "reason": "Forbidden"}
                            for e, m in rules],
        },
    }


def binding() -> dict:
    return {
        "apiVersion": API, "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": POLICY_NAME,
                     "labels": {"app.kubernetes.io/part-of": podspec.APP_NAME}},
        "spec": {"policyName": POLICY_NAME, "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {"matchLabels": {
                     probens.LABEL: probens.LABEL_VALUE}}}},
    }


def manifests() -> list[dict]:
    return [policy(), binding()]


def needs_annotation(image: str) -> bool:
    """Is `image` admitted only through the namespace's IMAGE_ANNOTATION (not the tool's
    repository pinned by digest)?"""
    return not re.match(IMAGE_PATTERN, image)


HEADER = """\
# GENERATED by `python -m kubectl_gpudoctor.reach.admission` from the pod spec builder
# (kubectl_gpudoctor/reach/podspec.py, agent_manifests.py): do not edit, regenerate.
#
# ValidatingAdmissionPolicy (Kubernetes >= 1.30): in namespaces labelled
# gpu-doctor.io/probe-namespace=true (deploy/rbac.yaml and `agent install` label theirs), the
# only pods admitted are exactly the ones gpu-doctor builds:
#   - the debug pod: one container `probe`, the gpu-doctor probe image pinned by digest,
#     `python3 -m node_probe -o jsonl --host-root /host --timeout N --trace-seconds N
#     --target-name <its nodeName> [--focus-pod UID]...`, env PYTHONUNBUFFERED=1 only, hostPID,
#     the builder's host paths at their mount paths (host / read-only), no token, no host
#     network/IPC, no hooks, probes, args, workingDir, init/ephemeral containers;
#   - the agent: the same, with its own command, system-node-critical priority (and, watching,
#     its service account's projected token, NODE_NAME from the downward API, its evidence
#     dir, a metrics port), only when the DaemonSet controller creates it for DaemonSet
#     gpu-doctor-agent. The agent's labels on any other pod are refused.
#
#   kubectl gpu-doctor rbac admission-policy | kubectl apply -f -
#   (or, from a checkout: kubectl apply -f deploy/admission-policy.yaml)
#
# `kubectl gpu-doctor agent install` applies this same policy (so re-applying this file never
# undoes it); an image it installs that is not pinned by digest in the tool's repository (a
# mirror: `agent install --image`) is admitted through the namespace's
# gpu-doctor.io/probe-image annotation, which install sets; `--dry-run -o yaml` prints both.
"""


def render() -> str:
    import yaml

    return HEADER + yaml.safe_dump_all(manifests(), sort_keys=False, width=100)


if __name__ == "__main__":  # pragma: no cover - regenerates deploy/admission-policy.yaml
    import sys

    sys.stdout.write(render())

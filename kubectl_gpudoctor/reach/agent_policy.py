"""Least privilege for the watching agent: its ServiceAccount, RBAC and admission policies.

Why: a watching agent writes to the API server, and `nodes/status patch` alone would let it
rewrite any node's status (capacity, addresses, the kubelet's Ready) or relabel nodes through the
status subresource. RBAC cannot name "my own node", so ValidatingAdmissionPolicies narrow it
(the shape of the one verified on a 1.35 API server, captures k8s-1.35/node-status-writes):
the agent's account may update only the status of the node its bound token names
(`request.userInfo.extra["authentication.kubernetes.io/node-name"]`), may change only condition
types starting with GpuDoctor (every other condition, every other status field and the node's
labels, annotations, owners and finalizers stay as they were), and may create only Events about
that node under its own component name, in either API that serves Events (core/v1 and
events.k8s.io/v1, a policy each). A denial is 422 `Invalid` (the writer backs off).
"""
from __future__ import annotations

from node_probe.protocol import conditions

SA_NAME = "gpu-doctor-agent"
ROLE_NAME = "gpu-doctor-agent-node-status"
NODE_POLICY = "gpu-doctor-agent-own-node"
EVENT_POLICY = "gpu-doctor-agent-own-events"              # core/v1 Events
EVENT_POLICY_V1 = "gpu-doctor-agent-own-events-k8s-io"    # events.k8s.io/v1 Events
WRITER_POLICY = "gpu-doctor-conditions-agent-only"       # everyone else's node writes
POLICY_NAMES = (NODE_POLICY, EVENT_POLICY, EVENT_POLICY_V1, WRITER_POLICY)
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
EVENT_COMPONENT = "gpu-doctor-agent"  # node_probe/watch/writer.py COMPONENT
PREFIX = conditions.TYPE_PREFIX
# Node.status fields other than conditions: none may change in the agent's requests
STATUS_FIELDS = ("capacity", "allocatable", "phase", "addresses", "daemonEndpoints", "nodeInfo",
                 "images", "volumesInUse", "volumesAttached", "config", "runtimeHandlers",
                 "features")
META_FIELDS = ("labels", "annotations", "ownerReferences", "finalizers")


# Node.status fields of type ResourceList (map[string]Quantity): the API server's type
# checker calls them undefined and warns on each typed access (captures k8s-1.35/admission-and-
# conditions b-status-gpu-doctor-agent-own-node: 10 errors), though they evaluate at run time
# (q01-q03). Selected through dyn() they are checked at run time only: no warning, the same
# check. dyn() is standard CEL (1.30 too).
RESOURCE_LISTS = ("capacity", "allocatable")


def _same(path: str) -> str:
    head, _, field = path.rpartition(".")
    if field in RESOURCE_LISTS:
        new, old = f"dyn(object.{head}).{field}", f"dyn(oldObject.{head}).{field}"
    else:
        new, old = f"object.{path}", f"oldObject.{path}"
    return f"has({new}) == has({old}) && (!has({new}) || {new} == {old})"


BOUND = (f"'{NODE_NAME_EXTRA}' in request.userInfo.extra && "
         f"size(request.userInfo.extra['{NODE_NAME_EXTRA}']) == 1")
OWN_NODE = f"{BOUND} && request.userInfo.extra['{NODE_NAME_EXTRA}'][0] == object.metadata.name"
FOREIGN = f"!c.type.startsWith('{PREFIX}')"
OWN_CONDITIONS_ONLY = (
    f"has(oldObject.status.conditions) ? (has(object.status.conditions) && "
    f"object.status.conditions.filter(c, {FOREIGN}) == "
    f"oldObject.status.conditions.filter(c, {FOREIGN})) : "
    f"(!has(object.status.conditions) || "
    f"object.status.conditions.all(c, c.type.startsWith('{PREFIX}')))")
OURS = f"c.type.startsWith('{PREFIX}')"
# Everyone but the agent: the GpuDoctor* conditions stay as they were (the kubelet's status
# patches merge by type and carry none of them), or all of them go at once (`agent uninstall`
# clears them as the admin who runs it). The field manager a writer names itself was the only
# attribution before (audit round 5, G-01: a forged condition under the manager
# `gpu-doctor-agent` read as the agent's own); now no other account can write one.
# It sees every node update in the cluster (the kubelets' heartbeats too), so it fails open
# (failurePolicy Ignore): an expression that cannot be evaluated never stops a kubelet.
OUR_CONDITIONS_UNCHANGED = (
    f"!has(object.status) || !has(object.status.conditions) || "
    f"object.status.conditions.filter(c, {OURS}).size() == 0 || "
    f"(has(oldObject.status) && has(oldObject.status.conditions) && "
    f"object.status.conditions.filter(c, {OURS}) == "
    f"oldObject.status.conditions.filter(c, {OURS}))")
OTHER_STATUS_UNCHANGED = " && ".join(_same(f"status.{f}") for f in STATUS_FIELDS)
METADATA_UNCHANGED = " && ".join(_same(f"metadata.{f}") for f in META_FIELDS)
NODE_CLAIM = f"request.userInfo.extra['{NODE_NAME_EXTRA}'][0]"


# The same Event in the two APIs that serve it. A core/v1 Event names its object in
# `involvedObject` and its writer in `source`; an events.k8s.io/v1 Event in `regarding`, and
# its writer in `reportingController`/`reportingInstance` (the node), `source` being
# `deprecatedSource` there. A policy's expressions are type-checked against every kind its
# rules match (with matchPolicy Equivalent, the equivalent kinds too: on 1.35 the core/v1
# rule drew "events.k8s.io/v1, Kind=Event: ERROR: ... undefined field 'involvedObject'",
# captures k8s-1.35/admission-and-conditions b-status-gpu-doctor-agent-own-events), so each
# version has its own policy, each matching exactly its version.
def _own_event(obj: str) -> str:
    return (f"{obj}.involvedObject.kind == 'Node' && "
            f"{obj}.involvedObject.name == {NODE_CLAIM} && "
            f"has({obj}.source) && {obj}.source.component == '{EVENT_COMPONENT}'")


def _own_event_v1(obj: str) -> str:
    return (f"{obj}.regarding.kind == 'Node' && {obj}.regarding.name == {NODE_CLAIM} && "
            f"{obj}.reportingController == '{EVENT_COMPONENT}' && "
            f"{obj}.reportingInstance == {NODE_CLAIM}")


# a create, or a patch of its count/lastTimestamp/message (client-go's correlator does that,
# node_probe/watch/events.py): both the Event and what it was are about its own node
EVENT_ABOUT_OWN_NODE = (f"{BOUND} && {_own_event('object')} && "
                        f"(request.operation == 'CREATE' || {_own_event('oldObject')})")
EVENT_V1_ABOUT_OWN_NODE = (f"{BOUND} && {_own_event_v1('object')} && "
                           f"(request.operation == 'CREATE' || {_own_event_v1('oldObject')})")


def username(namespace: str) -> str:
    return f"system:serviceaccount:{namespace}:{SA_NAME}"


def manifests(namespace: str, labels: dict) -> list[dict]:
    """The two policies with their bindings, then the ServiceAccount, the ClusterRole
    (nodes get, nodes/status patch, events create and patch) and its binding: everything the
    watching agent's identity needs, no more."""
    meta = {"labels": dict(labels)}
    is_agent = [{"name": "is-the-gpu-doctor-agent",
                 "expression": f"request.userInfo.username == '{username(namespace)}'"}]
    # the policies first: the grant never exists on a cluster without them (an API server
    # that does not serve ValidatingAdmissionPolicy fails the install before any grant)
    def policy(name: str, operations: list[str], resources: list[str],
               validations: list[tuple[str, str]], group: str = "",
               match: list[dict] | None = None, failure: str = "Fail") -> list[dict]:
        """A Deny policy on the agent's own requests to `group`/v1, and its binding.
        matchPolicy Exact: the expressions are written against that version's kind only
        (Equivalent would also type-check them against the equivalent kind of the other
        group: the warnings of capture b-status-gpu-doctor-agent-own-events); the other
        version of Events has its own policy."""
        return [
            {"apiVersion": "admissionregistration.k8s.io/v1",
             "kind": "ValidatingAdmissionPolicy",
             "metadata": {"name": name, **meta},
             "spec": {"failurePolicy": failure,
                      "matchConstraints": {"matchPolicy": "Exact", "resourceRules": [{
                          "apiGroups": [group], "apiVersions": ["v1"], "operations": operations,
                          "resources": resources}]},
                      "matchConditions": match or is_agent,
                      "validations": [{"expression": e, "message": m}
                                      for e, m in validations]}},
            {"apiVersion": "admissionregistration.k8s.io/v1",
             "kind": "ValidatingAdmissionPolicyBinding",
             "metadata": {"name": name, **meta},
             "spec": {"policyName": name, "validationActions": ["Deny"]}}]

    return [
        *policy(NODE_POLICY, ["UPDATE"], ["nodes", "nodes/status"], [
            (OWN_NODE, "the gpu-doctor agent may only patch the status of the node its token "
                       "is bound to"),
            (OWN_CONDITIONS_ONLY, f"the gpu-doctor agent may only write {PREFIX}* conditions"),
            (OTHER_STATUS_UNCHANGED, "the gpu-doctor agent may not change node status other "
                                     "than its conditions"),
            (METADATA_UNCHANGED, "the gpu-doctor agent may not change node labels, "
                                 "annotations, owners or finalizers")]),
        *policy(EVENT_POLICY, ["CREATE", "UPDATE"], ["events"], [
            (EVENT_ABOUT_OWN_NODE, "the gpu-doctor agent may only post Events about the node "
                                   "its token is bound to")]),
        *policy(EVENT_POLICY_V1, ["CREATE", "UPDATE"], ["events"], [
            (EVENT_V1_ABOUT_OWN_NODE, "the gpu-doctor agent may only post Events about the "
                                      "node its token is bound to")], group="events.k8s.io"),
        *policy(WRITER_POLICY, ["UPDATE"], ["nodes", "nodes/status"], [
            (OUR_CONDITIONS_UNCHANGED, f"only the gpu-doctor agent may write {PREFIX}* "
                                       f"conditions (others may only remove them all)")],
                match=[{"name": "not-the-gpu-doctor-agent",
                        "expression": f"request.userInfo.username != '{username(namespace)}'"}],
                failure="Ignore"),
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": SA_NAME, "namespace": namespace, **meta},
         "automountServiceAccountToken": False},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": ROLE_NAME, **meta},
         # as node-problem-detector's ClusterRole: read its node (a new agent pod adopts the
         # conditions it carries), patch its status, create and patch (correlate) Events
         "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
                   {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
                   {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": ROLE_NAME, **meta},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": ROLE_NAME},
         "subjects": [{"kind": "ServiceAccount", "name": SA_NAME, "namespace": namespace}]},
    ]

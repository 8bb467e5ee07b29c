"""deploy/: the base RBAC, the opt-in nodes/proxy role and the example admission policy are
valid Kubernetes objects (kubernetes-validate, strict); the base grants exactly what the client
calls and nothing exec-equivalent; the admission policy's CEL, evaluated for real (cel-python),
admits the debug pod and the agent's pod and refuses anything else in the probe namespace
(tests/packaging/test_admission_policy.py)."""
from __future__ import annotations

import re

import kubernetes_validate
import pytest
import yaml

from tests.packaging.conftest import REPO

DEPLOY = REPO / "deploy"
BASE = [d for d in yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text()) if d]
PROXY = [d for d in yaml.safe_load_all((DEPLOY / "rbac-nodes-proxy.yaml").read_text()) if d]
POLICY = [d for d in yaml.safe_load_all((DEPLOY / "admission-policy.yaml").read_text()) if d]
ALL = BASE + PROXY + POLICY
DEBUG_NS = "gpu-doctor"
GROUP = "gpu-doctor-users"
PROBE_NS_LABEL = ("gpu-doctor.io/probe-namespace", "true")
CLIENT_SRC = "\n".join(p.read_text() for p in (REPO / "kubectl_gpudoctor").rglob("*.py"))


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def granted(role: dict) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
            for r in rule["resources"] for v in rule["verbs"]}


@pytest.mark.parametrize("doc", ALL, ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_every_object_validates_strictly(doc: dict):
    kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def test_validator_rejects_a_broken_rule():
    broken = yaml.safe_load(yaml.safe_dump(by_kind(BASE, "ClusterRole")[0]))
    broken["rules"][0]["verb"] = broken["rules"][0].pop("verbs")  # typo: unknown field
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, kubernetes_validate.latest_version(), strict=True)


def test_base_cluster_role_is_read_only_and_has_no_nodes_proxy():
    [cr] = by_kind(BASE, "ClusterRole")
    g = granted(cr)
    assert g == {("", "nodes", "get"), ("", "nodes", "list"), ("", "pods", "get"),
                 ("", "pods", "list"), ("", "events", "list"), ("", "resourcequotas", "list"),
                 ("", "namespaces", "get"), ("node.k8s.io", "runtimeclasses", "list"),
                 ("resource.k8s.io", "resourceclaims", "list"),
                 ("resource.k8s.io", "resourceslices", "list"),
                 ("resource.k8s.io", "deviceclasses", "list"),
                 # the queueing systems that may hold a Pending GPU pod (`pod Y`, issue 32)
                 ("kueue.x-k8s.io", "workloads", "list"),
                 ("kueue.x-k8s.io", "localqueues", "get"),
                 ("kueue.x-k8s.io", "clusterqueues", "get"),
                 ("scheduling.volcano.sh", "podgroups", "get"),
                 ("scheduling.volcano.sh", "queues", "get"),
                 ("scheduling.run.ai", "podgroups", "get")}
    # namespaces get is for the probe namespace's label only
    [ns_rule] = [r for r in cr["rules"] if "namespaces" in r["resources"]]
    assert ns_rule["resourceNames"] == [DEBUG_NS]
    for doc in BASE:
        for rule in doc.get("rules") or ():
            assert not {"nodes/proxy", "pods/exec", "pods/attach",
                        "pods/ephemeralcontainers"} & set(rule["resources"])


def test_grants_the_client_never_uses_are_gone():
    g = set().union(*(granted(r) for r in by_kind(BASE, "ClusterRole") + by_kind(BASE, "Role")))
    assert not {x for x in g if x[0] == "events.k8s.io"}
    assert ("", "pods", "watch") not in g
    # the client reads Events through core/v1 only; the one mention of the newer group is
    # the watching agent's admission policy, which confines what the agent's account may
    # write through it (reach/agent_policy.py: a policy per Events API, issue 37 item 7)
    reads = "\n".join(p.read_text() for p in (REPO / "kubectl_gpudoctor").rglob("*.py")
                      if p.name != "agent_policy.py")
    assert "events.k8s.io" not in reads
    # the one watch is the streaming list (api/watchlist.py), used only where the server and
    # RBAC allow it: a 403 (this role grants no `watch`) falls back to the paged list
    listing = "\n".join(p.read_text() for p in (REPO / "kubectl_gpudoctor").rglob("*.py")
                        if p.name != "watchlist.py")
    assert not re.search(r"\(\s*\"watch\"\s*,", listing), "the client started to watch"
    # and everything granted is used
    evidence = {
        "nodes": r'"/api/v1/nodes"', "pods": r'"/api/v1/pods"', "events": r'/events"',
        "resourcequotas": r'/resourcequotas"', "namespaces": r'/api/v1/namespaces/\{[a-z_]+\}"',
        "leases": r"kube-node-lease", "pods/log": r"/log\"",
        "runtimeclasses": r"/apis/node\.k8s\.io/v1/runtimeclasses\"",
        "resourceclaims": r"/apis/resource\.k8s\.io/v1/resourceclaims\"",
        "resourceslices": r"/apis/resource\.k8s\.io/v1/resourceslices\"",
        "deviceclasses": r"/apis/resource\.k8s\.io/v1/deviceclasses\"",
        "workloads": r'/workloads"', "localqueues": r"/localqueues/",
        "clusterqueues": r"/clusterqueues/", "podgroups": r"/podgroups/",
        "queues": r"/queues/\{",
    }
    for _, res, _ in g:
        assert re.search(evidence[res], CLIENT_SRC), f"{res} is granted but never called"


def test_debug_pod_lifecycle_only_in_its_namespace():
    roles = {(r["metadata"]["namespace"], r["metadata"]["name"]): r for r in by_kind(BASE, "Role")}
    debug = [r for (ns, _), r in roles.items() if ns == DEBUG_NS]
    assert len(debug) == 1
    assert granted(debug[0]) == ({("", "pods", v) for v in ("create", "get", "list", "delete")}
                                 | {("", "pods/log", "get")})
    leases = [r for (ns, _), r in roles.items() if ns == "kube-node-lease"]
    assert len(leases) == 1
    assert granted(leases[0]) == {("coordination.k8s.io", "leases", "get"),
                                  ("coordination.k8s.io", "leases", "list")}
    for r in by_kind(ALL, "ClusterRole"):
        assert not {v for _, res, v in granted(r) if res == "pods"} & {"create", "delete", "patch", "update"}


def test_probe_namespace_is_labelled_and_allows_privileged_pods():
    [ns] = by_kind(BASE, "Namespace")
    assert ns["metadata"]["name"] == DEBUG_NS
    labels = ns["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    assert labels[PROBE_NS_LABEL[0]] == PROBE_NS_LABEL[1]


def test_nodes_proxy_is_its_own_opt_in_role_with_the_risk_stated():
    [cr] = by_kind(PROXY, "ClusterRole")
    assert granted(cr) == {("", "nodes/proxy", "get")}
    text = (DEPLOY / "rbac-nodes-proxy.yaml").read_text()
    assert "exec-equivalent" in text and "OPT-IN" in text
    [b] = by_kind(PROXY, "ClusterRoleBinding")
    assert b["roleRef"]["name"] == cr["metadata"]["name"]
    assert "pods create" in (DEPLOY / "rbac.yaml").read_text()  # node root, said in the file


def test_bindings_point_at_the_roles_and_the_group():
    roles = {("ClusterRole", r["metadata"]["name"]) for r in by_kind(BASE, "ClusterRole")}
    roles |= {("Role", r["metadata"]["name"], r["metadata"]["namespace"])
              for r in by_kind(BASE, "Role")}
    bindings = by_kind(BASE, "ClusterRoleBinding") + by_kind(BASE, "RoleBinding")
    assert len(bindings) == 3
    for b in bindings:
        ref = b["roleRef"]
        key = (ref["kind"], ref["name"]) if ref["kind"] == "ClusterRole" else \
            (ref["kind"], ref["name"], b["metadata"]["namespace"])
        assert key in roles, b["metadata"]["name"]
        assert b["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                                  "name": GROUP}]


# -- the admission policy: evaluated in tests/packaging/test_admission_policy.py ------------

def test_policy_binding_selects_the_labelled_namespace():
    [b] = by_kind(POLICY, "ValidatingAdmissionPolicyBinding")
    [p] = by_kind(POLICY, "ValidatingAdmissionPolicy")
    assert b["spec"]["policyName"] == p["metadata"]["name"]
    assert b["spec"]["validationActions"] == ["Deny"]
    assert b["spec"]["matchResources"]["namespaceSelector"]["matchLabels"] == dict([PROBE_NS_LABEL])
    rules = p["spec"]["matchConstraints"]["resourceRules"]
    assert {"pods", "pods/ephemeralcontainers"} <= {r for x in rules for r in x["resources"]}

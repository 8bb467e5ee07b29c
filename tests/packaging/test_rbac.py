"""deploy/rbac.yaml: valid Kubernetes objects (kubernetes-validate, strict) that grant exactly what
the plugin needs (docs/install.md#rbac) and nothing that lets a user create pods elsewhere."""
from __future__ import annotations

import kubernetes_validate
import pytest
import yaml

from tests.packaging.conftest import REPO

DOCS = list(yaml.safe_load_all((REPO / "deploy" / "rbac.yaml").read_text()))
DEBUG_NS = "gpu-doctor"
GROUP = "gpu-doctor-users"


def by_kind(kind: str) -> list[dict]:
    return [d for d in DOCS if d and d["kind"] == kind]


def granted(role: dict) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
            for r in rule["resources"] for v in rule["verbs"]}


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_every_object_validates_strictly(doc: dict):
    kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def test_validator_rejects_a_broken_rule():
    broken = yaml.safe_load(yaml.safe_dump(by_kind("ClusterRole")[0]))
    broken["rules"][0]["verb"] = broken["rules"][0].pop("verbs")  # typo: unknown field
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, kubernetes_validate.latest_version(), strict=True)


def test_cluster_wide_reads():
    [cr] = by_kind("ClusterRole")
    want = {("", "nodes", "get"), ("", "nodes", "list"), ("", "nodes/proxy", "get"),
            ("", "pods", "get"), ("", "pods", "list"), ("", "events", "list"),
            ("", "namespaces", "get")}
    assert want <= granted(cr)
    verbs = {v for _, _, v in granted(cr)}
    assert verbs <= {"get", "list", "watch"}, "the ClusterRole must be read-only"


def test_debug_pod_lifecycle_only_in_its_namespace():
    roles = {(r["metadata"]["namespace"], r["metadata"]["name"]): r for r in by_kind("Role")}
    debug = [r for (ns, _), r in roles.items() if ns == DEBUG_NS]
    assert len(debug) == 1
    want = {("", "pods", v) for v in ("create", "get", "list", "delete")} | {("", "pods/log", "get")}
    assert want <= granted(debug[0])
    leases = [r for (ns, _), r in roles.items() if ns == "kube-node-lease"]
    assert len(leases) == 1
    assert granted(leases[0]) == {("coordination.k8s.io", "leases", "get"),
                                  ("coordination.k8s.io", "leases", "list")}
    # nothing anywhere creates or deletes pods outside the debug namespace
    for r in by_kind("ClusterRole"):
        assert not {v for _, res, v in granted(r) if res == "pods"} & {"create", "delete", "patch", "update"}


def test_debug_namespace_allows_privileged_pods():
    [ns] = by_kind("Namespace")
    assert ns["metadata"]["name"] == DEBUG_NS
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


def test_bindings_point_at_the_roles_and_the_group():
    roles = {("ClusterRole", r["metadata"]["name"]) for r in by_kind("ClusterRole")}
    roles |= {("Role", r["metadata"]["name"], r["metadata"]["namespace"]) for r in by_kind("Role")}
    bindings = by_kind("ClusterRoleBinding") + by_kind("RoleBinding")
    assert len(bindings) == 3
    for b in bindings:
        ref = b["roleRef"]
        key = (ref["kind"], ref["name"]) if ref["kind"] == "ClusterRole" else \
            (ref["kind"], ref["name"], b["metadata"]["namespace"])
        assert key in roles, b["metadata"]["name"]
        assert b["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": GROUP}]

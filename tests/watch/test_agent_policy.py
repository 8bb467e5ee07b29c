"""The watching agent's RBAC and admission policies: valid against the official schemas
(kubernetes-validate, strict), and their CEL, evaluated for real (cel-python), admits the
captured own-node status patch and refuses every other shape (captures
k8s-1.35/node-status-writes: the request the real API server admitted, the bound token's
node claim)."""
from __future__ import annotations

import copy
import json

import celpy
import kubernetes_validate
import pytest
import yaml

from kubectl_gpudoctor.reach import agent_policy as ap
from tests.watch.fakeapi import CAPTURES, capture

NS = "gpu-doctor"
DOCS = ap.manifests(NS, {"app.kubernetes.io/name": "gpu-doctor"})


def _kind(kind):
    return [d for d in DOCS if d["kind"] == kind]


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_every_object_validates_strictly(doc):
    kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def test_rbac_is_exactly_node_get_status_patch_and_event_create_patch():
    """The capture's grant (nodes/status patch, events create), plus what node-problem-
    detector's ClusterRole also has and issue 31 needs: `nodes get` (a new agent pod adopts
    the conditions its node carries) and `events patch` (correlated Events)."""
    [role] = _kind("ClusterRole")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]}]
    cap = [d for d in yaml.safe_load_all((CAPTURES / "policy-used.yaml").read_text())
           if d and d["kind"] == "ClusterRole"][0]
    assert cap["rules"] == [
        {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    [b] = _kind("ClusterRoleBinding")
    assert b["subjects"] == [{"kind": "ServiceAccount", "name": ap.SA_NAME, "namespace": NS}]
    [sa] = _kind("ServiceAccount")
    assert sa["automountServiceAccountToken"] is False


def _request(node_name_claim, user=None, operation="CREATE"):
    claims = json.loads((CAPTURES / "bound-token-claims.json").read_text())
    extra = {} if node_name_claim is None else {ap.NODE_NAME_EXTRA: [node_name_claim]}
    return {"operation": operation,
            "userInfo": {"username": user or ap.username(NS), "extra": extra}}, claims


def _nodes():
    """(oldObject, object) as the captured patch left them: only a condition added."""
    new = capture("patch-own-node-status.200.json")
    old = copy.deepcopy(new)
    old["status"]["conditions"] = [c for c in old["status"]["conditions"]
                                   if c["type"] != "GPUDevicePluginHealthy"]
    for c in new["status"]["conditions"]:
        if c["type"] == "GPUDevicePluginHealthy":
            c["type"] = "GpuDoctorDevicePluginStuck"
    return old, new


def _refusals(policy_name, obj, old, request):
    [p] = [d for d in _kind("ValidatingAdmissionPolicy") if d["metadata"]["name"] == policy_name]
    env = celpy.Environment()
    act = {"object": celpy.json_to_cel(obj), "oldObject": celpy.json_to_cel(old),
           "request": celpy.json_to_cel(request)}
    for m in p["spec"]["matchConditions"]:
        if not env.program(env.compile(m["expression"])).evaluate(act):
            return None  # not matched: the policy does not apply
    out = []
    for v in p["spec"]["validations"]:
        if not env.program(env.compile(v["expression"])).evaluate(act):
            out.append(v["message"])
    return out


def test_the_captured_own_node_patch_is_admitted():
    old, new = _nodes()
    req, claims = _request(None)
    node = claims["kubernetes.io"]["node"]["name"]   # what the bound token says: 127.0.0.1
    assert new["metadata"]["name"] == node
    req["userInfo"]["extra"][ap.NODE_NAME_EXTRA] = [node]
    assert _refusals(ap.NODE_POLICY, new, old, req) == []


def test_another_node_is_refused():
    old, new = _nodes()
    req, _ = _request("gpu-node-other")
    assert any("node its token is bound to" in m for m in _refusals(ap.NODE_POLICY, new, old, req))
    req, _ = _request(None)  # a token bound to no node (not pod-bound)
    assert _refusals(ap.NODE_POLICY, new, old, req)


@pytest.mark.parametrize("change", ["ready", "new_foreign", "capacity", "label", "drop_ready"])
def test_anything_but_gpudoctor_conditions_is_refused(change):
    old, new = _nodes()
    if change == "ready":
        [r] = [c for c in new["status"]["conditions"] if c["type"] == "Ready"]
        r["status"] = "False"
    elif change == "new_foreign":
        new["status"]["conditions"].append({"type": "KernelDeadlock", "status": "True"})
    elif change == "capacity":
        new["status"]["capacity"]["nvidia.com/gpu"] = "8"
    elif change == "label":
        new["metadata"]["labels"]["node-role.kubernetes.io/control-plane"] = ""
    elif change == "drop_ready":
        new["status"]["conditions"] = [c for c in new["status"]["conditions"]
                                       if c["type"] != "Ready"]
    req, _ = _request("127.0.0.1")
    assert _refusals(ap.NODE_POLICY, new, old, req), change


def test_other_users_are_not_matched():
    old, new = _nodes()
    req, _ = _request("gpu-node-other", user="system:node:127.0.0.1")
    assert _refusals(ap.NODE_POLICY, new, old, req) is None


def test_events_only_about_the_own_node_under_the_agents_name():
    ev = capture("event-create.201.json")
    ev["source"]["component"] = ap.EVENT_COMPONENT
    req, _ = _request("127.0.0.1")
    assert _refusals(ap.EVENT_POLICY, ev, None, req) == []
    other = copy.deepcopy(ev)
    other["involvedObject"]["name"] = "gpu-node-other"
    assert _refusals(ap.EVENT_POLICY, other, None, req)
    pod = copy.deepcopy(ev)
    pod["involvedObject"]["kind"] = "Pod"
    assert _refusals(ap.EVENT_POLICY, pod, None, req)
    spoof = copy.deepcopy(ev)
    spoof["source"]["component"] = "kubelet"
    assert _refusals(ap.EVENT_POLICY, spoof, None, req)


def test_the_agent_may_patch_only_its_own_events():
    """Correlated Events are patched (count, lastTimestamp, message): only one that was, and
    stays, about its own node under its own name; never the kubelet's Event, never one moved
    to another node."""
    ev = capture("event-create.201.json")
    ev["source"]["component"] = ap.EVENT_COMPONENT
    upd, _ = _request("127.0.0.1", operation="UPDATE")
    new = copy.deepcopy(ev)
    new["count"], new["message"] = 7, "flapping"
    assert _refusals(ap.EVENT_POLICY, new, ev, upd) == []
    kubelets = copy.deepcopy(ev)
    kubelets["source"]["component"] = "kubelet"
    hijack = copy.deepcopy(kubelets)
    hijack["source"]["component"] = ap.EVENT_COMPONENT
    assert _refusals(ap.EVENT_POLICY, hijack, kubelets, upd)
    moved = copy.deepcopy(new)
    moved["involvedObject"]["name"] = "gpu-node-other"
    assert _refusals(ap.EVENT_POLICY, moved, ev, upd)


def test_the_writers_event_and_component_match_the_policy():
    from node_probe.watch import writer
    assert writer.COMPONENT == ap.EVENT_COMPONENT
    body = writer.event_body("127.0.0.1", None, "default", "GpuXid", "x", True, 0.0)
    req, _ = _request("127.0.0.1")
    assert _refusals(ap.EVENT_POLICY, body, None, req) == []


def test_the_writers_own_patch_merged_into_the_node_is_admitted():
    from node_probe.watch.state import ConditionState
    old, _ = _nodes()
    new = copy.deepcopy(old)
    new["status"]["conditions"] += ConditionState().api_conditions(0.0)  # merged by type
    req, _ = _request("127.0.0.1")
    assert _refusals(ap.NODE_POLICY, new, old, req) == []


def _event_v1(node: str, controller: str = ap.EVENT_COMPONENT) -> dict:
    """The agent's Event as events.k8s.io/v1 has it (the shape of capture k8s-1.35/admission-
    and-conditions d03-events-k8s-io-v1: `regarding`, `note`, `reportingController`,
    `reportingInstance`, `deprecatedSource`)."""
    return {"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": f"{node}.gpu-doctor.1", "namespace": "default"},
            "eventTime": "2026-11-27T20:55:20.000000Z", "action": "Watch", "reason": "GpuXid",
            "regarding": {"kind": "Node", "name": node},
            "note": "x", "type": "Warning", "reportingController": controller,
            "reportingInstance": node, "deprecatedSource": {"component": controller}}


def test_events_k8s_io_events_only_about_the_own_node_under_the_agents_name():
    req, _ = _request("127.0.0.1")
    ev = _event_v1("127.0.0.1")
    assert _refusals(ap.EVENT_POLICY_V1, ev, None, req) == []
    other = _event_v1("127.0.0.1")
    other["regarding"]["name"] = "gpu-node-other"
    assert _refusals(ap.EVENT_POLICY_V1, other, None, req)
    pod = _event_v1("127.0.0.1")
    pod["regarding"]["kind"] = "Pod"
    assert _refusals(ap.EVENT_POLICY_V1, pod, None, req)
    assert _refusals(ap.EVENT_POLICY_V1, _event_v1("127.0.0.1", "kubelet"), None, req)
    elsewhere = _event_v1("127.0.0.1")
    elsewhere["reportingInstance"] = "gpu-node-other"
    assert _refusals(ap.EVENT_POLICY_V1, elsewhere, None, req)
    upd, _ = _request("127.0.0.1", operation="UPDATE")
    assert _refusals(ap.EVENT_POLICY_V1, ev, _event_v1("127.0.0.1", "kubelet"), upd)
    assert _refusals(ap.EVENT_POLICY_V1, ev, ev, upd) == []


# -- audit round 5, G-01: only the agent's account writes GpuDoctor* conditions ----------------

def _forged(change: str):
    """(oldObject, object) of a node update by someone else than the agent."""
    old, _ = _nodes()
    old["status"]["conditions"].append({"type": "GpuDoctorWatching", "status": "True",
                                        "reason": "AgentWatching", "message": "watching"})
    new = copy.deepcopy(old)
    conds = new["status"]["conditions"]
    if change == "add":
        conds.append({"type": "GpuDoctorDevicePluginStuck", "status": "True",
                      "reason": "DevicepluginBlockedInNvml", "message": "forged"})
    elif change == "flip":
        conds[-1]["status"] = "False"
    elif change == "message":
        conds[-1]["message"] = "IMPORTANT: cordon gpu-1"
    elif change == "kubelet":   # the kubelet's heartbeat: its own conditions only
        for c in conds:
            if c["type"] == "Ready":
                c["lastHeartbeatTime"] = "2026-11-29T01:00:00Z"
    elif change == "remove_all":   # agent uninstall, run by an admin
        new["status"]["conditions"] = [c for c in conds if not c["type"].startswith("GpuDoctor")]
    return old, new


@pytest.mark.parametrize("user", ["system:serviceaccount:kube-system:node-problem-detector",
                                  "system:node:127.0.0.1", "kubernetes-admin"])
@pytest.mark.parametrize("change", ["add", "flip", "message"])
def test_no_other_account_may_write_a_gpudoctor_condition(user, change):
    """Whatever field manager it names itself (?fieldManager=gpu-doctor-agent): the writer is
    the account, and only the agent's may write them."""
    old, new = _forged(change)
    req, _ = _request("127.0.0.1", user=user, operation="UPDATE")
    assert any("only the gpu-doctor agent may write" in m
               for m in _refusals(ap.WRITER_POLICY, new, old, req)), (user, change)


@pytest.mark.parametrize("change", ["kubelet", "remove_all"])
def test_the_kubelets_heartbeat_and_the_uninstalls_clear_are_admitted(change):
    old, new = _forged(change)
    req, _ = _request(None, user="system:node:127.0.0.1", operation="UPDATE")
    assert _refusals(ap.WRITER_POLICY, new, old, req) == []


def test_the_agent_itself_is_not_matched_by_the_writer_policy():
    old, new = _forged("add")
    req, _ = _request("127.0.0.1", operation="UPDATE")
    assert _refusals(ap.WRITER_POLICY, new, old, req) is None
    [p] = [d for d in _kind("ValidatingAdmissionPolicy")
           if d["metadata"]["name"] == ap.WRITER_POLICY]
    assert p["spec"]["failurePolicy"] == "Ignore"   # every kubelet's heartbeat passes it
    assert p["spec"]["matchConstraints"]["matchPolicy"] == "Exact"

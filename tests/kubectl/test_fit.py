"""The Pending-pod GPU fit (analysis/scheduling/fit.py) as a pure function, one test per case.

Node and pod objects come from the fake cluster's builders (shaped like the real 1.35 captures)
and from the captured MIG node itself; nothing here talks to a server.
"""
from __future__ import annotations

import copy
import datetime as dt
import json
from pathlib import Path

import pytest

from kubectl_gpudoctor.analysis.scheduling import fit_findings, gpu_held, placement
from kubectl_gpudoctor.analysis.scheduling import quota as gpu_quota

from .fakecluster import FakeCluster, ts

CAPTURES = Path(__file__).resolve().parents[1] / "data" / "captures" / "k8s-1.35"
NOW = dt.datetime(2026, 11, 23, 8, 0, tzinfo=dt.timezone.utc)


def captured_mig_node(name: str, drop: tuple[str, ...] = ()) -> dict:
    """The real 1.35 node (2 full GPUs + MIG 1g.10gb x2, 2g.20gb, 3g.40gb) under a new name."""
    node = json.loads((CAPTURES / "wedged-3m-node.json").read_text())
    node["metadata"]["name"] = name
    for part in ("capacity", "allocatable"):
        for r in drop:
            node["status"][part].pop(r, None)
    return node


def pending(fc: FakeCluster, name="trainer-0", ns="ml", gpus=4, resource="nvidia.com/gpu",
            age_s=300.0) -> dict:
    p = fc.add_pod(ns, name, None, phase="Pending", gpus=0, age_s=age_s, now=NOW)
    res = p["spec"]["containers"][0]["resources"]
    res["requests"][resource] = str(gpus)
    res.setdefault("limits", {})[resource] = str(gpus)
    return p


def run(fc: FakeCluster, pod: dict, events=(), quotas=(), quota_events=(), extra_nodes=()):
    nodes = list(fc.nodes.values()) + list(extra_nodes)
    return fit_findings.analyze_pending(pod, nodes, list(fc.pods.values()), events, quotas,
                               quota_events, NOW)


def only(findings, fid):
    hits = [f for f in findings if f.id == fid]
    assert len(hits) == 1, [(f.id, f.title) for f in findings]
    return hits[0]


# -- the effective request, as kube-scheduler computes it -------------------------------------

def test_requests_init_containers_max_and_sidecars_add():
    pod = {"spec": {
        "containers": [{"resources": {"limits": {"nvidia.com/gpu": "2"}}},
                       {"resources": {"requests": {"nvidia.com/gpu": "1"}}}],
        "initContainers": [{"resources": {"limits": {"nvidia.com/gpu": "4"}}},
                           {"restartPolicy": "Always",
                            "resources": {"requests": {"nvidia.com/gpu": "1"}}},
                           {"resources": {"requests": {"nvidia.com/gpu": "3"}}}]}}
    # sum: 2 + 1 + sidecar 1 = 4; init: max(4, sidecar 1 + 3 = 4) = 4 -> 4
    assert gpu_held.pod_gpu_requests(pod) == {"nvidia.com/gpu": 4}
    pod["spec"]["initContainers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "8"
    assert gpu_held.pod_gpu_requests(pod) == {"nvidia.com/gpu": 8}  # an init alone needs 8
    assert gpu_held.pod_gpu_requests({"spec": {"containers": [
        {"resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "2"}}}],
        "overhead": {"nvidia.com/gpu": "1"}}}) == {"nvidia.com/gpu": 2}
    # quantity grammar, rounding and hostile values: tests/kubectl/test_quantity.py


# -- case 1: can never fit --------------------------------------------------------------------

def test_never_fits_request_larger_than_every_node():
    fc = FakeCluster()
    fc.add_node("gpu-1", gpus=2, allocatable_gpus=0, now=NOW)  # the real cluster
    fc.add_node("gpu-2", gpus=1, now=NOW)
    fc.add_node("cpu-1", gpus=0, now=NOW)
    f = only(run(fc, pending(fc, gpus=4)), "pod.gpu_never_fits")
    assert f.severity.value == "critical"
    ev = f.evidence
    assert ev["case"] == "never_fits" and ev["subcase"] == "request_exceeds_capacity"
    assert ev["requested"] == {"nvidia.com/gpu": 4}
    assert ev["largest_capacity"] == {"nvidia.com/gpu": 2}
    assert ev["nodes"][0] == {"node": "gpu-1", "capacity": {"nvidia.com/gpu": 2},
                              "allocatable": {"nvidia.com/gpu": 0},
                              "held": {"nvidia.com/gpu": 0}, "free": {"nvidia.com/gpu": 0}}
    assert ev["nodes_total"] == 3 and ev["nodes_offering"] == 2
    assert "the largest has 2 (gpu-1, 0 allocatable)" in f.title
    assert "at most 2 nvidia.com/gpu per pod" in f.remediation
    assert "node.gpu_capacity_mismatch" in f.remediation


def test_never_fits_mig_mixed_strategy_names_the_mig_resources():
    fc = FakeCluster()
    mig_nodes = [captured_mig_node(f"a100-{i}", drop=("nvidia.com/gpu",)) for i in range(2)]
    f = only(run(fc, pending(fc, gpus=1), extra_nodes=mig_nodes), "pod.gpu_never_fits")
    ev = f.evidence
    assert ev["subcase"] == "mig_mixed_strategy" and ev["not_offered"] == ["nvidia.com/gpu"]
    assert ev["offered"] == {"nvidia.com/mig-1g.10gb": 2, "nvidia.com/mig-2g.20gb": 2,
                             "nvidia.com/mig-3g.40gb": 2}
    assert "no node offers nvidia.com/gpu" in f.title and "nvidia.com/mig-1g.10gb" in f.title
    assert "strategy `mixed`" in f.remediation and "`single`" in f.remediation


def test_never_fits_reverse_mig_profile_on_nodes_without_mig():
    fc = FakeCluster()
    fc.add_node("gpu-1", gpus=8, now=NOW)
    f = only(run(fc, pending(fc, gpus=1, resource="nvidia.com/mig-1g.10gb")),
             "pod.gpu_never_fits")
    assert f.evidence["subcase"] == "mig_single_or_disabled"
    assert f.evidence["offered"] == {"nvidia.com/gpu": 1}
    # and a profile the MIG nodes do not have
    fc2 = FakeCluster()
    f2 = only(run(fc2, pending(fc2, gpus=1, resource="nvidia.com/mig-7g.80gb"),
                  extra_nodes=[captured_mig_node("a100-0")]), "pod.gpu_never_fits")
    assert f2.evidence["subcase"] == "mig_profile_absent"
    assert "nvidia.com/mig-3g.40gb" in f2.remediation


def test_never_fits_time_slicing_renamed_and_reverse():
    fc = FakeCluster()
    fc.add_node("ts-1", gpus=0, extra_capacity={"nvidia.com/gpu.shared": 16}, now=NOW)
    f = only(run(fc, pending(fc, gpus=1)), "pod.gpu_never_fits")
    assert f.evidence["subcase"] == "time_slicing_renamed"
    assert "`nvidia.com/gpu.shared`" in f.remediation
    fc2 = FakeCluster()
    fc2.add_node("gpu-1", gpus=4, now=NOW)
    f2 = only(run(fc2, pending(fc2, gpus=1, resource="nvidia.com/gpu.shared")),
              "pod.gpu_never_fits")
    assert f2.evidence["subcase"] == "sharing_not_renamed"


def test_never_fits_no_gpu_resource_anywhere():
    fc = FakeCluster()
    fc.add_node("cpu-1", gpus=0, now=NOW)
    f = only(run(fc, pending(fc, gpus=1)), "pod.gpu_never_fits")
    assert f.evidence["subcase"] == "not_offered" and f.evidence["offered"] == {}
    assert "no node advertises any GPU resource" in f.title


# -- case 2: the devices are not there ---------------------------------------------------------

def test_devices_missing_capacity_enough_allocatable_not():
    fc = FakeCluster()
    fc.add_node("gpu-1", gpus=8, allocatable_gpus=2, now=NOW)
    fc.add_node("gpu-2", gpus=8, allocatable_gpus=0, now=NOW)
    fc.add_node("gpu-small", gpus=2, now=NOW)  # healthy but too small
    f = only(run(fc, pending(fc, gpus=4)), "pod.gpu_devices_missing")
    ev = f.evidence
    assert f.severity.value == "critical" and ev["case"] == "devices_missing"
    assert ev["nodes_affected"] == 2 and ev["see"] == "node.gpu_capacity_mismatch"
    by = {n["node"]: n for n in ev["nodes"]}
    assert by["gpu-1"]["allocatable"] == {"nvidia.com/gpu": 2}
    assert by["gpu-2"]["capacity"] == {"nvidia.com/gpu": 8}
    assert "gpu-small" not in by
    assert "node.gpu_capacity_mismatch" in f.remediation
    assert "kubectl gpu-doctor node gpu-1" in f.remediation


# -- case 3: others hold them -------------------------------------------------------------------

def test_held_by_others_lists_holders_and_ignores_finished_pods():
    fc = FakeCluster()
    fc.add_node("gpu-1", gpus=8, now=NOW)
    fc.add_node("gpu-2", gpus=8, now=NOW)
    fc.add_pod("ml", "big-0", "gpu-1", gpus=6, age_s=7200, now=NOW)
    fc.add_pod("team-b", "infer-0", "gpu-2", gpus=3, age_s=600, now=NOW)
    fc.add_pod("team-b", "infer-1", "gpu-2", gpus=3, age_s=60, now=NOW, phase="Pending")
    # finished pods hold nothing, however many GPUs they asked for
    fc.add_pod("ml", "done-0", "gpu-1", gpus=8, now=NOW, phase="Succeeded")
    fc.add_pod("ml", "crashed-0", "gpu-2", gpus=8, now=NOW, phase="Failed")
    f = only(run(fc, pending(fc, gpus=4)), "pod.gpu_held_by_others")
    ev = f.evidence
    assert f.severity.value == "warning" and ev["case"] == "held_by_others"
    by = {n["node"]: n for n in ev["nodes"]}
    assert by["gpu-1"]["held"] == {"nvidia.com/gpu": 6}
    assert by["gpu-1"]["free"] == {"nvidia.com/gpu": 2}
    assert by["gpu-2"]["held"] == {"nvidia.com/gpu": 6}
    h1 = by["gpu-1"]["holders"]
    assert h1 == [{"pod": "ml/big-0", "count": {"nvidia.com/gpu": 6}, "age": "120m",
                   "phase": "Running"}]
    names2 = {h["pod"]: h for h in by["gpu-2"]["holders"]}
    assert set(names2) == {"team-b/infer-0", "team-b/infer-1"}
    assert names2["team-b/infer-1"]["phase"] == "Pending"
    assert all("done-0" not in h["pod"] and "crashed" not in h["pod"]
               for n in ev["nodes"] for h in n["holders"])
    assert "ml/big-0 6" in f.title or "team-b/infer-0 3" in f.title


def test_held_counts_init_containers_like_the_scheduler():
    fc = FakeCluster()
    fc.add_node("gpu-1", gpus=4, now=NOW)
    h = fc.add_pod("ml", "prep-0", "gpu-1", gpus=1, now=NOW)
    h["spec"]["initContainers"] = [{"name": "warm", "resources": {
        "limits": {"nvidia.com/gpu": "3"}}}]  # max(3, 1) = 3 held, not 4
    f = run(fc, pending(fc, gpus=2))
    assert {x.id for x in f} == {"pod.gpu_held_by_others"}
    assert f[0].evidence["nodes"][0]["held"] == {"nvidia.com/gpu": 3}
    h["spec"]["initContainers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1"
    g = run(fc, pending(fc, gpus=2))  # max(1, 1) = 1 held -> 3 free -> fits
    assert g[0].id == "pod.pending_explained" and g[0].evidence["case"] == "fits"


# -- case 4: excluded by placement --------------------------------------------------------------

def test_excluded_by_taint_selector_affinity_cordon_notready():
    fc = FakeCluster()
    fc.add_node("tainted", gpus=8, now=NOW)["spec"]["taints"] = [
        {"key": "dedicated", "value": "infer", "effect": "NoSchedule"},
        {"key": "soft", "effect": "PreferNoSchedule"}]
    fc.add_node("evicting", gpus=8, now=NOW)["spec"]["taints"] = [
        {"key": "maintenance", "effect": "NoExecute"}]
    fc.add_node("h100", gpus=8, labels={"pool": "h100"}, now=NOW)
    fc.add_node("old", gpus=8, labels={"gen": "7"}, now=NOW)
    cordoned = fc.add_node("cordoned", gpus=8, now=NOW)
    cordoned["spec"].update(unschedulable=True, taints=[
        {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}])
    fc.add_node("notready", gpus=8, ready=False, now=NOW)
    fc.add_node("small", gpus=1, labels={"pool": "a100"}, now=NOW)
    pod = pending(fc, gpus=4)
    pod["spec"]["nodeSelector"] = {"pool": "a100"}
    pod["spec"]["tolerations"] = [{"key": "soft", "operator": "Exists"}]
    pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "gen", "operator": "Gt", "values": ["8"]},
            {"key": "zone", "operator": "DoesNotExist"}]}]}}}
    f = only(run(fc, pod), "pod.gpu_placement_excluded")
    ev = f.evidence
    assert ev["case"] == "excluded_by_placement" and ev["nodes_excluded"] == 6
    assert ev["would_fit_if_allowed"] == 6
    by = {n["node"]: n["excluded_by"] for n in ev["nodes"]}
    assert "taint dedicated=infer:NoSchedule not tolerated" in by["tainted"]
    assert not any("soft" in r for r in by["tainted"])  # tolerated (and only Prefer anyway)
    assert "taint maintenance:NoExecute not tolerated" in by["evicting"]
    assert "nodeSelector pool=a100 (node has pool=h100)" in by["h100"]
    assert "nodeSelector pool=a100 (node has no label pool)" in by["old"]
    assert "required nodeAffinity gen Gt ['8'] (node has gen=7)" in by["old"]
    assert any("node.kubernetes.io/unschedulable:NoSchedule" in r and "cordoned" in r
               for r in by["cordoned"])
    assert "NotReady (Ready=Unknown)" in by["notready"]
    assert "small" not in by  # too small: not a placement question
    assert ev["excluded_by_rule"]["nodeSelector pool=a100"] == 6
    # the easiest node to open up first (two rules), with what lifts each rule
    assert ev["nodes"][0]["node"] == "h100"
    assert f.remediation.startswith("To let it onto h100 (8 of 8 free): nodeSelector pool: h100 "
                                    "to target it; change the pod's required nodeAffinity")


@pytest.mark.parametrize("op,values,label,ok", [
    ("In", ["a", "b"], "a", True), ("In", ["a"], "c", False), ("In", ["a"], None, False),
    ("NotIn", ["a"], "b", True), ("NotIn", ["a"], None, True), ("NotIn", ["a"], "a", False),
    ("Exists", [], "x", True), ("Exists", [], None, False),
    ("DoesNotExist", [], None, True), ("DoesNotExist", [], "x", False),
    ("Gt", ["3"], "4", True), ("Gt", ["3"], "3", False), ("Gt", ["3"], "x", False),
    ("Lt", ["3"], "2", True), ("Lt", ["3"], None, False)])
def test_node_affinity_operators(op, values, label, ok):
    node = {"metadata": {"name": "n", "labels": {} if label is None else {"k": label}},
            "spec": {}, "status": {}}
    pod = {"spec": {"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "k", "operator": op, "values": values}]}]}}}}}
    assert (placement.placement_failures(pod, node) == []) is ok


def test_a_long_affinity_value_list_is_shown_bounded():
    node = {"metadata": {"name": "n", "labels": {"k": "x"}}, "spec": {}, "status": {}}
    vals = [f"zone-{i:05d}" for i in range(5000)]
    pod = {"spec": {"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "k", "operator": "In", "values": vals}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": vals}]}]}}}}}
    (rule,) = placement.placement_failures(pod, node)
    assert len(rule) < 600, len(rule)
    assert "k In ['zone-00000', 'zone-00001'," in rule and "4995 more]" in rule


def test_affinity_terms_are_ored_and_tolerations_match_like_the_scheduler():
    node = {"metadata": {"name": "n1", "labels": {"pool": "b"}},
            "spec": {"taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}]},
            "status": {}}
    pod = {"spec": {"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}},
        "tolerations": [{"key": "k", "operator": "Equal", "value": "v"}]}}
    assert placement.placement_failures(pod, node) == []
    pod["spec"]["tolerations"] = [{"key": "k", "operator": "Equal", "value": "w"}]
    assert placement.placement_failures(pod, node) == ["taint k=v:NoSchedule not tolerated"]
    pod["spec"]["tolerations"] = [{"operator": "Exists"}]  # tolerates everything
    assert placement.placement_failures(pod, node) == []
    pod["spec"]["tolerations"] = [{"key": "k", "operator": "Exists", "effect": "NoExecute"}]
    assert len(placement.placement_failures(pod, node)) == 1  # wrong effect


def test_excluded_wins_when_the_allowed_nodes_are_full_but_an_excluded_one_is_free():
    fc = FakeCluster()
    fc.add_node("open", gpus=8, now=NOW)
    fc.add_pod("ml", "hog-0", "open", gpus=8, now=NOW)
    fc.add_node("reserved", gpus=8, now=NOW)["spec"]["taints"] = [
        {"key": "nvidia.com/gpu", "value": "reserved", "effect": "NoSchedule"}]
    f = only(run(fc, pending(fc, gpus=4)), "pod.gpu_placement_excluded")
    assert f.evidence["would_fit_if_allowed"] == 1
    assert f.evidence["allowed_nodes"][0]["node"] == "open"
    assert f.evidence["allowed_nodes"][0]["why_not"] == "held by other pods"
    assert ("add the toleration `{key: nvidia.com/gpu, operator: Equal, value: reserved, "
            "effect: NoSchedule}`") in f.remediation


# -- case 5: quota --------------------------------------------------------------------------------

def quota(name="gpu-quota", key="requests.nvidia.com/gpu", hard="8", used="8"):
    return {"kind": "ResourceQuota", "apiVersion": "v1",
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"hard": {key: hard}}, "status": {"hard": {key: hard}, "used": {key: used}}}


def test_quota_exhausted_with_failed_creates_is_a_warning():
    fc = FakeCluster()
    fc.add_node("gpu-1", gpus=8, now=NOW)
    fc.add_pod("ml", "big-0", "gpu-1", gpus=6, now=NOW)
    pod = pending(fc, gpus=4)
    ev = {"involvedObject": {"kind": "ReplicaSet", "name": "trainer-5d8f"},
          "reason": "FailedCreate", "type": "Warning", "count": 7,
          "message": 'Error creating: pods "trainer-5d8f-x" is forbidden: exceeded quota: '
                     'gpu-quota, requested: requests.nvidia.com/gpu=4, used: '
                     'requests.nvidia.com/gpu=8, limited: requests.nvidia.com/gpu=8'}
    fs = run(fc, pod, quotas=[quota()], quota_events=[ev])
    q = only(fs, "pod.gpu_quota_exhausted")
    assert q.severity.value == "warning" and q.evidence["case"] == "quota"
    assert q.evidence["quotas"] == [{"quota": "gpu-quota", "resource":
                                     "requests.nvidia.com/gpu", "hard": 8, "used": 8,
                                     "this_pod": 4}]
    assert q.evidence["failed_creates"][0]["object"] == "ReplicaSet/trainer-5d8f"
    assert "gpu-quota is used up: requests.nvidia.com/gpu 8/8" in q.title
    only(fs, "pod.gpu_held_by_others")  # the fit is judged as well


def test_quota_bare_name_without_refusals_is_info_and_room_left_is_silent():
    fc = FakeCluster()
    fc.add_node("gpu-1", gpus=8, now=NOW)
    pod = pending(fc, gpus=2, age_s=5)
    q = only(run(fc, pod, quotas=[quota(key="nvidia.com/gpu", hard="4", used="4")]),
             "pod.gpu_quota_exhausted")
    assert q.severity.value == "info"
    assert not [f for f in run(fc, pod, quotas=[quota(hard="8", used="2")])
                if f.id == "pod.gpu_quota_exhausted"]


# -- the healthy case and the rest ---------------------------------------------------------------

def test_healthy_pod_waiting_a_few_seconds_gives_no_warning():
    fc = FakeCluster()
    fc.add_node("gpu-1", gpus=8, now=NOW)
    fc.add_pod("ml", "other-0", "gpu-1", gpus=4, now=NOW)
    fs = run(fc, pending(fc, gpus=4, age_s=3))
    assert [(f.id, f.severity.value) for f in fs] == [("pod.pending_explained", "info")]
    assert fs[0].evidence["case"] == "fits" and fs[0].evidence["nodes_fitting"] == 1
    assert "gpu-1 4 free" in fs[0].title


def test_fits_but_scheduler_complains_about_something_else():
    fc = FakeCluster()
    fc.add_node("gpu-1", gpus=8, now=NOW)
    pod = pending(fc, gpus=1)
    ev = fc.add_event(pod, "Warning", "FailedScheduling",
                      "0/1 nodes are available: 1 Insufficient cpu.", "default-scheduler", NOW)
    fs = run(fc, pod, events=[ev])
    assert fs[0].id == "pod.pending_explained" and fs[0].severity.value == "warning"
    assert "Insufficient cpu" in fs[0].title and "GPU request is not the problem" in \
        fs[0].remediation


def test_fits_and_old_without_any_scheduler_event_suspects_the_scheduler():
    fc = FakeCluster()
    fc.add_node("gpu-1", gpus=8, now=NOW)
    pod = pending(fc, gpus=1, age_s=900)
    pod["spec"]["schedulerName"] = "hami-scheduler"
    f = run(fc, pod)[0]
    assert f.severity.value == "warning" and "15m" in f.title
    assert "`hami-scheduler` running" in f.remediation


def test_not_a_gpu_pod_or_already_scheduled_is_not_judged():
    fc = FakeCluster()
    fc.add_node("gpu-1", gpus=8, now=NOW)
    plain = fc.add_pod("ml", "web-0", None, phase="Pending", now=NOW)
    assert run(fc, plain) == []
    bound = fc.add_pod("ml", "train-1", "gpu-1", phase="Pending", gpus=1, now=NOW)
    assert run(fc, bound) == []


def test_hami_shares_are_left_to_the_extender():
    fc = FakeCluster()
    fc.add_node("gpu-1", gpus=10, now=NOW)  # HAMi: 10 vGPU slots
    pod = pending(fc, gpus=1, age_s=5)
    pod["spec"]["containers"][0]["resources"]["limits"].update(
        {"nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"})
    fs = run(fc, pod)
    assert fs[0].id == "pod.pending_explained" and fs[0].severity.value == "info"
    assert fs[0].evidence["judged_by_scheduler_extender"] == {
        "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30}


def test_node_free_for_the_fleet_column():
    fc = FakeCluster()
    node = fc.add_node("gpu-1", gpus=8, allocatable_gpus=6, now=NOW)
    fc.add_pod("ml", "a", "gpu-1", gpus=2, now=NOW)
    fc.add_pod("ml", "b", "gpu-1", gpus=3, now=NOW, phase="Succeeded")
    assert gpu_held.node_free(node, list(fc.pods.values())) == 4
    assert gpu_held.node_free(fc.add_node("cpu-1", gpus=0, now=NOW), []) is None
    mig = captured_mig_node("127.0.0.1")
    assert gpu_held.node_free(mig, []) == 6  # 2 full GPUs + 4 MIG slices


def test_captured_node_and_pods_shapes():
    """The real capture's pods (bound, no GPU requests in the plain one) hold what they ask."""
    node = json.loads((CAPTURES / "wedged-3m-node.json").read_text())
    pods = json.loads((CAPTURES / "wedged-3m-pods.json").read_text())["items"]
    held, _ = gpu_held.index_held(pods)
    gpu_pod = next(p for p in pods if p["metadata"]["name"] == "gdscn-gpu")
    assert held.get(node["metadata"]["name"], {}) == gpu_held.pod_gpu_requests(gpu_pod)
    p = copy.deepcopy(gpu_pod)
    del p["spec"]["nodeName"]
    p["metadata"]["uid"] = "x"
    p["metadata"]["creationTimestamp"] = ts(NOW - dt.timedelta(seconds=3))
    fs = fit_findings.analyze_pending(p, [node], pods, now=NOW)
    assert fs and fs[0].evidence["requested"] == gpu_held.pod_gpu_requests(gpu_pod)


def test_dra_claims_are_named_not_judged_here():
    fc = FakeCluster()
    fc.add_node("gpu-1", gpus=8, now=NOW)
    pod = pending(fc, gpus=1, age_s=5)
    pod["spec"]["resourceClaims"] = [{"name": "gpu-claim",
                                      "resourceClaimTemplateName": "one-gpu"}]
    f = run(fc, pod)[0]
    assert f.evidence["resource_claims"] == ["gpu-claim"] and f.severity.value == "info"
    only_claims = pending(fc, name="dra-0", gpus=0)
    only_claims["spec"]["containers"][0]["resources"] = {}
    only_claims["spec"]["resourceClaims"] = [{"name": "c"}]
    assert run(fc, only_claims) == []  # left to the DRA analysis


def test_fits_but_gated_names_the_gates():
    fc = FakeCluster()
    fc.add_node("gpu-1", gpus=8, now=NOW)
    pod = pending(fc, gpus=1, age_s=5)
    pod["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    f = run(fc, pod)[0]
    assert f.id == "pod.pending_explained" and f.severity.value == "warning"
    assert f.evidence["scheduling_gates"] == ["kueue.x-k8s.io/admission"]
    assert "kueue.x-k8s.io/admission" in f.title


def test_pod_never_created_because_of_a_gpu_quota():
    ev = {"involvedObject": {"kind": "StatefulSet", "name": "trainer"}, "count": 12,
          "reason": "FailedCreate", "type": "Warning",
          "message": 'create Pod trainer-0 in StatefulSet trainer failed error: pods '
                     '"trainer-0" is forbidden: exceeded quota: gpu-quota, requested: '
                     'cpu=1,requests.nvidia.com/gpu=4, used: cpu=3,requests.nvidia.com/gpu=6, '
                     'limited: cpu=64,requests.nvidia.com/gpu=8'}
    other = dict(ev, message=ev["message"].replace('"trainer-0"', '"trainer-1"'))
    cpu_only = dict(ev, message='pods "trainer-0" is forbidden: exceeded quota: q, '
                                'requested: cpu=1, used: cpu=8, limited: cpu=8')
    f = gpu_quota.refused_creation("ml", "trainer-0", [], [other, cpu_only, ev])
    assert len(f) == 1 and f[0].id == "pod.gpu_quota_exhausted"
    assert f[0].evidence["pod_exists"] is False
    assert f[0].evidence["quotas"] == [{"quota": "gpu-quota", "resource":
                                        "requests.nvidia.com/gpu", "hard": 8, "used": 6,
                                        "this_pod": 4}]
    assert "StatefulSet/trainer cannot create it" in f[0].title
    assert gpu_quota.refused_creation("ml", "trainer-0", [], [other, cpu_only]) == []
    # the quota as it stands now wins over the event's numbers
    f2 = gpu_quota.refused_creation("ml", "trainer-0", [quota(hard="8", used="7")], [ev])
    assert f2[0].evidence["quotas"][0]["used"] == 7

"""`kubectl gpu-doctor pod NAME` for a Pending GPU pod, end to end: the real CLI process and
kubernetes client against the kmock fake API server, one test per case of
analysis/scheduling/fit.py, plus a 1,000-node cluster and the `nodes` free-GPU column."""
from __future__ import annotations

import datetime as dt
import json
import re
import time
import uuid

from .conftest import run_cli
from .fakecluster import build_fleet, ts
from .test_fit import captured_mig_node

LIST_PATHS = ("/api/v1/nodes", "/api/v1/pods", "/api/v1/namespaces/ml/resourcequotas")


def pending(cluster, name="trainer-0", ns="ml", gpus=4, resource="nvidia.com/gpu",
            age_s=300.0, scheduler_says: str | None = None) -> dict:
    p = cluster.add_pod(ns, name, None, phase="Pending", gpus=0, age_s=age_s)
    res = p["spec"]["containers"][0]["resources"]
    res["requests"][resource] = str(gpus)
    res.setdefault("limits", {})[resource] = str(gpus)
    p["status"]["conditions"] = [{"type": "PodScheduled", "status": "False",
                                  "reason": "Unschedulable",
                                  "message": scheduler_says or "",
                                  "lastTransitionTime": p["metadata"]["creationTimestamp"]}]
    if scheduler_says:
        cluster.add_event(p, "Warning", "FailedScheduling", scheduler_says, "default-scheduler",
                          dt.datetime.now(dt.timezone.utc))
    return p


def pod_doc(cluster, kubeconfig, name="trainer-0", ns="ml", *extra: str):
    r = run_cli("pod", name, "-n", ns, "--kubeconfig", str(kubeconfig), "--no-probe",
                "-o", "json", *extra)
    assert "Traceback" not in r.stderr, r.stderr
    doc = json.loads(r.stdout)
    assert doc["exit_code"] == r.returncode
    return r, doc


def by_id(doc) -> dict:
    return {f["id"]: f for f in doc["findings"]}


def gpu_case(doc) -> dict:
    hits = [f for f in doc["findings"] if f["id"].startswith("pod.gpu_") and
            f["id"] != "pod.gpu_quota_exhausted" or f["id"] == "pod.pending_explained"]
    assert len(hits) == 1, [(f["id"], f["title"]) for f in doc["findings"]]
    return hits[0]


def test_never_fits_the_issue_cluster_names_node_and_numbers(cluster, kubeconfig):
    # the real 1.35 run of the issue: 4 asked, the only GPU node has capacity 2, allocatable 0
    cluster.add_node("gpu-1", gpus=2, allocatable_gpus=0)
    cluster.add_node("cpu-1", gpus=0)
    pending(cluster, gpus=4, scheduler_says="0/2 nodes are available: 2 Insufficient "
            "nvidia.com/gpu. preemption: 0/2 nodes are available: 2 No preemption victims "
            "found for incoming pod.")
    r, doc = pod_doc(cluster, kubeconfig)
    f = gpu_case(doc)
    assert f["id"] == "pod.gpu_never_fits" and f["severity"] == "critical"
    ev = f["evidence"]
    assert ev["case"] == "never_fits" and ev["subcase"] == "request_exceeds_capacity"
    assert ev["requested"] == {"nvidia.com/gpu": 4}
    assert ev["nodes"] == [{"node": "gpu-1", "capacity": {"nvidia.com/gpu": 2},
                            "allocatable": {"nvidia.com/gpu": 0}, "held": {"nvidia.com/gpu": 0},
                            "free": {"nvidia.com/gpu": 0}}]
    assert "Insufficient nvidia.com/gpu" in ev["scheduler_message"]
    assert "the largest has 2 (gpu-1" in f["title"]
    assert "at most 2 nvidia.com/gpu per pod" in f["remediation"]
    assert r.returncode == 1 and doc["summary"]["complete"] is True
    # three lists, whatever the cluster size; no per-node calls
    for path in LIST_PATHS:
        assert cluster.count("GET", re.escape(path)) == 1, path
    assert cluster.count("GET", r"/api/v1/nodes/.+") == 0
    checks = {c["id"]: c for c in doc["checks"]}
    assert checks["api.gpu_fit"]["status"] == "ok"


def test_never_fits_mig_mixed_strategy(cluster, kubeconfig):
    for i in range(2):  # the captured node's MIG slices, without full GPUs (strategy mixed)
        cluster.nodes[f"a100-{i}"] = captured_mig_node(f"a100-{i}", drop=("nvidia.com/gpu",))
    pending(cluster, gpus=1)
    r, doc = pod_doc(cluster, kubeconfig)
    f = gpu_case(doc)
    assert f["id"] == "pod.gpu_never_fits" and r.returncode == 1
    assert f["evidence"]["subcase"] == "mig_mixed_strategy"
    assert f["evidence"]["offered"]["nvidia.com/mig-1g.10gb"] == 2
    assert "nvidia.com/mig-1g.10gb" in f["title"] and "`single`" in f["remediation"]


def test_devices_missing(cluster, kubeconfig):
    cluster.add_node("gpu-1", gpus=8, allocatable_gpus=3)
    cluster.add_node("gpu-2", gpus=2)
    pending(cluster, gpus=4)
    r, doc = pod_doc(cluster, kubeconfig)
    f = gpu_case(doc)
    assert f["id"] == "pod.gpu_devices_missing" and f["severity"] == "critical"
    assert f["evidence"]["nodes"][0]["node"] == "gpu-1"
    assert f["evidence"]["nodes"][0]["allocatable"] == {"nvidia.com/gpu": 3}
    assert f["evidence"]["see"] == "node.gpu_capacity_mismatch"
    assert "gpu-1 3/8" in f["title"] and r.returncode == 1


def test_held_by_others_lists_holders_not_finished_pods(cluster, kubeconfig):
    cluster.add_node("gpu-1", gpus=8)
    cluster.add_pod("research", "sweep-7", "gpu-1", gpus=5, age_s=3 * 3600)
    # admitted by the kubelet, still creating its container (a bound Pending pod the kubelet
    # never touched would mean the node admits nothing: no room there at all)
    cluster.add_pod("ml", "eval-0", "gpu-1", gpus=1, age_s=600, phase="Pending", extra_status={
        "startTime": ts(dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=600)),
        "containerStatuses": [{
            "name": "main", "ready": False, "restartCount": 0, "image": "registry.example/app:1",
            "imageID": "", "state": {"waiting": {"reason": "ContainerCreating"}}}]})
    cluster.add_pod("ml", "old-job", "gpu-1", gpus=8, phase="Succeeded")
    cluster.add_pod("ml", "broken-job", "gpu-1", gpus=8, phase="Failed")
    pending(cluster, gpus=4)
    r, doc = pod_doc(cluster, kubeconfig)
    f = gpu_case(doc)
    assert f["id"] == "pod.gpu_held_by_others" and f["severity"] == "warning"
    node = f["evidence"]["nodes"][0]
    assert node["held"] == {"nvidia.com/gpu": 6} and node["free"] == {"nvidia.com/gpu": 2}
    assert [(h["pod"], h["count"]["nvidia.com/gpu"], h["age"], h["phase"])
            for h in node["holders"]] == [("research/sweep-7", 5, "3h", "Running"),
                                          ("ml/eval-0", 1, "10m", "Pending")]
    assert "research/sweep-7 5" in f["title"] and r.returncode == 1


def test_excluded_by_placement_names_rule_per_node(cluster, kubeconfig):
    cluster.add_node("gpu-tainted", gpus=8)["spec"]["taints"] = [
        {"key": "nvidia.com/gpu", "value": "reserved", "effect": "NoSchedule"}]
    cluster.add_node("gpu-h100", gpus=8, labels={"pool": "h100"})
    cordoned = cluster.add_node("gpu-cordoned", gpus=8, labels={"pool": "a100"})
    cordoned["spec"]["unschedulable"] = True
    cordoned["spec"]["taints"] = [{"key": "node.kubernetes.io/unschedulable",
                                   "effect": "NoSchedule"}]
    down = cluster.add_node("gpu-down", gpus=8, ready=False, labels={"pool": "a100"})
    down["spec"]["taints"] = [{"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"},
                              {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]
    cluster.add_node("gpu-small", gpus=2, labels={"pool": "a100"})
    p = pending(cluster, gpus=4)
    p["spec"]["nodeSelector"] = {"pool": "a100"}
    p["spec"]["tolerations"] = [{"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                                 "effect": "NoExecute", "tolerationSeconds": 300}]
    r, doc = pod_doc(cluster, kubeconfig)
    f = gpu_case(doc)
    assert f["id"] == "pod.gpu_placement_excluded" and r.returncode == 1
    ev = f["evidence"]
    rules = {n["node"]: n["excluded_by"] for n in ev["nodes"]}
    assert set(rules) == {"gpu-tainted", "gpu-h100", "gpu-cordoned", "gpu-down"}
    assert "taint nvidia.com/gpu=reserved:NoSchedule not tolerated" in rules["gpu-tainted"]
    assert "nodeSelector pool=a100 (node has pool=h100)" in rules["gpu-h100"]
    assert rules["gpu-cordoned"] == ["taint node.kubernetes.io/unschedulable:NoSchedule not "
                                     "tolerated (cordoned)"]
    assert rules["gpu-down"] == ["taint node.kubernetes.io/unreachable:NoSchedule not "
                                 "tolerated (NotReady: unreachable)"]
    assert ev["would_fit_if_allowed"] == 4 and ev["nodes_excluded"] == 4


def test_quota_exhausted_names_quota_and_refused_controller(cluster, kubeconfig):
    cluster.add_node("gpu-1", gpus=8)
    cluster.add_pod("ml", "trainer-1", "gpu-1", gpus=4)
    pending(cluster, gpus=4, age_s=5)
    cluster.add_quota("ml", "gpu-quota", {"requests.nvidia.com/gpu": 8},
                      {"requests.nvidia.com/gpu": 8})
    rs = {"metadata": {"name": "trainer-5d8f9c", "namespace": "ml", "uid": str(uuid.uuid4())}}
    ev = cluster.add_event(rs, "Warning", "FailedCreate",
                           'Error creating: pods "trainer-5d8f9c-k2x4q" is forbidden: exceeded '
                           'quota: gpu-quota, requested: requests.nvidia.com/gpu=4, used: '
                           'requests.nvidia.com/gpu=8, limited: requests.nvidia.com/gpu=8',
                           "replicaset-controller", dt.datetime.now(dt.timezone.utc))
    ev["involvedObject"]["kind"] = "ReplicaSet"
    r, doc = pod_doc(cluster, kubeconfig)
    q = by_id(doc)["pod.gpu_quota_exhausted"]
    assert q["severity"] == "warning" and r.returncode == 1
    assert q["evidence"]["quotas"][0] == {"quota": "gpu-quota", "resource":
                                          "requests.nvidia.com/gpu", "hard": 8, "used": 8,
                                          "this_pod": 4}
    assert q["evidence"]["failed_creates"][0]["object"] == "ReplicaSet/trainer-5d8f9c"
    assert "ReplicaSet/trainer-5d8f9c" in q["title"]
    # the pod itself fits (4 free): only the quota is a warning
    assert gpu_case(doc)["severity"] == "info"


def test_healthy_pod_waiting_for_the_scheduler_gives_no_warning(cluster, kubeconfig):
    cluster.add_node("gpu-1", gpus=8)
    cluster.add_pod("ml", "infer-0", "gpu-1", gpus=2)
    pending(cluster, gpus=4, age_s=3)
    r, doc = pod_doc(cluster, kubeconfig)
    assert r.returncode == 0, doc["findings"]
    assert doc["summary"]["warning"] == doc["summary"]["critical"] == 0
    f = gpu_case(doc)
    assert f["id"] == "pod.pending_explained" and f["severity"] == "info"
    assert f["evidence"]["case"] == "fits" and f["evidence"]["nodes_fitting"] == 1


def test_fit_not_computable_says_so_and_falls_back(cluster, kubeconfig):
    cluster.add_node("gpu-1", gpus=2)
    pending(cluster, gpus=4, scheduler_says="0/1 nodes are available: 1 Insufficient "
            "nvidia.com/gpu.")
    cluster.forbid.append(("GET", re.compile(r"^/api/v1/nodes$")))
    r, doc = pod_doc(cluster, kubeconfig)
    f = gpu_case(doc)
    assert f["id"] == "pod.pending_explained" and "Insufficient" in f["quoted"][0]["text"]
    check = {c["id"]: c for c in doc["checks"]}["api.gpu_fit"]
    assert check["status"] == "skipped" and "403" in check["message"]


def test_thousand_nodes(cluster, kubeconfig):
    # every node has 8 GPUs and exactly one held: 7 free everywhere, the pod asks 8
    build_fleet(cluster, 1000, 3000)
    pending(cluster, gpus=8)
    r, doc = pod_doc(cluster, kubeconfig)
    f = gpu_case(doc)
    assert f["id"] == "pod.gpu_held_by_others"
    ev = f["evidence"]
    assert ev["nodes_total"] == 1000 and ev["nodes_affected"] == 1000
    assert len(ev["nodes"]) == 10  # bounded evidence
    assert all(n["free"] == {"nvidia.com/gpu": 7} for n in ev["nodes"])
    assert all(len(n["holders"]) == 1 for n in ev["nodes"])
    assert cluster.count("GET", r"/api/v1/nodes") == 1
    assert cluster.count("GET", r"/api/v1/pods") == 1


def test_nodes_table_has_a_free_gpu_column(cluster, kubeconfig):
    cluster.add_node("gpu-a", gpus=8)
    cluster.add_node("gpu-b", gpus=8, allocatable_gpus=6)
    cluster.add_pod("ml", "x", "gpu-a", gpus=3)
    cluster.add_pod("ml", "y", "gpu-a", gpus=8, phase="Succeeded")
    cluster.add_pod("ml", "z", "gpu-b", gpus=1)
    r = run_cli("nodes", "--show-healthy", "--kubeconfig", str(kubeconfig))
    lines = [ln for ln in r.stdout.splitlines() if not ln.startswith("    ")]
    head = lines[0].split()
    assert head[:4] == ["NODE", "READY", "GPU", "A/C"] and head[4] == "FREE"
    rows = {ln.split()[0]: ln.split() for ln in lines[1:4]}
    assert rows["gpu-a"][2:4] == ["8/8", "5"]
    assert rows["gpu-b"][2:4] == ["6/8", "5"]


def test_pod_report_footer_shows_the_real_elapsed_time(cluster, kubeconfig):
    cluster.add_node("gpu-1", gpus=2, allocatable_gpus=0)
    pending(cluster, gpus=4)
    t0 = time.monotonic()
    r = run_cli("pod", "trainer-0", "-n", "ml", "--kubeconfig", str(kubeconfig), "--no-probe")
    wall = time.monotonic() - t0
    m = re.search(r"; (\d+\.\d)s; exit 1$", r.stdout.strip())
    assert m, r.stdout
    # the process's own lifetime: interpreter start and `import kubernetes` included (it
    # printed 0.0s when only the part after opening the report was counted)
    assert 0.1 < float(m.group(1)) <= wall + 0.05
    assert "None" not in r.stdout and r.stdout.startswith("pod ml/trainer-0: live ")
    doc = json.loads(run_cli("pod", "trainer-0", "-n", "ml", "--kubeconfig", str(kubeconfig),
                             "--no-probe", "-o", "json").stdout)
    assert doc["duration_s"] > 0.1


def test_statefulset_pod_never_created_because_of_gpu_quota(cluster, kubeconfig):
    cluster.add_node("gpu-1", gpus=8)
    cluster.add_pod("ml", "other-0", "gpu-1", gpus=8)
    cluster.add_quota("ml", "gpu-quota", {"requests.nvidia.com/gpu": 8},
                      {"requests.nvidia.com/gpu": 8})
    sts = {"metadata": {"name": "trainer", "namespace": "ml", "uid": str(uuid.uuid4())}}
    ev = cluster.add_event(sts, "Warning", "FailedCreate",
                           'create Pod trainer-0 in StatefulSet trainer failed error: pods '
                           '"trainer-0" is forbidden: exceeded quota: gpu-quota, requested: '
                           'requests.nvidia.com/gpu=4, used: requests.nvidia.com/gpu=8, '
                           'limited: requests.nvidia.com/gpu=8', "statefulset-controller",
                           dt.datetime.now(dt.timezone.utc))
    ev["involvedObject"]["kind"] = "StatefulSet"
    r, doc = pod_doc(cluster, kubeconfig)
    q = by_id(doc)["pod.gpu_quota_exhausted"]
    assert q["evidence"]["pod_exists"] is False and r.returncode == 1
    assert q["evidence"]["quotas"] == [{"quota": "gpu-quota", "resource":
                                        "requests.nvidia.com/gpu", "hard": 8, "used": 8,
                                        "this_pod": 4}]
    assert "StatefulSet/trainer cannot create it" in q["title"]
    # any other missing pod is still "not found" (exit 3, one line)
    r2 = run_cli("pod", "ghost-0", "-n", "ml", "--kubeconfig", str(kubeconfig), "--no-probe")
    assert r2.returncode == 3 and "not found" in r2.stderr

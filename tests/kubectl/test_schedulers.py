"""`pod Y` for a Pending GPU pod that a queueing system or another scheduler holds (issue 32):
the answer from that system's own objects, through the fake API server and the real CLI, joined
with the nodes' free GPUs.

The objects are shaped as each project writes them, with their field names, condition types,
reasons and message formats:
- Kueue: apis/kueue/v1beta2 (workload_types.go: QuotaReserved/Admitted, status.admission
  .podSetAssignments[].resourceUsage; clusterqueue_types.go: spec.resourceGroups[].flavors[]
  .resources[].nominalQuota, status.flavorsReservation), the ClusterQueue of
  site/static/examples/tas/sample-gpu-queues.yaml, the Pending Workload of
  site/content/en/docs/tasks/troubleshooting/troubleshooting_jobs.md with the message format of
  pkg/scheduler/flavorassigner/flavorassigner.go ("insufficient unused quota for %s in flavor
  %s, %s more needed", as in flavorassigner_test.go), the gate and labels of
  pkg/controller/jobs/pod/constants and pkg/controller/constants
  (https://github.com/kubernetes-sigs/kueue).
- Volcano: staging/src/volcano.sh/apis/pkg/apis/scheduling/v1beta1/types.go (PodGroup phase
  Pending, Queue spec.capability/status.allocated) and the event of
  pkg/scheduler/plugins/proportion/proportion.go with util.FormatResourceNames
  (https://github.com/volcano-sh/volcano).
- KAI: pkg/apis/scheduling/v2alpha2/podgroup_types.go (schedulingConditions, reasons) with the
  OverLimit message of pkg/scheduler/api/unschedule_info_test.go
  (https://github.com/NVIDIA/KAI-Scheduler).
- HAMi: the FilteringFailed event of pkg/scheduler/score.go (recordFilteringFailures) as
  Project-HAMi/website PR #767 quotes it (https://github.com/Project-HAMi/HAMi).
"""
from __future__ import annotations

import datetime as dt
import json
import uuid

from .conftest import run_cli
from .fakecluster import ts

KQ = "/apis/kueue.x-k8s.io/v1beta2"
NOW = dt.datetime.now(dt.timezone.utc)


def _gpu_nodes(cluster):
    """Two 8-GPU nodes; gpu-1's GPUs are held by two running pods: gpu-2 has 8 free."""
    for n in ("gpu-1", "gpu-2"):
        cluster.add_node(n, now=NOW)
    cluster.add_pod("team-a", "train-a-x7k2p", "gpu-1", gpus=4, now=NOW)
    cluster.add_pod("team-b", "eval-b-q9z4w", "gpu-1", gpus=4, now=NOW)


def _pending(cluster, ns: str, name: str, gpus: int = 4, **spec) -> dict:
    pod = cluster.add_pod(ns, name, None, phase="Pending", gpus=gpus, age_s=300, now=NOW,
                          events="none")
    pod["spec"].update(spec)
    return pod


def _workload(ns, name, queue, uid_label, conditions, admission=None, owner=None):
    wl = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
          "metadata": {"name": name, "namespace": ns, "uid": str(uuid.uuid4()),
                       "labels": {"kueue.x-k8s.io/job-uid": uid_label},
                       "ownerReferences": [owner] if owner else []},
          "spec": {"queueName": queue, "podSets": [{"name": "main", "count": 1, "template": {
              "spec": {"containers": [{"name": "main", "image": "x"}]}}}]},
          "status": {"conditions": conditions}}
    if admission:
        wl["status"]["admission"] = admission
    return wl


def _reserved(cq: str, gpus: str) -> tuple[list, dict]:
    conds = [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved",
              "message": f"Quota reserved in ClusterQueue {cq}",
              "lastTransitionTime": ts(NOW)},
             {"type": "Admitted", "status": "True", "reason": "Admitted",
              "message": "The workload is admitted", "lastTransitionTime": ts(NOW)}]
    adm = {"clusterQueue": cq, "podSetAssignments": [{
        "name": "main", "count": 1, "flavors": {"nvidia.com/gpu": "default-flavor"},
        "resourceUsage": {"cpu": "1", "nvidia.com/gpu": gpus}}]}
    return conds, adm


def _kueue(cluster, quota_used: str = "8"):
    cluster.api_groups["kueue.x-k8s.io"] = ("v1beta2", ("v1beta1",))
    cluster.objects[f"{KQ}/namespaces/ml/localqueues/user-queue"] = {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
        "metadata": {"name": "user-queue", "namespace": "ml"},
        "spec": {"clusterQueue": "gpu-cq"}}
    cluster.objects[f"{KQ}/clusterqueues/gpu-cq"] = {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
        "metadata": {"name": "gpu-cq"},
        "spec": {"namespaceSelector": {}, "resourceGroups": [{
            "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
            "flavors": [{"name": "default-flavor", "resources": [
                {"name": "cpu", "nominalQuota": 100}, {"name": "memory", "nominalQuota": "100Gi"},
                {"name": "nvidia.com/gpu", "nominalQuota": 8}]}]}]},
        "status": {"admittedWorkloads": 2, "reservingWorkloads": 2, "pendingWorkloads": 1,
                   "conditions": [{"type": "Active", "status": "True", "reason": "Ready",
                                   "message": "Can admit new workloads"}],
                   "flavorsReservation": [{"name": "default-flavor", "resources": [
                       {"name": "cpu", "total": "2", "borrowed": "0"},
                       {"name": "nvidia.com/gpu", "total": quota_used, "borrowed": "0"}]}]}}


def kueue_pending(cluster) -> dict:
    """GPU nodes, and pod ml/trainer-0 held by Kueue's admission gate: its Workload's quota
    reservation failed (4 more GPUs needed in gpu-cq), which team-a's and team-b's admitted
    Workloads hold. The pod."""
    _gpu_nodes(cluster)
    pod = _pending(cluster, "ml", "trainer-0",
                   schedulingGates=[{"name": "kueue.x-k8s.io/admission"}])
    pod["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "user-queue"
    _kueue(cluster)
    a_conds, a_adm = _reserved("gpu-cq", "4")
    mine = _workload("ml", "pod-trainer-0-5f3c1", "user-queue", pod["metadata"]["uid"], [
        {"type": "QuotaReserved", "status": "False", "reason": "Pending",
         "message": "couldn't assign flavors to pod set main: insufficient unused quota for "
                    "nvidia.com/gpu in flavor default-flavor, 4 more needed",
         "lastTransitionTime": ts(NOW)}])
    holders = [_workload(ns, f"job-{job}-{h}", "user-queue", str(uuid.uuid4()), a_conds, a_adm,
                         {"kind": "Job", "name": job, "controller": True, "uid": "x"})
               for ns, job, h in (("team-a", "train-a", "1a2b3"), ("team-b", "eval-b", "4c5d6"))]
    cluster.lists[f"{KQ}/namespaces/ml/workloads"] = ("WorkloadList", [mine])
    cluster.lists[f"{KQ}/workloads"] = ("WorkloadList", [mine, *holders])
    return pod


def test_kueue_names_the_clusterqueue_quota_and_who_holds_it(cluster, kubeconfig):
    kueue_pending(cluster)
    r = run_cli("pod", "trainer-0", "-n", "ml", "--no-probe", "--kubeconfig", str(kubeconfig),
                "-o", "json")
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    f = next(f for f in doc["findings"] if f["id"] == "kueue.not_admitted")
    assert f["title"] == ("Kueue has not admitted it: ClusterQueue gpu-cq has 0 nvidia.com/gpu "
                          "left, 8 used by Job team-a/train-a and Job team-b/eval-b; the nodes "
                          "that would take it have 8 nvidia.com/gpu free (1 node(s))")
    ev = f["evidence"]
    assert ev["workload"] == "pod-trainer-0-5f3c1" and ev["cluster_queue"] == "gpu-cq"
    assert ev["quota"]["nvidia.com/gpu"]["nominal"] == 8
    assert ev["quota_reserved"]["message"].endswith("4 more needed")
    assert {c["id"]: c["status"] for c in doc["checks"]}["api.kueue"] == "ok"
    # the Workloads were read slimmed: no pod templates kept, bounded paged lists
    assert cluster.count("GET", r"/apis/kueue\.x-k8s\.io/v1beta2/workloads") == 1


def test_kueue_gate_without_kueue_and_a_queue_that_does_not_exist(cluster, kubeconfig):
    _gpu_nodes(cluster)
    _pending(cluster, "ml", "orphan-0", schedulingGates=[{"name": "kueue.x-k8s.io/admission"}])
    r = run_cli("pod", "orphan-0", "-n", "ml", "--no-probe", "--kubeconfig", str(kubeconfig),
                "-o", "json")
    doc = json.loads(r.stdout)
    f = next(f for f in doc["findings"] if f["id"] == "kueue.not_admitted")
    assert "does not serve Kueue's API: nothing will remove it" in f["title"]
    assert cluster.count("GET", r"/apis/kueue\.x-k8s\.io/.*") == 0  # only the group lookup
    # Kueue served, the pod's LocalQueue missing: Kueue's Inadmissible reason, as its docs show
    pod = _pending(cluster, "ml", "lost-0",
                   schedulingGates=[{"name": "kueue.x-k8s.io/admission"}])
    pod["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "user-queue"
    cluster.api_groups["kueue.x-k8s.io"] = ("v1beta2", ())
    cluster.lists[f"{KQ}/namespaces/ml/workloads"] = ("WorkloadList", [_workload(
        "ml", "pod-lost-0-9e8d7", "user-queue", pod["metadata"]["uid"], [
            {"type": "QuotaReserved", "status": "False", "reason": "Inadmissible",
             "message": "LocalQueue user-queue doesn't exist"}])])
    r = run_cli("pod", "lost-0", "-n", "ml", "--no-probe", "--kubeconfig", str(kubeconfig),
                "-o", "json")
    f = next(f for f in json.loads(r.stdout)["findings"] if f["id"] == "kueue.not_admitted")
    assert f["title"].startswith("Kueue has not admitted it: LocalQueue user-queue does not exist")


def test_volcano_queue_capability(cluster, kubeconfig):
    _gpu_nodes(cluster)
    pod = _pending(cluster, "ml", "mpi-worker-0", schedulerName="volcano")
    pod["metadata"]["annotations"] = {"scheduling.k8s.io/group-name": "mpi-job-pg"}
    cluster.api_groups["scheduling.volcano.sh"] = ("v1beta1", ())
    vb = "/apis/scheduling.volcano.sh/v1beta1"
    pg = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
          "metadata": {"name": "mpi-job-pg", "namespace": "ml", "uid": str(uuid.uuid4())},
          "spec": {"minMember": 2, "queue": "gpu-q", "minResources": {"nvidia.com/gpu": "8"}},
          "status": {"phase": "Pending"}}
    cluster.objects[f"{vb}/namespaces/ml/podgroups/mpi-job-pg"] = pg
    cluster.objects[f"{vb}/queues/gpu-q"] = {
        "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
        "metadata": {"name": "gpu-q"},
        "spec": {"weight": 1, "capability": {"nvidia.com/gpu": "8"}},
        "status": {"state": "Open", "allocated": {"nvidia.com/gpu": "8"}}}
    cluster.add_event({"metadata": {"name": "mpi-job-pg", "namespace": "ml",
                                    "uid": pg["metadata"]["uid"]}}, "Normal", "Unschedulable",
                      "queue resource quota insufficient: insufficient nvidia.com/gpu",
                      "volcano", NOW)
    cluster.events[-1]["involvedObject"]["kind"] = "PodGroup"
    r = run_cli("pod", "mpi-worker-0", "-n", "ml", "--no-probe", "--kubeconfig",
                str(kubeconfig), "-o", "json")
    f = next(f for f in json.loads(r.stdout)["findings"] if f["id"] == "volcano.podgroup_pending")
    assert f["title"].startswith(
        "Volcano has not enqueued PodGroup mpi-job-pg: queue gpu-q nvidia.com/gpu: capability 8, "
        "8 allocated, it needs 8 (queue resource quota insufficient)")
    assert f["evidence"]["events"] == [
        "queue resource quota insufficient: insufficient nvidia.com/gpu"]


def test_kai_scheduling_conditions(cluster, kubeconfig):
    _gpu_nodes(cluster)
    pod = _pending(cluster, "ml", "kai-job-0", schedulerName="kai-scheduler")
    pod["metadata"]["annotations"] = {"pod-group-name": "pg-kai-job"}
    cluster.api_groups["scheduling.run.ai"] = ("v2", ("v2alpha2",))
    cluster.objects["/apis/scheduling.run.ai/v2alpha2/namespaces/ml/podgroups/pg-kai-job"] = {
        "apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
        "metadata": {"name": "pg-kai-job", "namespace": "ml"},
        "spec": {"minMember": 1, "queue": "gpu-queue"},
        "status": {"schedulingConditions": [{
            "type": "UnschedulableOnNodePool", "nodePool": "default", "status": "True",
            "reasons": [{"reason": "OverLimit", "message": (
                "gpu-queue quota has reached the allowable limit of GPUs. Limit is 8 GPUs, "
                "currently 6 GPUs allocated and workload requested 4 GPUs")}]}]}}
    r = run_cli("pod", "kai-job-0", "-n", "ml", "--no-probe", "--kubeconfig", str(kubeconfig),
                "-o", "json")
    f = next(f for f in json.loads(r.stdout)["findings"]
             if f["id"] == "kai.podgroup_unschedulable")
    # KAI's own message is data: in evidence, not the title (audit round 5, MCP-01)
    assert f["title"].startswith("KAI cannot schedule PodGroup pg-kai-job (OverLimit)")
    assert f["evidence"]["scheduling_conditions"][0]["message"].startswith(
        "gpu-queue quota has reached the allowable limit of GPUs.")
    assert f["evidence"]["queue"] == "gpu-queue"


def test_hami_filter_reasons(cluster, kubeconfig):
    _gpu_nodes(cluster)
    pod = _pending(cluster, "ml", "vgpu-0", gpus=1, schedulerName="hami-scheduler")
    cluster.add_event(pod, "Warning", "FilteringFailed",
                      "2 nodes CardInsufficientMemory(gpu-1,gpu-2)", "hami-scheduler", NOW)
    r = run_cli("pod", "vgpu-0", "-n", "ml", "--no-probe", "--kubeconfig", str(kubeconfig),
                "-o", "json")
    f = next(f for f in json.loads(r.stdout)["findings"] if f["id"] == "hami.filter_failed")
    assert f["title"].startswith("the HAMi scheduler found no node with a GPU that fits: 2 "
                                 "node(s) CardInsufficientMemory (no GPU has enough free memory)")
    assert f["evidence"]["reasons"]["CardInsufficientMemory"]["named"] == ["gpu-1", "gpu-2"]


def test_a_pod_of_kube_scheduler_alone_reads_no_queue_objects(cluster, kubeconfig):
    """The healthy control: a Pending GPU pod with no gate and the default scheduler gets the
    fit only; no queue API is even looked up."""
    _gpu_nodes(cluster)
    _pending(cluster, "ml", "plain-0")
    r = run_cli("pod", "plain-0", "-n", "ml", "--no-probe", "--kubeconfig", str(kubeconfig),
                "-o", "json")
    doc = json.loads(r.stdout)
    ids = {f["id"] for f in doc["findings"]}
    assert not ids & {"kueue.not_admitted", "volcano.podgroup_pending",
                      "kai.podgroup_unschedulable", "hami.filter_failed"}
    assert cluster.count("GET", r"/apis/.*") == 0
    assert not [c for c in doc["checks"] if c["id"] in ("api.kueue", "api.volcano", "api.kai")]

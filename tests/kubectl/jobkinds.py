"""Multi-node jobs on the fake API server, their objects and pods as the real controllers
write them (the label keys are the controllers' own constants; the sources are cited per
builder). Shared by tests/kubectl/test_job.py and bench/job_scale.py.
"""
from __future__ import annotations

import uuid

from .fakecluster import FakeCluster

GPUS = 8


def _owner(api: str, kind: str, name: str, uid: str) -> dict:
    return {"apiVersion": api, "kind": kind, "name": name, "uid": uid, "controller": True,
            "blockOwnerDeletion": True}


def _pod(fc: FakeCluster, ns: str, name: str, node: str | None, labels: dict,
         owner: dict, annotations: dict | None = None, **kw) -> dict:
    if node is None:  # not scheduled (yet)
        kw = {**kw, "phase": "Pending"}
    p = fc.add_pod(ns, name, node, gpus=GPUS, **kw)
    p["metadata"]["labels"] = dict(labels)
    p["metadata"]["ownerReferences"] = [owner]
    if annotations:
        p["metadata"]["annotations"] = dict(annotations)
    p["spec"]["restartPolicy"] = "Never" if owner["kind"] in ("Job",) else "OnFailure"
    return p


def _obj(fc: FakeCluster, group: str, version: str, plural: str, kind: str, ns: str,
         name: str, spec: dict | None = None, status: dict | None = None,
         owner: dict | None = None, labels: dict | None = None) -> dict:
    md: dict = {"name": name, "namespace": ns, "uid": str(uuid.uuid4()),
                "creationTimestamp": "2026-11-28T20:00:00Z"}
    if owner:
        md["ownerReferences"] = [owner]
    if labels:
        md["labels"] = labels
    api = f"{group}/{version}" if group != "" else version
    return fc.add_custom(group, version, plural, {"apiVersion": api, "kind": kind,
                                                  "metadata": md, "spec": spec or {},
                                                  "status": status or {}})


def _h(n: int) -> str:
    return uuid.uuid4().hex[:5]


# -- one builder per kind: (fc, ns, name, nodes) -> the job object ----------------------------

def batch_job(fc: FakeCluster, ns: str, name: str, nodes: list[str], **kw) -> dict:
    """batch/v1 Indexed Job: pods named NAME-INDEX-xxxxx, labelled with job-name,
    controller-uid and (k8s >= 1.28) the completion index, also an annotation
    (kubernetes pkg/apis/batch/types.go: JobNameLabel, ControllerUidLabel,
    JobCompletionIndexAnnotation; pkg/controller/job/indexed_job_utils.go adds the index)."""
    fc.serve("batch", "v1", "jobs")
    job = _obj(fc, "batch", "v1", "jobs", "Job", ns, name,
               {"completionMode": "Indexed", "completions": len(nodes),
                "parallelism": len(nodes), "backoffLimit": 0})
    uid = job["metadata"]["uid"]
    job["spec"]["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    for i, node in enumerate(nodes):
        _pod(fc, ns, f"{name}-{i}-{_h(i)}", node,
             {"batch.kubernetes.io/controller-uid": uid, "batch.kubernetes.io/job-name": name,
              "controller-uid": uid, "job-name": name,
              "batch.kubernetes.io/job-completion-index": str(i)},
             _owner("batch/v1", "Job", name, uid),
             {"batch.kubernetes.io/job-completion-index": str(i)}, **kw)
    return job


def jobset(fc: FakeCluster, ns: str, name: str, nodes: list[str], **kw) -> dict:
    """JobSet: one child Job per replicatedJob replica (NAME-RJOB-INDEX), owning its pods;
    every pod carries jobset.sigs.k8s.io/jobset-name, replicatedjob-name, job-index
    (kubernetes-sigs/jobset api/jobset/v1alpha2/jobset_types.go)."""
    fc.serve("batch", "v1", "jobs")
    js = _obj(fc, "jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet", ns, name,
              {"replicatedJobs": [{"name": "workers", "replicas": len(nodes)}]})
    for i, node in enumerate(nodes):
        child = f"{name}-workers-{i}"
        j = _obj(fc, "batch", "v1", "jobs", "Job", ns, child, {"completions": 1},
                 owner=_owner("jobset.x-k8s.io/v1alpha2", "JobSet", name,
                              js["metadata"]["uid"]),
                 labels={"jobset.sigs.k8s.io/jobset-name": name})
        juid = j["metadata"]["uid"]
        _pod(fc, ns, f"{child}-0-{_h(i)}", node,
             {"jobset.sigs.k8s.io/jobset-name": name,
              "jobset.sigs.k8s.io/replicatedjob-name": "workers",
              "jobset.sigs.k8s.io/job-index": str(i),
              "jobset.sigs.k8s.io/job-key": uuid.uuid4().hex,
              "batch.kubernetes.io/job-name": child, "job-name": child,
              "batch.kubernetes.io/controller-uid": juid, "controller-uid": juid,
              "batch.kubernetes.io/job-completion-index": "0"},
             _owner("batch/v1", "Job", child, juid),
             {"jobset.sigs.k8s.io/jobset-name": name,
              "batch.kubernetes.io/job-completion-index": "0"}, **kw)
    return js


def pytorchjob(fc: FakeCluster, ns: str, name: str, nodes: list[str], **kw) -> dict:
    """Kubeflow PyTorchJob: NAME-master-0 and NAME-worker-I, owned by the PyTorchJob, labelled
    training.kubeflow.org/job-name, replica-type, replica-index, operator-name and job-role
    on the master (kubeflow/training-operator pkg/apis/kubeflow.org/v1/common_types.go)."""
    pj = _obj(fc, "kubeflow.org", "v1", "pytorchjobs", "PyTorchJob", ns, name,
              {"pytorchReplicaSpecs": {"Master": {"replicas": 1},
                                       "Worker": {"replicas": len(nodes) - 1}}})
    own = _owner("kubeflow.org/v1", "PyTorchJob", name, pj["metadata"]["uid"])
    for i, node in enumerate(nodes):
        rtype, idx = ("master", 0) if i == 0 else ("worker", i - 1)
        labels = {"training.kubeflow.org/job-name": name,
                  "training.kubeflow.org/operator-name": "pytorchjob-controller",
                  "training.kubeflow.org/replica-type": rtype,
                  "training.kubeflow.org/replica-index": str(idx)}
        if rtype == "master":
            labels["training.kubeflow.org/job-role"] = "master"
        _pod(fc, ns, f"{name}-{rtype}-{idx}", node, labels, own, **kw)
    return pj


def mpijob(fc: FakeCluster, ns: str, name: str, nodes: list[str], **kw) -> dict:
    """MPIJob v2beta1 (kubeflow/mpi-operator): the launcher is a batch Job NAME-launcher owned
    by the MPIJob; the workers NAME-worker-I are pods it owns; all labelled
    training.kubeflow.org/job-name and job-role (launcher|worker), workers with replica-index
    (pkg/controller/mpi_job_controller.go)."""
    fc.serve("batch", "v1", "jobs")
    mj = _obj(fc, "kubeflow.org", "v2beta1", "mpijobs", "MPIJob", ns, name,
              {"mpiReplicaSpecs": {"Launcher": {"replicas": 1},
                                   "Worker": {"replicas": len(nodes) - 1}}})
    own = _owner("kubeflow.org/v2beta1", "MPIJob", name, mj["metadata"]["uid"])
    launcher = _obj(fc, "batch", "v1", "jobs", "Job", ns, f"{name}-launcher", owner=own)
    luid = launcher["metadata"]["uid"]
    base = {"training.kubeflow.org/job-name": name,
            "training.kubeflow.org/operator-name": "mpi-operator"}
    for i, node in enumerate(nodes):
        if i == 0:
            _pod(fc, ns, f"{name}-launcher-{_h(i)}", node,
                 {**base, "training.kubeflow.org/job-role": "launcher",
                  "batch.kubernetes.io/job-name": f"{name}-launcher",
                  "batch.kubernetes.io/controller-uid": luid},
                 _owner("batch/v1", "Job", f"{name}-launcher", luid), **kw)
        else:
            _pod(fc, ns, f"{name}-worker-{i - 1}", node,
                 {**base, "training.kubeflow.org/job-role": "worker",
                  "training.kubeflow.org/replica-index": str(i - 1)}, own, **kw)
    return mj


def lws(fc: FakeCluster, ns: str, name: str, nodes: list[str], size: int = 4, **kw) -> dict:
    """LeaderWorkerSet: leader pods NAME-G from the StatefulSet NAME, workers NAME-G-W from the
    StatefulSet NAME-G (owned by the leader pod); labels leaderworkerset.sigs.k8s.io/name,
    group-index, worker-index (kubernetes-sigs/lws api/leaderworkerset/v1)."""
    obj = _obj(fc, "leaderworkerset.x-k8s.io", "v1", "leaderworkersets", "LeaderWorkerSet",
               ns, name, {"replicas": max(1, len(nodes) // size),
                          "leaderWorkerTemplate": {"size": size}})
    for i, node in enumerate(nodes):
        g, w = divmod(i, size)
        labels = {"leaderworkerset.sigs.k8s.io/name": name,
                  "leaderworkerset.sigs.k8s.io/group-index": str(g),
                  "leaderworkerset.sigs.k8s.io/worker-index": str(w),
                  "leaderworkerset.sigs.k8s.io/group-key": uuid.uuid4().hex}
        if w == 0:
            _pod(fc, ns, f"{name}-{g}", node, labels,
                 _owner("apps/v1", "StatefulSet", name, str(uuid.uuid4())), **kw)
        else:
            _pod(fc, ns, f"{name}-{g}-{w}", node, labels,
                 _owner("apps/v1", "StatefulSet", f"{name}-{g}", str(uuid.uuid4())), **kw)
    return obj


def raycluster(fc: FakeCluster, ns: str, name: str, nodes: list[str], owner=None,
               **kw) -> dict:
    """RayCluster: head NAME-head-xxxxx and workers NAME-gpu-group-worker-xxxxx, owned by the
    RayCluster, labelled ray.io/cluster, ray.io/node-type (head|worker), ray.io/group
    (ray-project/kuberay ray-operator/controllers/ray/utils/constant.go)."""
    rc = _obj(fc, "ray.io", "v1", "rayclusters", "RayCluster", ns, name,
              {"workerGroupSpecs": [{"groupName": "gpu-group", "replicas": len(nodes) - 1}]},
              owner=owner)
    own = _owner("ray.io/v1", "RayCluster", name, rc["metadata"]["uid"])
    for i, node in enumerate(nodes):
        head = i == 0
        _pod(fc, ns, f"{name}-head-{_h(i)}" if head else f"{name}-gpu-group-worker-{_h(i)}",
             node, {"ray.io/cluster": name, "ray.io/node-type": "head" if head else "worker",
                    "ray.io/group": "headgroup" if head else "gpu-group",
                    "ray.io/is-ray-node": "yes", "app.kubernetes.io/created-by":
                    "kuberay-operator"}, own, **kw)
    return rc


def rayjob(fc: FakeCluster, ns: str, name: str, nodes: list[str], **kw) -> dict:
    """RayJob: runs on the RayCluster it creates and names in status.rayClusterName."""
    cluster = f"{name}-raycluster-{_h(0)}"
    rj = _obj(fc, "ray.io", "v1", "rayjobs", "RayJob", ns, name,
              {"entrypoint": "python train.py"},
              {"rayClusterName": cluster, "jobDeploymentStatus": "Running"})
    raycluster(fc, ns, cluster, nodes,
               owner=_owner("ray.io/v1", "RayJob", name, rj["metadata"]["uid"]), **kw)
    return rj


def volcano_job(fc: FakeCluster, ns: str, name: str, nodes: list[str], **kw) -> dict:
    """Volcano Job: pods NAME-TASK-I owned by the Job, labelled volcano.sh/job-name,
    volcano.sh/job-namespace, volcano.sh/queue-name, volcano.sh/task-spec
    (volcano-sh/apis pkg/apis/batch/v1alpha1/labels.go)."""
    vj = _obj(fc, "batch.volcano.sh", "v1alpha1", "jobs", "Job", ns, name,
              {"minAvailable": len(nodes), "schedulerName": "volcano",
               "tasks": [{"name": "worker", "replicas": len(nodes)}]})
    own = _owner("batch.volcano.sh/v1alpha1", "Job", name, vj["metadata"]["uid"])
    for i, node in enumerate(nodes):
        _pod(fc, ns, f"{name}-worker-{i}", node,
             {"volcano.sh/job-name": name, "volcano.sh/job-namespace": ns,
              "volcano.sh/queue-name": "default", "volcano.sh/task-spec": "worker"},
             own, {"volcano.sh/job-name": name, "volcano.sh/task-spec": "worker",
                   "volcano.sh/task-index": str(i), "scheduling.k8s.io/group-name":
                   f"{name}-{vj['metadata']['uid']}"}, **kw)
    return vj


def kueue_workload(fc: FakeCluster, ns: str, name: str, nodes: list[str], **kw) -> dict:
    """A Kueue Workload: job-NAME-xxxxx, owned (controller) by the batch Job it admits
    (kubernetes-sigs/kueue pkg/controller/jobframework: GetWorkloadNameForOwnerWithGVK)."""
    job = batch_job(fc, ns, name, nodes, **kw)
    return _obj(fc, "kueue.x-k8s.io", "v1beta1", "workloads", "Workload", ns,
                f"job-{name}-{_h(0)}", {"queueName": "user-queue"},
                owner=_owner("batch/v1", "Job", name, job["metadata"]["uid"]),
                labels={"kueue.x-k8s.io/job-uid": job["metadata"]["uid"]})


BUILDERS = {"Job": batch_job, "JobSet": jobset, "PyTorchJob": pytorchjob, "MPIJob": mpijob,
            "LeaderWorkerSet": lws, "RayJob": rayjob, "RayCluster": raycluster,
            "vcjob": volcano_job, "Workload": kueue_workload}

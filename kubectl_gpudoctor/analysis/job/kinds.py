"""The kinds of multi-node jobs, and how each finds its pods.

Why: "the job" is whatever the user launched -- a batch/v1 Job, a JobSet, a Kubeflow
PyTorchJob, an MPIJob, a LeaderWorkerSet, a RayJob or RayCluster, a Volcano Job, a Kueue
Workload -- and each controller marks its pods with its own label (and owns them directly or
through an object of its own). The keys below are the controllers' own constants:

- batch/v1 Job: `batch.kubernetes.io/job-name`, index in `batch.kubernetes.io/job-completion-index`
  (kubernetes pkg/apis/batch/types.go, labelPrefix + "job-name" / "job-completion-index")
- JobSet: `jobset.sigs.k8s.io/jobset-name`, `jobset.sigs.k8s.io/replicatedjob-name`,
  `jobset.sigs.k8s.io/job-index` (kubernetes-sigs/jobset api/jobset/v1alpha2/jobset_types.go)
- Kubeflow training jobs (PyTorchJob, TFJob, ...) and MPIJob: `training.kubeflow.org/job-name`,
  `training.kubeflow.org/replica-type`, `training.kubeflow.org/replica-index`
  (kubeflow/training-operator pkg/apis/kubeflow.org/v1/common_types.go; mpi-operator v2beta1
  writes the same job-name key and `training.kubeflow.org/job-role`)
- LeaderWorkerSet: `leaderworkerset.sigs.k8s.io/name`, `.../group-index`, `.../worker-index`
  (kubernetes-sigs/lws api/leaderworkerset/v1/leaderworkerset_types.go)
- RayCluster: `ray.io/cluster`, `ray.io/node-type`, `ray.io/group` (ray-project/kuberay
  ray-operator/controllers/ray/utils/constant.go); a RayJob runs on the RayCluster named in
  its `status.rayClusterName`
- Volcano Job: `volcano.sh/job-name`, `volcano.sh/task-spec` (volcano-sh/apis
  pkg/apis/batch/v1alpha1/labels.go)
- Kueue Workload: the job that owns it (its controller ownerReference), or for a plain pod
  group the `kueue.x-k8s.io/pod-group-name` label (kubernetes-sigs/kueue pkg/controller/jobs/pod)

The kinds share label keys (every Kubeflow kind writes `training.kubeflow.org/job-name`), so a
pod whose controller is of the job's own kind must have the job's uid (`owned`).
"""
from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Mapping, Sequence

JOB_NAME = "batch.kubernetes.io/job-name"
JOB_INDEX = "batch.kubernetes.io/job-completion-index"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
JOBSET_RJOB = "jobset.sigs.k8s.io/replicatedjob-name"
JOBSET_INDEX = "jobset.sigs.k8s.io/job-index"
KF_NAME = "training.kubeflow.org/job-name"
KF_TYPE = "training.kubeflow.org/replica-type"
KF_INDEX = "training.kubeflow.org/replica-index"
KF_ROLE = "training.kubeflow.org/job-role"
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER = "leaderworkerset.sigs.k8s.io/worker-index"
RAY_CLUSTER = "ray.io/cluster"
RAY_TYPE = "ray.io/node-type"
RAY_GROUP = "ray.io/group"
VC_NAME = "volcano.sh/job-name"
VC_TASK = "volcano.sh/task-spec"
KUEUE_GROUP = "kueue.x-k8s.io/pod-group-name"


@dataclasses.dataclass(frozen=True)
class Kind:
    """One kind of job: where its objects are listed and how its pods are labelled.
    `versions`: tried in order (the first the cluster serves is used); `label`: the pod label
    whose value is the job's name; `rank`: label keys that together name a pod's rank;
    `names`: what `--kind` accepts besides the kind, its plural and `kind.group`."""

    kind: str
    group: str
    versions: tuple[str, ...]
    plural: str
    label: str | None
    rank: tuple[str, ...] = ()
    names: tuple[str, ...] = ()

    @property
    def qualified(self) -> str:
        return f"{self.plural}.{self.group}"

    def path(self, version: str, namespace: str, name: str | None = None) -> str:
        base = f"/apis/{self.group}/{version}/namespaces/{namespace}/{self.plural}"
        return base if name is None else f"{base}/{name}"

    def accepts(self, text: str) -> bool:
        t = text.strip().lower()
        return t in {self.kind.lower(), self.plural, f"{self.kind.lower()}.{self.group}",
                     self.qualified, *self.names}


_KF = (KF_TYPE, KF_INDEX)
KINDS: tuple[Kind, ...] = (
    Kind("Job", "batch", ("v1",), "jobs", JOB_NAME, (JOB_INDEX,), ("job", "jobs")),
    Kind("JobSet", "jobset.x-k8s.io", ("v1alpha2",), "jobsets", JOBSET_NAME,
         (JOBSET_RJOB, JOBSET_INDEX, JOB_INDEX)),
    Kind("PyTorchJob", "kubeflow.org", ("v1",), "pytorchjobs", KF_NAME, _KF),
    Kind("TFJob", "kubeflow.org", ("v1",), "tfjobs", KF_NAME, _KF),
    Kind("XGBoostJob", "kubeflow.org", ("v1",), "xgboostjobs", KF_NAME, _KF),
    Kind("PaddleJob", "kubeflow.org", ("v1",), "paddlejobs", KF_NAME, _KF),
    Kind("JAXJob", "kubeflow.org", ("v1",), "jaxjobs", KF_NAME, _KF),
    Kind("MPIJob", "kubeflow.org", ("v2beta1", "v1"), "mpijobs", KF_NAME,
         (KF_ROLE, KF_TYPE, KF_INDEX)),
    Kind("LeaderWorkerSet", "leaderworkerset.x-k8s.io", ("v1",), "leaderworkersets", LWS_NAME,
         (LWS_GROUP, LWS_WORKER), ("lws",)),
    Kind("RayJob", "ray.io", ("v1",), "rayjobs", None, (RAY_TYPE, RAY_GROUP)),
    Kind("RayCluster", "ray.io", ("v1",), "rayclusters", RAY_CLUSTER, (RAY_TYPE, RAY_GROUP)),
    Kind("Job", "batch.volcano.sh", ("v1alpha1",), "jobs", VC_NAME, (VC_TASK,),
         ("vcjob", "vj", "volcanojob")),
    Kind("Workload", "kueue.x-k8s.io", ("v1beta1", "v1beta2"), "workloads", None, (),
         ("wl",)),
)


def by_name(text: str) -> list[Kind]:
    """The kinds `--kind TEXT` names, in any case (`JobSet`, `jobsets`, `job.batch`). A bare
    `job` is batch/v1 Job, as kubectl resolves it; Volcano's is `vcjob` or `jobs.batch.volcano.sh`."""
    hits = [k for k in KINDS if k.accepts(text)]
    if len(hits) > 1 and text.strip().lower() in ("job", "jobs"):
        hits = [k for k in hits if k.group == "batch"]
    return hits


def kind_names() -> list[str]:
    """What --kind accepts, for its help and error lines."""
    return sorted({k.kind if k.group != "batch.volcano.sh" else "vcjob" for k in KINDS},
                  key=str.lower)


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    m = obj.get("metadata")
    return m if isinstance(m, Mapping) else {}


def label_of(obj: Mapping[str, Any], key: str) -> str | None:
    labels = _meta(obj).get("labels")
    v = labels.get(key) if isinstance(labels, Mapping) else None
    return v if isinstance(v, str) else None


def annotation_of(obj: Mapping[str, Any], key: str) -> str | None:
    ann = _meta(obj).get("annotations")
    v = ann.get(key) if isinstance(ann, Mapping) else None
    return v if isinstance(v, str) else None


def controller_ref(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    refs = _meta(obj).get("ownerReferences")
    for r in refs if isinstance(refs, list) else ():
        if isinstance(r, Mapping) and r.get("controller") is True:
            return r
    return None


@dataclasses.dataclass(frozen=True)
class PodQuery:
    """How to list the job's pods: one label selector in its namespace, and the uid a pod
    controlled by an object of the job's own kind must carry (None: any owner)."""

    selector: str
    owner_kind: str | None = None
    owner_uid: str | None = None


def pod_query(kind: Kind, obj: Mapping[str, Any]) -> PodQuery | None:
    """The pods of `obj` (a job of `kind`). None when the object does not say yet (a RayJob
    with no cluster, a Workload whose owner is not a known kind)."""
    name = _meta(obj).get("name")
    uid = _meta(obj).get("uid")
    if not isinstance(name, str):
        return None
    if kind.kind == "RayJob":
        status = obj.get("status") if isinstance(obj.get("status"), Mapping) else {}
        cluster = status.get("rayClusterName")
        if not isinstance(cluster, str) or not cluster:
            return None
        return PodQuery(f"{RAY_CLUSTER}={cluster}")
    if kind.kind == "Workload":
        ref = controller_ref(obj)
        if ref is None:  # a plain pod group: its pods carry the group's name
            group = label_of(obj, KUEUE_GROUP) or name
            return PodQuery(f"{KUEUE_GROUP}={group}")
        return None  # resolved through the owner (owner_of)
    if kind.label is None:
        return None
    return PodQuery(f"{kind.label}={name}", kind.kind,
                    uid if isinstance(uid, str) else None)


def owner_of(workload: Mapping[str, Any]) -> tuple[Kind, str] | None:
    """A Kueue Workload's job: (kind, name) of its controller ownerReference, if a known kind."""
    ref = controller_ref(workload)
    if ref is None:
        return None
    api = str(ref.get("apiVersion") or "")
    group = api.split("/", 1)[0] if "/" in api else ""
    for k in KINDS:
        if k.kind == ref.get("kind") and k.group == group and k.kind != "Workload":
            name = ref.get("name")
            return (k, name) if isinstance(name, str) else None
    return None


def owned(pods: Sequence[Mapping[str, Any]], q: PodQuery) -> list[Mapping[str, Any]]:
    """The pods of the selector that belong to the job: a pod whose controller is of the
    job's kind must be the job's, and one controlled by another kind that writes the same
    label (a TFJob beside a PyTorchJob of one name) is not the job's. Pods controlled by
    the job's own children (a JobSet's Jobs, an MPIJob's launcher Job, a LeaderWorkerSet's
    StatefulSets) stay."""
    if q.owner_uid is None:
        return list(pods)
    key = q.selector.split("=", 1)[0]
    rivals = {k.kind for k in KINDS if k.label == key and k.kind != q.owner_kind}
    out = []
    for p in pods:
        ref = controller_ref(p)
        kind = ref.get("kind") if ref is not None else None
        if kind == q.owner_kind and ref.get("uid") != q.owner_uid:
            continue
        if kind in rivals:
            continue
        out.append(p)
    return out


def rank_of(kind: Kind | None, pod: Mapping[str, Any]) -> str:
    """A pod's rank in words, from its kind's labels (the completion index can be an
    annotation only); the pod's name when the kind names none."""
    parts = []
    for key in kind.rank if kind else ():
        v = label_of(pod, key) or annotation_of(pod, key)
        if v:
            parts.append(v)
    if kind is None:
        for key in (JOB_INDEX, KF_INDEX, LWS_GROUP):
            v = label_of(pod, key) or annotation_of(pod, key)
            if v:
                parts.append(v)
    return "/".join(parts) or str(_meta(pod).get("name") or "?")


def suggestions(name: str, found: Mapping[str, Sequence[str]], limit: int = 3) -> list[str]:
    """`did you mean` candidates: names of jobs of every listed kind close to `name`
    (found: kind label -> names in the namespace)."""
    pool = {n: k for k, names in found.items() for n in names}
    close = difflib.get_close_matches(name, list(pool), n=limit, cutoff=0.6)
    if not close:  # a prefix (the user typed the start of a generated name)
        close = sorted(n for n in pool if n.startswith(name) or name.startswith(n))[:limit]
    return [f"{pool[n]}/{n}" for n in close]

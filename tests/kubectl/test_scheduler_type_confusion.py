"""The queueing systems' and schedulers' objects of the wrong JSON types are a cluster answer,
never an internal error (security audit round 5, SC-01: 56 of 423 `pod Y` runs over Kueue
objects with a field set to [], 1e308 or a string ended in exit 70 with AttributeError or
TypeError, e.g. ClusterQueue `status.flavorsReservation[0].resources[0]`, the Workload's
`metadata.name`, another Workload's `status.admission.podSetAssignments[0].resourceUsage`).

The suite's one walker (test_api_type_confusion._paths: every field and list item of a JSON
document) goes over every object the client reads for a Pending pod that a queueing system or
scheduler holds -- Kueue's Workloads, LocalQueue and ClusterQueue, Volcano's PodGroup, Queue and
the PodGroup's event, KAI's PodGroup, HAMi's FilteringFailed event -- as test_schedulers.py
shapes them from each project's own types. Each field is set in turn to a value of another JSON
type and to 1e308, and `pod Y` runs in-process: it must end in its report or in one of the
tool's own errors, never in another exception.
"""
from __future__ import annotations

import copy
import io
import uuid
from typing import Any, Callable

import pytest

from kubectl_gpudoctor import errors
from kubectl_gpudoctor.api.kube import Kube
from kubectl_gpudoctor.commands import node as node_cmd
from kubectl_gpudoctor.reach import probe_run
from kubectl_gpudoctor.report.output import Output

from . import test_schedulers as T
from .fakecluster import ts
from .test_api_type_confusion import _other, _paths

NS = "ml"


def _run(kube: Kube, pod: str) -> int:
    out = Output("json", "warning", {"kind": "pod", "name": f"{NS}/{pod}"},
                 out=io.StringIO(), err=io.StringIO(), progress=False)
    settings = probe_run.Settings(namespace=NS, timeout_s=5, trace_s=0, probe=False,
                                  agent=False, kubelet_timeout_s=2)
    error = None
    try:
        node_cmd.diagnose_pod(kube, NS, pod, settings, out)
    except errors.GpuDoctorError as exc:   # the tool's own: one line and its exit code
        error = exc
    code = int(out.exit_status(error.exit_status if error else None))
    out.finish(code, error=None if error is None else {"type": type(error).__name__,
                                                         "message": str(error)})
    return code


def _kueue(fc) -> tuple[str, dict[str, tuple[Any, Callable[[Any], None]]]]:
    T._gpu_nodes(fc)
    pod = T._pending(fc, NS, "trainer-0", schedulingGates=[{"name": "kueue.x-k8s.io/admission"}])
    pod["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "user-queue"
    T._kueue(fc)
    a_conds, a_adm = T._reserved("gpu-cq", "4")
    mine = T._workload(NS, "pod-trainer-0-5f3c1", "user-queue", pod["metadata"]["uid"], [
        {"type": "QuotaReserved", "status": "False", "reason": "Pending",
         "message": "insufficient unused quota for nvidia.com/gpu in flavor default-flavor, "
                    "4 more needed", "lastTransitionTime": ts(T.NOW)}], a_adm)
    holder = T._workload("team-a", "job-train-a-1a2b3", "user-queue", str(uuid.uuid4()),
                         a_conds, a_adm, {"kind": "Job", "name": "train-a", "controller": True,
                                          "uid": "x"})
    cq, lq = f"{T.KQ}/clusterqueues/gpu-cq", f"{T.KQ}/namespaces/{NS}/localqueues/user-queue"
    state = {"mine": mine, "holder": holder}

    def lists() -> None:
        fc.lists[f"{T.KQ}/namespaces/{NS}/workloads"] = ("WorkloadList", [state["mine"]])
        fc.lists[f"{T.KQ}/workloads"] = ("WorkloadList", [state["mine"], state["holder"]])

    def put(key):
        def set_(doc):
            state[key] = doc
            lists()
        return set_
    lists()
    return "trainer-0", {
        "own Workload": (mine, put("mine")),
        "another queue's Workload": (holder, put("holder")),
        "ClusterQueue": (fc.objects[cq], lambda d: fc.objects.__setitem__(cq, d)),
        "LocalQueue": (fc.objects[lq], lambda d: fc.objects.__setitem__(lq, d)),
    }


def _volcano(fc):
    T._gpu_nodes(fc)
    pod = T._pending(fc, NS, "mpi-worker-0", schedulerName="volcano")
    pod["metadata"]["annotations"] = {"scheduling.k8s.io/group-name": "mpi-job-pg"}
    fc.api_groups["scheduling.volcano.sh"] = ("v1beta1", ())
    vb = "/apis/scheduling.volcano.sh/v1beta1"
    pgp, qp = f"{vb}/namespaces/{NS}/podgroups/mpi-job-pg", f"{vb}/queues/gpu-q"
    fc.objects[pgp] = {
        "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
        "metadata": {"name": "mpi-job-pg", "namespace": NS, "uid": str(uuid.uuid4())},
        "spec": {"minMember": 2, "queue": "gpu-q", "minResources": {"nvidia.com/gpu": "8"}},
        "status": {"phase": "Pending"}}
    fc.objects[qp] = {
        "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
        "metadata": {"name": "gpu-q"},
        "spec": {"weight": 1, "capability": {"nvidia.com/gpu": "8"}},
        "status": {"state": "Open", "allocated": {"nvidia.com/gpu": "8"}}}
    return "mpi-worker-0", {
        "Volcano PodGroup": (fc.objects[pgp], lambda d: fc.objects.__setitem__(pgp, d)),
        "Volcano Queue": (fc.objects[qp], lambda d: fc.objects.__setitem__(qp, d)),
    }


def _kai(fc):
    T._gpu_nodes(fc)
    pod = T._pending(fc, NS, "kai-job-0", schedulerName="kai-scheduler")
    pod["metadata"]["annotations"] = {"pod-group-name": "pg-kai-job"}
    fc.api_groups["scheduling.run.ai"] = ("v2", ("v2alpha2",))
    p = f"/apis/scheduling.run.ai/v2alpha2/namespaces/{NS}/podgroups/pg-kai-job"
    fc.objects[p] = {
        "apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
        "metadata": {"name": "pg-kai-job", "namespace": NS},
        "spec": {"minMember": 1, "queue": "gpu-queue"},
        "status": {"schedulingConditions": [{
            "type": "UnschedulableOnNodePool", "nodePool": "default", "status": "True",
            "reasons": [{"reason": "OverLimit", "message": (
                "gpu-queue quota has reached the allowable limit of GPUs. Limit is 8 GPUs, "
                "currently 6 GPUs allocated and workload requested 4 GPUs")}]}]}}
    return "kai-job-0", {"KAI PodGroup": (fc.objects[p], lambda d: fc.objects.__setitem__(p, d))}


def _hami(fc):
    T._gpu_nodes(fc)
    pod = T._pending(fc, NS, "vgpu-0", gpus=1, schedulerName="hami-scheduler")
    fc.add_event(pod, "Warning", "FilteringFailed",
                 "2 nodes CardInsufficientMemory(gpu-1,gpu-2)", "hami-scheduler", T.NOW)
    i = len(fc.events) - 1

    def put(d):
        fc.events[i] = d
    return "vgpu-0", {"HAMi FilteringFailed event": (fc.events[i], put)}


@pytest.mark.parametrize("system", [_kueue, _volcano, _kai, _hami],
                         ids=["kueue", "volcano", "kai", "hami"])
def test_every_field_of_a_scheduler_object_of_another_type_never_crashes(cluster, kubeconfig,
                                                                         system):
    pod, objects = system(cluster)
    kube = Kube(str(kubeconfig))
    assert _run(kube, pod) == 1   # the unmutated objects give their finding
    crashed, runs = [], 0
    for what, (doc, put) in objects.items():
        base = copy.deepcopy(doc)
        for path in _paths(base, max_items=2):
            for value in (None, 1e308):
                mutated = copy.deepcopy(base)
                cur = mutated
                for k in path[:-1]:
                    cur = cur[k]
                cur[path[-1]] = _other(cur[path[-1]]) if value is None else value
                put(mutated)
                runs += 1
                try:
                    _run(kube, pod)
                except Exception as exc:  # noqa: BLE001 - what the test is looking for
                    crashed.append(f"{what} {'.'.join(map(str, path))}="
                                   f"{'other' if value is None else value}: "
                                   f"{type(exc).__name__}: {exc}"[:240])
        put(base)
    assert runs > 20
    assert crashed == [], f"{len(crashed)} of {runs} runs crashed:\n" + "\n".join(crashed)

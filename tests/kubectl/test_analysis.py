"""API-side analyses over raw API dicts (built by the same fake the CLI tests serve)."""
from __future__ import annotations

import datetime as dt

from kubectl_gpudoctor.analysis.stuck import admission, goroutines
from kubectl_gpudoctor.analysis.resources import capacity, kubelet_config
from kubectl_gpudoctor.analysis import node_objects
from kubectl_gpudoctor.analysis.failing import pod_status
from kubectl_gpudoctor.analysis.common import events_by_uid, parse_time

from .fakecluster import FakeCluster
from .kubelet_dump import (HEALTHZ_SYNCLOOP_FAILED, healthy_kubelet_dump,
                           wedged_kubelet_dump)

NOW = dt.datetime(2025, 7, 30, 20, 50, tzinfo=dt.timezone.utc)


def wedged_cluster(lease_age_s=5.0, ready=True) -> FakeCluster:
    fc = FakeCluster()
    fc.add_node("gpu-1", now=NOW, lease_age_s=lease_age_s, ready=ready)
    fc.add_pod("ml", "train-0", "gpu-1", gpus=1, age_s=86400, now=NOW)  # healthy running
    for i, gpus in enumerate((1, 1, 0)):  # a non-GPU pod is stuck too (seed 000)
        fc.add_pod("mck-test", f"neal-0729-{i}", "gpu-1", phase="Pending", gpus=gpus,
                   age_s=600, now=NOW, events="scheduled-only")
    return fc


def pods_of(fc, node="gpu-1"):
    return [p for p in fc.pods.values() if p["spec"].get("nodeName") == node]


def test_three_pods_untouched_for_10_minutes_is_admission_stalled():
    fc = wedged_cluster()
    fs = admission.analyze_node(fc.nodes["gpu-1"], pods_of(fc), fc.events, fc.leases["gpu-1"],
                                NOW)
    assert [f.id for f in fs] == ["kubelet.admission_stalled"]
    f = fs[0]
    assert f.severity.value == "critical"
    assert f.evidence["pending_untouched"] == 3
    assert f.evidence["oldest_wait_s"] == 600
    assert f.evidence["non_gpu_pods_affected"] == 1
    assert f.evidence["lease_renewing"] is True and f.evidence["node_ready"] is True
    assert "kubernetes/kubernetes/issues/117435" in " ".join(f.refs)


def test_below_threshold_or_with_kubelet_event_is_not_stalled():
    fc = wedged_cluster()
    assert admission.analyze_node(fc.nodes["gpu-1"], pods_of(fc), fc.events,
                                  fc.leases["gpu-1"], NOW, threshold_s=900) == []
    for p in pods_of(fc):  # the kubelet got to them: a Pulling event each
        fc.add_event(p, "Normal", "Pulling", "Pulling image", "kubelet", NOW)
    assert admission.analyze_node(fc.nodes["gpu-1"], pods_of(fc), fc.events,
                                  fc.leases["gpu-1"], NOW) == []


def test_terminating_past_deadline_counts():
    fc = FakeCluster()
    fc.add_node("gpu-1", now=NOW)
    fc.add_pod("a", "old-0", "gpu-1", gpus=1, now=NOW, deletion_overdue_s=900)
    fc.add_pod("a", "fresh-0", "gpu-1", gpus=1, now=NOW, deletion_overdue_s=10)
    fs = admission.analyze_node(fc.nodes["gpu-1"], pods_of(fc), fc.events, fc.leases["gpu-1"],
                                NOW)
    assert len(fs) == 1 and fs[0].evidence["terminating_overdue"] == 1
    assert fs[0].evidence["pods"][0]["pod"] == "a/old-0"


def test_stale_lease_means_kubelet_down_not_admission():
    fc = wedged_cluster(lease_age_s=600, ready=False)
    fs = admission.analyze_node(fc.nodes["gpu-1"], pods_of(fc), fc.events, fc.leases["gpu-1"],
                                NOW)
    assert fs[0].severity.value == "warning" and "NotReady" in fs[0].title


def test_goroutine_dump_two_waits_in_get_preferred_allocation():
    dump = wedged_kubelet_dump(stuck=2, minutes=11)
    parsed = goroutines.parse_dump(dump)
    assert len(parsed) == 8
    waits = goroutines.device_plugin_waits(parsed)
    assert [g.wait_minutes for g in waits] == [11, 10]
    fs = goroutines.analyze("gpu-1", dump, goroutines.parse_healthz(HEALTHZ_SYNCLOOP_FAILED))
    f = fs[0]
    assert f.id == "kubelet.blocked_in_device_plugin" and f.severity.value == "critical"
    assert f.evidence["goroutines"] == 2
    assert f.evidence["longest_wait_min"] == 11
    assert f.evidence["calls"] == {"GetPreferredAllocation": 2}
    assert f.evidence["in_sync_loop"] == 1
    assert f.evidence["healthz_failed"] == ["syncloop"]


def test_healthy_dump_has_no_finding_and_unavailable_names_permission():
    assert goroutines.analyze("gpu-1", healthy_kubelet_dump()) == []
    f = goroutines.unavailable("gpu-1", 403, "forbidden")
    assert f.severity.value == "info" and "nodes/proxy" in f.remediation
    assert f.evidence["needs"] == "get nodes/proxy"


def test_capacity_mismatch():
    fc = FakeCluster()
    fc.add_node("a", gpus=8, allocatable_gpus=6)
    fc.add_node("b", gpus=8)
    fc.add_node("c", gpus=0, labels={"nvidia.com/gpu.count": "8"})
    fa, fb, fcc = (capacity.analyze_node(fc.nodes[n]) for n in "abc")
    assert fa[0].severity.value == "warning" and fa[0].evidence["resources"] == {
        "nvidia.com/gpu": {"capacity": 8, "allocatable": 6}}
    assert fb == []
    assert fcc[0].severity.value == "critical"
    assert capacity.is_gpu_node(fc.nodes["c"]) and not capacity.is_gpu_node(
        FakeCluster().add_node("cpu", gpus=0))


def test_pod_status_explanations():
    fc = wedged_cluster()
    p = fc.pods[("mck-test", "neal-0729-0")]
    evs = events_by_uid(fc.events)[p["metadata"]["uid"]]
    f = pod_status.analyze_pod(p, evs, NOW)[0]
    assert f.id == "pod.pending_explained" and f.severity.value == "critical"
    assert f.evidence["caused_by"] == "kubelet.admission_stalled"

    failed = fc.add_pod("x", "adm", "gpu-1", phase="Failed", gpus=1, now=NOW, extra_status={
        "reason": "UnexpectedAdmissionError",
        "message": "Pod was rejected: Allocate failed due to device number not matched, "
                   "which is unexpected"})
    f = pod_status.analyze_pod(failed, [], NOW)[0]
    assert f.id == "pod.admission_error" and "HAMi" in f.remediation

    pull = fc.add_pod("x", "pull", "gpu-1", phase="Pending", now=NOW, extra_status={
        "containerStatuses": [{"name": "main", "state": {"waiting": {
            "reason": "ImagePullBackOff", "message": "Back-off pulling image"}}}]})
    f = pod_status.analyze_pod(pull, [], NOW)[0]
    assert f.severity.value == "warning" and "ImagePullBackOff" in f.title

    unsched = fc.add_pod("x", "unsched", None, phase="Pending", gpus=1, now=NOW)
    fc.add_event(unsched, "Warning", "FailedScheduling",
                 "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.", "default-scheduler",
                 NOW)
    f = pod_status.analyze_pod(unsched, fc.events[-1:], NOW)[0]
    # the scheduler's words are quoted from its event, never the title (audit 5, MCP-01)
    assert "Insufficient" not in f.title and f.quoted[0]["source"].startswith(
        "event FailedScheduling on pod/x/unsched")
    assert "Insufficient nvidia.com/gpu" in f.quoted[0]["text"]


def test_kubelet_config_and_aggregate():
    cfg = kubelet_config.extract({"kubeletconfig": {"cpuManagerPolicy": "static",
                                                    "cgroupDriver": "systemd"}})
    f = kubelet_config.analyze("gpu-1", cfg)[0]
    assert f.id == "kubelet.config" and f.evidence["cpuManagerPolicy"] == "static"
    assert f.evidence["memory_reserved_for_system"] is False
    fc = wedged_cluster()
    fs, errs = node_objects(fc.nodes["gpu-1"], pods_of(fc), fc.events, fc.leases["gpu-1"],
                            NOW, kubelet_cfg=cfg)
    assert "kubelet.admission_stalled" in {x.id for x in fs}
    assert not [e for e in errs if "failed" in e], errs


def test_parse_time_variants():
    assert parse_time("2025-07-30T20:39:03Z").minute == 39
    assert parse_time("2025-07-30T20:39:03.123456789Z").microsecond == 123456
    assert parse_time("garbage") is None and parse_time(None) is None


def test_goroutine_header_variants():
    dump = ("goroutine 7 gp=0xc000007c00 m=nil [select, 42 minutes, locked to thread]:\n"
            "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager.(*ManagerImpl).Allocate(0x1)\n"
            "\t/src/manager.go:370 +0x1b0\n\n"
            "goroutine 8 [running]:\nmain.main()\n\t/x.go:1\n")
    gs = goroutines.parse_dump(dump)
    assert [(g.id, g.state, g.wait_minutes) for g in gs] == [(7, "select", 42), (8, "running", None)]
    f = goroutines.analyze("n", dump)[0]
    assert f.evidence["calls"] == {"Allocate": 1} and f.severity.value == "critical"


def test_unavailable_dump_still_carries_syncloop_health():
    f = goroutines.unavailable("n", 404, "404 page not found",
                               goroutines.parse_healthz(HEALTHZ_SYNCLOOP_FAILED))
    assert f.evidence["healthz_failed"] == ["syncloop"] and "syncloop failed" in f.title


def test_goroutine_dump_with_hostile_numbers_does_not_raise():
    dump = ("goroutine " + "9" * 5000 + " [select, 3 minutes]:\nfoo()\n"
            "goroutine 7 [select, " + "9" * 5000 + " minutes]:\nbar()\n"
            "goroutine \u0667 [select]:\nbaz()\n")
    gs = goroutines.parse_dump(dump)
    assert [(g.id, g.wait_minutes) for g in gs] == [(7, None)]

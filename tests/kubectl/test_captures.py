"""Parsers and verdicts against what a real 1.35 kubelet and API server returned (issue 13).

The inputs are the captures in tests/data/captures/k8s-1.35 (healthy, 20 s and 3 min into a wedge of the
unmodified NVIDIA device plugin in nvmlInit): goroutine dumps, /healthz?verbose, /configz,
the node, its pods, events and Lease. Each stage is judged at its own capture time (the
Lease's renewTime).
"""
from __future__ import annotations

import copy
import json

import pytest

from kubectl_gpudoctor.analysis.stuck import admission, goroutines, wedge
from kubectl_gpudoctor.analysis.resources import capacity, kubelet_config
from kubectl_gpudoctor.analysis import node_objects, subjects
from kubectl_gpudoctor.analysis.failing import pod_status
from kubectl_gpudoctor.analysis.common import events_by_uid, parse_time

from .conftest import REPO

CAPTURES = REPO / "tests" / "data" / "captures" / "k8s-1.35"
STAGES = ("healthy", "wedged-20s", "wedged-3m")
NODE = "127.0.0.1"
GFD_570_158 = {"nvidia.com/cuda.driver.major": "570", "nvidia.com/cuda.driver.minor": "158",
               "nvidia.com/cuda.driver.rev": "01", "nvidia.com/mig.strategy": "mixed",
               "nvidia.com/mig.capable": "true",
               "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


def text(name: str) -> str:
    return (CAPTURES / name).read_text()


def doc(name: str):
    return json.loads(text(name))


class Stage:
    def __init__(self, stage: str) -> None:
        self.name = stage
        self.node = doc(f"{stage}-node.json")
        self.pods = doc(f"{stage}-pods.json")["items"]
        self.events = doc(f"{stage}-events.json")["items"]
        self.lease = doc(f"{stage}-lease.json")
        self.dump = text(f"{stage}-goroutines.txt")
        self.healthz = text(f"{stage}-healthz-verbose.txt")
        self.now = parse_time(self.lease["spec"]["renewTime"])

    def pod(self, name: str) -> dict:
        return next(p for p in self.pods if p["metadata"]["name"] == name)

    def api_findings(self):
        fs, errs = node_objects(self.node, self.pods, self.events, self.lease, self.now)
        assert errs == []
        fs += goroutines.analyze(NODE, self.dump, goroutines.parse_healthz(self.healthz),
                                 pods=self.pods, now=self.now)
        return fs


@pytest.fixture(params=STAGES)
def stage(request) -> Stage:
    return Stage(request.param)


# -- parsers -----------------------------------------------------------------------------------

def test_goroutine_dumps_parse_completely():
    for stage, total in (("healthy", 173), ("wedged-20s", 164), ("wedged-3m", 165)):
        dump = text(f"{stage}-goroutines.txt")
        gs = goroutines.parse_dump(dump)
        assert len(gs) == total == dump.count("\ngoroutine ") + dump.startswith("goroutine ")
        assert all(g.frames for g in gs), stage
    sync = [g for g in goroutines.parse_dump(text("healthy-goroutines.txt"))
            if g.has(goroutines.SYNC_LOOP_FRAMES)]
    # the healthy sync loop idles in its select, outside any device plugin call
    assert [g.id for g in sync] == [233]
    assert goroutines.device_plugin_waits(sync) == []


def test_the_wedged_sync_loop_is_found_in_the_real_dumps():
    w20 = goroutines.device_plugin_waits(goroutines.parse_dump(text("wedged-20s-goroutines.txt")))
    w3m = goroutines.device_plugin_waits(goroutines.parse_dump(text("wedged-3m-goroutines.txt")))
    assert [(g.id, g.state, g.wait_minutes) for g in w20] == [(233, "select", None)]
    assert [(g.id, g.state, g.wait_minutes) for g in w3m] == [(233, "select", 3)]
    for g in w20 + w3m:
        assert g.call == "GetPreferredAllocation" and g.has(goroutines.SYNC_LOOP_FRAMES)
        names = [goroutines.func_name(f) for f in g.frames]
        assert ("k8s.io/kubernetes/pkg/kubelet/cm/devicemanager.(*ManagerImpl)."
                "callGetPreferredAllocationIfAvailable") in names
        assert "k8s.io/kubernetes/pkg/kubelet.(*Kubelet).HandlePodAdditions" in names


def test_healthz_verbose_of_a_real_kubelet(stage):
    h = goroutines.parse_healthz(stage.healthz)
    # even 3 minutes into the wedge the kubelet reports its sync loop ok
    assert h == {"ok": ["ping", "log", "syncloop", "device-plugin"], "failed": [],
                 "passed": True}
    failed = goroutines.parse_healthz(stage.healthz.replace(
        "[+]syncloop ok", "[-]syncloop failed: reason withheld").replace(
        "healthz check passed", "healthz check failed"))
    assert failed["failed"] == ["syncloop"] and failed["passed"] is False


def test_configz_of_a_real_kubelet():
    cfg = kubelet_config.extract(doc("configz.json"))
    assert cfg["cgroupDriver"] == "cgroupfs" and cfg["cpuManagerPolicy"] == "none"
    [f] = kubelet_config.analyze(NODE, cfg)
    assert f.id == "kubelet.config" and f.severity.value == "info"
    assert "cpuManagerPolicy=none" in f.title and "cgroupDriver=cgroupfs" in f.title


def test_pods_of_a_real_api_server():
    healthy = Stage("healthy")
    assert admission.untouched_pending(healthy.pod("gdscn-gpu"), (), healthy.now) is None
    w20, w3m = Stage("wedged-20s"), Stage("wedged-3m")
    idx = events_by_uid(w20.events)
    waits = {p["metadata"]["name"]: admission.untouched_pending(
        p, idx.get(p["metadata"]["uid"], ()), w20.now) for p in w20.pods}
    assert waits == {"gdscn-gpu": pytest.approx(22.1, abs=0.5),
                     "gdscn-plain": pytest.approx(19.4, abs=0.5)}
    gpu = w3m.pod("gdscn-gpu")
    evs = events_by_uid(w3m.events)[gpu["metadata"]["uid"]]
    assert [e["reason"] for e in evs] == ["Scheduled"]
    [f] = pod_status.analyze_pod(gpu, evs, w3m.now)
    assert f.id == "pod.pending_explained" and f.severity.value == "critical"
    assert f.evidence["gpu"] == {"nvidia.com/gpu": "1"}
    [f] = pod_status.analyze_pod(w20.pod("gdscn-gpu"), evs, w20.now)
    assert f.severity.value == "info" and f.evidence["waiting_s"] == 22
    assert pod_status.analyze_pod(healthy.pod("gdscn-gpu"), [], healthy.now) == []


# -- verdicts ----------------------------------------------------------------------------------

def test_healthy_capture_is_quiet():
    s = Stage("healthy")
    fs = s.api_findings()
    assert [f for f in fs if f.severity.value in ("critical", "warning")] == []
    assert wedge.decide(NODE, fs, s.pods).create_pod is True


def test_wedged_20s_blocked_sync_loop_is_critical_before_the_stall_threshold():
    s = Stage("wedged-20s")
    fs = s.api_findings()
    assert "kubelet.admission_stalled" not in {f.id for f in fs}  # nobody waited 120 s yet
    [f] = [f for f in fs if f.id == "kubelet.blocked_in_device_plugin"]
    assert f.severity.value == "critical"
    assert f.evidence["in_sync_loop"] == 1 and f.evidence["longest_wait_min"] == 0
    assert f.evidence["resource"] == ["nvidia.com/gpu"]
    assert f.evidence["admitting_pod"] == "default/gdscn-gpu"
    assert [p["pod"] for p in f.evidence["pods_waiting"]] == ["default/gdscn-gpu",
                                                              "default/gdscn-plain"]
    assert "for nvidia.com/gpu (admitting pod default/gdscn-gpu" in f.title
    # without the pod list the dump alone still says critical
    [f] = goroutines.analyze(NODE, s.dump)
    assert f.severity.value == "critical"


def test_sync_loop_caught_mid_call_with_nobody_waiting_is_not_critical():
    s = Stage("wedged-20s")
    young = s.now.replace(second=1)  # 07:22:01: the GPU pod has waited about 1 s
    [f] = goroutines.analyze(NODE, s.dump, pods=s.pods, now=young)
    assert f.severity.value == "warning"
    assert wedge.decide(NODE, [f], s.pods).create_pod is True


def test_wedged_3m_is_stalled_and_blocked():
    s = Stage("wedged-3m")
    fs = s.api_findings()
    by = {f.id: f for f in fs}
    st = by["kubelet.admission_stalled"]
    assert st.severity.value == "critical" and st.evidence["pending_untouched"] == 2
    assert st.evidence["non_gpu_pods_affected"] == 1 and st.evidence["lease_renewing"] is True
    b = by["kubelet.blocked_in_device_plugin"]
    assert b.severity.value == "critical" and b.evidence["longest_wait_min"] == 3
    assert "the longest for 3m" in b.title


@pytest.mark.parametrize("stage_name", ["wedged-20s", "wedged-3m"])
def test_known_wedge_decides_against_the_debug_pod(stage_name):
    s = Stage(stage_name)
    fs = s.api_findings()
    d = wedge.decide(NODE, fs, s.pods)
    assert d.create_pod is False and d.blocked is True
    assert "kubelet.blocked_in_device_plugin" in d.caused_by
    assert any(w.startswith(f"ssh {NODE} ") for w in d.ways_in)
    forced = wedge.decide(NODE, fs, s.pods, force=True)
    assert forced.create_pod is True and forced.forced
    with_agent = wedge.decide(NODE, fs, s.pods, agent="gpu-doctor/gpu-doctor-agent-x1")
    assert with_agent.ways_in[0].startswith("the standing agent gpu-doctor/gpu-doctor-agent-x1")
    f = wedge.not_created_finding(NODE, d)
    assert f.id == "probe.pod_not_started" and f.evidence["created"] is False
    assert "--force-pod" in f.remediation and f.evidence["ways_in"] == list(d.ways_in)


def with_gfd(node: dict, labels: dict = GFD_570_158) -> dict:
    n = copy.deepcopy(node)
    n["metadata"]["labels"].update(labels)
    return n


def test_wedge_names_the_known_bad_driver_from_gfd_labels():
    s = Stage("wedged-20s")
    fs = s.api_findings()
    [f] = wedge.known_bad_driver(with_gfd(s.node), fs)
    assert f.id == "driver.known_bad" and f.severity.value == "critical"
    ev = f.evidence
    assert ev["driver_version"] == "570.158.01" and ev["confirmed_on_node"] is False
    assert ev["trigger_present"] is True  # nvidia.com/gpu beside nvidia.com/mig-* slices
    assert ev["resource"] == ["nvidia.com/gpu"]
    assert ev["labels"]["nvidia.com/mig.strategy"] == "mixed"
    assert "570.172.08" in ev["fixed_in"]
    assert f.title.startswith("likely root cause: NVIDIA driver 570.158.01")
    assert "nvidia.com/gpu" in f.title
    # no labels: nothing to say from the API side
    assert wedge.known_bad_driver(s.node, fs) == []
    # a fixed driver: nothing
    fixed = dict(GFD_570_158, **{"nvidia.com/cuda.driver.minor": "172",
                                 "nvidia.com/cuda.driver.rev": "08"})
    assert wedge.known_bad_driver(with_gfd(s.node, fixed), fs) == []


def test_known_bad_driver_on_a_healthy_node():
    s = Stage("healthy")
    fs = s.api_findings()
    [f] = wedge.known_bad_driver(with_gfd(s.node), fs)
    assert f.severity.value == "warning" and f.evidence["caused"] is None  # a wedge waiting
    # full GPUs only (no MIG slices advertised): the trigger is absent, the node stays quiet
    full_only = with_gfd(s.node)
    for part in ("capacity", "allocatable"):
        for k in [k for k in full_only["status"][part] if k.startswith("nvidia.com/mig-")]:
            del full_only["status"][part][k]
    assert wedge.known_bad_driver(full_only, fs) == []
    newer = with_gfd(s.node, {"nvidia.com/cuda.driver-version.full": "570.124.06"})
    assert wedge.known_bad_driver(newer, fs)[0].evidence["driver_version"] == "570.124.06"


def test_captured_nodes_have_no_capacity_mismatch(stage):
    assert capacity.analyze_node(stage.node) == []


def test_capacity_plugin_gone_vs_devices_unhealthy():
    """Node objects shaped like the captured one (nvidia.com/gpu beside MIG slices)."""
    node = Stage("healthy").node
    gone = copy.deepcopy(node)   # the plugin exited: capacity stays, allocatable 0 everywhere
    for k in gone["status"]["allocatable"]:
        if k.startswith("nvidia.com/"):
            gone["status"]["allocatable"][k] = "0"
    [f] = capacity.analyze_node(gone)
    assert f.severity.value == "critical" and f.evidence["cause"] == "plugin_not_registered"
    assert set(f.evidence["resources"]) == {"nvidia.com/gpu", "nvidia.com/mig-1g.10gb",
                                            "nvidia.com/mig-2g.20gb", "nvidia.com/mig-3g.40gb"}
    assert f.title.startswith("no device plugin is registered for nvidia.com/gpu")
    assert "Unhealthy" not in f.title

    sick = copy.deepcopy(node)   # one full GPU and one 1g slice reported Unhealthy
    sick["status"]["allocatable"]["nvidia.com/gpu"] = "1"
    sick["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] = "1"
    [f] = capacity.analyze_node(sick)
    assert f.severity.value == "warning" and f.evidence["cause"] == "devices_unhealthy"
    assert f.evidence["resources"] == {"nvidia.com/gpu": {"capacity": 2, "allocatable": 1},
                                       "nvidia.com/mig-1g.10gb": {"capacity": 2,
                                                                  "allocatable": 1}}
    assert "Unhealthy" in f.title and "2 GPU device(s)" in f.title

    both = copy.deepcopy(sick)   # the MIG plugin registration gone, a full GPU unhealthy
    for k in ("nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-3g.40gb"):
        both["status"]["allocatable"][k] = "0"
    causes = {f.evidence["cause"]: set(f.evidence["resources"])
              for f in capacity.analyze_node(both)}
    assert causes == {"plugin_not_registered": {"nvidia.com/mig-1g.10gb",
                                                "nvidia.com/mig-2g.20gb",
                                                "nvidia.com/mig-3g.40gb"},
                      "devices_unhealthy": {"nvidia.com/gpu"}}


# -- names for node-side subjects ------------------------------------------------------------

def test_client_names_a_node_finding_left_with_a_pod_uid():
    """The record the probe sent on the real kubelet (names null), for the captured pod."""
    pod = Stage("healthy").pod("gdscn-gpu")
    uid = pod["metadata"]["uid"]
    cid = pod["status"]["containerStatuses"][0]["containerID"].split("://")[1]
    rec = {"schema": "gpu-doctor/v1", "kind": "finding", "id": "cgroup.device_denied",
           "severity": "critical", "subject": f"pod uid {uid} container {cid[:13]}",
           "title": f"Container {cid[:13]} in pod uid {uid} cannot open /dev/nvidia-uvm "
                    f"(c 508:0): its device cgroup denies it",
           "evidence": {"pod_uid": uid, "namespace": None, "pod": None, "container": None,
                        "container_id": cid}}
    idx = subjects.PodIndex([pod])
    out = subjects.name_record(rec, idx)
    assert out["subject"] == "pod default/gdscn-gpu container c"
    assert out["title"].startswith("Container c in pod default/gdscn-gpu cannot open")
    ev = out["evidence"]
    assert (ev["namespace"], ev["pod"], ev["container"]) == ("default", "gdscn-gpu", "c")
    assert rec["evidence"]["pod"] is None  # the input record is not modified
    # an event that names only the uid in its subject, and a uid the API does not know
    ev_rec = {"kind": "event", "name": "cgroup.device_denied", "subject": f"pod uid {uid}",
              "message": "x"}
    assert subjects.name_record(ev_rec, idx)["subject"] == "pod default/gdscn-gpu"
    other = dict(rec, subject="pod uid 00000000-0000-0000-0000-000000000000 container x",
                 title="Container x in pod uid 00000000-0000-0000-0000-000000000000",
                 evidence={"pod_uid": "00000000-0000-0000-0000-000000000000", "pod": None})
    assert subjects.name_record(other, idx) is other
    named = dict(rec, subject="pod default/gdscn-gpu container c",
                 title="Container c in pod default/gdscn-gpu cannot open",
                 evidence={"pod_uid": uid, "pod": "gdscn-gpu"})
    assert subjects.name_record(named, idx) is named


def test_pending_pod_behind_a_blocked_sync_loop_is_critical_before_the_threshold():
    s = Stage("wedged-20s")
    gpu = s.pod("gdscn-gpu")
    evs = events_by_uid(s.events)[gpu["metadata"]["uid"]]
    [f] = pod_status.analyze_pod(gpu, evs, s.now, node_findings=s.api_findings())
    assert f.severity.value == "critical"
    assert f.evidence["caused_by"] == "kubelet.blocked_in_device_plugin"
    assert "admission waits in the device plugin for nvidia.com/gpu" in f.title
    [f] = pod_status.analyze_pod(gpu, evs, s.now, node_findings=Stage("healthy").api_findings())
    assert f.severity.value == "info" and f.evidence["caused_by"] is None


def test_syncloop_failed_with_no_readable_dump_still_decides_against_the_pod():
    s = Stage("wedged-3m")
    failed = goroutines.parse_healthz(s.healthz.replace("[+]syncloop ok",
                                                        "[-]syncloop failed: reason withheld"))
    f = goroutines.unavailable(NODE, 403, "forbidden", failed)
    assert f.severity.value == "info"
    d = wedge.decide(NODE, [f], s.pods)
    assert d.create_pod is False and d.caused_by == ("kubelet.goroutines_unavailable",)
    ok = goroutines.unavailable(NODE, 403, "forbidden", goroutines.parse_healthz(s.healthz))
    assert wedge.decide(NODE, [ok], s.pods).create_pod is True

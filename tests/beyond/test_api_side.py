"""API-side analyses beyond the seeds: DRA claims and device health, kubelet goroutines in DRA
calls, runtime handler / RuntimeClass / CDI events, the MIG manager's state label. Pure analyses
on API-shaped objects, the lists fetched through the real kubernetes client from the fake API
server, and the real 1.35 kubelet goroutine capture for the quiet case."""
from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from kubectl_gpudoctor import analysis
from kubectl_gpudoctor.api import extra_lists
from kubectl_gpudoctor.analysis.scheduling import dra
from kubectl_gpudoctor.analysis.stuck import goroutines
from kubectl_gpudoctor.analysis.resources import mig
from kubectl_gpudoctor.analysis.failing import runtime
from tests.beyond.api_objects import (DRIVER, claim, device_class, event, gpu_device, pod,
                                      resource_slice)

NOW = dt.datetime(2026, 11, 23, 8, 0, tzinfo=dt.timezone.utc)
CAPTURES = Path(__file__).resolve().parents[1] / "data" / "captures" / "k8s-1.35"
NODE = "gpu-node-1"


def ids(findings, severities=("warning", "critical")):
    return [(f.id, f.severity.value) for f in findings if f.severity.value in severities]


def unallocated(pods, claims, slices, classes, events=()):
    return dra.analyze_claims(pods, claims, slices, classes, list(events), NOW)


# -- DRA: why a claim is not allocated -----------------------------------------------------------

def test_allocated_claims_and_running_pods_are_quiet():
    c = claim("c1", allocated=(NODE, ["gpu-0"]))
    p = pod("p1", claim_name="c1", node=NODE, phase="Running")
    assert unallocated([p], [c], [resource_slice(NODE)], [device_class()]) == []


def test_device_class_missing():
    f = unallocated([pod("p1", claim_name="c1")], [claim("c1", cls="gpu.example.com")],
                    [resource_slice(NODE)], [device_class()])
    assert f[0].id == "dra.claim_unallocated" and f[0].severity.value == "warning"
    assert f[0].evidence["reason"] == "device_class_missing"
    assert "gpu.example.com" in f[0].title


def test_no_resource_slice_from_the_driver():
    other = resource_slice(NODE, driver="net.example.com")
    f = unallocated([pod("p1", claim_name="c1")], [claim("c1")], [other], [device_class()])
    assert f[0].evidence["reason"] == "no_resource_slices"
    assert f[0].evidence["requests"][0]["drivers"] == [DRIVER]
    assert "kubelet plugin" in f[0].title


def test_slices_of_an_incomplete_newer_generation_are_not_used():
    # generation 1 complete, generation 2 announced as 2 slices but only one published
    slices = [resource_slice(NODE, generation=1), resource_slice(NODE, generation=2, count=2)]
    f = unallocated([pod("p1", claim_name="c1")], [claim("c1")], slices, [device_class()])
    ev = f[0].evidence["requests"][0]
    assert ev["reason"] == "pool_not_usable"
    problems = {p["problem"] for p in ev["pools"]}
    assert problems == {"incomplete", "stale_slices"}


def test_stale_generation_is_reported_beside_a_later_reason():
    slices = [resource_slice(NODE, generation=1), resource_slice(NODE, generation=3)]
    f = unallocated([pod("p1", claim_name="c1")],
                    [claim("c1", selectors=['device.attributes["gpu.nvidia.com"].productName '
                                            '== "NVIDIA B200"'])], slices, [device_class()])
    ev = f[0].evidence["requests"][0]
    assert ev["reason"] == "selector_matches_nothing"
    assert ev["pool_problems"] == [{"driver": DRIVER, "pool": NODE, "generation": 3,
                                    "stale_generations": [1], "problem": "stale_slices"}]


def test_device_class_selector_matches_nothing():
    cls = device_class(extra='device.attributes["gpu.nvidia.com"].type == "mig"')
    f = unallocated([pod("p1", claim_name="c1")], [claim("c1")], [resource_slice(NODE, n=4)],
                    [cls])
    ev = f[0].evidence["requests"][0]
    assert ev["reason"] == "selector_matches_nothing" and ev["devices_published"] == 4
    assert "match none of the 4" in f[0].title


def test_all_matching_devices_tainted_unless_tolerated():
    taint = [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]
    s = resource_slice(NODE, devices=[gpu_device(0, taints=taint), gpu_device(1, taints=taint)])
    f = unallocated([pod("p1", claim_name="c1")], [claim("c1")], [s], [device_class()])
    ev = f[0].evidence["requests"][0]
    assert ev["reason"] == "devices_tainted" and ev["taints"] == ["gpu.nvidia.com/xid=79:NoSchedule"]
    tolerant = claim("c1", tolerations=[{"key": "gpu.nvidia.com/xid", "operator": "Exists"}])
    f = unallocated([pod("p1", claim_name="c1")], [tolerant], [s], [device_class()])
    assert f[0].evidence["reason"] == "not_yet_allocated" and f[0].severity.value == "info"


def test_all_matching_devices_held_by_other_claims():
    held = claim("other", allocated=(NODE, ["gpu-0", "gpu-1"]))
    f = unallocated([pod("p1", claim_name="c1")], [claim("c1"), held],
                    [resource_slice(NODE, n=2)], [device_class()],
                    [event(pod("p1"), "FailedScheduling", "0/3 nodes are available: 1 cannot "
                           "allocate all claims.", component="default-scheduler")])
    ev = f[0].evidence
    assert ev["reason"] == "devices_in_use"
    assert ev["requests"][0]["free_devices"] == 0 and ev["requests"][0]["matching_devices"] == 2
    assert "cannot allocate all claims" in ev["last_scheduler_message"]


def test_claim_from_template_not_created_yet():
    p = pod("p1", claim_name=None)
    p["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "t"}]
    f = unallocated([p], [], [resource_slice(NODE)], [device_class()])
    assert f[0].evidence["reason"] == "claim_missing"


def test_unknown_cel_is_not_a_false_verdict():
    c = claim("c1", selectors=['device.capacity["gpu.nvidia.com"].memory.compareTo('
                               'quantity("40Gi")) >= 0'])
    f = unallocated([pod("p1", claim_name="c1")], [c], [resource_slice(NODE)], [device_class()])
    assert f[0].evidence["reason"] == "unknown" and f[0].severity.value == "info"


# -- device health in pod status ------------------------------------------------------------------

def test_unhealthy_allocated_devices_in_pod_status():
    cs = [{"name": "main", "restartCount": 3, "allocatedResourcesStatus": [
        {"name": "claim:c1/gpu", "resources": [{"resourceID": "gpu.nvidia.com/gpu-node-1/gpu-0",
                                                "health": "Unhealthy"},
                                               {"resourceID": "gpu.nvidia.com/gpu-node-1/gpu-1",
                                                "health": "Healthy"}]},
        {"name": "nvidia.com/gpu", "resources": [{"resourceID": "GPU-abc", "health": "Unknown"}]}]}]
    f = dra.analyze_device_health([pod("p1", claim_name="c1", node=NODE, phase="Running",
                                       container_statuses=cs)])
    assert ids(f) == [("dra.device_unhealthy", "warning")]
    assert f[0].evidence["unhealthy"] == [{"resource": "claim:c1/gpu",
                                           "device": "gpu.nvidia.com/gpu-node-1/gpu-0"}]


def test_healthy_devices_in_pod_status_are_quiet():
    cs = [{"name": "main", "allocatedResourcesStatus": [
        {"name": "claim:c1/gpu", "resources": [{"resourceID": "x", "health": "Healthy"}]}]}]
    assert dra.analyze_device_health([pod("p1", phase="Running", container_statuses=cs)]) == []


# -- kubelet goroutines parked in DRA calls -------------------------------------------------------

DRA_WEDGE = """
goroutine 4711 [select, 6 minutes]:
google.golang.org/grpc/internal/transport.(*Stream).waitOnHeader(0xc001c2e000)
	google.golang.org/grpc@v1.72.1/internal/transport/transport.go:331 +0x7c
google.golang.org/grpc.(*ClientConn).Invoke(0xc000a80008, {0x29995f0, 0xc001b4c0f0}, {0x25b2e1a, 0x3a}, {0x2367fe0, 0xc001c0a1e0}, {0x2368020, 0xc001c0a230}, {0x0, 0x0, 0x0})
	google.golang.org/grpc@v1.72.1/call.go:35 +0x223
k8s.io/kubelet/pkg/apis/dra/v1.(*dRAPluginClient).NodePrepareResources(0xc000a1c0b8, {0x29995f0, 0xc001b4c0f0}, 0xc001c0a1e0, {0x0, 0x0, 0x0})
	k8s.io/kubelet/pkg/apis/dra/v1/api_grpc.pb.go:74 +0xc3
k8s.io/kubernetes/pkg/kubelet/cm/dra/plugin.(*DRAPlugin).NodePrepareResources(0xc000b2a000, {0x29995f0, 0xc001b4c0c0}, 0xc001c0a1e0, {0x0, 0x0, 0x0})
	k8s.io/kubernetes/pkg/kubelet/cm/dra/plugin/dra_plugin.go:120 +0x2d9
k8s.io/kubernetes/pkg/kubelet/cm/dra.(*Manager).prepareResources(0xc000a7e1e0, {0x29995f0, 0xc001b4c0c0}, 0xc001aa2908)
	k8s.io/kubernetes/pkg/kubelet/cm/dra/manager.go:331 +0x9b0
k8s.io/kubernetes/pkg/kubelet/cm/dra.(*Manager).PrepareResources(...)
	k8s.io/kubernetes/pkg/kubelet/cm/dra/manager.go:228
k8s.io/kubernetes/pkg/kubelet/cm.(*containerManagerImpl).PrepareDynamicResources(0xc0001c8008, {0x29995f0, 0xc001b4c0c0}, 0xc001aa2908)
	k8s.io/kubernetes/pkg/kubelet/cm/container_manager_linux.go:1021 +0x45
k8s.io/kubernetes/pkg/kubelet/kuberuntime.(*kubeGenericRuntimeManager).SyncPod(0xc000682a80, {0x29995f0, 0xc001b4c0c0}, 0xc001aa2908, 0xc001a9e2d0, {0x3ba9bc0, 0x0, 0x0}, 0xc000c0a3c0)
	k8s.io/kubernetes/pkg/kubelet/kuberuntime/kuberuntime_manager.go:1290 +0x5b1
created by k8s.io/kubernetes/pkg/kubelet.(*podWorkers).UpdatePod in goroutine 290
	k8s.io/kubernetes/pkg/kubelet/pod_workers.go:947 +0x85b
"""


def test_real_healthy_kubelet_dump_has_no_dra_wait():
    text = (CAPTURES / "healthy-goroutines.txt").read_text()
    assert "cm/dra.(*Manager).Start" in text  # the DRA manager runs, idle
    assert not [f for f in goroutines.analyze(NODE, text) if f.id.startswith("kubelet.")]


def test_kubelet_parked_in_node_prepare_resources():
    text = (CAPTURES / "healthy-goroutines.txt").read_text() + DRA_WEDGE
    f = [x for x in goroutines.analyze(NODE, text) if x.id == "kubelet.blocked_in_dra_plugin"]
    assert f and f[0].severity.value == "critical"
    assert f[0].evidence["calls"] == {"NodePrepareResources": 1}
    assert f[0].evidence["longest_wait_min"] == 6


def test_dra_wait_seconds_old_is_info():
    text = DRA_WEDGE.replace("[select, 6 minutes]", "[select]")
    f = [x for x in goroutines.analyze(NODE, text) if x.id == "kubelet.blocked_in_dra_plugin"]
    assert f and f[0].severity.value == "info"


# -- runtime handler, RuntimeClass, CDI -------------------------------------------------------------

SANDBOX_MSG = ('Failed to create pod sandbox: rpc error: code = Unknown desc = failed to get '
               'sandbox runtime: no runtime for "nvidia" is configured')
CDI_MSG = ("Error: failed to create containerd task: failed to create shim task: OCI runtime "
           "create failed: could not apply required modification to OCI specification: error "
           "modifying OCI spec: failed to inject CDI devices: unresolvable CDI devices "
           "nvidia.com/gpu=GPU-e78e68c0-4e6a-737e-f9cc-4223fe50aead")
NVIDIA_RC = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
             "metadata": {"name": "nvidia"}, "handler": "nvidia"}


def test_missing_handler_grouped_by_node():
    p1 = pod("a", node=NODE, runtime_class="nvidia")
    p2 = pod("b", node=NODE, runtime_class="nvidia")
    evs = [event(p1, "FailedCreatePodSandBox", SANDBOX_MSG, count=7),
           event(p2, "FailedCreatePodSandBox", SANDBOX_MSG)]
    f = runtime.analyze([p1, p2], evs, [NVIDIA_RC])
    assert ids(f) == [("runtime.handler_missing", "warning")]
    ev = f[0].evidence
    assert ev["handler"] == "nvidia" and ev["pods"] == ["ml/a", "ml/b"] and ev["count"] == 8
    assert ev["runtime_class_handler"] == "nvidia" and f[0].subject == f"node/{NODE}"


def test_missing_handler_counts_every_pod_and_names_a_bounded_few():
    ps = [pod(f"p{i:02d}", node=NODE, runtime_class="nvidia") for i in range(25)]
    (f,) = runtime.analyze(ps, [event(p, "FailedCreatePodSandBox", SANDBOX_MSG) for p in ps],
                           [NVIDIA_RC])
    assert f.evidence["pod_count"] == 25 and len(f.evidence["pods"]) == runtime.MAX_PODS
    assert "25 pod(s) cannot create their sandbox" in f.title


def test_crio_wording_of_a_missing_handler():
    p = pod("a", node=NODE, runtime_class="nvidia")
    msg = ("Failed to create pod sandbox: rpc error: code = Unknown desc = failed to find "
           "runtime handler nvidia from runtime list map[crun:0xc000 runc:0xc001]")
    f = runtime.analyze([p], [event(p, "FailedCreatePodSandBox", msg)], [NVIDIA_RC])
    assert f[0].evidence["handler"] == "nvidia"


def test_runtime_class_missing():
    p = pod("a", node=NODE, runtime_class="nvidia-cdi")
    f = runtime.analyze([p], [], [NVIDIA_RC])
    assert ids(f) == [("runtime.class_missing", "warning")]
    assert f[0].evidence["runtime_classes"] == ["nvidia"]


def test_unresolvable_cdi_devices():
    p = pod("a", node=NODE)
    f = runtime.analyze([p], [event(p, "Failed", CDI_MSG)], None)
    assert ids(f) == [("cdi.unresolvable_devices", "warning")]
    assert f[0].evidence["devices"] == ["nvidia.com/gpu=GPU-e78e68c0-4e6a-737e-f9cc-4223fe50aead"]


def test_runtime_quiet_on_healthy_pods():
    p = pod("a", node=NODE, runtime_class="nvidia", phase="Running")
    evs = [event(p, "Started", "Started container main", type_="Normal")]
    assert runtime.analyze([p], evs, [NVIDIA_RC]) == []


# -- MIG manager state label -------------------------------------------------------------------

def mig_node(state, written="2026-11-23T07:58:00Z", paused=False):
    labels = {"nvidia.com/mig.config": "all-1g.10gb", "nvidia.com/mig.config.state": state}
    if paused:
        labels["nvidia.com/gpu.deploy.device-plugin"] = "paused-for-mig-change"
    return {"metadata": {"name": NODE, "labels": labels, "managedFields": [
        {"manager": "kubelet", "operation": "Update", "time": "2026-11-20T00:00:00Z",
         "fieldsV1": {"f:metadata": {"f:labels": {"f:kubernetes.io/hostname": {}}}}},
        {"manager": "nvidia-mig-manager", "operation": "Update", "time": written,
         "fieldsV1": {"f:metadata": {"f:labels": {"f:nvidia.com/mig.config.state": {}}}}}]}}


def test_mig_config_failed_is_critical():
    f = mig.analyze_node(mig_node("failed", paused=True), NOW)
    assert ids(f) == [("mig.config_failed", "critical")]
    assert f[0].evidence["paused_operands"] == ["nvidia.com/gpu.deploy.device-plugin"]
    assert f[0].evidence["written_by"] == "nvidia-mig-manager"


def test_mig_pending_stuck_vs_in_progress():
    stuck = mig.analyze_node(mig_node("pending", written="2026-11-23T07:30:00Z"), NOW)
    assert ids(stuck) == [("mig.config_failed", "warning")]
    assert stuck[0].evidence["state_age_s"] == 1800
    fresh = mig.analyze_node(mig_node("pending"), NOW)
    assert ids(fresh) == [] and fresh[0].severity.value == "info"


def test_mig_success_is_quiet():
    assert mig.analyze_node(mig_node("success"), NOW) == []


# -- the lists through the real kubernetes client, and node_objects --------------------------------

@pytest.fixture
def fake():
    from tests.kubectl.fakecluster import FakeCluster

    fc = FakeCluster().start()
    try:
        yield fc
    finally:
        fc.stop()


def test_fetch_through_the_client_and_node_objects(fake, tmp_path):
    from kubectl_gpudoctor.api.kube import Kube

    fake.add_node(NODE)
    fake.lists["/apis/resource.k8s.io/v1/resourceslices"] = (
        "ResourceSliceList", [resource_slice(NODE, driver="net.example.com")])
    fake.lists["/apis/resource.k8s.io/v1/resourceclaims"] = ("ResourceClaimList", [claim("c1")])
    fake.lists["/apis/resource.k8s.io/v1/deviceclasses"] = ("DeviceClassList", [device_class()])
    # node.k8s.io RuntimeClasses not served: a 404 is a note, not an error
    kube = Kube(kubeconfig=str(fake.kubeconfig(tmp_path / "kc")))
    extra, notes = extra_lists.fetch(kube)
    assert extra["runtimeclasses"] is None and notes == [
        "runtimeclasses: not served by this API server (/apis/node.k8s.io/v1/runtimeclasses)"]
    assert [c["metadata"]["name"] for c in extra["resourceclaims"]] == ["c1"]
    node = fake.nodes[NODE]
    p = pod("p1", claim_name="c1", node=NODE)
    findings, errs = analysis.node_objects(node, [p], [], None, NOW, extra=extra)
    assert not errs
    f = [x for x in findings if x.id == "dra.claim_unallocated"]
    assert f and f[0].evidence["reason"] == "no_resource_slices"


def test_fetch_forbidden_is_a_note(fake, tmp_path):
    import re

    from kubectl_gpudoctor.api.kube import Kube

    fake.forbid.append(("GET", re.compile(r"^/apis/resource\.k8s\.io/")))
    kube = Kube(kubeconfig=str(fake.kubeconfig(tmp_path / "kc")))
    extra, notes = extra_lists.fetch(kube, kinds=("resourceclaims",))
    assert extra == {"resourceclaims": None} and "forbidden" in notes[0]


def test_fetch_server_errors_are_notes_and_unreachable_propagates():
    from kubectl_gpudoctor import errors

    class Kube:
        def __init__(self, exc):
            self.exc = exc

        def get_json(self, path, timeout=None):
            raise self.exc

    extra, notes = extra_lists.fetch(Kube(errors.api_error(500, "Internal Server Error",
                                                           "etcd timeout", "/x")),
                                     kinds=("deviceclasses",))
    assert extra == {"deviceclasses": None} and notes[0].startswith("deviceclasses: HTTP 500")
    with pytest.raises(errors.ApiUnreachable):
        extra_lists.fetch(Kube(errors.ApiUnreachable("connection refused")),
                          kinds=("deviceclasses",))


@pytest.mark.parametrize("state", ["healthy", "wedged-20s", "wedged-3m"])
def test_real_1_35_captures_raise_none_of_the_new_ids(state):
    """The node, pods, events and goroutines of a real 1.35 kubelet (device-plugin GPUs, no
    DRA, no MIG manager): none of the beyond-the-seeds analyses speak up."""
    import json

    def load(name):
        return json.loads((CAPTURES / f"{state}-{name}.json").read_text())

    node, pods, events = load("node"), load("pods")["items"], load("events")["items"]
    findings, errs = analysis.node_objects(node, pods, events, load("lease"), NOW,
                                           extra={"runtimeclasses": [], "resourceclaims": [],
                                                  "resourceslices": [], "deviceclasses": []})
    findings += goroutines.analyze(NODE, (CAPTURES / f"{state}-goroutines.txt").read_text())
    assert not errs
    new = ("dra.", "runtime.", "cdi.", "mig.config_failed", "kubelet.blocked_in_dra_plugin")
    assert not [f.id for f in findings if f.id.startswith(new)]

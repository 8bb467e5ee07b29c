"""The committed stubs speak the kubelet's wire format: golden bytes written from the field
numbers of k8s.io/kubelet's api.proto files (not from our .proto), method paths, and the
stubs are what scripts/gen-protos.sh generates today."""
import os
import subprocess
import sys
from pathlib import Path

from node_probe.kubeletapi import deviceplugin_v1beta1_pb2 as dp
from node_probe.kubeletapi import podresources_v1_pb2 as pr

REPO = Path(__file__).resolve().parents[2]


def test_device_plugin_messages_use_the_kubelet_field_numbers():
    # DevicePluginOptions: pre_start_required = 1, get_preferred_allocation_available = 2
    assert dp.DevicePluginOptions(pre_start_required=True,
                                  get_preferred_allocation_available=True
                                  ).SerializeToString() == b"\x08\x01\x10\x01"
    # Device: ID = 1, health = 2, topology = 3 (TopologyInfo.nodes = 1, NUMANode.ID = 1)
    d = dp.Device(ID="x", health="Healthy", topology=dp.TopologyInfo(nodes=[dp.NUMANode(ID=1)]))
    assert d.SerializeToString() == b"\n\x01x\x12\x07Healthy\x1a\x04\n\x02\x08\x01"
    # ListAndWatchResponse.devices = 1
    assert dp.ListAndWatchResponse(devices=[dp.Device(ID="x")]).SerializeToString() \
        == b"\n\x03\n\x01x"
    # ContainerPreferredAllocationRequest: available = 1, must_include = 2, size = 3;
    # PreferredAllocationRequest.container_requests = 1
    req = dp.PreferredAllocationRequest(container_requests=[
        dp.ContainerPreferredAllocationRequest(available_deviceIDs=["a"],
                                               must_include_deviceIDs=["b"], allocation_size=2)])
    assert req.SerializeToString() == b"\n\x08\n\x01a\x12\x01b\x18\x02"
    # PreferredAllocationResponse.container_responses = 1, deviceIDs = 1
    resp = dp.PreferredAllocationResponse.FromString(b"\n\x03\n\x01a")
    assert list(resp.container_responses[0].deviceIDs) == ["a"]


def test_device_plugin_service_paths_match_the_kubelet():
    svc = dp.DESCRIPTOR.services_by_name["DevicePlugin"]
    assert svc.full_name == "v1beta1.DevicePlugin"
    assert [m.name for m in svc.methods] == ["GetDevicePluginOptions", "ListAndWatch",
                                             "GetPreferredAllocation", "Allocate",
                                             "PreStartContainer"]
    law = svc.methods_by_name["ListAndWatch"]
    assert law.server_streaming and not law.client_streaming


def test_pod_resources_messages_use_the_kubelet_field_numbers():
    # PodResources: name = 1, namespace = 2, containers = 3; ContainerResources: name = 1,
    # devices = 2; ContainerDevices: resource_name = 1, device_ids = 2
    wire = (b"\n\x1a"                       # ListPodResourcesResponse.pod_resources = 1
            b"\n\x01p\x12\x02ns"            # name, namespace
            b"\x1a\x11"                      # containers = 3
            b"\n\x01c\x12\x0c\n\x01r\x12\x07GPU-abc")
    msg = pr.ListPodResourcesResponse.FromString(wire)
    pod = msg.pod_resources[0]
    assert (pod.name, pod.namespace, pod.containers[0].name) == ("p", "ns", "c")
    dev = pod.containers[0].devices[0]
    assert (dev.resource_name, list(dev.device_ids)) == ("r", ["GPU-abc"])
    # AllocatableResourcesResponse.devices = 1, cpu_ids = 2
    a = pr.AllocatableResourcesResponse(devices=[pr.ContainerDevices(resource_name="r")],
                                        cpu_ids=[3])
    assert a.SerializeToString() == b"\n\x03\n\x01r\x12\x01\x03"
    svc = pr.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert svc.full_name == "v1.PodResourcesLister"
    assert {"List", "GetAllocatableResources"} <= {m.name for m in svc.methods}


def test_unknown_newer_fields_are_skipped():
    # a newer kubelet adds fields (e.g. ContainerResources field 6); decoding must not fail
    wire = b"\n\x0b\n\x01p\x1a\x06\n\x01c2\x01z"
    msg = pr.ListPodResourcesResponse.FromString(wire)
    assert msg.pod_resources[0].containers[0].name == "c"


def test_committed_stubs_are_current():
    r = subprocess.run(["bash", str(REPO / "scripts" / "gen-protos.sh"), "--check"],
                       capture_output=True, text=True, timeout=120, cwd=REPO,
                       env={**os.environ, "PYTHON": sys.executable})
    assert r.returncode == 0, r.stderr

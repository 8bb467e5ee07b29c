"""The kubelet device checkpoint: allocations per pod UID + container and the plugin's
Allocate answer (a real ContainerAllocateResponse serialized by protobuf, as the kubelet
stores it), and the seed 002 verdict drawn from it end to end."""
import base64
import json

import pytest

from node_probe.host import device_checkpoint as dc
from tests.cgroups.conftest import (GPU0_UUID, UVM_MAJOR, deny_all_then_allow, make_host_root,
                                    new_cid, new_uid)
from tests.probe_run import run_probe

pb = pytest.importorskip("node_probe.kubeletapi.deviceplugin_v1beta1_pb2",
                         reason="protobuf is needed to build a real AllocResp")


def alloc_resp(devices, envs=None) -> str:
    r = pb.ContainerAllocateResponse(
        envs=envs or {}, devices=[pb.DeviceSpec(container_path=d, host_path=d, permissions="rw")
                                  for d in devices])
    return base64.b64encode(r.SerializeToString()).decode()


def checkpoint(entries) -> str:
    return json.dumps({"Data": {"PodDeviceEntries": entries,
                                "RegisteredDevices": {"nvidia.com/gpu": [GPU0_UUID]}},
                       "Checksum": 12345})


def test_parse_numa_and_legacy_device_ids_and_decode_allocate():
    uid = new_uid()
    text = checkpoint([
        {"PodUID": uid, "ContainerName": "trainer", "ResourceName": "nvidia.com/gpu",
         "DeviceIDs": {"-1": [GPU0_UUID]},
         "AllocResp": alloc_resp(["/dev/nvidiactl", "/dev/nvidia0"],
                                 {"NVIDIA_VISIBLE_DEVICES": GPU0_UUID, "TOKEN": "secret"})},
        {"PodUID": uid, "ContainerName": "old", "ResourceName": "nvidia.com/gpu",
         "DeviceIDs": ["GPU-a", "GPU-b"], "AllocResp": "!!not base64!!"}])
    e1, e2 = dc.parse(text)
    assert e1.device_ids == (GPU0_UUID,) and e2.device_ids == ("GPU-a", "GPU-b")
    assert [d["host_path"] for d in e1.alloc["devices"]] == ["/dev/nvidiactl", "/dev/nvidia0"]
    assert e1.alloc["envs"] == {"NVIDIA_VISIBLE_DEVICES": GPU0_UUID}     # TOKEN dropped
    assert e2.alloc is None
    assert dc.index([e1, e2])[(uid, "trainer")] == [e1]


def test_missing_or_garbage_checkpoint(tmp_path):
    assert dc.load(tmp_path) is None
    (tmp_path / "device-plugins").mkdir()
    (tmp_path / "device-plugins/kubelet_internal_checkpoint").write_text("{not json")
    assert dc.load(tmp_path) is None
    for shape in ('[1]', '{"Data": 1}', '{"Data": {"PodDeviceEntries": 1}}',
                  '{"Data": {"RegisteredDevices": [1]}}'):
        (tmp_path / "device-plugins/kubelet_internal_checkpoint").write_text(shape)
        assert dc.load(tmp_path) is None, shape


@pytest.mark.root
def test_seed_002_from_the_kubelet_checkpoint_end_to_end(v1_tree, tmp_path):
    """No pod-resources, no NVIDIA_* env: the checkpoint says the container has GPU 0 and the
    plugin's Allocate answer left /dev/nvidia-uvm out; the cgroup denies it."""
    host = make_host_root(tmp_path)
    uid, cid = new_uid(), new_cid()
    cg = v1_tree.container(uid, cid)
    deny_all_then_allow(cg, ["c 1:3 rwm", "c *:* m", "c 195:255 rw", "c 195:0 rw"])
    v1_tree.spawn(cg, {})
    bundle = host / f"run/containerd/io.containerd.runtime.v2.task/k8s.io/{cid}"
    bundle.mkdir(parents=True)
    bundle.joinpath("config.json").write_text(json.dumps({"annotations": {
        "io.kubernetes.cri.sandbox-name": "infer-7", "io.kubernetes.cri.sandbox-namespace": "ai",
        "io.kubernetes.cri.container-name": "server"}}))
    kdir = host / "var/lib/kubelet"
    (kdir / "device-plugins").mkdir(parents=True)
    (kdir / "device-plugins/kubelet_internal_checkpoint").write_text(checkpoint([
        {"PodUID": uid, "ContainerName": "server", "ResourceName": "nvidia.com/gpu",
         "DeviceIDs": {"0": [GPU0_UUID]},
         "AllocResp": alloc_resp(["/dev/nvidiactl", "/dev/nvidia0"])}]))
    run = run_probe("--host-root", str(host), "--cgroup-root", "/sys/fs/cgroup",
                    "--only", "cgroup.devices", "--trace-seconds", "0", "--focus-pod", uid)
    f = run.findings("cgroup.device_denied")
    assert len(f) == 1, run.stdout
    ev = f[0]["evidence"]
    assert f[0]["subject"] == "pod ai/infer-7 container server"
    assert ev["gpu_source"] == "checkpoint" and ev["gpu_ids"] == [GPU0_UUID]
    assert ev["allocate_device_specs"] == ["/dev/nvidiactl", "/dev/nvidia0"]
    assert ev["causes"][0] == "plugin_omitted_device"
    assert ev["denied"][0]["device"] == "/dev/nvidia-uvm" and ev["major"] == UVM_MAJOR
    assert ev["denied"][0]["in_allocate_specs"] is False
    assert ev["plugin_passes_device_specs"] is True


DEEP = '{"Data":' + "[" * 200_000 + "]" * 200_000 + "}"   # round-3 audit H-51's checkpoint


def test_a_200k_deep_checkpoint_is_unreadable_with_its_reason(tmp_path):
    (tmp_path / "device-plugins").mkdir()
    (tmp_path / "device-plugins/kubelet_internal_checkpoint").write_text(DEEP)
    assert dc.load(tmp_path) is None
    got, why = dc.state(tmp_path)
    assert got is None and why == ("the kubelet's device checkpoint is unreadable: its JSON is "
                                   "nested deeper than the parser's limit")
    assert dc.state(tmp_path / "absent") == (None, None)     # absent is not unreadable


def test_a_deep_checkpoint_and_oci_config_cost_no_check_its_run(tmp_path):
    """H-51 end to end: the checks that read the checkpoint (containers, deviceplugin, kubelet,
    gpu.isolation) and a container's OCI config.json nested 200,000 deep: no check ends in
    `error` (they did, with RecursionError, and the run was incomplete: exit 4); the containers
    check says why the checkpoint was not used."""
    from node_probe.host import containers
    assert containers.parse_bundle_config(DEEP) == {}
    root = tmp_path / "host"
    kd = root / "var/lib/kubelet/device-plugins"
    kd.mkdir(parents=True)
    (kd / "kubelet_internal_checkpoint").write_text(DEEP)
    (root / "proc").mkdir()
    (root / "proc/devices").write_text("Character devices:\n195 nvidia-frontend\n")
    run = run_probe("--host-root", str(root), "--kubelet-dir", str(root / "var/lib/kubelet"),
                    "--only", "containers", "--only", "deviceplugin", "--only", "kubelet",
                    "--only", "gpu.isolation", "--trace-seconds", "0",
                    "--focus-pod", "00000000-0000-0000-0000-000000000000")
    status = {c["id"]: c for c in run.summary["checks"]}
    assert not [c for c in status.values() if c["status"] == "error"], status
    assert run.summary["complete"] is True and run.returncode != 4
    logs = [r["message"] for r in run.records if r.get("kind") == "log"
            and r.get("check") == "containers"]
    assert any("nested deeper than the parser's limit" in m for m in logs), logs

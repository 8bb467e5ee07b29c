"""The pods a GPU fault hit, named by the probe itself (issue 40.6): `node X` through a debug pod
has no agent, so the Xid finding must carry the pods the kubelet gave that GPU (pod-resources
List joined to NVML's GPUs by bus id, UUID and MIG devices). The Xid line is the driver's own
wording (https://github.com/NVIDIA/nvidia-docker/issues/1553: `NVRM: Xid (PCI:0000:09:00): 79,
pid=0, GPU has fallen off the bus.`, a GPU that failed under a running container); the GPUs are
the stand-in NVML's; pod-resources is served on the kubelet's unix socket."""
from __future__ import annotations

from tests.deviceplugin.conftest import GPU_A, GPU_B
from tests.fakes.nvml import FakeGpu, build_fake_nvml
from tests.probe_run import run_probe

LINE = "[1084456.074562] NVRM: Xid (PCI:0000:09:00): 79, pid=0, GPU has fallen off the bus.\n"
MIG = "MIG-0b8e2a5a-2b0f-5d0c-9d1c-6f0e5a7c8b91"


def two_gpus_two_pods(host, start_plugin, podres, tmp_path, bus_a: str, line: str):
    """The stand-in NVML with GPU_A at `bus_a` and GPU_B at 3C:00.0, a healthy plugin,
    pod-resources giving GPU_A to team-a/train-0 and GPU_B to team-b/infer-1, and a kernel log
    file holding `line`. The log's path."""
    lib = build_fake_nvml(host.root / "usr/lib/x86_64-linux-gnu", init="ok", gpus=(
        FakeGpu(GPU_A, minor=0, pci_bus_id=bus_a),
        FakeGpu(GPU_B, minor=1, pci_bus_id="00000000:3C:00.0")))
    start_plugin("nvidia-gpu.sock", mode="healthy", nvml_lib=lib)
    podres([{"namespace": "team-a", "pod": "train-0", "container": "main",
             "resource": "nvidia.com/gpu", "device_ids": [GPU_A]},
            {"namespace": "team-b", "pod": "infer-1", "container": "server",
             "resource": "nvidia.com/gpu", "device_ids": [GPU_B]}])
    kmsg = tmp_path / "kmsg.txt"
    kmsg.write_text(line)
    return kmsg


def test_an_xid_names_the_pods_on_that_gpu_without_the_agent(host, start_plugin, podres,
                                                             tmp_path):
    kmsg = two_gpus_two_pods(host, start_plugin, podres, tmp_path, "00000000:09:00.0", LINE)
    run = run_probe(*host.args("--kmsg-file", str(kmsg), "--trace-seconds", "0",
                               "--only", "kmsg", "--only", "nvml", "--only", "deviceplugin"))
    (x,) = run.findings("gpu.xid")
    assert x["evidence"]["pods"] == ["team-a/train-0/main"], x
    assert "pods on it: team-a/train-0/main" in x["title"]
    assert "infer-1" not in x["title"]           # the other GPU's pod was not hit


def test_healthy_node_names_no_pods_and_warns_nothing(host, start_plugin, podres, tmp_path):
    lib = build_fake_nvml(host.root / "usr/lib/x86_64-linux-gnu", init="ok", gpus=(
        FakeGpu(GPU_A, minor=0, pci_bus_id="00000000:09:00.0"),))
    start_plugin("nvidia-gpu.sock", mode="healthy", nvml_lib=lib)
    podres([{"namespace": "team-a", "pod": "train-0", "container": "main",
             "resource": "nvidia.com/gpu", "device_ids": [GPU_A]}])
    kmsg = tmp_path / "kmsg.txt"
    kmsg.write_text(f"[   12.1] NVRM: GPU at PCI:0000:09:00: {GPU_A}\n")
    run = run_probe(*host.args("--kmsg-file", str(kmsg), "--trace-seconds", "0",
                               "--only", "kmsg", "--only", "nvml", "--only", "deviceplugin"))
    assert [f for f in run.findings() if f["check"] == "kmsg"] == []


def test_the_join_by_mig_device_and_uuid():
    from node_probe.deviceplugin import podresources as pr

    class G:
        def __init__(self, uuid, pci, migs=()):
            self.uuid, self.pci_bus_id = uuid, pci
            self.mig_devices = [type("M", (), {"uuid": m})() for m in migs]
    hit = pr.gpu_users([{"namespace": "a", "pod": "p", "container": "c",
                         "device_ids": [MIG]},
                        {"namespace": "b", "pod": "q", "container": "d",
                         "device_ids": [f"{GPU_B}::3"]}],
                       [G(GPU_A, "00000000:09:00.0", [MIG]), G(GPU_B, "00000000:3C:00.0")])
    assert pr.users_of("pci 0000:09:00", hit) == ("a/p/c",)          # the MIG's pod, by bus
    assert pr.users_of("gpu", hit, GPU_B) == ("b/q/d",)               # by UUID (replica)
    assert pr.users_of("node", hit) == ()

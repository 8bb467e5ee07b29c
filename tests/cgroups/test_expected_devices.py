"""Which device numbers a GPU container needs, from proc/devices, procfs GPU info and NVML."""
from pathlib import Path

from node_probe.host import nvidia_devices as nd

UUID0 = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
UUID1 = "GPU-bbbbbbbb-1111-1111-1111-111111111111"
MIG = "MIG-cccccccc-2222-2222-2222-222222222222"


def host(tmp_path: Path, uvm_major=509, caps=True) -> Path:
    root = tmp_path / "h"
    (root / "proc/driver/nvidia/gpus").mkdir(parents=True)
    devices = "Character devices:\n  1 mem\n195 nvidia\n"
    if uvm_major:
        devices += f"{uvm_major} nvidia-uvm\n"
    if caps:
        devices += "234 nvidia-caps\n"
    devices += "\nBlock devices:\n  7 loop\n"
    (root / "proc/devices").write_text(devices)
    # minor != index on purpose: bus 0x3b has minor 2, bus 0x86 has minor 0
    for bus, minor, uid in (("0000:3b:00.0", 2, UUID0), ("0000:86:00.0", 0, UUID1)):
        d = root / "proc/driver/nvidia/gpus" / bus
        d.mkdir()
        d.joinpath("information").write_text(
            f"Model:           NVIDIA A100\nGPU UUID:        {uid}\nDevice Minor:    {minor}\n")
    if caps:
        (root / "proc/driver/nvidia-caps").mkdir(parents=True)
        (root / "proc/driver/nvidia-caps/mig-minors").write_text(
            "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n"
            "gpu0/gi2/access 21\ngpu0/gi2/ci0/access 22\n")
    return root


def majmins(exp):
    return {d.name: d.majmin for d in exp.devices}


def test_uuid_resolves_through_procfs_minor_not_index(tmp_path):
    inv = nd.inventory(host(tmp_path), None)
    assert inv.source == "procfs" and inv.uvm_major == 509
    exp = nd.expected_devices([UUID1], inv)
    assert majmins(exp) == {"nvidiactl": "195:255", "nvidia-uvm": "509:0",
                            "nvidia-uvm-tools": "509:1", "nvidia0": "195:0"}
    assert not exp.notes
    tools = next(d for d in exp.devices if d.name == "nvidia-uvm-tools")
    assert tools.required is False


def test_all_time_slicing_and_unknown(tmp_path):
    inv = nd.inventory(host(tmp_path), None)
    assert {"nvidia2", "nvidia0"} <= set(majmins(nd.expected_devices(["all"], inv)))
    assert "nvidia2" in majmins(nd.expected_devices([f"{UUID0}::3"], inv))
    exp = nd.expected_devices(["GPU-nope"], inv)
    assert exp.notes and "nvidia2" not in majmins(exp)


def test_uvm_not_loaded_is_a_note(tmp_path):
    inv = nd.inventory(host(tmp_path, uvm_major=None), None)
    exp = nd.expected_devices([UUID0], inv)
    assert "nvidia-uvm" not in majmins(exp)
    assert any("nvidia-uvm" in n for n in exp.notes)


def test_nvml_fact_mig_device_needs_caps(tmp_path):
    nvml = {"status": "ok", "gpus": [
        {"index": 0, "uuid": UUID1, "minor": 0, "mig_mode": True,
         "mig_devices": [{"index": 0, "uuid": MIG, "profile": "1g.10gb",
                          "gpu_instance_id": 2, "compute_instance_id": 0}]},
        {"index": 1, "uuid": UUID0, "minor": None, "mig_mode": False, "mig_devices": []}]}
    inv = nd.inventory(host(tmp_path), nvml)
    assert inv.source == "nvml+procfs"     # minor of GPU 1 filled in from procfs
    m = majmins(nd.expected_devices([MIG], inv))
    assert m["nvidia0"] == "195:0"
    assert m["nvidia-caps/nvidia-cap21"] == "234:21"
    assert m["nvidia-caps/nvidia-cap22"] == "234:22"
    # index strategy: "0:0" is GPU 0's MIG device 0
    assert "nvidia-caps/nvidia-cap21" in majmins(nd.expected_devices(["0:0"], inv))
    # old style MIG-GPU-<uuid>/<gi>/<ci>
    assert "nvidia-caps/nvidia-cap13" in majmins(nd.expected_devices([f"MIG-{UUID1}/1/0"], inv))
    assert majmins(nd.expected_devices(["1"], inv))["nvidia2"] == "195:2"


def test_mig_monitor_env(tmp_path):
    inv = nd.inventory(host(tmp_path), None)
    exp = nd.expected_devices([UUID0], inv, {"NVIDIA_MIG_MONITOR_DEVICES": "all"})
    assert majmins(exp)["nvidia-caps/nvidia-cap2"] == "234:2"


def test_gpu_information_parser():
    info = nd.parse_gpu_information("Model: \t\t NVIDIA H20\nGPU UUID: \t GPU-x\n"
                                    "Device Minor: \t 7\nBus Location: \t 0000:3b:00.0\n")
    assert info["Device Minor"] == "7" and info["GPU UUID"] == "GPU-x"
    assert info["Bus Location"] == "0000:3b:00.0"

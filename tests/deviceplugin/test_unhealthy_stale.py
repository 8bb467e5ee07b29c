"""GPUs the plugin marked Unhealthy that never come back (issue 25, class 2).

NVIDIA's plugin logs, when an Xid hits a GPU (NVIDIA/k8s-device-plugin #189):
  "XidCriticalError: Xid=69 on Device=GPU-7540a9b3-..., the device will go unhealthy."
  "'nvidia.com/gpu' device marked unhealthy: GPU-7540a9b3-..."
and then keeps it Unhealthy until the plugin restarts (#234: "Once marked unhealthy, the plugin
will then leave it unhealthy forever"; #1014; HAMi #2200 "Devices cannot recover from Unhealthy
state"). A real plugin process reports device 0 Unhealthy over the real v1beta1 API; NVML is the
gcc-built stand-in under the host root; the kernel log is a saved dmesg.
"""
from tests.deviceplugin.conftest import GPU_A, GPU_B
from tests.fakes.nvml import FakeGpu, build_fake_nvml
from tests.probe_run import run_probe

LIBDIR = "usr/lib/x86_64-linux-gnu"
BUS_A = "00000000:3B:00.0"


def run(host, start_plugin, kernel_log, **gpu_a):
    build_fake_nvml(host.root / LIBDIR, gpus=[FakeGpu(GPU_A, minor=0, pci_bus_id=BUS_A, **gpu_a),
                                              FakeGpu(GPU_B, minor=1)])
    log = host.root / "kern.log"
    log.write_text(kernel_log)
    start_plugin(mode="unhealthy", devices=(GPU_A, GPU_B))
    return run_probe(*host.args("--only", "deviceplugin", "--only", "nvml", "--only", "kmsg",
                                "--kmsg-file", str(log), "--trace-seconds", "0"))


def test_unhealthy_after_a_transient_xid_while_nvml_says_fine_is_stale(host, start_plugin):
    # Xid 13 is the application's fault (NVIDIA: RESTART_APP); the GPU itself is fine
    r = run(host, start_plugin, "[ 500.000000] NVRM: Xid (PCI:0000:3b:00): 13, pid=48211, "
                                "name=python3, Graphics Exception: ESR 0x504648=0x102000e\n")
    [f] = r.findings("deviceplugin.unhealthy_stale")
    assert not r.findings("deviceplugin.unhealthy")
    assert f["severity"] == "warning"
    [v] = f["evidence"]["verdicts"]
    assert v["id"] == GPU_A and v["verdict"] == "stale" and v["reasons"] == []
    assert v["xids"] == [{"xid": 13, "count": 1, "bucket": "restart_app",
                          "last_s_since_boot": 500.0}]
    assert "Restart the device plugin pod" in f["remediation"]


def test_a_gpu_with_an_xid_that_needs_a_reset_is_sick_not_stale(host, start_plugin):
    r = run(host, start_plugin, "[ 900.000000] NVRM: Xid (PCI:0000:3b:00): 48, pid='<unknown>', "
                                "name=<unknown>, An uncorrectable double bit error (DBE) has "
                                "been detected on GPU in the framebuffer at partition 6.\n")
    assert not r.findings("deviceplugin.unhealthy_stale")
    [f] = r.findings("deviceplugin.unhealthy")
    [v] = f["evidence"]["verdicts"]
    assert v["verdict"] == "sick" and "Xid 48" in v["reasons"][0]
    assert "not before" in f["remediation"]


def test_a_gpu_nvml_reports_degraded_is_sick(host, start_plugin):
    r = run(host, start_plugin, "", remap_pending=True)
    assert not r.findings("deviceplugin.unhealthy_stale")
    [f] = r.findings("deviceplugin.unhealthy")
    assert f["evidence"]["verdicts"][0]["reasons"] == ["NVML: row remapping pending (reset needed)"]


def test_all_healthy_stays_quiet(host, start_plugin):
    build_fake_nvml(host.root / LIBDIR, gpus=[FakeGpu(GPU_A, minor=0), FakeGpu(GPU_B, minor=1)])
    start_plugin(mode="healthy", devices=(GPU_A, GPU_B))
    r = run_probe(*host.args("--only", "deviceplugin", "--only", "nvml", "--trace-seconds", "0"))
    assert not [f for f in r.findings() if f["id"].startswith("deviceplugin.unhealthy")]


def _checkpoint(host, entries):
    import json
    (host.plugins_dir / "kubelet_internal_checkpoint").write_text(json.dumps({
        "Data": {"PodDeviceEntries": [
            {"PodUID": uid, "ContainerName": c, "ResourceName": "nvidia.com/gpu",
             "DeviceIDs": {"-1": ids}} for uid, c, ids in entries],
            "RegisteredDevices": {"nvidia.com/gpu": [GPU_A, GPU_B]}},
        "Checksum": 12345}))


def test_checkpoint_holding_device_ids_the_plugin_no_longer_advertises(host, start_plugin):
    # the plugin switched to index ids ("0", "1") after the kubelet checkpointed uuids: the
    # container with GPU_A is refused "previously allocated devices are no longer healthy" on
    # its next admission
    _checkpoint(host, [("uid-train", "main", [GPU_A])])
    start_plugin(devices=("0", "1"))
    r = run_probe(*host.args("--only", "deviceplugin", "--trace-seconds", "0"))
    [f] = r.findings("deviceplugin.checkpoint_mismatch")
    [c] = f["evidence"]["containers"]
    assert (c["pod_uid"], c["container"], c["missing"]) == ("uid-train", "main", [GPU_A])
    assert f["evidence"]["advertised"] == ["0", "1"]
    assert f["evidence"]["plugin_started_s_ago"] is not None
    assert "previously allocated devices are no longer healthy" in f["remediation"]


def test_checkpoint_matching_the_plugin_stays_quiet(host, start_plugin):
    _checkpoint(host, [("uid-train", "main", [GPU_A])])
    start_plugin(devices=(GPU_A, GPU_B))
    r = run_probe(*host.args("--only", "deviceplugin", "--trace-seconds", "0"))
    assert not r.findings("deviceplugin.checkpoint_mismatch")

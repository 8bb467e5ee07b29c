"""The `kubelet` check end to end: kubelet config + a real NVIDIA-plugin process with and
without device specs (seed 001)."""
import pytest

from tests.probe_run import run_probe

ONLY = ("--only", "kubelet", "--trace-seconds", "0")


def _config(host, policy, driver="cgroupfs"):
    (host.kubelet / "config.yaml").write_text(
        f"kind: KubeletConfiguration\ncpuManagerPolicy: {policy}\ncgroupDriver: {driver}\n")


def test_static_cpu_manager_without_device_specs_warns(host, start_plugin):
    _config(host, "static")
    p = start_plugin("nvidia-gpu.sock")
    run = run_probe(*host.args(*ONLY))
    (cm,) = run.findings("kubelet.cpu_manager_static")
    assert cm["severity"] == "warning"
    assert cm["evidence"]["nvidia_plugins_without_device_specs"] == [p.pid]
    (ds,) = run.findings("deviceplugin.no_device_specs")
    assert ds["severity"] == "warning" and ds["evidence"]["pid"] == p.pid
    assert ds["evidence"]["pass_device_specs"] is False
    assert run.returncode == 1


@pytest.mark.parametrize("how", ["env", "flag", "flag=true", "config-file"])
def test_device_specs_passed_makes_static_informational(host, start_plugin, how):
    _config(host, "static")
    if how == "env":
        start_plugin("nvidia-gpu.sock", env={"PASS_DEVICE_SPECS": "true"})
    elif how == "flag":
        start_plugin("nvidia-gpu.sock", extra=("--pass-device-specs",))
    elif how == "flag=true":
        start_plugin("nvidia-gpu.sock", extra=("--pass-device-specs=true",),
                     env={"PASS_DEVICE_SPECS": "false"})  # the flag wins
    else:
        cfg = host.root / "plugin-config.yaml"
        cfg.write_text("version: v1\nflags:\n  plugin:\n    passDeviceSpecs: true\n")
        start_plugin("nvidia-gpu.sock", extra=("--config-file", str(cfg)))
    run = run_probe(*host.args(*ONLY))
    (cm,) = run.findings("kubelet.cpu_manager_static")
    assert cm["severity"] == "info", cm
    assert "passes device specs" in cm["title"]
    assert run.findings("deviceplugin.no_device_specs") == []
    assert run.returncode == 0


def test_explicitly_disabled_flag_counts_as_missing(host, start_plugin):
    _config(host, "static")
    start_plugin("nvidia-gpu.sock", extra=("--pass-device-specs=false",),
                 env={"PASS_DEVICE_SPECS": "true"})
    run = run_probe(*host.args(*ONLY))
    (ds,) = run.findings("deviceplugin.no_device_specs")
    assert ds["evidence"]["flag"] is False and ds["evidence"]["env_PASS_DEVICE_SPECS"] == "true"


def test_not_static_gives_info_about_device_specs_only(host, start_plugin):
    _config(host, "none")
    start_plugin("nvidia-gpu.sock")
    run = run_probe(*host.args(*ONLY))
    assert run.findings("kubelet.cpu_manager_static") == []
    (ds,) = run.findings("deviceplugin.no_device_specs")
    assert ds["severity"] == "info"
    assert run.returncode == 0


def test_systemd_cgroup_driver_alone_makes_missing_specs_a_warning(host, start_plugin):
    _config(host, "none", driver="systemd")
    start_plugin("nvidia-gpu.sock")
    run = run_probe(*host.args(*ONLY))
    (ds,) = run.findings("deviceplugin.no_device_specs")
    assert ds["severity"] == "warning" and "systemd" in ds["title"]


def test_no_plugin_and_no_config(host):
    run = run_probe(*host.args(*ONLY))
    assert run.findings() == [] and run.returncode == 0


def test_unreadable_kubelet_config_is_skipped_not_judged_as_none(host, start_plugin):
    (host.kubelet / "config.yaml").write_text('{"kind": "KubeletConfiguration", '
                                              '"cpuManagerPolicy": "static"')  # cut short
    start_plugin("nvidia-gpu.sock")
    run = run_probe(*host.args(*ONLY))
    (c,) = [c for c in run.summary["checks"] if c["id"] == "kubelet"]
    assert c["status"] == "skipped" and "kubelet config not read" in c["reason"], c
    assert run.findings("kubelet.cpu_manager_static") == []
    # the plugin was still looked at
    assert run.findings("deviceplugin.no_device_specs")


def test_healthy_kubelet_config_looks_and_is_quiet(host):
    _config(host, "none", driver="cgroupfs")
    run = run_probe(*host.args(*ONLY))
    (c,) = [c for c in run.summary["checks"] if c["id"] == "kubelet"]
    assert c["status"] == "ok" and run.findings() == []

"""GPU sharing misconfigured (issue 25, class 6): the device plugin's config vs what it serves.

A real plugin process (tests/fakes/fake_device_plugin.py) started with `--config-file`, as
NVIDIA's plugin is (flag or $CONFIG_FILE), serving the real v1beta1 API on its socket; the
probe reads the config inside the plugin's root and the devices from ListAndWatch. The config
shape is NVIDIA's (k8s-device-plugin README, "Shared Access to GPUs"): sharing.timeSlicing /
sharing.mps with renameByDefault and resources[{name, replicas}]; replicated device ids are
`<GPU uuid>::<n>` as the plugin builds them.
"""
import os
import shutil
import signal
import subprocess

import pytest

from tests.deviceplugin.conftest import GPU_A, GPU_B
from tests.probe_run import run_probe


def config(host, strategy="timeSlicing", replicas=4, rename_by_default=False):
    path = host.root / "plugin-config.yaml"
    path.write_text(f"""version: v1
flags:
  migStrategy: none
sharing:
  {strategy}:
    renameByDefault: {str(rename_by_default).lower()}
    resources:
    - name: nvidia.com/gpu
      replicas: {replicas}
""")
    return path


def replicated(n):
    return [f"{g}::{i}" for g in (GPU_A, GPU_B) for i in range(n)]


def probe(host):
    return run_probe(*host.args("--only", "deviceplugin", "--trace-seconds", "0"))


def test_plugin_still_serving_one_device_per_gpu_after_the_config_asked_for_4_replicas(
        host, start_plugin):
    cfg = config(host, replicas=4)
    start_plugin(devices=(GPU_A, GPU_B), extra=("--config-file", str(cfg)))
    run = probe(host)
    [f] = run.findings("sharing.misconfigured")
    ev = f["evidence"]
    assert f["severity"] == "warning"
    assert (ev["advertised_devices"], ev["gpus"], ev["expected_devices"]) == (2, 2, 8)
    assert ev["config_file"] == str(cfg)
    assert "4 replicas x 2 GPU(s) = 8 devices expected, 2 advertised" in f["title"]


def test_rename_by_default_but_the_node_advertises_nvidia_com_gpu(host, start_plugin):
    cfg = config(host, replicas=2, rename_by_default=True)
    start_plugin(devices=replicated(2), env={"CONFIG_FILE": str(cfg)})
    run = probe(host)
    [f] = run.findings("sharing.misconfigured")
    assert f["evidence"]["sharing"]["resources"][0]["advertised_as"] == "nvidia.com/gpu.shared"
    assert "as nvidia.com/gpu.shared, but the node gets nvidia.com/gpu" in f["title"]


def test_mps_without_a_control_daemon_is_critical(host, start_plugin):
    cfg = config(host, strategy="mps", replicas=2)
    start_plugin(devices=replicated(2), extra=("--config-file", str(cfg)))
    run = probe(host)
    assert not run.findings("sharing.misconfigured")
    [f] = run.findings("sharing.mps_daemon_missing")
    assert f["severity"] == "critical"
    assert f["evidence"]["mps_control_daemon_pids"] == []


def test_matching_config_and_a_running_mps_daemon_stay_quiet(host, start_plugin):
    cfg = config(host, strategy="mps", replicas=2)
    start_plugin(devices=replicated(2), extra=("--config-file", str(cfg)))
    exe = host.root / "nvidia-cuda-mps-control"   # a real process by the daemon's name
    shutil.copy("/bin/sleep", exe)
    daemon = subprocess.Popen([str(exe), "60"])
    try:
        run = probe(host)
    finally:
        daemon.send_signal(signal.SIGKILL)
        daemon.wait(timeout=10)
    assert not run.findings("sharing.misconfigured")
    assert not run.findings("sharing.mps_daemon_missing")


def test_time_slicing_as_configured_stays_quiet(host, start_plugin):
    cfg = config(host, replicas=2)
    start_plugin(devices=replicated(2), extra=("--config-file", str(cfg)))
    run = probe(host)
    assert not [f for f in run.findings() if f["id"].startswith("sharing.")]

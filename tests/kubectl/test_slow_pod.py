"""`kubectl gpu-doctor pod Y` on a Running pod whose GPU runs slow, as a user runs it (issue 38
item 3): the agent's pod is running, so the node probe runs by exec in it (the exec fake runs
the real `python -m node_probe` against a temp host root: the stand-in libnvidia-ml.so.1 says
the GPU is busy at PCIe Gen2 of Gen5, the pod-resources fake says which pod holds it). The
report leads with the slow-down, its cause and its action, at 80 columns.

PROVEN ONLY ON THE STAND-IN libnvidia-ml (tests/fakes/fake_nvml.c): no real GPU was at hand.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.deviceplugin.conftest import host, podres, start_plugin  # noqa: F401 - fixtures
from tests.fakes.nvml import FakeGpu, build_fake_nvml

from .conftest import REPO, cli_env, run_cli
from .fakeexec import PROBE_NS, ExecCluster, local_probe_argv

NODE = "gpu-slow-1"
GPU = "GPU-5ee1a0b2-0b0e-4c1e-9d7a-6a1f3c2b9e01"


def _cluster(host, podres, start_plugin, attrs):  # noqa: F811
    lib = build_fake_nvml(host.root / "usr/lib/x86_64-linux-gnu", gpus=[
        FakeGpu(GPU, pci_bus_id="00000000:3B:00.0", attrs=attrs),
        FakeGpu("GPU-idle", minor=1)])
    start_plugin("nvidia-gpu.sock", mode="healthy", nvml_lib=lib)
    podres([{"namespace": "ml", "pod": "train-0", "container": "main",
             "resource": "nvidia.com/gpu", "device_ids": [GPU]}])
    fc = ExecCluster()
    fc.namespaces["gpu-doctor"] = {PROBE_NS: "true"}
    fc.add_node(NODE)
    fc.add_pod("ml", "train-0", NODE, phase="Running", gpus=1, age_s=3600)
    fc.add_agent_pod(NODE)
    fc.exec_argv = local_probe_argv(str(host.root), ("--only", "gpu.slow", "--only",
                                                     "deviceplugin"))
    fc.start()
    return fc


@pytest.fixture
def slow_node(host, podres, start_plugin):  # noqa: F811
    fc = _cluster(host, podres, start_plugin, (("util_gpu", 100), ("clock_reasons", 0),
                                 ("pcie_gen_cur", 2)))
    try:
        yield fc
    finally:
        fc.stop()


@pytest.fixture
def healthy_node(host, podres, start_plugin):  # noqa: F811
    fc = _cluster(host, podres, start_plugin, (("util_gpu", 100), ("clock_reasons", 0)))
    try:
        yield fc
    finally:
        fc.stop()


def test_running_pod_on_a_downtrained_gpu_leads_with_it(slow_node, tmp_path):
    kc = str(slow_node.kubeconfig(tmp_path / "kc"))
    r = run_cli("pod", "train-0", "-n", "ml", "--kubeconfig", kc, "-o", "json",
                "--trace-seconds", "0", "--timeout", "30")
    doc = json.loads(r.stdout)
    v = doc["verdict"]
    assert v["root_cause"] == "gpu.pcie_downtrained", (v, r.stderr[-2000:])
    assert v["headline"].startswith("Pod ml/train-0 runs slow: GPU 0 (00000000:3B:00.0): "
                                    "PCIe Gen2 x16 of Gen5 x16: 1/8 of host bandwidth")
    [f] = [f for f in doc["findings"] if f["id"] == "gpu.pcie_downtrained"]
    assert f["evidence"]["pods"] == ["ml/train-0"] and f["evidence"]["uuid"] == GPU
    assert r.returncode == 1
    t = subprocess.run([sys.executable, "-m", "kubectl_gpudoctor", "pod", "train-0", "-n",
                        "ml", "--kubeconfig", kc, "--trace-seconds", "0", "--timeout", "30"],
                       capture_output=True, text=True, timeout=60, cwd=str(REPO),
                       env={**cli_env(), "COLUMNS": "80"})
    lines = t.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), [x for x in lines if len(x) > 80]
    first = next(line for line in lines if "runs slow" in line)
    assert "Pod ml/train-0 runs slow" in first
    assert "kubectl drain gpu-slow-1" in t.stdout


def test_a_healthy_running_pod_is_said_healthy(healthy_node, tmp_path):
    kc = str(healthy_node.kubeconfig(tmp_path / "kc"))
    r = run_cli("pod", "train-0", "-n", "ml", "--kubeconfig", kc, "-o", "json",
                "--trace-seconds", "0", "--timeout", "30")
    doc = json.loads(r.stdout)
    assert not [f for f in doc["findings"] if f.get("check") == "gpu.slow"]
    head = doc["verdict"]["headline"]
    assert head.startswith("Pod ml/train-0 is Running and its GPUs are not slowed"), head
    assert r.returncode == 0, r.stderr[-2000:]

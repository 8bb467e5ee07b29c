"""The flagship incident through the agent: a node whose kubelet admits nothing (API side: pods
bound and untouched, goroutines parked in GetPreferredAllocation) and whose device plugin is stuck
in the stand-in NVML's nvmlInit. The agent's pod was already running, so the node probe runs by
exec in it (the exec fake runs the real `python -m node_probe` against a temp host root with a
real stuck plugin) and returns the node-side root cause; no debug pod is created."""
from __future__ import annotations

import json
import time

import pytest

from kubectl_gpudoctor.reach import agent_exec
from kubectl_gpudoctor.api.kube import Kube
from node_probe.deviceplugin import rpc
from tests.deviceplugin.conftest import GPU_A, host, start_plugin  # noqa: F401 - fixtures
from tests.fakes.nvml import build_fake_nvml

from .conftest import run_cli
from .fakeexec import PROBE_NS  # noqa: E402
from .fakeexec import ExecCluster, local_probe_argv
from .kubelet_dump import wedged_kubelet_dump

NODE = "gpu-wedged"


@pytest.fixture
def stuck_plugin(host, start_plugin, tmp_path):  # noqa: F811 - fixtures imported above
    """The device plugin thread parked inside nvmlInit_v2 since the kubelet's call."""
    host.driver_version("570.158.01")
    lib = build_fake_nvml(tmp_path / "lib", init="block")
    p = start_plugin("nvidia-gpu.sock", mode="nvml-block", nvml_lib=lib,
                     extra=("--no-preferred-allocation",))
    with rpc.PluginClient(str(p.socket)) as c:  # plays the kubelet, whose call never returns
        assert c.preferred_allocation([GPU_A], 1, 0.5).status == "timeout"
    return p


@pytest.fixture
def wedged(host):  # noqa: F811
    fc = ExecCluster()
    fc.namespaces["gpu-doctor"] = {PROBE_NS: "true"}
    fc.add_node(NODE)
    for k in range(3):
        fc.add_pod("ml", f"train-{k}", NODE, phase="Pending", gpus=1, age_s=600,
                   events="scheduled-only")
    fc.goroutines[NODE] = wedged_kubelet_dump(stuck=2, minutes=10)
    fc.debug_pod_mode = "pending"  # the wedged kubelet would never start a new pod
    fc.add_agent_pod(NODE)
    # the agent container's view: the host root is the test's temp root
    fc.exec_argv = local_probe_argv(str(host.root), ("--only", "deviceplugin"))
    fc.start()
    try:
        yield fc
    finally:
        fc.stop()


def test_agent_exec_returns_blocked_in_nvml(wedged, stuck_plugin, tmp_path):
    """agent_exec.run_probe alone: the node side's verdict through a real exec stream."""
    kube = Kube(str(wedged.kubeconfig(tmp_path / "kc")))
    from kubectl_gpudoctor.report.output import Output
    import io
    out = Output("json", "warning", {"kind": "node", "name": NODE, "node": NODE},
                 out=io.StringIO(), err=io.StringIO(), progress=False)
    pod, why = agent_exec.find_agent_pod(kube, "gpu-doctor", NODE)
    assert pod is not None, why
    assert agent_exec.run_probe(kube, NODE, pod, out, timeout_s=20, trace_s=0) is True
    ids = {f.id for f in out.report.findings}
    assert "deviceplugin.blocked_in_nvml" in ids, ids
    (b,) = [f for f in out.report.findings if f.id == "deviceplugin.blocked_in_nvml"]
    assert b.evidence["pid"] == stuck_plugin.pid
    assert out.report.complete
    assert stuck_plugin.alive()
    assert wedged.created == []  # no pod was created on the wedged node


def test_node_on_a_wedged_node_reports_both_halves_through_the_agent(wedged, stuck_plugin,
                                                                    tmp_path):
    """`kubectl gpu-doctor node X` as a user runs it: the API side's stall and the node side's
    root cause in one report, without a pod being created."""
    kc = str(wedged.kubeconfig(tmp_path / "kc"))
    t0 = time.monotonic()
    r = run_cli("node", NODE, "--kubeconfig", kc, "-o", "json", "--trace-seconds", "0",
                "--timeout", "20")
    wall = time.monotonic() - t0
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    ids = {f["id"] for f in doc["findings"]}
    assert {"kubelet.admission_stalled", "deviceplugin.blocked_in_nvml"} <= ids, ids
    assert doc["summary"]["complete"], doc["summary"]
    assert wedged.created == [] and len(wedged.execs) == 1
    checks = {c["id"]: c for c in doc["checks"]}
    assert "via agent pod" in checks["node.probe"]["message"]
    print(f"wedged node through the agent: {wall:.1f}s wall")

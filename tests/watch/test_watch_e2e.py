"""Done-when, node side: the real `python -m node_probe agent-watch` against the fake API server
(TLS, captured answers) and a real device plugin that gets wedged in NVML init.

The plugin is healthy when the agent starts; then the driver's nvmlInit starts blocking (the
stand-in NVML's config) and the kubelet's GetPreferredAllocation call (played by the test)
leaves a plugin thread stuck inside nvmlInit_v2. The node must carry GpuDoctorDevicePluginStuck
within 60 s with an Event, the evidence bundle must be kept, and after the plugin is restarted
on a working driver the condition clears while `agent-history` still replays the bundle naming
deviceplugin.blocked_in_nvml.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from node_probe.deviceplugin import rpc
from tests.fakes.nvml import build_fake_nvml, config_text
from tests.watch.conftest import REPO, wait_for

from tests.deviceplugin.conftest import GPU_A

NODE = "gpu-node-a"
STUCK = "GpuDoctorDevicePluginStuck"

pytestmark = pytest.mark.slow


def _history(evidence, *args):
    return subprocess.run([sys.executable, "-m", "node_probe", "agent-history", *args,
                           "--evidence-dir", str(evidence)], capture_output=True, timeout=60,
                          cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


def test_wedged_plugin_marks_the_node_and_the_evidence_outlives_the_restart(
        api, host, start_plugin, podres, start_agent, tmp_path):
    api.cluster.add_capture_node(NODE)
    api.bind("tok-a", NODE)
    libdir = host.root / "usr/lib/x86_64-linux-gnu"
    lib = build_fake_nvml(libdir, init="ok")
    host.driver_version("570.158.01")
    plugin = start_plugin("nvidia-gpu.sock", mode="nvml-block", nvml_lib=lib,
                          devices=(GPU_A, "MIG-e76cc178-e1f3-5596-a9e1-84fa6bffa030"))
    podres([])
    kmsg = tmp_path / "kmsg.txt"
    kmsg.write_text("")
    cg = tmp_path / "cgroup"
    cg.mkdir()
    evidence = tmp_path / "evidence"
    agent = start_agent(*host.args(), "--node-name", NODE, "--interval", "5",
                        "--api-token-file", str(api.token_file), "--api-ca-file", str(api.ca),
                        "--kmsg-file", str(kmsg), "--cgroup-root", str(cg),
                        "--evidence-dir", str(evidence), "--capture-trace-seconds", "0",
                        "--capture-timeout", "40", env=api.env())
    # healthy first: the agent says it watches, the plugin class is False
    wait_for(lambda: api.cluster.conditions(NODE).get("GpuDoctorWatching"), 60,
             "the agent's first PATCH")
    assert api.cluster.conditions(NODE)[STUCK]["status"] == "False"
    assert "GetPreferredAllocation" not in plugin.calls()  # no cheap signal: not provoked

    # the fault starts: nvmlInit blocks, and the kubelet's call wedges a plugin thread
    (libdir / "fake_nvml.conf").write_text(config_text(init="block"))
    with rpc.PluginClient(str(plugin.socket)) as c:
        assert c.preferred_allocation([GPU_A], 1, 0.5).status == "timeout"
    t_fault = time.monotonic()
    cond = wait_for(lambda: (api.cluster.conditions(NODE)[STUCK]["status"] == "True"
                             and api.cluster.conditions(NODE)[STUCK]), 60,
                    "the condition within 60 s of the fault")
    latency = time.monotonic() - t_fault
    assert latency < 60
    assert cond["reason"] in ("DevicepluginBlockedInNvml", "NvmlInitHang")
    ev = wait_for(lambda: [e for e in api.cluster.posted_events
                           if e["reason"] == cond["reason"]], 30, "the transition's Event")
    assert ev[0]["type"] == "Warning" and STUCK in ev[0]["message"]
    assert ev[0]["involvedObject"]["name"] == NODE
    # the kubelet's Ready is untouched (strategic merge by type)
    assert api.cluster.conditions(NODE)["Ready"]["reason"] == "KubeletReady"
    wait_for(lambda: list(evidence.glob("bundle-*.json")), 90, "the evidence bundle")

    # the on-call restarts the plugin on a driver that works again: the node looks healthy
    (libdir / "fake_nvml.conf").write_text(config_text(init="ok"))
    plugin.stop()
    plugin.socket.unlink()
    start_plugin("nvidia-gpu.sock", mode="healthy", nvml_lib=lib)
    wait_for(lambda: api.cluster.conditions(NODE)[STUCK]["status"] == "False", 90,
             "the condition cleared")
    wait_for(lambda: [e for e in api.cluster.posted_events
                      if e["reason"] == "DevicePluginStuckCleared"], 30, "the clearing Event")
    assert agent.proc.poll() is None  # still watching
    assert agent.stop() == 0

    # the bundle captured at the moment replays the wedge
    lst = _history(evidence, "list")
    assert lst.returncode == 0, lst.stderr
    rows = [json.loads(x) for x in lst.stdout.splitlines()]
    assert rows and rows[0]["n"] == 1 and rows[0]["class"] == STUCK
    got = _history(evidence, "get", "1")
    assert got.returncode == 0, got.stderr
    doc = json.loads(got.stdout)
    ids = {f["id"] for f in doc["report"]["findings"]}
    assert "deviceplugin.blocked_in_nvml" in ids, ids
    from kubectl_gpudoctor.report import bundle as client_bundle  # the client's replay reads it
    path = tmp_path / "replayed.json"
    path.write_bytes(got.stdout)
    import io
    out, err = io.StringIO(), io.StringIO()
    code = client_bundle.replay(client_bundle.load(str(path)), "table", stdout=out, stderr=err)
    assert code == 1
    assert "deviceplugin.blocked_in_nvml" in out.getvalue()
    print(f"fault -> condition latency {latency:.1f}s (interval 5 s)")

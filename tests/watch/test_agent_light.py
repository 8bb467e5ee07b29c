"""The agent stays light (issue 31 item 5): each pass runs in a forked child (watch/passchild.py),
so grpc and protobuf -- loaded to talk to the device plugin and the kubelet's pod-resources
socket -- and a pass's peak never stay in the agent; a pass that wedges is killed with its
descendants at its deadline. RSS and CPU are measured by bench/agent_watch.py, not here."""
from __future__ import annotations

import os
import time

import pytest

from tests.fakes.nvml import build_fake_nvml
from tests.watch.conftest import wait_for

NODE = "gpu-node-a"


def _mapped(pid: int, needle: str) -> bool:
    with open(f"/proc/{pid}/maps") as f:
        return any(needle in line for line in f)


@pytest.mark.slow
def test_grpc_is_loaded_by_the_passes_never_by_the_agent(api, host, start_plugin, podres,
                                                          start_agent, tmp_path):
    """Before: the first pass that talked to the plugin loaded grpc's C core (cygrpc) into
    the agent for good. Now the plugin is queried from the pass's child (when due)."""
    api.cluster.add_capture_node(NODE)
    api.bind("tok-a", NODE)
    lib = build_fake_nvml(host.root / "usr/lib/x86_64-linux-gnu", init="ok")
    plugin = start_plugin("nvidia-gpu.sock", mode="healthy", nvml_lib=lib)
    podres([])
    kmsg = tmp_path / "kmsg.txt"
    kmsg.write_text("")
    agent = start_agent(*host.args(), "--node-name", NODE, "--interval", "1",
                        "--api-token-file", str(api.token_file), "--api-ca-file", str(api.ca),
                        "--kmsg-file", str(kmsg), "--cgroup-root", str(tmp_path),
                        "--no-evidence", env=api.env())
    wait_for(lambda: plugin.calls().count("GetDevicePluginOptions") >= 1, 90,
             "a pass that asked the plugin")
    # a quiet pass asks no plugin (issue 41: detect.RpcPacer); one that finds a new plugin
    # asks it at once, loading grpc again in that pass's child
    other = start_plugin("nvidia-mig.sock", mode="healthy", nvml_lib=lib)
    wait_for(lambda: other.calls().count("GetDevicePluginOptions") >= 1, 90,
             "a later pass that asked the new plugin")
    assert not _mapped(agent.pid, "cygrpc"), "grpc's C core is mapped in the agent"
    assert not _mapped(agent.pid, "_upb") and not _mapped(agent.pid, "protobuf")
    # and nothing of the passes is left: no child process between passes is older than one
    time.sleep(0.5)
    kids = open(f"/proc/{agent.pid}/task/{agent.pid}/children").read().split()
    assert len(kids) <= 2
    assert agent.stop() == 0


def test_a_pass_past_its_deadline_is_killed_with_its_descendants(monkeypatch, tmp_path):
    """A pass that never ends (a check wedged beyond its own deadline) and a grandchild in a
    session of its own (as the NVML child runs): both are SIGKILLed at the pass's deadline, the
    pass counts as unsure for every class, and nothing is left running."""
    import subprocess
    from node_probe.watch import detect, passchild

    pidfile = tmp_path / "grandchild.pid"

    def wedged(*args, **kw):
        p = subprocess.Popen(["sleep", "300"], start_new_session=True)
        pidfile.write_text(str(p.pid))
        time.sleep(300)

    monkeypatch.setattr(detect, "run_pass", wedged)
    monkeypatch.setattr(passchild, "GRACE_S", 0.5)
    runner = passchild.PassRunner()
    res = runner.run(None, timeout_s=1.0)
    assert res.unsure == set(passchild.detect_classes()) and res.problems == {}
    assert runner.killed == 1 and not runner.alive()
    gc = int(pidfile.read_text())
    for _ in range(100):
        try:
            state = open(f"/proc/{gc}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            state = "gone"
        if state in ("gone", "Z"):
            break
        time.sleep(0.05)
    assert state in ("gone", "Z"), "the grandchild outlived the pass"

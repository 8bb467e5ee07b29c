"""Which pods a fault hit (issue 31 item 6): a GPU fault the agent marks names, in its condition
(what `node X` shows) and its Event, the pods and containers the kubelet gave that GPU
(pod-resources List), bounded. The Xid line is the driver's own wording (the audit's flapping
repro, shared/audits/t4-repro/w_agent.py: Xid 79, "GPU has fallen off the bus"); the GPU's PCI id
is what NVML reports for it (the stand-in NVML)."""
from __future__ import annotations

import pytest

from node_probe.watch.detect import _pci, users_of
from node_probe.watch.state import ConditionState, Problem
from tests.deviceplugin.conftest import GPU_A, GPU_B
from tests.deviceplugin.test_fault_pods_probe import two_gpus_two_pods
from tests.watch.conftest import wait_for

NODE = "gpu-node-a"
XID = "GpuDoctorXidErrors"
LINE = ("[  100.000000] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen "
        "off the bus.\n")


def test_the_kernels_and_nvmls_pci_ids_name_the_same_gpu():
    assert _pci("pci 0000:3b:00") == _pci("00000000:3B:00.0") == "0000:3b:00.0"
    hit = {"0000:3b:00.0": ("team-a/train-0/main",), GPU_B: ("team-b/infer-1/server",)}
    assert users_of("pci 0000:3b:00", hit) == ("team-a/train-0/main",)
    assert users_of(GPU_B, hit) == ("team-b/infer-1/server",)
    assert users_of("node", hit) == ()


def test_the_message_names_at_most_five_pods_and_counts_the_rest():
    pods = tuple(f"ns/p{i}/c" for i in range(9))
    s = ConditionState(now=0.0)
    (t,) = s.update({XID: [Problem(XID, "gpu.xid", "critical", "pci 0000:3b:00", "Xid 79",
                                   pods)]}, now=1.0)
    assert t.message.startswith("pods on the GPU: ns/p0/c, ns/p1/c, ns/p2/c, ns/p3/c, ns/p4/c "
                                "(+4 more); gpu.xid: pci 0000:3b:00: Xid 79")


@pytest.mark.slow
def test_an_xid_names_the_pods_on_that_gpu_in_the_condition_and_the_event(
        api, host, start_plugin, podres, start_agent, tmp_path):
    api.cluster.add_capture_node(NODE)
    api.bind("tok-a", NODE)
    kmsg = two_gpus_two_pods(host, start_plugin, podres, tmp_path, "00000000:3B:00.0", LINE)
    agent = start_agent(*host.args(), "--node-name", NODE, "--interval", "1",
                        "--api-token-file", str(api.token_file), "--api-ca-file", str(api.ca),
                        "--kmsg-file", str(kmsg), "--cgroup-root", str(tmp_path),
                        "--no-evidence", env=api.env())
    cond = wait_for(lambda: api.cluster.conditions(NODE).get(XID, {}).get("status") == "True"
                    and api.cluster.conditions(NODE)[XID], 90, "the Xid condition")
    assert cond["message"].startswith("pods on the GPU: team-a/train-0/main;"), cond["message"]
    assert "infer-1" not in cond["message"]      # the other GPU's pod was not hit
    ev = wait_for(lambda: [e for e in api.cluster.posted_events if e["reason"] == "GpuXid"],
                  30, "the Event")
    assert "team-a/train-0/main" in ev[0]["message"]
    assert agent.stop() == 0

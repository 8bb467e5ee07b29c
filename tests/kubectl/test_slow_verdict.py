"""`pod Y` on a Running pod answers "is it slow, and why" first (issue 38 item 3): the GPU, the
lost bandwidth or clock, the cause and the action, from the gpu.slow check's findings (the
judges of node_probe/checks/slow, fed records as the NVML child and sysfs give them).
A healthy Running pod is said to be healthy; `node X` ranks a slow GPU as a warning."""
import textwrap

from kubectl_gpudoctor.analysis import verdict
from node_probe.checks.slow import judge, placement
from node_probe.protocol import catalog
from tests.slow.test_judges import gpu

POD = {"kind": "pod", "name": "ml/train-0", "node": "gpu-node-1"}
RUNNING = {"pod_phase": "Running"}   # what `pod` puts in the output's context
HOLD = {"GPU-2f815c32-768d-d782-1073-db01d7b90215": ["ml/train-0"]}
INVENTORY = catalog.make("nvml.inventory", "info", "node", "Driver 570, 1 GPU(s)", {})
PERSIST = catalog.make("persistence.off", "warning", "node", "Persistence is off", {})


def _decide(findings, target=POD, phase="Running", looked=True, **kw):
    return verdict.decide(findings, target, context={"pod_phase": phase,
                                                     "slow_looked": looked}, **kw)


def test_downtrained_link_leads_with_bandwidth_cause_and_action():
    fs = judge.judge_gpus([gpu(pcie={"gen_cur": 2, "width_cur": 16, "gen_max": 5,
                                     "width_max": 16})], holders=HOLD)
    v = _decide([INVENTORY, PERSIST, *fs])
    assert v.root_cause == "gpu.pcie_downtrained"
    assert v.headline.startswith("Pod ml/train-0 runs slow: GPU 0 (00000000:3B:00.0): PCIe "
                                 "Gen2 x16 of Gen5 x16: 1/8 of host bandwidth")
    steps = [(a.step, a.command) for a in v.actions]
    assert steps[0] == ("mitigate", "kubectl drain gpu-node-1 --ignore-daemonsets "
                                    "--delete-emptydir-data --timeout=10m")
    assert any("reseat" in a.text and "nvidia-smi -r -i 00000000:3B:00.0" in a.text
               for a in v.actions)
    assert v.actions[-1].command == "kubectl gpu-doctor pod train-0 -n ml"
    # it fits 80 columns once wrapped at words: no word is wider than the screen
    assert all(len(line) <= 80 for line in textwrap.wrap(v.headline, 80))


def test_thermal_throttle_leads_with_clock_and_cooling():
    fs = judge.judge_gpus([gpu(clocks={"event_reasons": 0x40, "sm_mhz": 1005,
                                       "sm_max_mhz": 1980},
                               temperature={"gpu_c": 86, "slowdown_c": 87})], holders=HOLD)
    v = _decide([INVENTORY, *fs])
    assert v.root_cause == "gpu.clocks_throttled"
    assert "HW thermal slowdown: SM 1005 of 1980 MHz, 1 C from slowdown" in v.headline
    assert any(a.text.startswith("cooling") for a in v.actions)


def test_numa_misplacement_says_move_the_pod():
    g = gpu(numa_node=0)
    fs = placement.judge_numa([{"pod": "ml/train-0", "container": "main", "cpus": [40, 41],
                                "gpus": [g["uuid"]]}], [g], {40: 1, 41: 1},
                              {"topologyManagerPolicy": "none"})
    v = _decide([INVENTORY, *fs])
    assert v.root_cause == "pod.numa_misplaced"
    assert "NUMA node 1, its GPU on node 0 (topology manager policy none)" in v.headline
    assert any(a.command == "kubectl delete pod train-0 -n ml" for a in v.actions)


def test_a_healthy_running_pod_is_said_healthy_not_hidden_under_the_node():
    fs = judge.judge_gpus([gpu()], holders=HOLD)
    assert fs == []
    v = _decide([INVENTORY, PERSIST])
    assert v.headline.startswith("Pod ml/train-0 is Running and its GPUs are not slowed")
    assert "1 other warning(s) below" in v.headline


def test_no_healthy_claim_when_a_check_could_not_look_or_a_slow_gpu_names_no_pod():
    assert "not slowed" not in _decide([INVENTORY], looked=False).headline
    assert "not slowed" not in _decide([INVENTORY], complete=False).headline
    fs = judge.judge_gpus([gpu(pcie={"gen_cur": 2, "width_cur": 16, "gen_max": 5,
                                     "width_max": 16})])   # holders unknown
    v = _decide([INVENTORY, *fs])
    assert "not slowed" not in v.headline and v.root_cause == "gpu.pcie_downtrained"


def test_another_pods_slow_gpu_does_not_lead_this_pod():
    fs = judge.judge_gpus([gpu(pcie={"gen_cur": 2, "width_cur": 16, "gen_max": 5,
                                     "width_max": 16})],
                          holders={"GPU-2f815c32-768d-d782-1073-db01d7b90215": ["ml/other"]})
    v = _decide([INVENTORY, *fs])
    assert not v.headline.startswith("Pod ml/train-0 runs slow")


def test_a_pending_pod_and_a_critical_node_are_not_led_by_slowness():
    fs = judge.judge_gpus([gpu(pcie={"gen_cur": 2, "width_cur": 16, "gen_max": 5,
                                     "width_max": 16})], holders=HOLD)
    assert not _decide([INVENTORY, *fs], phase="Pending").headline.startswith(
        "Pod ml/train-0 runs")
    lost = catalog.make("gpu.lost", "critical", "GPU-x", "GPU has fallen off the bus", {})
    assert _decide([INVENTORY, lost, *fs]).root_cause == "gpu.lost"


def test_node_ranks_a_slow_gpu_as_a_warning_with_its_fix():
    fs = judge.judge_gpus([gpu(pcie={"gen_cur": 2, "width_cur": 16, "gen_max": 5,
                                     "width_max": 16})], holders=HOLD)
    v = _decide([INVENTORY, *fs], {"kind": "node", "name": "gpu-node-1",
                                   "node": "gpu-node-1"})
    assert v.severity == "warning" and v.root_cause == "gpu.pcie_downtrained"
    assert any("retrain the GPU's PCIe link" in a.text for a in v.actions)


def test_hostile_evidence_never_reaches_a_command_or_the_headline():
    f = catalog.make("gpu.pcie_downtrained", "warning", "GPU-x", "x",
                     {"pods": ["ml/train-0"], "pci_bus_id": "$(reboot)", "index": 0,
                      "link": "Gen2 x16; rm -rf /", "link_max": "Gen5 x16"})
    v = _decide([INVENTORY, f])
    assert "reboot" not in v.headline and "rm -rf" not in v.headline
    assert all("$(" not in (a.command or "") + a.text for a in v.actions)


def test_the_verdict_block_leads_with_the_slow_down_at_80_columns():
    from node_probe.protocol.render import verdict_lines
    fs = judge.judge_gpus([gpu(pcie={"gen_cur": 2, "width_cur": 16, "gen_max": 5,
                                     "width_max": 16})], holders=HOLD)
    lines = verdict_lines(_decide([INVENTORY, PERSIST, *fs]).to_dict(), 80)
    assert all(len(line) <= 80 for line in lines), lines
    text = "\n".join(lines)
    assert lines[0].split(None, 1)[1].startswith("Pod ml/train-0 runs slow: GPU 0")
    assert "1/8 of host bandwidth" in " ".join(text.split())
    assert "kubectl drain gpu-node-1" in text

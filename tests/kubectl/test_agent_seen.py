"""`node X` mentions what the watching agent marked on the node (its GpuDoctor conditions):
a problem True now, or cleared within the last hour; older ones and foreign conditions stay
quiet; hostile condition text is bounded and one line."""
from __future__ import annotations

import datetime as dt

from kubectl_gpudoctor.analysis.monitors import agent_seen
from node_probe.protocol import conditions
from node_probe.watch.state import ConditionState, Problem

NOW = dt.datetime(2026, 11, 26, 12, 0, tzinfo=dt.timezone.utc)
T0 = NOW.timestamp()


def _node(conds):
    return {"metadata": {"name": "gpu-1"}, "status": {"conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady"}, *conds]}}


def _agent_conditions(clear: bool, cleared_ago_s: float = 600.0):
    """The conditions exactly as the agent's own state writes them."""
    s = ConditionState(clear_after=1, now=T0 - 7200)
    s.update({"GpuDoctorDevicePluginStuck": [Problem(
        "GpuDoctorDevicePluginStuck", "deviceplugin.blocked_in_nvml", "critical",
        "nvidia.com/gpu plugin (pid 42)", "thread 43 of pid 42 entered nvmlInit_v2")]},
        now=T0 - 3600)
    if clear:
        s.update({}, now=T0 - cleared_ago_s)
    return s.api_conditions(T0)


def test_a_problem_marked_now_is_the_finding_it_names_as_nodes_reports_it():
    """Issue 36.4: the mark the agent holds now is the finding it names, at its class's
    severity, exactly as `nodes` (agent_conditions) reports it -- not a warning of its own."""
    from kubectl_gpudoctor.analysis.monitors import agent_conditions
    node = _node(_agent_conditions(clear=False))
    (f,) = agent_seen.analyze(node, NOW)
    assert f.id == "deviceplugin.blocked_in_nvml" and f.severity.value == "critical"
    assert f == next(g for g in agent_conditions.analyze(node, NOW) if g.id == f.id)
    assert f.evidence["condition"] == "GpuDoctorDevicePluginStuck"
    assert "60m" in f.title and "since" not in f.title


def test_a_problem_cleared_within_the_hour_is_still_mentioned_with_what_it_was():
    (f,) = agent_seen.analyze(_node(_agent_conditions(clear=True)), NOW)
    assert f.severity.value == "info" and "cleared since" in f.title
    # the cleared message keeps what it was: quoted, as the agent wrote it
    assert "DevicepluginBlockedInNvml" in f.quoted[0]["text"]
    assert "10m ago" in f.title


def test_old_cleared_problems_and_a_quiet_agent_stay_silent():
    assert agent_seen.analyze(_node(_agent_conditions(clear=True, cleared_ago_s=7000)), NOW) \
        == []
    quiet = ConditionState(now=T0 - 60).api_conditions(T0)
    assert agent_seen.analyze(_node(quiet), NOW) == []
    assert agent_seen.analyze({"metadata": {"name": "x"}}, NOW) == []
    foreign = [{"type": "KernelDeadlock", "status": "True"},
               {"type": "GpuDoctorSomethingNew", "status": "True"}]
    assert agent_seen.analyze(_node(foreign), NOW) == []


def test_hostile_condition_text_is_bounded_and_one_line():
    c = {"type": "GpuDoctorXidErrors", "status": "True", "reason": "GpuXid\x1b[31m",
         "message": "a\nb\x07" + "x" * 100000, "lastTransitionTime": "not a time"}
    (f,) = agent_seen.analyze(_node([c]), NOW)
    assert "\n" not in f.title and "\x1b" not in f.title and len(f.title) < 600
    assert "unknown time" in f.title
    assert conditions.finding_id_of(f.evidence["reason"]) is None


def test_the_verdict_names_the_probe_finding_not_the_agents_mark():
    from kubectl_gpudoctor.analysis import verdict
    from node_probe.protocol import catalog
    (seen,) = agent_seen.analyze(_node(_agent_conditions(clear=False)), NOW)
    probe = catalog.make("deviceplugin.blocked_in_nvml", "critical", "nvidia.com/gpu plugin",
                         "thread 43 entered nvmlInit_v2", {"pid": 42})
    v = verdict.decide([seen, probe], {"kind": "node", "name": "gpu-1", "node": "gpu-1"})
    assert v.root_cause == "deviceplugin.blocked_in_nvml"
    # the finding seen now speaks for the id: its pid, not the agent's mark from then
    assert "pid 42" in v.headline and "marked by the watching agent" not in v.headline
    alone = verdict.decide([seen], {"kind": "node", "name": "gpu-1", "node": "gpu-1"})
    assert alone.root_cause == v.root_cause and alone.severity == v.severity == "critical"
    assert "marked by the watching agent 60m ago" in alone.headline
    (cleared,) = agent_seen.analyze(_node(_agent_conditions(clear=True)), NOW)
    assert cleared.evidence["finding_id"] == "deviceplugin.blocked_in_nvml"


def test_node_reports_the_agents_current_mark_once(cluster, kubeconfig):
    """`node X` on a node the agent marks now: one finding for the mark (the id it names, as
    `nodes` reports it), not a second one for the same condition."""
    import json

    from .conftest import run_cli
    from .kubelet_dump import healthy_kubelet_dump
    node = cluster.add_node("gpu-1")
    now = dt.datetime.now(dt.timezone.utc)
    s = ConditionState(clear_after=1, now=now.timestamp() - 600)
    s.update({"GpuDoctorDevicePluginStuck": [Problem(
        "GpuDoctorDevicePluginStuck", "deviceplugin.blocked_in_nvml", "critical",
        "nvidia.com/gpu plugin (pid 42)", "thread 43 of pid 42 entered nvmlInit_v2")]},
        now=now.timestamp() - 300)
    node["status"]["conditions"] += s.api_conditions(now.timestamp())
    cluster.goroutines["gpu-1"] = healthy_kubelet_dump()
    r = run_cli("node", "gpu-1", "--kubeconfig", str(kubeconfig), "--no-probe", "-o", "json")
    doc = json.loads(r.stdout)
    about = [f for f in doc["findings"] if f["id"] in ("agent.problem_seen",
                                                        "deviceplugin.blocked_in_nvml")]
    assert [f["id"] for f in about] == ["deviceplugin.blocked_in_nvml"], about

"""The per-node verdicts `nodes` shares with `node` (analysis/monitors/agent_conditions.py,
readiness in analysis.node_objects) and the rule that a node with no room never counts as room in
the Pending-pod fit -- as pure functions over node and pod objects shaped like the 1.35 captures."""
from __future__ import annotations

import datetime as dt

from kubectl_gpudoctor import analysis
from kubectl_gpudoctor.analysis.stuck import admission
from kubectl_gpudoctor.analysis.monitors import agent_conditions, agent_marks
from kubectl_gpudoctor.analysis.scheduling import fit
from node_probe.protocol import conditions

from .fakecluster import FakeCluster
from .test_fit import NOW, pending, run
from .test_fleet_view import agent_condition, captured_node, watching


def test_captured_node_with_a_foreign_condition_is_not_ours():
    """The captured node carries a condition another writer set (GPUDevicePluginHealthy=False):
    not a GpuDoctor type, so no agent, no finding (issue 25 reads foreign ones)."""
    node = captured_node()
    assert agent_marks.watch_of(node, NOW).state == "none"
    assert agent_conditions.analyze(node, NOW) == []


def test_a_watching_agent_with_nothing_to_report_is_quiet():
    node = captured_node()
    node["status"]["conditions"] += watching(heartbeat_age_s=30)
    now = dt.datetime.now(dt.timezone.utc)
    assert agent_marks.watch_of(node, now).state == "watching"
    assert agent_conditions.analyze(node, now) == []
    fs, errs = analysis.node_objects(node, [], [], None, now)
    assert errs == [] and not [f for f in fs if f.id.startswith("agent.")]


def test_problem_cleared_by_the_agent_is_not_reported():
    node = captured_node()
    cond = agent_condition("GpuDoctorDevicePluginStuck", "False", "NoDevicePluginStuck",
                           "no problem seen in the last 2 pass(es)", 20, 40)
    node["status"]["conditions"] += [cond] + watching()[:1]
    assert agent_conditions.analyze(node, dt.datetime.now(dt.timezone.utc)) == []


def test_stale_agent_marks_are_reported_as_stale_but_not_on_a_not_ready_node():
    node = captured_node()
    node["status"]["conditions"] += watching(
        heartbeat_age_s=conditions.STALE_AFTER_S + 60, problems={
            "GpuDoctorMemoryThrash": (conditions.reason_of("memory.pressure"),
                                      "memory.pressure: node: refaults", 4000)})
    now = dt.datetime.now(dt.timezone.utc)
    by = {f.id: f for f in agent_conditions.analyze(node, now)}
    assert set(by) == {"memory.pressure", "agent.heartbeat_stale"}
    assert by["memory.pressure"].evidence["stale"] is True and "stale" in by[
        "memory.pressure"].title
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    ready["status"] = "Unknown"
    assert {f.id for f in agent_conditions.analyze(node, now)} == {"memory.pressure"}


def test_node_objects_say_not_ready_like_node_does():
    fc = FakeCluster()
    node = fc.add_node("gpu-1", ready=False, now=NOW, lease_age_s=600)
    fs, _ = analysis.node_objects(node, [], [], fc.leases["gpu-1"], NOW)
    (f,) = [f for f in fs if f.id == "node.not_ready"]
    assert f.severity.value == "critical" and f.evidence["lease_renew_age_s"] >= 600
    healthy = fc.add_node("gpu-2", now=NOW)
    fs, _ = analysis.node_objects(healthy, [], [], fc.leases["gpu-2"], NOW)
    assert fs == []


# -- the fit: no room where no new pod can run ------------------------------------------------

def _fleet_with_one_free_node():
    fc = FakeCluster()
    fc.add_node("gpu-full", gpus=8, now=NOW)
    fc.add_pod("research", "sweep", "gpu-full", gpus=8, now=NOW)
    fc.add_node("gpu-free", gpus=8, now=NOW)
    return fc


def test_free_gpus_on_a_node_whose_kubelet_admits_nothing_are_no_room():
    fc = _fleet_with_one_free_node()
    pod = pending(fc, gpus=4)
    assert run(fc, pod)[0].id == "pod.pending_explained"     # fits on gpu-free
    # a pod bound to gpu-free ten minutes ago that its kubelet never touched
    fc.add_pod("ml", "stuck", "gpu-free", phase="Pending", gpus=1, age_s=600, now=NOW,
               events="scheduled-only")
    assert admission.stalled_nodes(fc.pods.values(), NOW) == {
        "gpu-free": "1 pod(s) bound to it untouched by its kubelet for up to 10m"}
    f = run(fc, pod)[0]
    assert f.id == "pod.gpu_placement_excluded", f.title
    (node,) = f.evidence["nodes"]
    assert node["node"] == "gpu-free" and any("admits no pod" in r for r in node["excluded_by"])


def test_tolerated_not_ready_or_cordoned_node_is_still_no_room():
    for change in ("not_ready", "cordoned"):
        fc = _fleet_with_one_free_node()
        node = fc.nodes["gpu-free"]
        if change == "not_ready":
            node["status"]["conditions"][-1]["status"] = "Unknown"
            node["spec"]["taints"] = [{"key": "node.kubernetes.io/unreachable",
                                       "effect": "NoSchedule"}]
        else:
            node["spec"]["unschedulable"] = True
            node["spec"]["taints"] = [{"key": "node.kubernetes.io/unschedulable",
                                       "effect": "NoSchedule"}]
        pod = pending(fc, gpus=4)
        pod["spec"]["tolerations"] = [{"operator": "Exists"}]   # tolerates every taint
        f = run(fc, pod)[0]
        assert f.id == "pod.gpu_placement_excluded", (change, f.title)
        rules = f.evidence["nodes"][0]["excluded_by"]
        assert any(("NotReady" if change == "not_ready" else "cordoned") in r for r in rules)


def test_healthy_fleet_fit_unchanged():
    fc = _fleet_with_one_free_node()
    pod = pending(fc, gpus=4)
    f = run(fc, pod)[0]
    assert f.id == "pod.pending_explained" and f.evidence["nodes"][0]["node"] == "gpu-free"
    assert fit.compute(pod, list(fc.nodes.values()), list(fc.pods.values()), NOW,
                       {}).case == fit.FITS_CASE
    assert f.evidence["nodes_fitting"] == 1

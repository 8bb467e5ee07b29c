"""Our conditions as automation reads them (issue 31 item 3; docs/agent.md "For automation").

Each consumer's rule is written here as its own source or documentation states it, and run
against the node the agent's patches leave behind: every PATCH the agent's state sends is
applied as a real 1.35 API server applies it (tests/kubectl/apiwrites.patch_node, captures
admission-and-conditions c01-c06: merge by type, a field not sent is kept).

- Karpenter's node repair (kubernetes-sigs/karpenter pkg/controllers/node/health/controller.go,
  findUnhealthyConditions): a repair policy {ConditionType, ConditionStatus, TolerationDuration}
  matches when `nodeCondition.Status == policy.ConditionStatus`, and the node is replaced at
  `nodeCondition.LastTransitionTime.Add(policy.TolerationDuration)`.
- EKS node auto repair (docs.aws.amazon.com/eks/latest/userguide/node-repair.html): a node
  condition in its unhealthy status for its "Repair after" time (10m for
  AcceleratedHardwareReady, 30m for the others), through the same Karpenter mechanism or
  managed node groups; it reads its own condition types, so ours count only where a repair
  policy names them.
- GKE node auto-repair (cloud.google.com/kubernetes-engine/docs/how-to/node-auto-repair): the
  node's Ready status (NotReady ~10 min, no status ~10 min) and its boot disk; no custom
  condition. Ours must never touch Ready.
- node-problem-detector's consumers (e.g. a remedy system reading its permanent conditions,
  github.com/kubernetes/node-problem-detector README): type and status, True while the problem
  lasts, False once it is gone.
"""
from __future__ import annotations

import copy
import datetime as dt
import json
from pathlib import Path

from node_probe.watch.state import ConditionState, Problem, parse_time
from tests.kubectl import apiwrites

CAP = Path(__file__).resolve().parents[1] / "data/captures/k8s-1.35/node-status-writes"
LOST = "GpuDoctorGpuLost"
MIN = 60.0


def _lost(title="Xid 79: GPU has fallen off the bus"):
    return {LOST: [Problem(LOST, "gpu.lost", "critical", "pci 0000:3b:00", title)]}


class Node:
    """The node object on the server, patched as the real one is."""

    def __init__(self) -> None:
        self.obj = json.loads((CAP / "patch-own-node-status.200.json").read_text())
        self.obj["status"]["conditions"] = [c for c in self.obj["status"]["conditions"]
                                            if c["type"] in ("MemoryPressure", "DiskPressure",
                                                             "PIDPressure", "Ready")]
        self.ready = copy.deepcopy(next(c for c in self.obj["status"]["conditions"]
                                        if c["type"] == "Ready"))

    def patch(self, state: ConditionState, now: float) -> None:
        code, _ = apiwrites.patch_node(self.obj, apiwrites.SMP, {"status": {
            "conditions": state.api_conditions(now)}}, "gpu-doctor-agent", True)
        assert code == 200

    def cond(self, ctype: str) -> dict:
        return next(c for c in self.obj["status"]["conditions"] if c["type"] == ctype)


def karpenter_repairs_at(node: Node, ctype: str, status: str, toleration_s: float
                         ) -> float | None:
    """findUnhealthyConditions: the time the node is replaced, None when it does not match."""
    c = node.cond(ctype)
    if c["status"] != status:
        return None
    return parse_time(c["lastTransitionTime"]) + toleration_s


def test_karpenter_and_eks_repair_fire_once_the_toleration_passed_whatever_happens_meanwhile():
    """The problem stays (a lost GPU): heartbeats, a new message, a new reason and an agent
    restart all happen within the toleration; the repair time never moves, so the repair
    fires (eks-node-monitoring-agent #39: a reason change that resets lastTransitionTime
    keeps repair from ever firing)."""
    node, t0 = Node(), 1_800_000_000.0
    s = ConditionState(clear_after=2, now=t0, clear_quiet_s=MIN)
    s.update(_lost(), now=t0)
    node.patch(s, t0)
    due = karpenter_repairs_at(node, LOST, "True", 10 * MIN)   # EKS: "Repair after" 10m
    assert due == t0 + 10 * MIN
    for i in range(1, 20):                                       # passes every 30 s
        t = t0 + 30 * i
        s.update(_lost(f"Xid 79 x{i}"), now=t)                   # a new message
        if i == 7:
            s.update({LOST: [Problem(LOST, "gpu.lost", "critical", "pci 0000:3b:00",
                                     "NVML: GPU is lost")]}, now=t)  # a new reason's wording
        if i == 9:                                               # the agent pod is replaced
            s.stopped("upgrade", now=t)
            node.patch(s, t)
            s = ConditionState(clear_after=2, now=t, clear_quiet_s=MIN)
            s.adopt(node.obj["status"]["conditions"], now=t)
            s.update(_lost(), now=t)
        node.patch(s, t)
        assert karpenter_repairs_at(node, LOST, "True", 10 * MIN) == due


def test_a_cleared_problem_does_not_match_and_keeps_what_it_was():
    """eks-node-monitoring-agent #266: a condition that never clears after recovery makes
    auto-repair replace a healthy node. Ours goes False (no repair policy on True matches)
    and its message keeps what the problem was."""
    node, t0 = Node(), 1_800_000_000.0
    s = ConditionState(clear_after=2, now=t0, clear_quiet_s=MIN)
    s.update(_lost(), now=t0)
    node.patch(s, t0)
    for t in (t0 + 30, t0 + 60, t0 + 90):
        s.update({}, now=t)
        node.patch(s, t)
    c = node.cond(LOST)
    assert c["status"] == "False" and karpenter_repairs_at(node, LOST, "True", 10 * MIN) is None
    assert "was " in c["message"] and "GPU has fallen off the bus" in c["message"]
    # it moved on the flip only: 2 passes without it and 60 s quiet
    assert parse_time(c["lastTransitionTime"]) == t0 + 60


def test_a_flapping_fault_does_not_reset_the_repair_clock():
    """On 5 s, off 5 s for ten minutes: with the quiet window the class stays True from its
    first pass, so a repair policy fires at its toleration instead of being reset each flip."""
    node, t0 = Node(), 1_800_000_000.0
    s = ConditionState(clear_after=2, now=t0, clear_quiet_s=MIN)
    for i in range(120):
        t = t0 + 5 * i
        s.update(_lost() if i % 2 == 0 else {}, now=t)
        node.patch(s, t)
    assert karpenter_repairs_at(node, LOST, "True", 10 * MIN) == t0 + 10 * MIN


def test_gke_and_the_kubelet_see_ready_untouched():
    """GKE repairs on Ready alone; the agent's patches (merged by type) never touch it."""
    node, t0 = Node(), 1_800_000_000.0
    s = ConditionState(clear_after=1, now=t0)
    for i in range(10):
        s.update(_lost() if i < 5 else {}, now=t0 + 30 * i)
        node.patch(s, t0 + 30 * i)
    assert node.cond("Ready") == node.ready


def test_npd_style_consumers_read_type_and_status():
    """A consumer of node-problem-detector's conditions acts on type and status: True while the
    problem lasts, False after; GpuDoctorWatching True says a writer is alive."""
    node, t0 = Node(), 1_800_000_000.0
    s = ConditionState(clear_after=1, now=t0)
    s.update(_lost(), now=t0)
    node.patch(s, t0)
    assert (node.cond(LOST)["status"], node.cond("GpuDoctorWatching")["status"]) == (
        "True", "True")
    s.update({}, now=t0 + 30)
    node.patch(s, t0 + 30)
    assert node.cond(LOST)["status"] == "False"
    s.stopped("SIGTERM", now=t0 + 60)
    node.patch(s, t0 + 60)
    assert node.cond("GpuDoctorWatching")["status"] == "False"
    assert dt.datetime.fromtimestamp(parse_time(node.cond(LOST)["lastTransitionTime"]),
                                     dt.timezone.utc).year == 2027

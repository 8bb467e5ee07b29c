"""Hysteresis of the agent's conditions (node_probe/watch/state.py) and the recency rule for
kernel-log findings (detect.is_active)."""
from node_probe.protocol import Finding, conditions
from node_probe.watch.detect import Provoker, is_active, problems_of
from node_probe.watch.state import ConditionState, Problem

XID = "GpuDoctorXidErrors"


def _p(fid="gpu.xid", sev="critical", subject="pci 0000:3b:00.0", title="Xid 95 x9000"):
    return Problem(conditions.class_of(fid), fid, sev, subject, title)


def test_true_at_once_false_only_after_n_absent_passes():
    s = ConditionState(clear_after=3, now=0.0)
    (t,) = s.update({XID: [_p()]}, now=10.0)
    assert (t.ctype, t.status, t.reason) == (XID, "True", "GpuXid")
    assert s.conds[XID].transition == 10.0
    assert s.update({}, now=40.0) == [] and s.update({}, now=70.0) == []
    assert s.conds[XID].status == "True"
    (t,) = s.update({}, now=100.0)
    assert t.status == "False" and s.conds[XID].transition == 100.0
    assert s.conds[XID].reason == "XidErrorsCleared"


def test_a_problem_back_before_n_passes_resets_the_count_and_keeps_the_transition_time():
    s = ConditionState(clear_after=2, now=0.0)
    s.update({XID: [_p()]}, now=10.0)
    s.update({}, now=40.0)
    assert s.update({XID: [_p(title="Xid 95 x9500")]}, now=70.0) == []  # no new transition
    assert s.conds[XID].transition == 10.0 and "x9500" in s.conds[XID].message
    assert s.update({}, now=100.0) == []
    assert s.conds[XID].status == "True"


def test_a_pass_that_could_not_look_is_neither_present_nor_absent():
    s = ConditionState(clear_after=1, now=0.0)
    s.update({XID: [_p()]}, now=10.0)
    assert s.update({}, unsure={XID}, now=40.0) == []
    assert s.conds[XID].status == "True"
    assert s.update({}, now=70.0)[0].status == "False"


def test_message_names_the_worst_and_counts_the_rest():
    s = ConditionState()
    s.update({XID: [_p(sev="warning", title="Xid 13"), _p(title="Xid 95\nx2", subject="pci b")]})
    c = s.conds[XID]
    assert c.message == "gpu.xid: pci b: Xid 95 x2 (+1 more)"
    assert c.reason == conditions.reason_of("gpu.xid")


def _xid(age, sev="critical"):
    return Finding("gpu.xid", sev, "pci 0000:3b:00.0", "Xid 95", {"last_age_s": age})


def test_old_kernel_log_reports_do_not_hold_a_condition():
    assert is_active(_xid(30.0)) and is_active(_xid(None))
    assert not is_active(_xid(3600.0))
    assert not is_active(_xid(5.0, sev="info"))
    assert not is_active(Finding("memory.pressure", "ok", "node", "No memory pressure"))
    assert not is_active(Finding("nvml.inventory", "critical", "node", "x"))  # not watched
    assert list(problems_of([_xid(1.0), _xid(9999.0)])) == ["GpuDoctorXidErrors"]


def test_provoking_needs_a_signal_and_is_rate_limited():
    pv = Provoker(min_gap_s=600)
    assert not pv.want(0.0)
    pv.observe([Finding("nvml.init_hang", "critical", "node", "hang")])
    assert pv.want(0.0)
    pv.used(0.0)
    assert not pv.want(599.0) and pv.want(600.0)
    pv.observe([])
    assert not pv.want(10000.0)


def test_signature_changes_only_with_what_a_patch_would_change():
    s = ConditionState(now=0.0)
    sig = s.signature()
    s.update({}, now=30.0)
    assert s.signature() == sig  # a quiet pass: nothing to write until the heartbeat
    s.update({XID: [_p()]}, now=60.0)
    assert s.signature() != sig


def test_within_a_class_the_most_specific_finding_names_it():
    s = ConditionState()
    ct = "GpuDoctorDevicePluginStuck"
    s.update({ct: [Problem(ct, "nvml.init_hang", "critical", "node", "hang"),
                   Problem(ct, "deviceplugin.blocked_in_nvml", "critical", "plugin", "stuck")]})
    assert s.conds[ct].reason == "DevicepluginBlockedInNvml"


def test_agent_watch_bad_setup_is_one_line_and_exit_2(tmp_path):
    import os
    import subprocess
    import sys
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": repo}
    for args, want in ((["--no-api"], "no valid node name"),
                       (["--node-name", "n1"], "not in a cluster"),
                       (["--node-name", "Bad/Name", "--no-api"], "no valid node name"),
                       (["--node-name", "n1", "--no-api", "--evidence-dir",
                         str(tmp_path / "f" / "x")], None),
                       (["--node-name", "n1", "--interval", "soon"], "--interval")):
        if want is None:  # the evidence directory's parent is a file: refused up front
            (tmp_path / "f").write_text("")
            want = "Not a directory"
        r = subprocess.run([sys.executable, "-m", "node_probe", "agent-watch", *args],
                           capture_output=True, text=True, timeout=60, env=env, cwd=repo)
        assert r.returncode == 2, (args, r.stderr)
        assert want in r.stderr and r.stderr.count("\n") == 1, (args, r.stderr)


def test_reason_and_message_changes_never_move_the_transition_time():
    s = ConditionState(clear_after=2, now=0.0)
    s.update({XID: [_p()]}, now=10.0)
    s.update({XID: [_p(fid="gpu.xid", title="Xid 79 x3")]}, now=20.0)
    s.update({XID: [_p(sev="warning", title="Xid 13 x1")]}, now=30.0)
    assert s.conds[XID].transition == 10.0 and "Xid 13" in s.conds[XID].message


def test_a_new_agent_adopts_what_the_node_carries():
    """The node as a real 1.35 API server returned it after the agent's patches (capture
    admission-and-conditions c07): a new agent pod keeps each class's status and
    lastTransitionTime instead of writing them anew (issue 31 item 3)."""
    import json
    from pathlib import Path
    cap = json.loads((Path(__file__).resolve().parents[1] / "data/captures/k8s-1.35/"
                      "admission-and-conditions/c07-get-node-two-custom-conditions.200.json")
                     .read_text())
    conds = cap["status"]["conditions"]
    stuck = next(c for c in conds if c["type"] == "GpuDoctorDevicePluginStuck")
    s = ConditionState(clear_after=2, now=2e9)
    kept = s.adopt(conds, now=2e9)
    assert "GpuDoctorDevicePluginStuck" in kept
    c = s.conds["GpuDoctorDevicePluginStuck"]
    assert c.status == stuck["status"]
    assert c.to_api(2e9)["lastTransitionTime"] == stuck["lastTransitionTime"]
    # the kubelet's conditions and forged times are not taken
    assert s.adopt([{"type": "Ready", "status": "True"},
                    {"type": XID, "status": "True", "lastTransitionTime": "tomorrow"}]) == []


def test_a_true_class_clears_only_after_its_quiet_window():
    s = ConditionState(clear_after=1, now=0.0, clear_quiet_s=60.0)
    s.update({XID: [_p()]}, now=10.0)
    for t in (11.0, 13.0, 15.0):              # flapping: absent, back, absent...
        assert s.update({}, now=t) == []
        s.update({XID: [_p()]}, now=t + 1)
    assert s.update({}, now=50.0) == [] and s.conds[XID].status == "True"
    (tr,) = s.update({}, now=80.0)            # 64 s after it was last seen
    assert tr.status == "False" and s.conds[XID].transition == 80.0


def test_stopping_flips_watching_only():
    s = ConditionState(clear_after=1, now=0.0)
    s.update({XID: [_p()]}, now=10.0)
    s.stopped("the agent stopped", now=20.0)
    assert (s.watching.status, s.watching.reason, s.watching.transition) == (
        "False", "AgentStopped", 20.0)
    assert s.conds[XID].status == "True" and s.conds[XID].transition == 10.0

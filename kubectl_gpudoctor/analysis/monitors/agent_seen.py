"""What the watching agent saw on a node, from the GpuDoctor conditions it writes (`node X`).

Why: the incidents the tool is for come and go; by the time someone runs `node X` the plugin may
have been restarted and the node looks healthy. The agent keeps one NodeCondition per problem
class (node_probe/protocol/conditions.py): True while the problem lasts, False with a message
saying what it was once it cleared. A class True now, or cleared within the last hour, becomes a
finding that names the problem, when, and the way to the evidence (`node X --history`). The
conditions are read (bounded, one line, reasons mapped only to their class's ids) by
agent_marks, the same reader `nodes` uses, so both commands see the same marks; this module
only words them. All text is kept as data, never a command.
"""
from __future__ import annotations

import datetime as dt
from typing import Any, Mapping

from node_probe.protocol import Finding, catalog, quote

from ..common import fmt_duration
from ..quoting import word
from . import agent_conditions
from .agent_marks import one_line, read_marks, watch_from

WINDOW_S = 3600.0
REFS = ("https://kubernetes.io/docs/concepts/architecture/nodes/#condition",
        "https://github.com/kubernetes/node-problem-detector")


def analyze(node: Mapping[str, Any], now: dt.datetime, window_s: float = WINDOW_S
            ) -> list[Finding]:
    name = one_line((node.get("metadata") or {}).get("name"), 253) or "node"
    history = (f"`kubectl gpu-doctor node {name} --history` lists the evidence the agent "
               f"captured when it started; `--history N` replays one.")
    out = []
    marks = read_marks(node, now)
    current = watch_from(marks).state == "watching"
    # a mark the agent holds now, on a node it still watches: the finding it names, at its
    # class's severity, exactly as `nodes` reports it (agent_conditions), so `node X`, `node X
    # --no-probe`, the `nodes` row and MCP reach the same root cause and severity (issue 36)
    named = {}
    if current:
        for f in agent_conditions.analyze(node, now):
            e = f.evidence if isinstance(f.evidence, Mapping) else {}
            if e.get("source") == agent_conditions.SOURCE and e.get("condition"):
                named.setdefault(e.get("condition"), f)
    for m in marks:
        if m.active and not m.foreign and m.type in named:
            out.append(named[m.type])
            continue
        recent = m.cleared and m.since_s is not None and m.since_s <= window_s
        if not (m.active or recent):
            continue
        if m.foreign:  # G-01: another node-status writer's word, never above the tool's own
            out.append(catalog.make(
                "agent.problem_seen", "info", m.type,
                f"{m.type} {m.status} was written by another node-status writer, not the "
                f"gpu-doctor agent (the writer and its message are quoted)",
                {"condition": m.type, "status": m.status, "reason": m.reason,
                 "message": m.message, "reported_by": list(m.writers),
                 "last_transition_time": m.last_transition_time},
                f"Not the agent's mark: ask who runs the writer named in the node's "
                f"managedFields; the node probe's findings below are what the tool saw itself.",
                REFS, quoted=(quote(f"condition {m.type}", "message", m.message or m.reason),
                              quote(f"condition {m.type}", "managedFields manager",
                                    m.reported_by))))
            continue
        ev = {"condition": m.type, "status": m.status, "reason": m.reason,
              "message": m.message, "last_transition_time": m.last_transition_time,
              "last_heartbeat_time": m.last_heartbeat_time, "finding_id": m.finding_id}
        if m.finding_id:  # the verdict links it: a symptom of that finding when the probe sees it
            ev["caused_by"] = [m.finding_id]
        ago = f"{fmt_duration(m.since_s)} ago" if m.since_s is not None else "at an unknown time"
        what = m.type + (f" ({m.finding_id})" if m.finding_id else
                         f" ({word(m.reason)})" if m.reason else "")
        said = (quote(f"condition {m.type}", "message", m.message or m.reason),)
        if m.active and not current:  # its writer is gone: not presented as current
            out.append(catalog.make(
                "agent.problem_seen", "info", m.type,
                f"The watching agent marked this node {what} {ago}, before it stopped "
                f"watching (not current; its message is quoted)",
                ev, f"{history} The node probe's findings below say whether it still holds.",
                REFS, quoted=said))
        elif m.active:
            out.append(catalog.make(
                "agent.problem_seen", "warning", m.type,
                f"The watching agent marks this node {what} since {ago} (its message is quoted)",
                ev, f"{history} The node probe's findings below say whether it still holds.",
                REFS, quoted=said))
        else:
            out.append(catalog.make(
                "agent.problem_seen", "info", m.type,
                f"The watching agent saw {what} until {ago} (cleared since; its message is quoted)",
                ev, f"An intermittent problem: it may come back. {history}", REFS,
                quoted=said))
    return out

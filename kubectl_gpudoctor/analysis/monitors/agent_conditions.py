"""What the watching agent wrote on a node: its problems as findings, and whether it still watches.

Why: the agent (`agent install --watch`) marks its own node with one NodeCondition per problem
class (node_probe/protocol/conditions.py, node-problem-detector's format) and refreshes their
heartbeat. Those conditions arrive with the node list `nodes` already fetches, so the node-side
health of every watched node is known with no exec and no debug pod; and a GPU node whose
agent heartbeat is missing or stale is a node whose next wedge nobody sees.

The conditions are read by agent_marks, the one reader `node X` (agent_seen) shares: at most a
bounded number of entries, the contract's types only, each field one bounded line, reasons
mapped only to ids of their own class; nothing is executed or trusted as a fix. This module
only turns the marks into findings. Pure function over the raw node dict; no I/O.
"""
from __future__ import annotations

import datetime as dt
from typing import Any, Mapping

from node_probe.protocol import Finding, catalog, conditions, quote

from ..common import fmt_duration, node_is_ready
from ..quoting import word
from .agent_marks import read_marks, watch_from

SOURCE = "gpu-doctor agent"
# how bad each problem class is when the agent reports it (the condition carries no severity)
SEVERITY = {
    "GpuDoctorDevicePluginStuck": "critical",
    "GpuDoctorDeviceAccessLost": "critical",
    "GpuDoctorGpuLost": "critical",
    "GpuDoctorFabricNotReady": "critical",
    "GpuDoctorIsolationBreach": "critical",
    "GpuDoctorXidErrors": "warning",
    "GpuDoctorKernelHungTask": "warning",
    "GpuDoctorMemoryThrash": "warning",
    "GpuDoctorGpuDegraded": "warning",
}
REFS = ("https://kubernetes.io/docs/concepts/architecture/nodes/#condition",
        "https://github.com/kubernetes/node-problem-detector")


def _said(m: Any, node: str) -> tuple:
    """The condition's message (and, for another writer, its name), quoted: whoever can
    patch nodes/status can write them (audit round 5, MCP-01)."""
    out = [quote(f"node/{node} condition {m.type}", "message", m.message)] if m.message else []
    if m.foreign:
        out.append(quote(f"node/{node} condition {m.type}", "managedFields manager",
                         m.reported_by))
    return tuple(out)


def analyze(node: Mapping[str, Any], now: dt.datetime) -> list[Finding]:
    """One finding per problem the agent marks on the node (status True), with its age; and
    agent.heartbeat_stale when the agent's marks are older than the contract allows."""
    name = str((node.get("metadata") or {}).get("name") or "")
    subject = f"node/{name}"
    marks = read_marks(node, now)
    watch = watch_from(marks)
    if watch.state == "none":
        return []
    stale = watch.state == "stale"
    stopped = watch.state == "stopped"
    out: list[Finding] = []
    for m in marks:
        if not m.active:
            continue
        ctype, reason, fid, message = m.type, m.reason, m.finding_id, m.message
        since, beat = m.since_s, m.heartbeat_age_s
        evidence = {"source": SOURCE, "condition": ctype, "reason": reason,
                    "message": message or None,
                    "since_s": None if since is None else round(since),
                    "heartbeat_age_s": None if beat is None else round(beat),
                    "stale": stale or stopped, "reported_by": list(m.writers) or None}
        when = f"for {fmt_duration(since)}" if since is not None else "since an unknown time"
        what = fid or f"{ctype} ({reason})"
        if m.foreign:
            # G-01: anyone with nodes/status patch can write this; it is their word, not the
            # tool's evidence: named as theirs, ranked below anything the tool saw itself
            out.append(catalog.make(
                "agent.condition", "info", subject,
                f"{ctype} on {name} was written by another node-status writer, not the "
                f"gpu-doctor agent ({word(reason)}; the writer and its message are quoted)",
                {**evidence, "source": "another node-status writer"},
                f"Not the agent's mark: ask who runs the writer named in the node's "
                f"managedFields. For the tool's own evidence: `kubectl gpu-doctor node {name}`.",
                REFS, quoted=_said(m, name)))
            continue
        title = (f"the gpu-doctor agent on {name} reported {what} {when}"
                 + (" (its heartbeat is stale: this may be outdated)" if stale else "")
                 + (" before it stopped: not current" if stopped else "")
                 + (" (its message is quoted)" if message else "")) if stale or stopped else \
            (f"the gpu-doctor agent on {name} reports {what} {when}"
             + (" (its message is quoted)" if message else ""))
        fix = (f"The agent saw this on the node itself. For the evidence now: `kubectl "
               f"gpu-doctor node {name}`; `kubectl gpu-doctor explain {fid or 'agent.condition'}`"
               f" explains the problem and its fix.")
        # a mark whose writer is gone is not presented as current (issue 31)
        sev = "info" if stale or stopped else SEVERITY.get(ctype, "warning")
        out.append(catalog.make(fid or "agent.condition", sev, subject, title, evidence, fix,
                                REFS, quoted=_said(m, name)))
    if stopped and node_is_ready(node) is not False:
        out.append(catalog.make(
            "agent.heartbeat_stale", "warning", subject,
            f"the gpu-doctor agent on {name} stopped (it marked GpuDoctorWatching False): "
            f"problems on this node go unseen",
            {"source": SOURCE, "heartbeat_age_s": None if watch.heartbeat_age_s is None
             else round(watch.heartbeat_age_s), "stopped": True},
            f"Is the agent pod on {name} running? `kubectl gpu-doctor agent status`. An agent "
            f"uninstalled on purpose removes its conditions (`kubectl gpu-doctor agent "
            f"uninstall`).", REFS))
    if stale and node_is_ready(node) is not False:  # a NotReady node stops its agent too:
        age = watch.heartbeat_age_s                  # node.not_ready says so already
        out.append(catalog.make(
            "agent.heartbeat_stale", "warning", subject,
            f"the gpu-doctor agent on {name} stopped refreshing its node conditions "
            + (f"{fmt_duration(age)} ago" if age is not None else "(no heartbeat time)")
            + ": problems on this node go unseen",
            {"source": SOURCE, "heartbeat_age_s": None if age is None else round(age),
             "stale_after_s": conditions.STALE_AFTER_S},
            f"Is the agent pod on {name} running? `kubectl gpu-doctor agent status`; "
            f"`kubectl -n gpu-doctor get pods -o wide --field-selector spec.nodeName={name}`. "
            f"An agent uninstalled on purpose leaves its conditions on the node object: "
            f"reinstall it (`kubectl gpu-doctor agent install`) to watch the node again.",
            REFS))
    return out

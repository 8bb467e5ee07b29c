"""What the watching agent saw on a node, from the GpuDoctor conditions it writes.

Why: the incidents the tool is for come and go; by the time someone runs `node X` the plugin may
have been restarted and the node looks healthy. The agent keeps one NodeCondition per problem
class (node_probe/protocol/conditions.py): True while the problem lasts, False with a message
saying what it was once it cleared. A class True now, or cleared within the last hour, becomes a
finding that names the problem, when, and the way to the evidence (`node X --history`). All
text comes from the node object (anyone who may patch node status wrote it): bounded and kept
as data, never a command.
"""
from __future__ import annotations

import datetime as dt
import re
from typing import Any, Mapping

from node_probe.protocol import Finding, catalog, conditions

from .common import age_s, fmt_duration

WINDOW_S = 3600.0
_WAS = re.compile(r"\bwas ([A-Za-z0-9]{1,128}):")  # a cleared condition's message (watch/state)
MAX_TEXT = 300
REFS = ("https://kubernetes.io/docs/concepts/architecture/nodes/#condition",
        "https://github.com/kubernetes/node-problem-detector")


def _text(v: Any) -> str:
    return conditions.sanitize_message(str(v or ""), MAX_TEXT)


def analyze(node: Mapping[str, Any], now: dt.datetime, window_s: float = WINDOW_S
            ) -> list[Finding]:
    name = _text((node.get("metadata") or {}).get("name")) or "node"
    out = []
    conds = ((node.get("status") or {}).get("conditions")) or []
    for c in conds[:64] if isinstance(conds, list) else ():
        if not isinstance(c, dict) or not conditions.is_owned(c):
            continue
        ctype = _text(c.get("type"))
        if ctype not in conditions.CLASSES:
            continue
        since = age_s(c.get("lastTransitionTime"), now)
        status, reason, msg = c.get("status"), _text(c.get("reason")), _text(c.get("message"))
        was = _WAS.search(msg) if status == "False" else None
        fid = conditions.finding_id_of(was.group(1) if was else reason)
        ev = {"condition": ctype, "status": status, "reason": reason, "message": msg,
              "last_transition_time": _text(c.get("lastTransitionTime")),
              "last_heartbeat_time": _text(c.get("lastHeartbeatTime")),
              "finding_id": fid}
        if fid:  # the verdict links it: a symptom of that finding when the probe sees it too
            ev["caused_by"] = [fid]
        ago = f"{fmt_duration(since)} ago" if since is not None else "at an unknown time"
        history = (f"`kubectl gpu-doctor node {name} --history` lists the evidence the agent "
                   f"captured when it started; `--history N` replays one.")
        if status == "True":
            out.append(catalog.make(
                "agent.problem_seen", "warning", ctype,
                f"The watching agent marks this node {ctype} since {ago}: {msg or reason}",
                ev, f"{history} The node probe's findings below say whether it still holds.",
                REFS))
        elif status == "False" and reason == conditions.cleared_reason(ctype) and \
                since is not None and since <= window_s:
            out.append(catalog.make(
                "agent.problem_seen", "info", ctype,
                f"The watching agent saw {ctype} until {ago} (cleared since): {msg or reason}",
                ev, f"An intermittent problem: it may come back. {history}", REFS))
    return out

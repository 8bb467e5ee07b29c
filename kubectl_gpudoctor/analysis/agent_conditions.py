"""What the watching agent wrote on a node: its problems as findings, and whether it still watches.

Why: the agent (`agent install --watch`) marks its own node with one NodeCondition per problem
class (node_probe/protocol/conditions.py, node-problem-detector's format) and refreshes their
heartbeat. Those conditions arrive with the node list `nodes` already fetches, so the node-side
health of every watched node is known with no exec and no debug pod; and a GPU node whose
agent heartbeat is missing or stale is a node whose next wedge nobody sees.

Everything read here was written by a process on the node: reasons are only mapped to ids the
contract knows, messages are cut to one bounded line, nothing is executed or trusted as a fix.
Pure function over the raw node dict; no I/O.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any, Mapping

from node_probe.protocol import Finding, catalog, conditions

from .common import age_s, fmt_duration, node_is_ready

SOURCE = "gpu-doctor agent"
MESSAGE_SHOWN = 300   # characters of the agent's message kept in a title / evidence
# how bad each problem class is when the agent reports it (the condition carries no severity)
SEVERITY = {
    "GpuDoctorDevicePluginStuck": "critical",
    "GpuDoctorDeviceAccessLost": "critical",
    "GpuDoctorGpuLost": "critical",
    "GpuDoctorFabricNotReady": "critical",
    "GpuDoctorXidErrors": "warning",
    "GpuDoctorKernelHungTask": "warning",
    "GpuDoctorMemoryThrash": "warning",
}
REFS = ("https://kubernetes.io/docs/concepts/architecture/nodes/#condition",
        "https://github.com/kubernetes/node-problem-detector")


@dataclasses.dataclass(frozen=True)
class Watch:
    """The agent's presence on one node: `state` is "watching", "stale" or "none"."""
    state: str
    heartbeat_age_s: float | None = None

    def to_dict(self) -> dict:
        return {"state": self.state, "heartbeat_age_s":
                None if self.heartbeat_age_s is None else round(self.heartbeat_age_s)}


def _one_line(value: Any, limit: int = MESSAGE_SHOWN) -> str:
    text = conditions.sanitize_message(str(value or ""), limit * 4)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def watch_of(node: Mapping[str, Any], now: dt.datetime) -> Watch:
    """Whether a gpu-doctor agent watches this node: its conditions' newest heartbeat."""
    owned = [c for c in (node.get("status") or {}).get("conditions") or ()
             if isinstance(c, Mapping) and conditions.is_owned(c)]
    if not owned:
        return Watch("none")
    ages = [a for a in (age_s(c.get("lastHeartbeatTime"), now) for c in owned) if a is not None]
    newest = min(ages) if ages else None
    watching = next((c for c in owned if c.get("type") == conditions.WATCHING_TYPE), None)
    alive = (watching is not None and watching.get("status") == "True" and newest is not None
             and newest <= conditions.STALE_AFTER_S)
    return Watch("watching" if alive else "stale", newest)


def analyze(node: Mapping[str, Any], now: dt.datetime) -> list[Finding]:
    """One finding per problem the agent marks on the node (status True), with its age; and
    agent.heartbeat_stale when the agent's marks are older than the contract allows."""
    name = str((node.get("metadata") or {}).get("name") or "")
    subject = f"node/{name}"
    watch = watch_of(node, now)
    if watch.state == "none":
        return []
    stale = watch.state == "stale"
    out: list[Finding] = []
    for c in (node.get("status") or {}).get("conditions") or ():
        if not isinstance(c, Mapping):
            continue
        ctype = str(c.get("type") or "")
        if ctype not in conditions.CLASSES or c.get("status") != "True":
            continue
        reason = _one_line(c.get("reason"), 128)
        fid = conditions.finding_id_of(reason, conditions.CLASSES[ctype])
        since = age_s(c.get("lastTransitionTime"), now)
        beat = age_s(c.get("lastHeartbeatTime"), now)
        message = _one_line(c.get("message"))
        evidence = {"source": SOURCE, "condition": ctype, "reason": reason,
                    "message": message or None,
                    "since_s": None if since is None else round(since),
                    "heartbeat_age_s": None if beat is None else round(beat),
                    "stale": stale}
        when = f"for {fmt_duration(since)}" if since is not None else "since an unknown time"
        what = fid or f"{ctype} ({reason})"
        title = (f"the gpu-doctor agent on {name} reports {what} {when}"
                 + (" (its heartbeat is stale: this may be outdated)" if stale else "")
                 + (f": {message}" if message else ""))
        fix = (f"The agent saw this on the node itself. For the evidence now: `kubectl "
               f"gpu-doctor node {name}`; `kubectl gpu-doctor explain {fid or 'agent.condition'}`"
               f" explains the problem and its fix.")
        out.append(catalog.make(fid or "agent.condition",
                                SEVERITY.get(ctype, "warning"), subject, title, evidence, fix,
                                REFS))
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

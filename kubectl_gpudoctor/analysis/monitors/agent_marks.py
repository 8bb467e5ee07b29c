"""The watching agent's marks on a node, read once: the one reader of its GpuDoctor conditions.

Why: `node X` (agent_seen) and `nodes` (agent_conditions) both judge the NodeConditions the agent
writes (node_probe/protocol/conditions.py). Each used to read them its own way, so the two
commands bounded the same hostile fields differently and could disagree on which conditions
count. Here they are read one way and both views judge the same frozen Marks.

Everything read here was written by whoever may patch the node's status: at most MAX_SCANNED
entries are looked at, only the contract's exact condition types count (the first of each),
every string becomes one printable line under a cap, and a reason (or a cleared message's
"was <Reason>:") is trusted only when it names a finding id of its own class. Pure; no I/O.

Who wrote each mark (security round 4, G-01): any node-status writer (the kubelet, node-
problem-detector, anyone with nodes/status patch) can write a GpuDoctor condition. The API
server records the field manager of every condition entry in the node's managedFields
(`f:status.f:conditions.k:{"type":"..."}`, the manager named after the writer's User-Agent or
fieldManager; the agent's is AGENT_MANAGER). A mark whose writers are known and do not include
the agent is `foreign`: the views say "reported by <writer>" and never rank it above what the
tool saw itself. The node list keeps only this much of managedFields (api/slim.py, WRITERS_KEY);
a node without managedFields (a server or proxy that strips them) has marks of unknown writer.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import re
from typing import Any, Mapping

from node_probe.protocol import conditions

from ..common import age_s

MAX_SCANNED = 256   # condition entries looked at (a node carries ~10-30); the rest are ignored
REASON_MAX = 128    # characters: conditions.reason_of never makes a longer reason
MESSAGE_MAX = 300   # bytes of UTF-8 kept of the agent's message (it writes up to 1024)
TIME_MAX = 64       # characters: an RFC 3339 time is 20-35; longer is no time
_RAW_PER_BYTE = 8   # raw characters looked at per byte kept (whitespace runs collapse)
# a cleared condition's message keeps what the problem was (node_probe/watch/state.py)
_WAS = re.compile(r"\bwas ([A-Za-z0-9]{1,128}):")
_STATUSES = ("True", "False", "Unknown")
AGENT_MANAGER = "gpu-doctor-agent"   # node_probe/watch/writer.py COMPONENT, its User-Agent
WRITERS_KEY = "gpuDoctorConditionWriters"  # what api/slim.py keeps of managedFields
MAX_MANAGED = 64      # managedFields entries looked at
MANAGER_MAX = 128
STOPPED_REASON = "AgentStopped"      # node_probe/watch/state.py: GpuDoctorWatching on SIGTERM


@dataclasses.dataclass(frozen=True)
class Mark:
    """One GpuDoctor condition as the agent wrote it, bounded and one line per field.
    `finding_id`: the contract's id its reason (or, once cleared, its "was" reason) names
    within its class; None when it names none. Ages are seconds before `now`, None when the
    time is missing or no time."""
    type: str
    status: str                   # "True", "False", "Unknown", or "" for anything else
    reason: str
    finding_id: str | None
    message: str
    since_s: float | None
    heartbeat_age_s: float | None
    last_transition_time: str
    last_heartbeat_time: str
    writers: tuple[str, ...] = ()   # field managers of this condition (empty: not known)

    @property
    def foreign(self) -> bool:
        """Written by someone other than the gpu-doctor agent (managedFields say so)."""
        return bool(self.writers) and AGENT_MANAGER not in self.writers

    @property
    def reported_by(self) -> str:
        return ", ".join(self.writers) if self.writers else "an unknown writer"

    @property
    def active(self) -> bool:
        """A problem class the agent marks True now."""
        return self.status == "True" and self.type in conditions.CLASSES

    @property
    def cleared(self) -> bool:
        """A problem class the agent set False after a problem (not merely quiet)."""
        return (self.status == "False" and self.type in conditions.CLASSES
                and self.reason == conditions.cleared_reason(self.type))


@dataclasses.dataclass(frozen=True)
class Watch:
    """The agent's presence on one node: `state` is "watching", "stale", "stopped" (it said so
    on SIGTERM) or "none"; only "watching" makes its marks current."""
    state: str
    heartbeat_age_s: float | None = None

    def to_dict(self) -> dict:
        return {"state": self.state, "heartbeat_age_s":
                None if self.heartbeat_age_s is None else round(self.heartbeat_age_s)}


def one_line(value: Any, limit: int) -> str:
    """A string field as one printable line of at most `limit` bytes; a non-string is ""."""
    if not isinstance(value, str):
        return ""
    if (len(value) <= limit and value.isascii() and value.isprintable() and "  " not in value
            and value == value.strip()):
        return value  # already one short line (the agent's usual text): nothing to change
    return conditions.sanitize_message(value[:limit * _RAW_PER_BYTE], limit)


def _time(value: Any) -> str:
    return value if isinstance(value, str) and len(value) <= TIME_MAX else ""


def _finding_id(ctype: str, status: str, reason: str, message: str) -> str | None:
    ids = conditions.CLASSES.get(ctype)
    if not ids:
        return None
    was = _WAS.search(message) if status == "False" else None
    return conditions.finding_id_of(was.group(1) if was else reason, ids)


def writers_from_managed(managed: Any) -> dict[str, list[str]]:
    """{condition type: [field managers]} for the contract's types, from a node's raw
    managedFields (bounded: MAX_MANAGED entries, managers cut at MANAGER_MAX)."""
    out: dict[str, list[str]] = {}
    for e in managed[:MAX_MANAGED] if isinstance(managed, list) else ():
        if not isinstance(e, Mapping) or not isinstance(e.get("manager"), str):
            continue
        f = e.get("fieldsV1")
        f = f.get("f:status") if isinstance(f, Mapping) else None
        f = f.get("f:conditions") if isinstance(f, Mapping) else None
        if not isinstance(f, Mapping):
            continue
        mgr = one_line(e["manager"], MANAGER_MAX)
        for k in list(f)[:MAX_SCANNED]:
            m = re.fullmatch(r'k:\{"type":"([A-Za-z]{1,64})"\}', str(k))
            if m and m.group(1) in conditions.OWNED_TYPES and mgr:
                out.setdefault(m.group(1), [])
                if mgr not in out[m.group(1)]:
                    out[m.group(1)].append(mgr)
    return out


def writers_of(node: Mapping[str, Any]) -> dict[str, list[str]]:
    md = node.get("metadata") if isinstance(node, Mapping) else None
    if not isinstance(md, Mapping):
        return {}
    if "managedFields" in md:
        return writers_from_managed(md.get("managedFields"))
    kept = md.get(WRITERS_KEY)
    if not isinstance(kept, Mapping):
        return {}
    return {t: [one_line(w, MANAGER_MAX) for w in ws[:8] if isinstance(w, str)]
            for t, ws in kept.items() if t in conditions.OWNED_TYPES and isinstance(ws, list)}


def read_marks(node: Mapping[str, Any], now: dt.datetime) -> tuple[Mark, ...]:
    """The node's GpuDoctor conditions of the contract's types, in the node's order."""
    conds = (node.get("status") or {}).get("conditions") if isinstance(node, Mapping) else None
    writers = writers_of(node)
    out: list[Mark] = []
    seen: set[str] = set()
    for c in conds[:MAX_SCANNED] if isinstance(conds, list) else ():
        if not isinstance(c, Mapping):
            continue
        ctype = c.get("type")
        if not isinstance(ctype, str) or ctype not in conditions.OWNED_TYPES or ctype in seen:
            continue
        seen.add(ctype)
        status = c.get("status") if c.get("status") in _STATUSES else ""
        reason = one_line(c.get("reason"), REASON_MAX)
        message = one_line(c.get("message"), MESSAGE_MAX)
        since, beat = _time(c.get("lastTransitionTime")), _time(c.get("lastHeartbeatTime"))
        out.append(Mark(ctype, status, reason, _finding_id(ctype, status, reason, message),
                        message, age_s(since, now), age_s(beat, now),
                        one_line(since, TIME_MAX), one_line(beat, TIME_MAX),
                        tuple(writers.get(ctype) or ())))
    return tuple(out)


def watch_from(marks: tuple[Mark, ...]) -> Watch:
    """Whether the agent still watches: GpuDoctorWatching True and the newest heartbeat of its
    marks within the contract's staleness bound; "none" when the node carries no mark."""
    marks = tuple(m for m in marks if not m.foreign)  # a forged heartbeat watches nothing
    if not marks:
        return Watch("none")
    ages = [m.heartbeat_age_s for m in marks if m.heartbeat_age_s is not None]
    newest = min(ages) if ages else None
    w = next((m for m in marks if m.type == conditions.WATCHING_TYPE), None)
    if w is not None and w.status == "False" and w.reason == STOPPED_REASON:
        return Watch("stopped", newest)
    alive = (w is not None and w.status == "True"
             and newest is not None and newest <= conditions.STALE_AFTER_S)
    return Watch("watching" if alive else "stale", newest)


def watch_of(node: Mapping[str, Any], now: dt.datetime) -> Watch:
    """Whether a gpu-doctor agent watches this node (from its conditions' heartbeats)."""
    return watch_from(read_marks(node, now))

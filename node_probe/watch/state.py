"""Condition state with hysteresis: which problem class is True, since when, and when it flips.

Why: a condition that flaps with every pass (a Xid burst, PSI around a threshold) wakes people
up for nothing and makes auto-repair thrash. A class goes True on the first pass that sees its
problem and False only after `clear_after` consecutive passes saw it absent; a pass whose
detector for the class could not look (timeout, error, stuck from an earlier pass) counts as
neither present nor absent; and it clears only once the problem has also been gone for
`clear_quiet_s`, so a fault that flaps every few seconds stays True (its message updated)
instead of flipping with every pass. `lastTransitionTime` moves only on a flip (node-problem-
detector's rule), never on a reason or message change, a heartbeat or an agent restart: a new
agent adopts what its node already carries (adopt), and a stopping one marks only
GpuDoctorWatching False (stopped).
"""
from __future__ import annotations

import calendar
import dataclasses
import time
from typing import Iterable, Mapping

from node_probe.protocol import conditions

# the checks whose verdicts decide each class: if one of them could not look in a pass, the
# class's absence in that pass proves nothing
CLASS_CHECKS: dict[str, tuple[str, ...]] = {
    "GpuDoctorDevicePluginStuck": ("deviceplugin", "nvml"),
    "GpuDoctorDeviceAccessLost": ("cgroup.devices", "deviceplugin"),
    "GpuDoctorGpuUnhealthy": ("nvml", "deviceplugin"),
    "GpuDoctorXidErrors": ("kmsg",),
    "GpuDoctorKernelHungTask": ("kmsg",),
    "GpuDoctorMemoryThrash": ("memory",),
    "GpuDoctorGpuLost": ("gpu_lost",),
    "GpuDoctorFabricNotReady": ("fabric",),
    "GpuDoctorIsolationBreach": ("gpu.isolation",),
    "GpuDoctorGpuDegraded": ("gpu.slow", "nvml"),
}
# statuses meaning a check looked (default: ok and skipped, a skip saying there was nothing to
# look at). The isolation check skips when it could not read what was allocated or was cut by
# its deadline or descriptor cap: absence then proves nothing.
LOOKED: dict[str, tuple[str, ...]] = {"gpu.isolation": ("ok",)}


@dataclasses.dataclass(frozen=True)
class Problem:
    """One active finding, reduced to what a condition, an Event and a metric need."""

    ctype: str
    finding_id: str
    severity: str
    subject: str
    title: str
    pods: tuple[str, ...] = ()   # "ns/pod/container" using the GPU it is about (pod-resources)


@dataclasses.dataclass
class Condition:
    type: str
    status: str            # "True" | "False"
    reason: str
    message: str
    transition: float      # lastTransitionTime, seconds since epoch
    absent: int = 0        # consecutive passes without the problem while True

    def to_api(self, heartbeat: float) -> dict:
        return {"type": self.type, "status": self.status, "reason": self.reason,
                "message": self.message, "lastHeartbeatTime": rfc3339(heartbeat),
                "lastTransitionTime": rfc3339(self.transition)}


@dataclasses.dataclass(frozen=True)
class Transition:
    ctype: str
    status: str            # the new status
    reason: str
    message: str
    problems: tuple[Problem, ...]


def rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


_SEV = {"critical": 0, "warning": 1}
POD_NAMES = 5   # pods named in a condition's message and its Event; the rest counted


def describe(problems: Iterable[Problem]) -> tuple[str, str]:
    """(reason, message) for a class from its problems: the worst one names it (the plugin
    blocked in NVML before the NVML hang that explains it, as CLASSES orders them)."""
    def rank(p: Problem) -> tuple:  # worst first; within a class, its most specific id first
        ids = conditions.CLASSES.get(p.ctype, ())
        return (_SEV.get(p.severity, 2), ids.index(p.finding_id) if p.finding_id in ids
                else len(ids), p.finding_id, p.subject)
    ps = sorted(problems, key=rank)
    top = ps[0]
    more = f" (+{len(ps) - 1} more)" if len(ps) > 1 else ""
    msg = f"{top.finding_id}: {top.subject}: {top.title}{more}"
    hit = list(dict.fromkeys(pod for p in ps for pod in p.pods))
    if hit:  # which workloads the fault hit, first (the message is cut at its end)
        msg = (f"pods on the GPU: {', '.join(hit[:POD_NAMES])}"
               + (f" (+{len(hit) - POD_NAMES} more)" if len(hit) > POD_NAMES else "")
               + f"; {msg}")
    return conditions.reason_of(top.finding_id), conditions.sanitize_message(msg)


def parse_time(v: object) -> float | None:
    """An RFC 3339 UTC time as the agent writes it (2026-11-27T20:54:44Z), else None."""
    if not isinstance(v, str) or len(v) > 40:
        return None
    try:
        return float(calendar.timegm(time.strptime(v, "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return None


STOPPED_REASON = "AgentStopped"


class ConditionState:
    def __init__(self, clear_after: int = 2, now: float | None = None,
                 clear_quiet_s: float = 0.0) -> None:
        if clear_after < 1:
            raise ValueError("clear_after must be >= 1")
        self.clear_after = clear_after
        self.clear_quiet_s = clear_quiet_s
        t = time.time() if now is None else now
        self.conds: dict[str, Condition] = {
            ct: Condition(ct, "False", conditions.quiet_reason(ct), "no problem seen", t)
            for ct in conditions.CLASSES}
        self.watching = Condition(conditions.WATCHING_TYPE, "True", "AgentWatching",
                                  "the gpu-doctor agent is watching this node", t)
        self.last_seen: dict[str, float] = {}  # class -> last time a pass saw the problem

    def update(self, problems: Mapping[str, list[Problem]], unsure: Iterable[str] = (),
               now: float | None = None) -> list[Transition]:
        """Apply one pass. `unsure`: classes whose detectors could not look this pass."""
        t = time.time() if now is None else now
        unsure = set(unsure)
        out: list[Transition] = []
        for ct, c in self.conds.items():
            found = problems.get(ct) or []
            if found:
                self.last_seen[ct] = t
                reason, message = describe(found)
                c.absent = 0
                c.reason, c.message = reason, message
                if c.status != "True":
                    c.status, c.transition = "True", t
                    out.append(Transition(ct, "True", reason, message, tuple(found)))
            elif c.status == "True" and ct not in unsure:
                c.absent += 1
                quiet = self.clear_quiet_s <= 0 or \
                    t - self.last_seen.get(ct, t) >= self.clear_quiet_s
                if c.absent >= self.clear_after and quiet:
                    # the message keeps what it was, so `node X` can say so after it cleared
                    was = f"was {c.reason}: {c.message[:400]}"
                    c.status, c.transition, c.absent = "False", t, 0
                    c.reason = conditions.cleared_reason(ct)
                    c.message = conditions.sanitize_message(
                        f"cleared after {self.clear_after} pass(es) without it, last seen "
                        f"{rfc3339(self.last_seen.get(ct, t))}; {was}")
                    out.append(Transition(ct, "False", c.reason, c.message, ()))
        return out

    def adopt(self, node_conditions: object, now: float | None = None) -> list[str]:
        """Take over what the node already carries (a new agent pod after a restart or an
        upgrade): each owned class keeps its status, reason, message and lastTransitionTime, so
        nothing flips and no transition time moves because the agent was replaced. A class
        True on the node counts as seen now (it clears by hysteresis if it is gone).
        GpuDoctorWatching keeps its transition time only if it was True (a crash); after a
        clean stop it flips to True now. Returns the types adopted."""
        t = time.time() if now is None else now
        out = []
        seen: set[str] = set()
        for raw in node_conditions[:256] if isinstance(node_conditions, list) else ():
            if not isinstance(raw, dict) or raw.get("type") in seen:
                continue
            ctype = raw.get("type")
            seen.add(ctype)
            status = raw.get("status")
            since = parse_time(raw.get("lastTransitionTime"))
            if status not in ("True", "False") or since is None or since > t + 300:
                continue
            if ctype == conditions.WATCHING_TYPE:
                if status == "True":
                    self.watching.transition = since
                    out.append(ctype)
                continue
            c = self.conds.get(ctype)
            if c is None:
                continue
            reason, message = raw.get("reason"), raw.get("message")
            c.status, c.transition = status, since
            if isinstance(reason, str) and reason.isalnum() and len(reason) <= 128:
                c.reason = reason
            if isinstance(message, str):
                c.message = conditions.sanitize_message(message)
            if status == "True":
                self.last_seen[ctype] = t
            out.append(ctype)
        return out

    def stopped(self, why: str, now: float | None = None) -> None:
        """The agent is stopping: GpuDoctorWatching goes False with a reason saying so (its
        problem marks keep their status: the next agent pod adopts them, and `node`/`nodes`
        read them as no longer current)."""
        t = time.time() if now is None else now
        w = self.watching
        if w.status != "False":
            w.status, w.transition = "False", t
        w.reason = STOPPED_REASON
        w.message = conditions.sanitize_message(why)

    def flips(self) -> tuple:
        """Status and transition of every condition: a change is written at once."""
        return tuple((c.type, c.status, c.transition)
                     for c in (self.watching, *self.conds.values()))

    def signature(self) -> tuple:
        """What a PATCH would change (heartbeats aside): unchanged means no write is due."""
        return tuple((c.type, c.status, c.reason, c.message, c.transition)
                     for c in (self.watching, *self.conds.values()))

    def api_conditions(self, heartbeat: float) -> list[dict]:
        return [self.watching.to_api(heartbeat)] + [c.to_api(heartbeat)
                                                    for c in self.conds.values()]

"""Small helpers shared by the API-side analyses: timestamps, pod identity, events by pod.

Why: every analysis reads the same raw API dicts (camelCase, RFC 3339 strings); parsing them
once here keeps the analyses pure and short.
"""
from __future__ import annotations

import datetime as dt
from typing import Any, Callable, Iterable, Mapping

from node_probe.protocol.duration import human

GPU_RESOURCE_PREFIXES = ("nvidia.com/", "amd.com/gpu", "gpu.intel.com/", "habana.ai/")
SCHEDULER_COMPONENTS = ("default-scheduler", "scheduler")


def parse_time(value: Any) -> dt.datetime | None:
    if not value or not isinstance(value, str):
        return None
    text = value.strip().replace("Z", "+00:00")
    try:
        t = dt.datetime.fromisoformat(text)
    except ValueError:
        # fractional seconds with more than 6 digits (eventTime: 2024-01-01T00:00:00.123456789Z)
        head, _, rest = text.partition(".")
        frac = "".join(ch for ch in rest if ch.isdigit())[:6]
        tz = rest[len("".join(ch for ch in rest if ch.isdigit())):]
        try:
            t = dt.datetime.fromisoformat(f"{head}.{frac or '0'}{tz}")
        except ValueError:
            return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    return t


def age_s(value: Any, now: dt.datetime) -> float | None:
    t = parse_time(value)
    return None if t is None else max(0.0, (now - t).total_seconds())


def pod_ref(pod: Mapping[str, Any]) -> str:
    md = pod.get("metadata") or {}
    return f"{md.get('namespace', '')}/{md.get('name', '')}"


def pod_uid(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")


def gpu_requests(pod: Mapping[str, Any]) -> dict[str, str]:
    """Extended GPU resources the pod's containers ask for (limits win over requests)."""
    out: dict[str, str] = {}
    spec = pod.get("spec") or {}
    for c in list(spec.get("containers") or ()) + list(spec.get("initContainers") or ()):
        res = c.get("resources") or {}
        for part in ("requests", "limits"):
            for k, v in (res.get(part) or {}).items():
                if is_gpu_resource(k):
                    out[k] = str(v)
    return out


def is_gpu_resource(name: str) -> bool:
    return any(name.startswith(p) for p in GPU_RESOURCE_PREFIXES)


def node_is_ready(node: Mapping[str, Any]) -> bool | None:
    for c in (node.get("status") or {}).get("conditions") or ():
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return None


def event_time(ev: Mapping[str, Any]) -> dt.datetime | None:
    for key in ("lastTimestamp", "eventTime", "firstTimestamp"):
        t = parse_time(ev.get(key))
        if t is not None:
            return t
    series = ev.get("series") or {}
    t = parse_time(series.get("lastObservedTime"))
    return t or parse_time((ev.get("metadata") or {}).get("creationTimestamp"))


def event_source(ev: Mapping[str, Any]) -> str:
    return str((ev.get("source") or {}).get("component") or ev.get("reportingComponent")
               or ev.get("reportingController") or "")


def is_scheduler_event(ev: Mapping[str, Any]) -> bool:
    src = event_source(ev)
    return src in SCHEDULER_COMPONENTS or src.endswith("-scheduler") or (
        ev.get("reason") in ("Scheduled", "FailedScheduling") and not src)


def events_by_uid(events: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    out: dict[str, list[Mapping[str, Any]]] = {}
    for ev in events:
        uid = (ev.get("involvedObject") or ev.get("regarding") or {}).get("uid")
        if uid:
            out.setdefault(uid, []).append(ev)
    return out


class ByIdentity:
    """`fn(obj)` remembered for the very object passed (not for an equal one).

    Why: a fleet's steady pods are kept as skeletons that share one containers list per page
    and shape (api/slim.PodCompactor), so what is derived from a pod's containers (its GPU
    requests, its memory limit) is the same for thousands of pods; computed once per shared
    list instead of once per pod. Keyed by id(); each entry holds its object, so no id is
    reused while it is remembered. Bounded: cleared at `size` entries. An object that is not
    shared (a whole pod's own list) simply misses."""

    def __init__(self, fn: Callable[[Any], Any], size: int = 4096) -> None:
        self._fn = fn
        self._size = size
        self._memo: dict[int, tuple[Any, Any]] = {}

    def __call__(self, obj: Any) -> Any:
        hit = self._memo.get(id(obj))
        if hit is not None and hit[0] is obj:
            return hit[1]
        value = self._fn(obj)
        if len(self._memo) >= self._size:
            self._memo.clear()
        self._memo[id(obj)] = (obj, value)
        return value


def both_ends(text: str, limit: int) -> str:
    """`text` cut to about `limit` characters keeping both ends: the kubelet's and the container
    runtimes' messages put the cause last, after layers of wrapping."""
    if len(text) <= limit:
        return text
    return text[:limit // 3] + " \u2026 " + text[-(2 * limit // 3):]


fmt_duration = human  # the one duration format: node_probe/protocol/duration.human

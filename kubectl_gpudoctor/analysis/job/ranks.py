"""Compare the ranks (pods) of one job: the one that crash-loops, restarts more than the
others, was replaced, or started far behind them.

Why: a collective waits for its slowest rank; a rank that was re-created or that started
minutes after the others is where a hang or a restart of the whole job came from, and the
pod's own status says so without any node access. Pending ranks keep the explanation
`pod Y` gives (analysis/failing/pod_status.py); this module only adds what needs the siblings.
"""
from __future__ import annotations

import statistics
from typing import Any, Mapping, Sequence

from node_probe.protocol import Finding
from node_probe.protocol.catalog import make

from ..common import parse_time, pod_ref
from ..failing.pod_status import analyze_pod
from .kinds import Kind, rank_of

LATE_S = 300.0           # a rank this far behind the median (creation or start) stands out
RESTARTS_MIN = 3         # restarts below this are noise
MAX_PENDING = 20         # pending explanations computed (the rest counted)


def _statuses(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    st = pod.get("status") if isinstance(pod.get("status"), Mapping) else {}
    cs = st.get("containerStatuses")
    return [c for c in cs if isinstance(c, Mapping)] if isinstance(cs, list) else []


def restarts(pod: Mapping[str, Any]) -> int:
    n = 0
    for c in _statuses(pod):
        r = c.get("restartCount")
        if isinstance(r, int) and not isinstance(r, bool) and 0 <= r < 10**9:
            n += r
    return n


def _crashloop(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for c in _statuses(pod):
        w = (c.get("state") or {}).get("waiting") if isinstance(c.get("state"), Mapping) else None
        if isinstance(w, Mapping) and w.get("reason") == "CrashLoopBackOff":
            return c
    return None


def _phase(pod: Mapping[str, Any]) -> str:
    st = pod.get("status") if isinstance(pod.get("status"), Mapping) else {}
    return str(st.get("phase") or "Pending")


def _node(pod: Mapping[str, Any]) -> str | None:
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    n = spec.get("nodeName")
    return n if isinstance(n, str) else None


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def analyze(job: str, kind: Kind | None, pods: Sequence[Mapping[str, Any]],
            events: Mapping[str, Sequence[Mapping[str, Any]]], now, *,
            stall_threshold_s: float = 120.0) -> list[Finding]:
    """The rank findings of a job's pods (`events`: by pod uid)."""
    out: list[Finding] = []
    live = [p for p in pods if _phase(p) not in ("Succeeded", "Failed")]
    counts = [restarts(p) for p in live]
    med_restarts = _median(counts) or 0
    created = {id(p): parse_time((p.get("metadata") or {}).get("creationTimestamp"))
               for p in live}
    started = {id(p): parse_time((p.get("status") or {}).get("startTime")) for p in live}
    c_times = [t.timestamp() for t in created.values() if t is not None]
    s_times = [t.timestamp() for t in started.values() if t is not None]
    med_created, med_started = _median(c_times), _median(s_times)
    pending = 0
    for p in live:
        ref = pod_ref(p)
        uid = str((p.get("metadata") or {}).get("uid") or "")
        base = {"pod": ref, "rank": rank_of(kind, p), "node": _node(p), "job": job}
        if _phase(p) == "Pending":
            pending += 1
            if pending <= MAX_PENDING:
                out += analyze_pod(p, list(events.get(uid, ())), now, stall_threshold_s)
            continue
        cl = _crashloop(p)
        n = restarts(p)
        if cl is not None:
            last = ((cl.get("lastState") or {}).get("terminated")
                    if isinstance(cl.get("lastState"), Mapping) else None) or {}
            out.append(make(
                "job.rank_crashloop", "critical", f"pod/{ref}",
                f"rank {base['rank']} ({ref}) is in CrashLoopBackOff",
                {**base, "container": cl.get("name"), "restarts": n,
                 "last_exit_code": last.get("exitCode"), "last_reason": last.get("reason")},
                f"read why it exits: `kubectl logs -n {ref.split('/')[0]} "
                f"{ref.split('/', 1)[-1]} --previous`"))
        elif len(live) > 1 and n >= RESTARTS_MIN and n > 2 * med_restarts:
            out.append(make(
                "job.rank_restarts", "warning", f"pod/{ref}",
                f"rank {base['rank']} ({ref}) restarted {n} times; the job's median is "
                f"{med_restarts:g}", {**base, "restarts": n, "median_restarts": med_restarts},
                f"read why it exits: `kubectl logs -n {ref.split('/')[0]} "
                f"{ref.split('/', 1)[-1]} --previous`"))
        c, s = created.get(id(p)), started.get(id(p))
        if len(live) > 2 and c is not None and med_created is not None \
                and c.timestamp() - med_created > LATE_S:
            out.append(make(
                "job.rank_replaced", "warning", f"pod/{ref}",
                f"rank {base['rank']} ({ref}) was re-created "
                f"{round((c.timestamp() - med_created) / 60)} min after the job's other pods",
                {**base, "created_after_median_s": round(c.timestamp() - med_created)},
                "the rank's first pod failed or was evicted: its node and the job's events "
                "say why (`kubectl get events -n NS --field-selector involvedObject.name=POD`)"))
        elif len(live) > 2 and s is not None and med_started is not None \
                and s.timestamp() - med_started > LATE_S:
            out.append(make(
                "job.rank_late_start", "warning", f"pod/{ref}",
                f"rank {base['rank']} ({ref}) started "
                f"{round((s.timestamp() - med_started) / 60)} min after the job's other pods",
                {**base, "started_after_median_s": round(s.timestamp() - med_started)},
                "the other ranks waited for it (a slow image pull, a late schedule): its "
                "events say which"))
    return out

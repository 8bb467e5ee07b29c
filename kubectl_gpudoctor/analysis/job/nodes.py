"""Compare the nodes of one job and name the odd one out.

Why: a job of 64 nodes hangs in a collective or crawls at its slowest rank when ONE node is
bad, and each node looked at alone says little; side by side, the node whose findings (the
agent's marks, NotReady, black-hole signs, other monitors' conditions, GPU start failures, and
with --probe the node side) or whose allocatable GPUs differ from its siblings' stands out.
A problem every node shares is not a node's: it is said as shared.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Any, Mapping, Sequence

from node_probe.protocol import Finding, Severity
from node_probe.protocol.catalog import make

from ..resources import capacity

MAX_RANKS_SHOWN = 16
# Symptoms of WAITING for a peer, not causes (node_probe/checks/collective.py): in a hung job
# every healthy node shows them. They never make a node differ or a cause "shared"; when most
# nodes wait, the nodes that do not are the ones the job waits for.
WAITING = frozenset({"gpu.collective_spin"})


@dataclasses.dataclass(frozen=True)
class NodeView:
    """One node of the job as compared: its problem ids (warning and worse), its worst
    severity, its allocatable GPUs, the job's pods on it."""

    name: str
    problems: tuple[str, ...]
    worst: str
    gpus: int | None
    pods: tuple[str, ...]
    ready: bool | None


@dataclasses.dataclass(frozen=True)
class Comparison:
    """`baseline`: the signature most nodes share (empty when the healthy ones are as many);
    `odd`: nodes that differ, worst first; `shared`: the baseline is itself a problem most
    nodes have (the cause is not one node)."""

    views: tuple[NodeView, ...]
    baseline: tuple[str, ...]
    odd: tuple[str, ...]
    shared: bool
    gpus_usual: int | None
    findings: tuple[Finding, ...]
    fewer: tuple[str, ...] = ()   # nodes with fewer allocatable GPUs than most
    not_waiting: tuple[str, ...] = ()  # most nodes wait in a collective; these do not


def _worst(fs: Sequence[Finding]) -> str:
    bad = [f.severity for f in fs if f.severity.rank >= Severity.WARNING.rank]
    return max(bad, key=lambda s: s.rank).value if bad else "ok"


def view(name: str, node: Mapping[str, Any] | None, findings: Sequence[Finding],
         job_pods: Sequence[str], ready: bool | None) -> NodeView:
    probs = tuple(sorted({f.id for f in findings if f.severity.rank >= Severity.WARNING.rank}))
    gpus = None
    if node is not None:
        res = capacity.gpu_resources(node)
        gpus = sum(a for _, a in res.values()) if res else None
    return NodeView(name, probs, _worst(findings), gpus, tuple(sorted(job_pods)), ready)


def _usual(values: Sequence[int]) -> int | None:
    """The allocatable GPU count most nodes have (the larger on a tie: a node that lost a GPU
    is the one below)."""
    if not values:
        return None
    c = collections.Counter(values)
    top = max(c.values())
    return max(v for v, n in c.items() if n == top)


def compare(job: str, views: Sequence[NodeView]) -> Comparison:
    """The comparison of the job's nodes (`job`: the job in words, for the findings)."""
    sigs = collections.Counter(_causes(v.problems) for v in views)
    waiters = sum(1 for v in views if WAITING & set(v.problems))
    most_wait = waiters * 2 > len(views) and waiters < len(views)
    top = max(sigs.values()) if sigs else 0
    baseline: tuple[str, ...] = ()
    if sigs and sigs.get((), 0) < top:
        baseline = max((s for s, n in sigs.items() if n == top), key=lambda s: (len(s), s))
    usual = _usual([v.gpus for v in views if v.gpus is not None])
    findings: list[Finding] = []
    fewer_nodes: list[str] = []
    odd: list[tuple[tuple, str]] = []
    alike = sigs.get(baseline, 0)
    idle: list[str] = []
    for v in views:
        extra = tuple(p for p in _causes(v.problems) if p not in baseline)
        fewer = usual is not None and v.gpus is not None and v.gpus < usual
        if fewer:
            fewer_nodes.append(v.name)
            findings.append(make(
                "job.node_fewer_gpus", "warning", f"node/{v.name}",
                f"node {v.name} has {v.gpus} allocatable GPUs where the job's other nodes "
                f"have {usual}",
                {"node": v.name, "gpu_allocatable": v.gpus, "siblings_gpu_allocatable": usual,
                 "job": job, "job_pods": list(v.pods[:MAX_RANKS_SHOWN])},
                f"a GPU of {v.name} is gone or unhealthy: `kubectl gpu-doctor node {v.name}` "
                f"says which; cordon it and restart the job from its checkpoint"))
        if most_wait and not WAITING & set(v.problems):
            idle.append(v.name)
            findings.append(make(
                "job.node_differs", "warning", f"node/{v.name}",
                f"node {v.name}'s GPUs do not wait in the collective where {waiters} of "
                f"{len(views)} nodes' do (gpu.collective_spin): the job likely waits for "
                f"{v.name}" + (f" ({', '.join(extra[:3])})" if extra else ""),
                {"node": v.name, "differs_by": ["not waiting", *extra], "not_waiting": True,
                 "nodes_waiting": waiters, "nodes": len(views), "job": job,
                 "job_pods": list(v.pods[:MAX_RANKS_SHOWN]), "job_pods_on_node": len(v.pods)},
                f"cordon {v.name} (`kubectl cordon {v.name}`) and restart the job from its "
                f"checkpoint; `kubectl gpu-doctor node {v.name}` has the evidence"))
            rank = Severity(v.worst).rank if v.worst != "ok" else Severity.WARNING.rank
            odd.append(((-rank, v.ready is not False, -len(extra) - 1, -len(v.pods), v.name),
                        v.name))
            continue
        if not extra and not fewer:
            continue
        sev = v.worst if extra else "warning"
        if extra:
            findings.append(make(
                "job.node_differs", sev if sev in ("critical", "warning") else "warning",
                f"node/{v.name}",
                f"node {v.name} differs from the job's other nodes: {', '.join(extra[:4])}"
                + (f" (+{len(extra) - 4})" if len(extra) > 4 else ""),
                {"node": v.name, "differs_by": list(extra), "siblings_alike": alike,
                 "nodes": len(views), "job": job, "job_pods": list(v.pods[:MAX_RANKS_SHOWN]),
                 "job_pods_on_node": len(v.pods)},
                f"cordon {v.name} (`kubectl cordon {v.name}`) and restart the job from its "
                f"checkpoint; `kubectl gpu-doctor node {v.name}` has the evidence"))
        rank = Severity(sev).rank if sev != "ok" else Severity.WARNING.rank
        odd.append(((-rank, v.ready is not False, -len(extra), -len(v.pods), v.name), v.name))
    odd.sort()
    shared = bool(baseline) and alike * 2 > len(views)
    return Comparison(tuple(views), baseline, tuple(n for _, n in odd), shared, usual,
                      tuple(findings), tuple(fewer_nodes), tuple(idle))


def _causes(problems: Sequence[str]) -> tuple[str, ...]:
    return tuple(p for p in problems if p not in WAITING)


def signature(v: NodeView, c: Comparison) -> dict:
    """A node's row in `-o json`: what it has, and how it differs from its siblings."""
    fewer = v.name in c.fewer
    worst = "warning" if fewer and v.worst == "ok" else v.worst
    return {"node": v.name, "signature": list(v.problems) + (["job.node_fewer_gpus"] if fewer
                                                             else []),
            "differs": v.name in c.odd,
            "differs_by": (["not waiting"] if v.name in c.not_waiting else [])
            + [p for p in _causes(v.problems) if p not in c.baseline]
            + (["job.node_fewer_gpus"] if fewer else []),
            "waiting": bool(WAITING & set(v.problems)),
            "severity": worst, "ready": v.ready, "gpu_allocatable": v.gpus,
            "job_pods": list(v.pods[:MAX_RANKS_SHOWN]), "job_pods_on_node": len(v.pods)}

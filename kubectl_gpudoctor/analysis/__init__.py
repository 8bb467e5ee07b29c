"""API-side analyses: pure functions over raw API JSON dicts (camelCase, as the API returns them).

Why a package of pure functions: the same analyses run for one node (`node X`, `pod Y`) and
for a thousand (`nodes`), and tests feed them recorded API objects without any server. The
collectors (commands/node.py, commands/nodes.py) fetch; these only judge.
"""
from __future__ import annotations

import datetime as dt
from typing import Any, Mapping, Sequence

from node_probe.protocol import Finding

from .common import events_by_uid
from .failing import black_hole, container_start, plugin_messages, pod_status, runtime  # noqa: F401
from .monitors import agent_conditions, foreign  # noqa: F401
from .resources import capacity, kubelet_config, memory, mig  # noqa: F401
from .scheduling import dra, hami  # noqa: F401
from .stuck import admission, goroutines, readiness  # noqa: F401


def node_objects(node: Mapping[str, Any], pods_on_node: Sequence[Mapping[str, Any]],
                 events: Sequence[Mapping[str, Any]] | Mapping[str, Sequence],
                 lease: Mapping[str, Any] | None, now: dt.datetime, *,
                 threshold_s: float = admission.DEFAULT_THRESHOLD_S,
                 kubelet_cfg: Mapping[str, Any] | None = None,
                 events_known: bool = True,
                 extra: Mapping[str, Any] | None = None,
                 node_events: Sequence[Mapping[str, Any]] = (),
                 agent_marks: bool = True,
                 gone: Sequence[black_hole.Attempt] = (),
                 peers: black_hole.Peers | None = None,
                 memory_tally: memory.Tally | None = None) -> tuple[list[Finding], list[str]]:
    """Every list-based analysis of one node. Returns (findings, errors of analyses).
    The one place both `node X` (commands/node.py collect_node) and `nodes` (commands/nodes.py
    scan) judge a node from its objects: a verdict added here is in both, so they never
    disagree.
    `node_events`: events about the Node object itself (other monitors' reports); `nodes`
    does not list them, so there only the conditions and taints are read.
    `agent_marks`: the watching agent's current marks as findings (`nodes`); `node X` reads
    them itself with what cleared within the hour (agent_seen), so it passes False and each
    mark is reported once.
    `extra`: lists beyond the core ones (kubectl_gpudoctor.extra_lists.fetch): runtimeclasses,
    resourceclaims, resourceslices, deviceclasses; a list that could not be read is None.
    `gone`, `peers`: what the black-hole test (black_hole.analyze) needs beyond the node's pods:
    the failed GPU pods that are gone (from the kubelet's events), and the same controllers'
    outcomes on other nodes (None: not known; the finding then says it did not compare).
    `memory_tally`: the memory limits of every pod on the node, added up as `nodes` read them
    (it keeps only the pods a verdict may name: analysis/resources/podfold.py)."""
    findings: list[Finding] = []
    errs: list[str] = []
    ev_list = events if not isinstance(events, Mapping) else [
        e for evs in events.values() for e in evs]

    def run(label: str, fn, *args) -> None:
        try:
            findings.extend(fn(*args) or ())
        except Exception as exc:  # noqa: BLE001 - one broken analysis must not hide the rest
            errs.append(f"analysis {label} failed: {type(exc).__name__}: {exc}")

    run("readiness", lambda: [f for f in (readiness.not_ready(node, lease, now),) if f])
    if agent_marks:
        run("agent", agent_conditions.analyze, node, now)  # the watching agent's conditions
    run("admission", lambda: admission.analyze_node(node, pods_on_node, events, lease, now,
                                                    threshold_s, events_known))
    run("capacity", capacity.analyze_node, node)
    run("foreign", foreign.foreign_conditions, node, node_events, now)
    run("hami", lambda: hami.analyze_node(node, list(pods_on_node), list(ev_list), now))
    run("memory", lambda: memory.analyze_node(node, list(pods_on_node),
                                              dict(kubelet_cfg) if kubelet_cfg else None,
                                              memory_tally))
    run("mig", mig.analyze_node, node, now)
    run("runtime", lambda: runtime.analyze(pods_on_node, ev_list,
                                           (extra or {}).get("runtimeclasses")))
    run("dra.health", dra.analyze_device_health, pods_on_node)
    # a GPU pod that cannot start for a node reason: the node is sick from the first one
    run("container_start", container_start.analyze_node,
        str((node.get("metadata") or {}).get("name") or ""), pods_on_node,
        events if isinstance(events, Mapping) else ev_list)
    # a GPU plugin pod failing with a known driver cause (version mismatch, lost GPU, NVML)
    run("plugin_messages", plugin_messages.analyze_plugin_pods,
        str((node.get("metadata") or {}).get("name") or ""), pods_on_node)
    # a kubelet that admits nothing now is the wedge, not a black hole (pods wait, none is
    # rejected any more): kubelet.admission_stalled says it, once
    if not any(f.id == "kubelet.admission_stalled" and f.severity.value == "critical"
               for f in findings):
        run("black_hole", lambda: black_hole.analyze(
            node, pods_on_node, events if isinstance(events, Mapping) else events_by_uid(events),
            gone, now, peers))
    x = extra or {}
    if x.get("resourceclaims") is not None and x.get("resourceslices") is not None:
        run("dra.claims", lambda: dra.analyze_claims(pods_on_node, x["resourceclaims"],
                                                     x["resourceslices"],
                                                     x.get("deviceclasses") or (), ev_list, now))
    return findings, errs

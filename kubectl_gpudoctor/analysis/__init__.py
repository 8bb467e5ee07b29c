"""API-side analyses: pure functions over raw API JSON dicts (camelCase, as the API returns them).

Why a package of pure functions: the same analyses run for one node (`node X`, `pod Y`) and
for a thousand (`nodes`), and tests feed them recorded API objects without any server. The
collectors (diagnose.py, fleet.py) fetch; these only judge.
"""
from __future__ import annotations

import datetime as dt
from typing import Any, Mapping, Sequence

from node_probe.protocol import Finding

from . import (admission, capacity, goroutines, hami, kubelet_config,  # noqa: F401
               memory, pod_status)


def node_objects(node: Mapping[str, Any], pods_on_node: Sequence[Mapping[str, Any]],
                 events: Sequence[Mapping[str, Any]] | Mapping[str, Sequence],
                 lease: Mapping[str, Any] | None, now: dt.datetime, *,
                 threshold_s: float = admission.DEFAULT_THRESHOLD_S,
                 kubelet_cfg: Mapping[str, Any] | None = None,
                 events_known: bool = True) -> tuple[list[Finding], list[str]]:
    """Every list-based analysis of one node. Returns (findings, errors of analyses)."""
    findings: list[Finding] = []
    errs: list[str] = []
    ev_list = events if not isinstance(events, Mapping) else [
        e for evs in events.values() for e in evs]

    def run(label: str, fn, *args) -> None:
        try:
            findings.extend(fn(*args) or ())
        except Exception as exc:  # noqa: BLE001 - one broken analysis must not hide the rest
            errs.append(f"analysis {label} failed: {type(exc).__name__}: {exc}")

    run("admission", lambda: admission.analyze_node(node, pods_on_node, events, lease, now,
                                                    threshold_s, events_known))
    run("capacity", capacity.analyze_node, node)
    run("hami", lambda: hami.analyze_node(node, list(pods_on_node), list(ev_list), now))
    run("memory", lambda: memory.analyze_node(node, list(pods_on_node),
                                              dict(kubelet_cfg) if kubelet_cfg else None))
    return findings, errs

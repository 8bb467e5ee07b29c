"""API-side analyses: pure functions over raw API JSON dicts (camelCase, as the API returns them).

Why a package of pure functions: the same analyses run for one node (`node X`, `pod Y`) and
for a thousand (`nodes`), and tests feed them recorded API objects without any server. The
collectors (diagnose.py, fleet.py) fetch; these only judge.

hami.py and memory.py are written by the HAMi/memory engineer; they are imported defensively so
the client keeps working if one is missing or broken (the failure is reported, not hidden).
"""
from __future__ import annotations

import datetime as dt
import importlib
from typing import Any, Mapping, Sequence

from node_probe.protocol import Finding

from . import admission, capacity, goroutines, kubelet_config, pod_status  # noqa: F401

OPTIONAL_ERRORS: dict[str, str] = {}


def _optional(name: str):
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except Exception as exc:  # noqa: BLE001 - a missing/broken optional analysis is reported
        OPTIONAL_ERRORS[name] = f"{type(exc).__name__}: {exc}"
        return None


hami = _optional("hami")
memory = _optional("memory")


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
    if hami is not None:
        run("hami", lambda: hami.analyze_node(node, list(pods_on_node), list(ev_list), now))
    if memory is not None:
        run("memory", lambda: memory.analyze_node(node, list(pods_on_node),
                                                  dict(kubelet_cfg) if kubelet_cfg else None))
    for name, err in OPTIONAL_ERRORS.items():
        errs.append(f"analysis {name} unavailable: {err}")
    return findings, errs

"""A fleet's pods folded into per-node tallies as they are read: memory by nodes, not by pods.

Why: `nodes` over 20,000 nodes / 600,000 pods cannot keep every pod, even as a skeleton
(~1.9 KiB each: issue 41 measured 70 MiB + 1.83 MiB per 1,000 pods, so 94,000 pods reached the
CLI's memory bound). What the node analyses (analysis.node_objects) read of a node's steady
pods adds up: how many there are, the GPUs they hold (fit.add_held) and their memory limits
(memory.Tally). So each page of pods is folded into its nodes' NodeFold and dropped; a pod is
kept (in its node's `kept`) only when an analysis may read it one by one:

- any pod that is not steady (the page parsers keep those whole: slim.PodCompactor): pending,
  failing, restarting, terminating, HAMi-annotated -- the pods a verdict names;
- a steady GPU pod created within the black-hole window (its success counts against the
  failures there, and against its controller's failures elsewhere: black_hole.peers), at most
  MAX_RECENT per node;
- a steady pod with resource claims (DRA), a RuntimeClass, a Warning event, or a device-plugin
  name (HAMi's plugin pod);
- every pod with `keep_all` (`nodes --probe`: the probe's records name containers by id; the
  probe runs on few nodes, or on nodes with an agent).

A dropped pod is one every analysis passes over (Running, no container status left by the
compactor, no deletion, none of the above): the per-node findings are the ones the whole list
gives (tests/kubectl/test_podfold.py compares both). What is kept is bounded by the non-steady
pods of the cluster and by MAX_RECENT per node, and the pager bounds it once more by bytes.

Pure: no I/O. `reset()` starts over (the list restarted after its continue token expired).
"""
from __future__ import annotations

import datetime as dt
from typing import Any, Callable, Iterable, Mapping

from ..failing import black_hole
from ..scheduling import fit
from . import memory

MAX_RECENT = 256  # steady GPU pods created within the window, kept per node (black hole)


class NodeFold:
    """One node's pods, added up; `kept`: those an analysis reads one by one."""

    __slots__ = ("pods", "kept", "held", "memory", "recent", "events")

    def __init__(self) -> None:
        self.pods = 0
        self.kept: list[dict] = []
        self.events: dict[str, list] | None = None  # uid -> events, of its pods with events
        self.held: dict[str, int] = {}
        self.memory = memory.Tally()
        self.recent = 0  # steady GPU pods of the window kept

    def add(self, pod: dict, keep: bool) -> None:
        self.pods += 1
        fit.add_held(self.held, pod)
        self.memory.add(pod)
        if keep:
            self.kept.append(pod)


class PodFold:
    """Folds pages of pods (as the pager reduces them) into NodeFold per node name.

    `events`: called once, before the first pod is folded, for the pod events by uid (the
    events list is read at the same time as the pods: this waits for it); None: no events.
    `now`: the time the black-hole window ends at (a little earlier than the analysis's)."""

    def __init__(self, events: Callable[[], Mapping[str, list] | None] | None = None,
                 now: dt.datetime | None = None, keep_all: bool = False) -> None:
        self._events_of = events
        self._events: Mapping[str, list] | None = None
        self._now = now or dt.datetime.now(dt.timezone.utc)
        # `now` is read before the lists, the analysis's after them: this window starts
        # earlier than the analysis's, so every pod it counts is kept
        self.since = self._now - black_hole.window()
        self.keep_all = keep_all
        self.reset()

    def reset(self) -> None:
        self.nodes: dict[str, NodeFold] = {}
        self.listed: set[str] = set()      # uids with events whose pod is listed
        self.claim_nodes: set[str] = set()  # nodes where a bound pod still waits on a claim
        self.unbound: list[dict] = []      # not bound to a node, not steady (kept)
        self.total = 0
        self.kept = 0

    @property
    def events(self) -> Mapping[str, list]:
        if self._events is None:
            got = self._events_of() if self._events_of is not None else None
            self._events = got if got is not None else {}
        return self._events

    def page(self, items: Iterable[dict]) -> int:
        """Fold one page; returns how many of its pods were kept."""
        events, nodes, since = self.events, self.nodes, self.since
        kept = 0
        for p in items:
            self.total += 1
            md, spec, st = p.get("metadata") or {}, p.get("spec") or {}, p.get("status") or {}
            uid = md.get("uid")
            evs = events.get(uid) if isinstance(uid, str) else None
            if evs:
                self.listed.add(uid)
            nn = spec.get("nodeName")
            keep = self.keep_all or not _droppable(md, spec, st, evs)
            if not isinstance(nn, str) or not nn:
                if keep:
                    self.unbound.append(p)
                    kept += 1
                continue
            nf = nodes.get(nn)
            if nf is None:
                nf = nodes[nn] = NodeFold()
            if not keep and nf.recent < MAX_RECENT and _recent_gpu(p, md, since):
                keep = True
                nf.recent += 1
            nf.add(p, keep)
            if evs:
                if nf.events is None:
                    nf.events = {}
                nf.events[uid] = evs
            kept += keep
            if spec.get("resourceClaims") and st.get("phase") in (None, "Pending"):
                self.claim_nodes.add(nn)
        self.kept += kept
        return kept

    def kept_pods(self) -> Iterable[dict]:
        """Every pod kept, bound or not (the black-hole context reads these)."""
        for nf in self.nodes.values():
            yield from nf.kept
        yield from self.unbound


def _droppable(md: Mapping[str, Any], spec: Mapping[str, Any], st: Mapping[str, Any],
               evs: list | None) -> bool:
    """A pod every node analysis passes over, its tallies apart (see the module's list)."""
    if st.get("phase") != "Running" or "containerStatuses" in st \
            or "initContainerStatuses" in st or md.get("deletionTimestamp"):
        return False
    if spec.get("resourceClaims") or spec.get("runtimeClassName"):
        return False
    name = md.get("name")
    if isinstance(name, str) and "device-plugin" in name:
        return False
    for k in md.get("annotations") or ():
        if "hami.io" in k or "nvidia.com" in k:
            return False
    if evs:
        for e in evs:
            if e.get("type") == "Warning":
                return False
    return True


def _recent_gpu(p: Mapping[str, Any], md: Mapping[str, Any], since: dt.datetime) -> bool:
    """A GPU pod created within the black-hole window (black_hole.attempt's success)."""
    if not fit.pod_gpu_requests(p):
        return False
    from ..common import parse_time
    created = parse_time(md.get("creationTimestamp"))
    return created is not None and created >= since

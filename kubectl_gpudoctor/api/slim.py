"""Each listed object loses the bulk no analysis reads (managedFields, volumes, env) as it is parsed.

Why apart from pager.py: the page parsers (pageparse.py, in child processes) apply the same
reduction, and pager uses the page parsers; one module each way keeps the imports acyclic.
"""
from __future__ import annotations

import json
import sys
from typing import Any, Callable, Mapping

from ..analysis.monitors import agent_marks

_POD_SPEC_BULK = ("volumes",)
_CONTAINER_BULK = ("env", "envFrom", "volumeMounts", "livenessProbe", "readinessProbe",
                   "startupProbe", "terminationMessagePath", "terminationMessagePolicy")


def _interned_names(pairs: list) -> dict:
    """An object with its member names interned: json decodes each list item with a fresh
    memo of names, so 5,000 nodes carried 5,000 copies of each of their ~80 names (12,000
    events, ~25 each), ~50 bytes a copy, and marshal hands the CLI one object per copy;
    interned, the CLI keeps one string per name (bench/nodes_scale.py: ~20 MiB less). The same
    dict as without the hook: pairs in order, a repeated name's last value at its first place."""
    return {intern(k): v for k, v in pairs}


intern = sys.intern    # member names are always strings (json keys): no type test needed
# how list items are decoded (pageparse, typedpods): json's own, names interned
DECODER = json.JSONDecoder(object_pairs_hook=_interned_names)


def slim(obj: dict) -> dict:
    """Drop what no analysis reads (in place): managedFields of every object, for nodes the
    image list (often 10+ KB a node), and for pods the volumes and per-container env, mounts
    and probes."""
    md = obj.get("metadata")
    if isinstance(md, dict):
        managed = md.pop("managedFields", None)
        st0 = obj.get("status")
        if managed is not None and isinstance(st0, dict) and "nodeInfo" in st0:
            # who wrote each GpuDoctor condition, the one thing a node's view needs of it
            writers = agent_marks.writers_from_managed(managed)
            if writers:
                md[agent_marks.WRITERS_KEY] = writers
    st = obj.get("status")
    if isinstance(st, dict) and "nodeInfo" in st:
        st.pop("images", None)
    spec = obj.get("spec")
    if isinstance(spec, dict) and "containers" in spec:
        for k in _POD_SPEC_BULK:
            spec.pop(k, None)
        for key in ("containers", "initContainers"):
            for c in spec.get(key) or ():
                if isinstance(c, dict):
                    for k in _CONTAINER_BULK:
                        c.pop(k, None)
    return obj


def slim_workload(obj: dict) -> dict:
    """A Kueue Workload without what no analysis reads: managedFields and each pod set's pod
    template (a whole pod spec per pod set); the name and count of each pod set are kept."""
    slim(obj)
    spec = obj.get("spec")
    if isinstance(spec, dict) and isinstance(spec.get("podSets"), list):
        spec["podSets"] = [{"name": ps.get("name"), "count": ps.get("count")}
                           for ps in spec["podSets"] if isinstance(ps, dict)]
    return obj


class PodCompactor:
    """Fleet-scale pod lists: a pod in steady state (Running, every container ready and never
    restarted, not being deleted, no HAMi annotations) is kept as the skeleton the fleet
    analyses read -- name, namespace, uid, creation time, labels, annotations, owners, node,
    each container's name and resources, priority, phase -- with identical parts (a
    Deployment's replicas share labels, annotations and container resources) stored once.
    Any other pod is kept whole (slimmed): it is the one a verdict may be about. Measured on
    the bench's pods: ~17 KB each as parsed JSON, ~8.5 KB slimmed, ~1.5 KB as a skeleton."""

    MAX_SHARED = 4096  # distinct parts remembered; then the table starts over (bounded memory:
                       # labels unique to each pod would otherwise keep one key per pod)

    def __init__(self, container_ids: bool = False) -> None:
        self._shared: dict[str, Any] = {}
        # keep each container's id and name (status.*containerStatuses): with `nodes --probe`
        # the node side's records name containers by id only (analysis/subjects.py)
        self.container_ids = container_ids

    def _one(self, obj: Any, key: Any = None) -> Any:
        """The object equal to `obj` seen before on this page (kept once), else `obj`.
        `key`: a hashable stand-in the caller built more cheaply than repr (labels' items)."""
        if not obj:
            return obj
        if len(self._shared) >= self.MAX_SHARED:
            self._shared.clear()
        # repr, not json.dumps(sort_keys=True): 3x cheaper, and one API server writes equal
        # objects with their keys in the same order
        return self._shared.setdefault(repr(obj) if key is None else key, obj)

    def _mapping(self, d: dict) -> Any:
        """_one for a mapping of strings (labels, annotations), keyed by its items."""
        try:
            return self._one(d, ("m",) + tuple(d.items()))
        except TypeError:  # a value that is not hashable (not a string): by repr
            return self._one(d)

    def __call__(self, pod: dict) -> dict:
        md, spec, st = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
        if not _steady(md, spec, st):
            return slim(pod)
        owners = md.get("ownerReferences")
        return self.skeleton(
            md.get("name"), md.get("namespace"), md.get("uid"), md.get("creationTimestamp"),
            md.get("labels"), md.get("annotations"),
            [(o.get("kind"), o.get("name"), o.get("controller")) for o in owners
             if isinstance(o, dict)] if owners else None,
            spec.get("nodeName"),
            [(key, [(c.get("name"), c.get("resources")) for c in spec.get(key) or ()])
             for key in ("containers", "initContainers")],
            [(key, spec[key]) for key in SKELETON_SPEC if key in spec],
            st.get("phase"), st.get("qosClass"),
            [(key, [(c.get("name"), c.get("containerID")) for c in st.get(key) or ()
                    if isinstance(c, dict)])
             for key in ("initContainerStatuses", "containerStatuses")]
            if self.container_ids else ())

    def skeleton(self, name: Any, namespace: Any, uid: Any, created: Any, labels: Any,
                 annotations: Any, owners: list | None, node: Any,
                 containers: list, spec_kept: list, phase: Any, qos: Any,
                 statuses: Any, check: Callable[[list], None] | None = None) -> dict:
        """The skeleton of a steady pod, from its fields as plain values (what __call__ reads
        of a parsed pod, and api/typedpods.py of a typed one: one construction for both).
        `owners`: (kind, name, controller) of each owner reference, None when it has none;
        `containers`: (key, [(name, resources)]); `spec_kept`: (key, value) of each
        SKELETON_SPEC field present; `statuses`: (key, [(name, containerID)]), used only
        with container_ids. `check(cs)`: called on each containers list not shared yet (one
        already shared has passed it, or came from a checked pod); it may raise."""
        # plain loops and few calls: this runs for every steady pod of the fleet
        if annotations:
            for k in annotations:
                if k.endswith(_LAST_APPLIED):  # kubectl's copy of the whole object: dropped
                    annotations = {k: v for k, v in annotations.items()
                                   if not k.endswith(_LAST_APPLIED)}
                    break
        intern = sys.intern
        meta = {"name": name, "namespace": intern(namespace or ""), "uid": uid,
                "creationTimestamp": intern(created or "")}
        if labels:
            meta["labels"] = self._mapping(labels) if type(labels) is dict else self._one(labels)
        if annotations:
            meta["annotations"] = (self._mapping(annotations) if type(annotations) is dict
                                   else self._one(annotations))
        if owners is not None:  # the replicas of one ReplicaSet share theirs
            kept = [(intern(k) if type(k) is str else k, n, c) for k, n, c in owners]
            try:
                key: Any = ("o",) + tuple(kept)
                hash(key)
            except TypeError:
                key = None
            if key is None or not kept:
                meta["ownerReferences"] = self._one(
                    [{"kind": k, "name": n, "controller": c} for k, n, c in kept], key)
            else:  # built only when no replica has shared it yet
                meta["ownerReferences"] = self._shared_by(key, _owners, kept)
        sp: dict = {"nodeName": intern(node or "")}
        for key, cs in containers:
            if cs:
                # keyed by the (name, resources) pairs' repr: the list of dicts is built once
                pairs = [(n, r or {}) for n, r in cs]
                sp[key] = self._shared_by(("c", repr(pairs)), _containers, pairs, check)
        for key, v in spec_kept:
            sp[key] = intern(v) if type(v) is str else v  # the same few names in 150,000 pods
        if self.container_ids:
            status = {"phase": phase or "", **({"qosClass": qos} if qos else {})}
            for key, ids in statuses:
                if ids:
                    status[key] = [{"name": n, "containerID": c} for n, c in ids]
        else:  # a few kinds in a whole cluster
            status = self._shared_by(("s", repr(phase or ""), repr(qos) if qos else None),
                                     _status, phase, qos)
        return {"metadata": meta, "spec": sp, "status": status}

    def _shared_by(self, key: Any, build: Callable[..., Any], *args: Any) -> Any:
        """_one for the object `build(*args)` makes, built only when none is shared under
        `key` (which stands for its value); never called for an empty one."""
        table = self._shared
        if len(table) >= self.MAX_SHARED:
            table.clear()
        got = table.get(key)
        if got is None:
            got = table[key] = build(*args)
        return got


# what a skeleton keeps of a steady pod's spec besides its node and containers, when present
SKELETON_SPEC = ("priority", "priorityClassName", "overhead", "resourceClaims", "schedulerName")


_LAST_APPLIED = "last-applied-configuration"


def _containers(pairs: list, check: Callable[[list], None] | None) -> list:
    if check is not None:
        check(pairs)
    return [{"name": n, "resources": r} for n, r in pairs]


def _owners(kept: list) -> list:
    return [{"kind": k, "name": n, "controller": c} for k, n, c in kept]


def _status(phase: Any, qos: Any) -> dict:
    return {"phase": phase or "", **({"qosClass": qos} if qos else {})}


def _steady(md: Mapping[str, Any], spec: Mapping[str, Any], st: Mapping[str, Any]) -> bool:
    # plain loops, not any()/all() over generators: this runs for every pod of the fleet
    if st.get("phase") != "Running" or md.get("deletionTimestamp") or not spec.get("nodeName"):
        return False
    for k in md.get("annotations") or ():
        if "hami.io" in k or "nvidia.com" in k:
            return False
    statuses = st.get("containerStatuses")
    if not statuses:
        return False
    for c in statuses:
        if not (c.get("ready") and not c.get("restartCount")
                and "running" in (c.get("state") or ())):
            return False
    return True



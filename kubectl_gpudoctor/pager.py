"""Paged LIST calls (`limit`/`continue`), each page slimmed as it arrives.

Why: `nodes` on 5,000 nodes / 150,000 pods must stay under 500 MiB (DESIGN.md section 8). One
unpaged pod list is ~500 MiB of JSON on such a cluster and several times that as Python dicts;
paged, only one page of raw JSON is alive at a time, and each object loses the bulk no analysis
reads (managedFields, volumes, env) before the next page is fetched. Small clusters still need
one call: a list that fits in one page comes back without a `continue` token. The pages are a
consistent read (no resourceVersion=0: a watch cache that predates ListFromCacheSnapshot
ignores `limit`), and an expired token (410 Gone, the list outlived etcd's compaction) restarts
the list once from the beginning. Pages are parsed item by item (pageparse.parse_page: never a
whole page as one tree), in child processes when `nodes` gives a pageparse.ParsePool.
"""
from __future__ import annotations

import re
import sys
from typing import Any, Callable, Mapping, Sequence

from . import errors, pageparse
from .kube import Kube

PAGE_SIZE = 1000  # ~3.5 MiB of pod JSON per page: bounded memory (in the CLI and each page
                  # parser), one page parsed while the next arrives; 2,000 cost ~30 MiB more at
                  # 150,000 pods for no measurable speed
_POD_SPEC_BULK = ("volumes",)
_CONTAINER_BULK = ("env", "envFrom", "volumeMounts", "livenessProbe", "readinessProbe",
                   "startupProbe", "terminationMessagePath", "terminationMessagePolicy")


def slim(obj: dict) -> dict:
    """Drop what no analysis reads (in place): managedFields of every object, for nodes the
    image list (often 10+ KB a node), and for pods the volumes and per-container env, mounts
    and probes."""
    md = obj.get("metadata")
    if isinstance(md, dict):
        md.pop("managedFields", None)
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

    def _one(self, obj: Any) -> Any:
        if not obj:
            return obj
        if len(self._shared) >= self.MAX_SHARED:
            self._shared.clear()
        # repr, not json.dumps(sort_keys=True): 3x cheaper, and one API server writes equal
        # objects with their keys in the same order
        return self._shared.setdefault(repr(obj), obj)

    def __call__(self, pod: dict) -> dict:
        md, spec, st = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
        if not _steady(md, spec, st):
            return slim(pod)
        ann = {k: v for k, v in (md.get("annotations") or {}).items()
               if not k.endswith("last-applied-configuration")}
        meta = {"name": md.get("name"), "namespace": sys.intern(md.get("namespace") or ""),
                "uid": md.get("uid"),
                "creationTimestamp": sys.intern(md.get("creationTimestamp") or "")}
        for k, v in (("labels", md.get("labels")), ("annotations", ann)):
            if v:
                meta[k] = self._one(v)
        owners = md.get("ownerReferences")
        if owners:  # the replicas of one ReplicaSet share theirs
            meta["ownerReferences"] = self._one(
                [{"kind": _intern(o.get("kind")), "name": o.get("name"),
                  "controller": o.get("controller")} for o in owners if isinstance(o, dict)])
        sp: dict = {"nodeName": sys.intern(spec.get("nodeName") or "")}
        for key in ("containers", "initContainers"):
            cs = [{"name": c.get("name"), "resources": c.get("resources") or {}}
                  for c in spec.get(key) or ()]
            if cs:
                sp[key] = self._one(cs)
        for key in ("priority", "priorityClassName", "overhead", "resourceClaims",
                    "schedulerName"):
            if key in spec:
                sp[key] = spec[key]
        phase, qos = st.get("phase") or "", st.get("qosClass")
        status = {"phase": phase, **({"qosClass": qos} if qos else {})}
        if self.container_ids:
            for key in ("initContainerStatuses", "containerStatuses"):
                ids = [{"name": c.get("name"), "containerID": c.get("containerID")}
                       for c in st.get(key) or () if isinstance(c, dict)]
                if ids:
                    status[key] = ids
        else:
            status = self._one(status)  # a few kinds in a whole cluster
        return {"metadata": meta, "spec": sp, "status": status}


def _intern(v: Any) -> Any:
    return sys.intern(v) if type(v) is str else v


def _steady(md: Mapping[str, Any], spec: Mapping[str, Any], st: Mapping[str, Any]) -> bool:
    if st.get("phase") != "Running" or md.get("deletionTimestamp") or not spec.get("nodeName"):
        return False
    if any("hami.io" in k or "nvidia.com" in k for k in md.get("annotations") or ()):
        return False
    statuses = st.get("containerStatuses") or ()
    if not statuses:
        return False
    return all(c.get("ready") and not c.get("restartCount") and
               "running" in (c.get("state") or {}) for c in statuses)


_CONTINUE = re.compile(rb'"continue"\s*:\s*"([^"]*)"')
_REMAINING = re.compile(rb'"remainingItemCount"\s*:\s*([0-9]+)')


def _worth_children(head: bytes, token: str | None, page_size: int) -> bool:
    """Whether a list whose first page is `head` is long enough for child parsers (their
    start costs ~0.1 s of CPU and ~20 MiB each): at least two more full pages."""
    if not token:
        return False
    m = _REMAINING.search(head, 0, 4096)
    return m is None or int(m.group(1)) >= 2 * page_size


def list_items(kube: Kube, path: str, query: Sequence[tuple[str, Any]] = (), *,
               page_size: int = PAGE_SIZE, timeout: float = 60,
               each: Callable[[dict], dict] | None = slim,
               parsers: "pageparse.ParsePool | None" = None) -> tuple[list[dict], int]:
    """Every item of the list at `path` and the number of pages it took. The next page is
    fetched while this one is parsed: its token is read from the head of the raw page (the
    API server writes `metadata` before `items`). With `parsers` (child processes), pages are
    parsed and reduced there, a few at a time, and merged here in order."""
    restarted = False
    while True:
        try:
            return _walk(kube, path, list(query), page_size, timeout, each, parsers)
        except errors.Gone:
            if restarted:
                raise
            restarted = True  # the token expired mid-list: one consistent restart


def _kind(each: Callable[[dict], dict] | None) -> int | None:
    """The child-side reduction equal to `each`, or None (then pages are parsed here)."""
    if each is slim:
        return pageparse.KIND_SLIM
    if type(each) is PodCompactor:
        return pageparse.KIND_PODS_IDS if each.container_ids else pageparse.KIND_PODS
    return None


def _walk(kube: Kube, path: str, query: list, page_size: int, timeout: float,
          each: Callable[[dict], dict] | None,
          parsers: "pageparse.ParsePool | None") -> tuple[list[dict], int]:
    import collections
    import concurrent.futures as cf

    def fetch(token: str | None) -> bytes:
        q = query + [("limit", str(page_size))] + ([("continue", token)] if token else [])
        return kube.request("GET", path, q, timeout=timeout)

    kind = _kind(each)
    if parsers is None or not parsers.workers or kind is None:
        parsers, ahead = None, 1
    else:
        # pages with the children, not yet merged: one each (the next page is being fetched
        # meanwhile); this bounds the raw pages the CLI holds while they wait for a child
        ahead = parsers.workers
    items: list[dict] = []
    pages = 0
    # (raw page, or None once a child has it; its parse in a child or None; the token that
    # fetched it; the token read from its head)
    inflight: collections.deque = collections.deque()
    with cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="page") as pool:
        asked: str | None = None  # the continue token of the fetch in flight (`nxt`)
        nxt = pool.submit(fetch, asked)
        try:
            while nxt is not None or inflight:
                if nxt is not None and len(inflight) < ahead:
                    raw, this = nxt.result(), asked
                    pages += 1
                    m = _CONTINUE.search(raw, 0, 4096)
                    token = m.group(1).decode() if m and m.group(1) else None
                    asked, nxt = token, pool.submit(fetch, token) if token else None
                    if pages == 1 and parsers is not None and not _worth_children(
                            raw, token, page_size):
                        parsers, ahead = None, 1  # a list of a page or two: parse it here
                    if parsers is not None:  # the child has it now; refetched if it fails
                        inflight.append((None, parsers.submit(raw, kind), this, token))
                    else:
                        inflight.append((raw, None, this, token))
                    del raw
                    continue
                raw, fut, this, token = inflight.popleft()
                try:
                    if fut is not None:
                        got, real = parsers.result(fut, lambda t=this: fetch(t), each)
                    else:
                        got, real = pageparse.parse_page(raw, each)
                except pageparse.NotJson:
                    raise errors.ApiError(
                        f"the API server sent non-JSON for {path}") from None
                del raw, fut
                items.extend(got)
                del got
                if real != token:  # the head scan disagreed with the parsed page: trust the
                    inflight.clear()  # page; what was fetched after it came from a wrong token
                    if nxt is not None:
                        nxt.cancel()
                    asked, nxt = real, pool.submit(fetch, real) if real else None
        finally:
            if nxt is not None:
                nxt.cancel()
    return items, pages

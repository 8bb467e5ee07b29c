"""Paged LIST calls (`limit`/`continue`), each page slimmed as it arrives.

Why: `nodes` on 5,000 nodes / 150,000 pods must stay under 500 MiB (DESIGN.md section 8). One
unpaged pod list is ~500 MiB of JSON on such a cluster and several times that as Python dicts;
paged, only one page of raw JSON is alive at a time, and each object loses the bulk no analysis
reads (managedFields, volumes, env) before the next page is fetched. Small clusters still need
one call: a list that fits in one page comes back without a `continue` token. The pages are a
consistent read (no resourceVersion=0: a watch cache that predates ListFromCacheSnapshot
ignores `limit`), and an expired token (410 Gone, the list outlived etcd's compaction) restarts
the list once from the beginning.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from . import errors
from .kube import Kube

PAGE_SIZE = 5000  # ~17 MiB of pod JSON per page: few round trips, bounded memory
_POD_SPEC_BULK = ("volumes",)
_CONTAINER_BULK = ("env", "envFrom", "volumeMounts", "livenessProbe", "readinessProbe",
                   "startupProbe", "terminationMessagePath", "terminationMessagePolicy")


def slim(obj: dict) -> dict:
    """Drop what no analysis reads (in place): managedFields of every object, and for pods the
    volumes and per-container env, mounts and probes."""
    md = obj.get("metadata")
    if isinstance(md, dict):
        md.pop("managedFields", None)
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


def list_items(kube: Kube, path: str, query: Sequence[tuple[str, Any]] = (), *,
               page_size: int = PAGE_SIZE, timeout: float = 60,
               each: Callable[[dict], dict] | None = slim) -> tuple[list[dict], int]:
    """Every item of the list at `path` and the number of pages it took."""
    restarted = False
    while True:
        items: list[dict] = []
        pages = 0
        token = None
        try:
            while True:
                q = list(query) + [("limit", str(page_size))]
                if token:
                    q.append(("continue", token))
                doc = kube.get_json(path, q, timeout=timeout)
                pages += 1
                page = doc.get("items") or ()
                items.extend(each(i) for i in page) if each else items.extend(page)
                token = (doc.get("metadata") or {}).get("continue")
                del doc, page
                if not token:
                    return items, pages
        except errors.Gone:
            if restarted:
                raise
            restarted = True  # the token expired mid-list: one consistent restart

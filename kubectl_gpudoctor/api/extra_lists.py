"""The cluster-scoped lists the beyond-the-seeds analyses need, fetched once per run:
RuntimeClasses (node.k8s.io/v1) and the DRA objects (resource.k8s.io/v1: ResourceClaims,
ResourceSlices, DeviceClasses).

Why a module of its own: these lists are optional. A cluster without DRA (before 1.34, or the
API group disabled) answers 404, RBAC may forbid them; either way the other analyses still run
and the analyses that needed the list say they could not look. One list call per kind (O(1) in
the number of nodes), each with the client's request deadline.
"""
from __future__ import annotations

from typing import Any

from .. import errors

LISTS = {
    "runtimeclasses": "/apis/node.k8s.io/v1/runtimeclasses",
    "resourceclaims": "/apis/resource.k8s.io/v1/resourceclaims",
    "resourceslices": "/apis/resource.k8s.io/v1/resourceslices",
    "deviceclasses": "/apis/resource.k8s.io/v1/deviceclasses",
}


def fetch(kube, kinds=tuple(LISTS), timeout: float | None = None,
          paged: bool = False) -> tuple[dict[str, Any], list[str]]:
    """({kind: items or None}, notes). None: the list could not be read (the note says why);
    404 means the API is not served (no DRA), which is not an error. An unreachable API server
    (errors.ApiUnreachable) is not a note: it propagates. paged: `limit`/`continue` pages,
    each object slimmed (pager.py; `nodes` on a large cluster: one ResourceSlice per node and
    driver, a claim per GPU pod)."""
    out: dict[str, Any] = {}
    notes: list[str] = []
    for kind in kinds:
        path = LISTS[kind]
        try:
            if paged:
                from . import pager
                out[kind], _ = pager.list_items(kube, path, timeout=timeout)
                continue
            doc = kube.get_json(path, timeout=timeout)
            out[kind] = list((doc or {}).get("items") or [])
            continue
        except errors.NotFound:
            notes.append(f"{kind}: not served by this API server ({path})")
        except errors.Forbidden:
            notes.append(f"{kind}: forbidden (grant list on {path.rsplit('/', 1)[-1]})")
        except errors.ApiError as exc:
            notes.append(f"{kind}: HTTP {exc.status} {exc.message}"[:200])
        out[kind] = None
    return out, notes


# -- the queueing systems' and schedulers' objects (analysis/scheduling/schedulers.py) -------------
#
# Read for one Pending GPU pod (`pod Y`) whose queueing system or scheduler holds it: Kueue
# (kueue.x-k8s.io: Workloads, LocalQueue, ClusterQueue), Volcano (scheduling.volcano.sh/v1beta1:
# PodGroup, Queue), KAI (scheduling.run.ai/v2alpha2: PodGroup). Each group is looked up first
# (GET /apis/GROUP, one small call): a cluster without it answers 404 and nothing else is asked.
# Every read has the request deadline and the pager's bounds; one that fails is a note.

MAX_QUEUE_ITEMS = 20_000  # Workloads read to name who holds a ClusterQueue's quota


def discover(kube, group: str, timeout: float = 10) -> tuple[str | None, set[str], str | None]:
    """(the API server's preferred version of `group`, every version it serves, None), or
    (None, empty, a note: not served, forbidden, or why it could not be read). KAI serves its
    PodGroups and Queues in different versions, hence the set."""
    try:
        doc = kube.get_json(f"/apis/{group}", timeout=timeout)
    except errors.NotFound:
        return None, set(), f"{group}: not served by this API server"
    except errors.ApiError as exc:
        return None, set(), f"{group}: HTTP {exc.status} {exc.message}"[:200]
    doc = doc if isinstance(doc, dict) else {}
    pref = doc.get("preferredVersion") if isinstance(doc.get("preferredVersion"), dict) else {}
    served = {v.get("version") for v in doc.get("versions") or ()
              if isinstance(v, dict) and isinstance(v.get("version"), str)}
    version = pref.get("version")
    if not isinstance(version, str) or not version:
        return None, served, f"{group}: the API server named no version"
    return version, served | {version}, None


def get_object(kube, path: str, timeout: float = 30) -> tuple[dict | None, str | None, bool]:
    """(the object, None, False); (None, note, True) when it does not exist (404); (None, note,
    False) when it could not be read."""
    try:
        doc = kube.get_json(path, timeout=timeout)
    except errors.NotFound:
        return None, f"{path}: not found", True
    except errors.BadAnswer as exc:   # e.g. a field of another JSON type (api/shape.py)
        return None, str(exc.message)[:200], False
    except errors.ApiError as exc:
        return None, f"{path}: HTTP {exc.status} {exc.message}"[:200], False
    return (doc if isinstance(doc, dict) else None), None, False


def list_objects(kube, path: str, query=(), timeout: float = 30, each=None,
                 most: int | None = None) -> tuple[list[dict] | None, str | None]:
    """(the items, None) of a paged list, each reduced by `each` (slim.slim by default), or
    (None, note); past `most` items, the first `most` and a note."""
    from . import pager
    from .slim import slim
    try:
        items, _ = pager.list_items(kube, path, list(query), timeout=timeout,
                                    each=each or slim)
    except errors.BadAnswer as exc:   # e.g. an item with a field of another JSON type
        return None, str(exc.message)[:200]
    except errors.ApiError as exc:
        return None, f"{path}: HTTP {exc.status} {exc.message}"[:200]
    if most is not None and len(items) > most:
        return items[:most], f"{path}: the first {most} of {len(items)} items"
    return items, None

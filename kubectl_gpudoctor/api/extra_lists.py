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

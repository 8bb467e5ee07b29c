"""The 3 a.m. typo: a node or pod that is not there, and the name that probably was meant.

Why its own module: `node gpu-001` (gpu-0001 exists) and `pod trainer-0` typed without `-n ml`
are the commonest mistakes of a tired on-call engineer; kubectl answers only "not found". After
the API's 404, and only then, one bounded list call looks for the likely target:
- a node: the names of the nodes (metadata only, one page), the nearest by params.closest_names;
- a pod: the pods of that exact name in every namespace (a field selector the API server
  evaluates: one call, one page).
Whatever that call meets (forbidden, slow, an odd answer) leaves the plain "not found": a hint
never turns a clear error into another one. Names from the API are printed only when they are
valid Kubernetes names (nothing else reaches the terminal).
"""
from __future__ import annotations

import json

from .. import errors, params
from ..api.kube import Kube

# one page of names: PartialObjectMetadataList (~1 KiB a node) where the server offers it
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
NAMES_PAGE = 5000
NAMES_MAX_BYTES = 32 << 20
SUGGEST_TIMEOUT_S = 5.0
MAX_NAMESPACES = 50


def _names(kube: Kube, path: str, query: list, kind: str,
           quiet: bool = True) -> list[tuple[str, str]]:
    """(namespace, name) of the first page of `path`, valid names only; [] on any failure
    (`quiet`), else the failure raised as one line about the list."""
    try:
        raw = kube.request("GET", path, query,
                           timeout=min(SUGGEST_TIMEOUT_S, kube.timeout_s) if quiet else None,
                           accept=METADATA_ONLY, max_bytes=NAMES_MAX_BYTES)
        doc = json.loads(raw)
    except errors.ApiError as exc:
        if quiet:
            return []
        raise exc.about(f"{kind}s in every namespace", "list") from None
    except (errors.GpuDoctorError, ValueError, RecursionError):
        if quiet:
            return []
        raise errors.ClusterError(f"cannot list {kind}s in every namespace: not a list") \
            from None
    items = doc.get("items") if isinstance(doc, dict) else None
    found = []
    for item in items if isinstance(items, list) else ():
        md = item.get("metadata") if isinstance(item, dict) else None
        name = md.get("name") if isinstance(md, dict) else None
        ns = md.get("namespace") or "" if isinstance(md, dict) else ""
        if isinstance(name, str) and isinstance(ns, str) and \
                params.name_problem(kind, name) is None and \
                (not ns or params.name_problem("namespace", ns) is None):
            found.append((ns, name))
    return found


def node_not_found(kube: Kube, name: str, exc: errors.NotFound) -> errors.NotFound:
    """`node NAME not found`, with the nearest node names when there are some."""
    names = [n for _, n in _names(kube, "/api/v1/nodes", [("limit", NAMES_PAGE)], "node")]
    hint = params.did_you_mean(params.closest_names(name, names))
    return errors.NotFound(f"node {name} not found", status=exc.status, reason=exc.reason,
                           path=exc.path, hint=hint)


def pod_namespaces(kube: Kube, name: str, quiet: bool = True) -> list[str]:
    """The namespaces that hold a pod called `name` (sorted; one call, bounded)."""
    got = _names(kube, "/api/v1/pods", [("fieldSelector", f"metadata.name={name}"),
                                        ("limit", MAX_NAMESPACES)], "pod", quiet)
    return sorted({ns for ns, n in got if n == name and ns})


def pod_not_found(kube: Kube, namespace: str, name: str, exc: errors.ApiError) -> errors.ApiError:
    """`pod NS/NAME not found`, saying where a pod of that name is when it is elsewhere."""
    elsewhere = [ns for ns in pod_namespaces(kube, name) if ns != namespace]
    if not elsewhere:
        return exc
    if len(elsewhere) == 1:
        hint = f"found in namespace {elsewhere[0]} (use -n {elsewhere[0]})"
    else:
        hint = (f"found in namespaces {', '.join(elsewhere[:5])}"
                f"{' and more' if len(elsewhere) > 5 else ''} (use -n NAMESPACE)")
    return errors.NotFound(exc.message, status=exc.status, reason=exc.reason, path=exc.path,
                           hint=hint)


def pod_namespace_anywhere(kube: Kube, name: str) -> str:
    """`pod NAME -A`: the one namespace that holds pod NAME; NotFound if none, a usage error
    naming them if several."""
    found = pod_namespaces(kube, name, quiet=False)
    if not found:
        raise errors.NotFound(f"pod {name} not found in any namespace")
    if len(found) > 1:
        raise errors.UsageError(f"pod {name} exists in namespaces {', '.join(found[:5])}"
                                f"{' and more' if len(found) > 5 else ''}: choose one with -n")
    return found[0]

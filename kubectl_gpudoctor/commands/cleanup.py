"""`cleanup`: delete leftover debug pods found by their labels (a pod already gone counts as
deleted); what remains after a crash or a lost connection.

Where, as kubectl scopes a command: one namespace, `-A/--all-namespaces` for every one. The
default namespace is the probe namespace (`$GPU_DOCTOR_NAMESPACE`, else `gpu-doctor`), not the
kubeconfig context's: debug pods are created only there, as `agent` commands default to the
agent's namespace, so a bare `cleanup` cleans where `node X` left pods.
"""
from __future__ import annotations

from node_probe.protocol import ExitStatus

from .. import errors
from ..session import Session, echo
from .cluster import connect


def namespace_of(o: dict) -> str | None:
    """The namespace to clean: None for all (-A), else -n, else the probe namespace."""
    if o.get("all_namespaces"):
        return None
    from ..reach.probens import choose
    return o.get("namespace") or choose(None)


def cleanup(session: Session, o: dict) -> ExitStatus:
    """Delete leftover debug pods (by label); a pod already gone counts as deleted."""
    from ..reach import debugpod
    from ..api.kube import seg
    namespace = namespace_of(o)
    kube = connect(o)
    deleted, failed = 0, []
    for p in debugpod.list_leftovers(kube, namespace):
        md = p.get("metadata") or {}
        try:
            kube.request("DELETE", f"/api/v1/namespaces/{seg(md.get('namespace'))}/pods/"
                         f"{seg(md.get('name'))}", [("gracePeriodSeconds", "0")])
            deleted += 1
        except errors.NotFound:
            deleted += 1
        except errors.ApiError as exc:
            failed.append(f"{md.get('namespace')}/{md.get('name')}: {exc.status}")
    where = f"namespace {namespace}" if namespace else "all namespaces"
    echo(f"deleted {deleted} gpu-doctor debug pod(s) in {where}")
    if failed:
        raise errors.ClusterError(f"could not delete {len(failed)} gpu-doctor debug pod(s): "
                                  f"{', '.join(failed)}")
    return ExitStatus.OK

"""`cleanup`: delete leftover debug pods found by their labels (a pod already gone counts as
deleted); what remains after a crash or a lost connection."""
from __future__ import annotations


import click

from node_probe.protocol import ExitStatus

from .. import errors
from ..session import Session
from .cluster import connect


def cleanup(session: Session, o: dict) -> ExitStatus:
    """Delete leftover debug pods (by label); a pod already gone counts as deleted."""
    from ..reach import debugpod
    from ..api.kube import seg
    kube = connect(o)
    deleted, failed = 0, []
    for p in debugpod.list_leftovers(kube, o.get("namespace")):
        md = p.get("metadata") or {}
        try:
            kube.request("DELETE", f"/api/v1/namespaces/{seg(md.get('namespace'))}/pods/"
                         f"{seg(md.get('name'))}", [("gracePeriodSeconds", "0")])
            deleted += 1
        except errors.NotFound:
            deleted += 1
        except errors.ApiError as exc:
            failed.append(f"{md.get('namespace')}/{md.get('name')}: {exc.status}")
    where = f"namespace {o['namespace']}" if o.get("namespace") else "all namespaces"
    click.echo(f"deleted {deleted} gpu-doctor debug pod(s) in {where}")
    if failed:
        raise errors.ClusterError(f"could not delete {len(failed)} gpu-doctor debug pod(s): "
                                  f"{', '.join(failed)}")
    return ExitStatus.OK



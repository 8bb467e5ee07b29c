"""Which pod and container hold which device: the kubelet's pod-resources API, read-only.

Why: a finding about a wedged plugin or a denied device is only actionable when it names the
pods involved, and the cgroup audit needs the devices each container was given. The kubelet
serves PodResourcesLister on <kubelet-dir>/pod-resources/kubelet.sock; List and
GetAllocatableResources are called with deadlines (the kubelet may itself be wedged).
"""
from __future__ import annotations

import time
from pathlib import Path

from .rpc import RpcOutcome, _classify, unix_channel

SOCKET_REL = "pod-resources/kubelet.sock"


def socket_path(kubelet_dir: Path) -> Path:
    return Path(kubelet_dir) / SOCKET_REL


def _load():
    import grpc

    from ..kubeletapi import podresources_v1_pb2 as pb
    from ..kubeletapi import podresources_v1_pb2_grpc as pbg
    return grpc, pb, pbg


def rows_from_list(resp) -> list[dict]:
    """Flatten a ListPodResourcesResponse into the "podresources" fact rows."""
    rows = []
    for pod in resp.pod_resources:
        for c in pod.containers:
            for d in c.devices:
                rows.append({"namespace": pod.namespace, "pod": pod.name, "container": c.name,
                             "resource": d.resource_name, "device_ids": list(d.device_ids)})
    return rows


def query(path: Path, deadline_s: float) -> tuple[RpcOutcome, RpcOutcome]:
    """(List outcome with value=rows, GetAllocatableResources outcome with value={res: [ids]})."""
    grpc, pb, pbg = _load()
    ch = unix_channel(grpc, str(path))
    stub = pbg.PodResourcesListerStub(ch)
    try:
        outs = []
        for name, call, req, conv in (
                ("List", stub.List, pb.ListPodResourcesRequest(), rows_from_list),
                ("GetAllocatableResources", stub.GetAllocatableResources,
                 pb.AllocatableResourcesRequest(), _allocatable)):
            t0 = time.monotonic()
            try:
                value = conv(call(req, timeout=deadline_s))
                outs.append(RpcOutcome(name, "ok", time.monotonic() - t0, deadline_s,
                                       value=value))
            except grpc.RpcError as exc:
                status, code, detail = _classify(grpc, exc)
                outs.append(RpcOutcome(name, status, time.monotonic() - t0, deadline_s, code,
                                       detail))
        return outs[0], outs[1]
    finally:
        ch.close()


def _allocatable(resp) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for d in resp.devices:
        out.setdefault(d.resource_name, []).extend(d.device_ids)
    return out


def holders(rows: list[dict], device_ids=None, resource: str | None = None) -> list[dict]:
    """Pods/containers holding any of `device_ids` (or any device of `resource`)."""
    ids = set(device_ids or ())
    out = []
    for r in rows:
        if (resource or ids) and not (r.get("resource") == resource
                                      or ids & set(r["device_ids"])):
            continue
        out.append({"pod": f"{r['namespace']}/{r['pod']}", "container": r["container"],
                    "resource": r["resource"], "device_ids": r["device_ids"]})
    return out

"""Which pod and container hold which device: the kubelet's pod-resources API, read-only.

Why: a finding about a wedged plugin or a denied device is only actionable when it names the
pods involved, and the cgroup audit needs the devices each container was given. The kubelet
serves PodResourcesLister on <kubelet-dir>/pod-resources/kubelet.sock; List and
GetAllocatableResources are called with deadlines (the kubelet may itself be wedged).
"""
from __future__ import annotations

import re
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


# -- which pods a GPU fault hit (issue 40.6) ----------------------------------------------------

MAX_USERS = 32          # pods kept per GPU (a GPU shared by time-slicing has a few)
MAX_ROWS = 10000
_PCI_RE = re.compile(r"([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})(?:\.([0-7]))?")
_UUID_RE = re.compile(r"(?:GPU|MIG)-[0-9a-fA-F-]{8,}")


def pci_key(text: str) -> str | None:
    """`pci 0000:3b:00` (the Xid line's `PCI:0000:3b:00`), `00000000:3B:00.0` (NVML) ->
    `0000:3b:00.0`: domain, bus, device, function (0 when not written)."""
    m = _PCI_RE.search(text)
    if not m:
        return None
    return (f"{int(m.group(1), 16):04x}:{m.group(2).lower()}:{m.group(3).lower()}."
            f"{m.group(4) or 0}")


def gpu_users(rows, gpus) -> dict[str, tuple[str, ...]]:
    """{GPU key: ("ns/pod/container", ...)} from pod-resources List rows (the device ids the
    kubelet allocated: GPU or MIG UUIDs, `UUID::n` replicas under time-slicing) and NVML's
    GPUs (objects with uuid, pci_bus_id, mig_devices: a PCI bus id -> its UUID, and its MIG
    devices' UUIDs). Keys are GPU and MIG UUIDs and PCI ids `0000:3b:00.0`. Pure, bounded."""
    by_dev: dict[str, list[str]] = {}
    for r in list(rows or ())[:MAX_ROWS]:
        name = "/".join(str(r.get(k) or "?")[:253] for k in ("namespace", "pod", "container"))
        for d in list(r.get("device_ids") or ())[:64]:
            users = by_dev.setdefault(str(d).split("::", 1)[0], [])
            if name not in users and len(users) < MAX_USERS:
                users.append(name)
    out: dict[str, tuple[str, ...]] = {k: tuple(v) for k, v in by_dev.items()}
    for g in gpus or ():
        users = list(out.get(getattr(g, "uuid", None) or "", ()))
        for m in getattr(g, "mig_devices", ()) or ():
            users += [u for u in out.get(m.uuid or "", ()) if u not in users]
        if g.uuid:
            out[g.uuid] = tuple(users[:MAX_USERS])
        pci = pci_key(getattr(g, "pci_bus_id", None) or "")
        if pci:
            out[pci] = tuple(users[:MAX_USERS])
    return out


def users_of(subject: str, hit: dict[str, tuple[str, ...]], *more: str) -> tuple[str, ...]:
    """The pods on the GPU a finding names (its subject, or more of its words: a UUID or a
    PCI id), else ()."""
    if not hit:
        return ()
    for text in (subject, *more):
        if not text:
            continue
        m = _UUID_RE.search(text)
        if m and m.group(0) in hit:
            return hit[m.group(0)]
        pci = pci_key(text)
        if pci and pci in hit:
            return hit[pci]
    return ()

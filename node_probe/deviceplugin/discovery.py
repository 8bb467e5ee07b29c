"""Which device plugins serve this node: their sockets, the processes behind them, their pods.

Why: the kubelet talks to each plugin over a unix socket in <kubelet-dir>/device-plugins/, and
the socket file alone says nothing about who serves it. The serving process is the one holding
the socket's inode (host.unix_sockets: nothing else, a process name or a path string, counts,
since any tenant can choose those). The pod comes from the process's cgroup path, the resource
name from the kubelet's checkpoint or the socket name.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from node_probe.host import containers, device_checkpoint, procfs
from node_probe.host.unix_sockets import find_owners, list_sockets


@dataclasses.dataclass
class PluginTarget:
    socket: str                       # path as the probe sees it
    pid: int | None = None
    comm: str = ""
    resource: str | None = None
    resource_source: str | None = None  # kubelet-checkpoint | pod-resources | socket-name
    pod_uid: str | None = None
    container_id: str | None = None
    socket_path_in_process: str | None = None
    match: str | None = None          # how the process was matched: always "inode"
    nvml_library: str | None = None   # libnvidia-ml.so* the process has mapped (its own path)

    def fact(self) -> dict:
        """The "deviceplugin.targets" record (contract keys first, extras after)."""
        d = {"pid": self.pid, "comm": self.comm, "resource": self.resource, "socket": self.socket,
             "pod_uid": self.pod_uid, "resource_source": self.resource_source}
        if self.nvml_library and self.pid:
            d["nvml_library"] = self.nvml_library
            d["nvml_library_host_path"] = f"/proc/{self.pid}/root{self.nvml_library}"
        return d


def pod_of(pid: int, proc: Path = procfs.PROC) -> tuple[str | None, str | None]:
    """(pod UID, container id) from the process's cgroup path, if it runs in a pod."""
    ref = containers.pod_of_pid(pid, proc)
    return (ref.pod_uid, ref.container_id) if ref else (None, None)


def resource_from_socket_name(name: str) -> str | None:
    """NVIDIA's plugin names its socket nvidia-<resource>.sock (nvidia-gpu.sock,
    nvidia-mig-1g.10gb.sock) for resource nvidia.com/<resource>."""
    stem = name[:-5] if name.endswith(".sock") else name
    if stem.startswith("nvidia-") and len(stem) > 7:
        return "nvidia.com/" + stem[7:]
    return None


def read_checkpoint(kubelet_dir: Path) -> dict:
    """The kubelet's device manager checkpoint (parsed by node_probe.host.device_checkpoint):
    {"registered": {resource: [ids]}, "allocations": [{"pod_uid","container","resource",
    "device_ids"}]} ({} if absent or unreadable)."""
    got = device_checkpoint.read(kubelet_dir)
    if got is None:
        return {}
    entries, registered = got
    return {"registered": registered,
            "allocations": [{"pod_uid": e.pod_uid, "container": e.container,
                             "resource": e.resource, "device_ids": list(e.device_ids)}
                            for e in entries]}


def discover(kubelet_dir: Path, proc: Path = procfs.PROC) -> list[PluginTarget]:
    """All plugin sockets with their serving processes (pid None when nobody serves one)."""
    from node_probe.host import proctasks  # local: proctasks imports elfsyms, only needed here

    sockets = list_sockets(kubelet_dir)
    owners = find_owners(sockets, proc)
    ckpt = read_checkpoint(kubelet_dir)
    out = []
    for s in sockets:
        t = PluginTarget(socket=str(s))
        res = resource_from_socket_name(s.name)
        if res:
            t.resource, t.resource_source = res, "socket-name"
        if s in owners:
            pid, inner, how = owners[s]
            t.pid, t.socket_path_in_process, t.match = pid, inner, how
            t.comm = procfs.read_comm(pid, proc)
            t.pod_uid, t.container_id = pod_of(pid, proc)
            t.nvml_library = proctasks.nvml_library(pid, proc)
        if t.resource is None and len(ckpt.get("registered", {})) == 1:
            # one registered resource on the node and one plugin: it is that one
            (only,) = ckpt["registered"]
            if len(sockets) == 1:
                t.resource, t.resource_source = only, "kubelet-checkpoint"
        out.append(t)
    return out


def refine_resource(t: PluginTarget, device_ids: list[str],
                    registered: dict[str, list[str]], source: str) -> None:
    """Name the plugin's resource from a registry of resource -> device ids (the kubelet
    checkpoint or pod-resources GetAllocatableResources) by device-id overlap."""
    ids = set(device_ids)
    if not ids:
        return
    best = max(registered.items(), key=lambda kv: len(ids & set(kv[1])), default=None)
    if best and ids & set(best[1]):
        t.resource, t.resource_source = best[0], source

"""Which device plugins serve this node: their sockets, the processes behind them, their pods.

Why: the kubelet talks to each plugin over a unix socket in <kubelet-dir>/device-plugins/, and
the socket file alone says nothing about who serves it. The serving process is found from the
kernel's socket tables: /proc/PID/net/unix (one read per network namespace, since plugins often
run in a pod's netns) lists the socket inodes bound to that path, and /proc/PID/fd/* links
`socket:[inode]` name the process holding them. The path in the table is the path inside the
plugin's mount namespace, so a match on the basename is confirmed by stat()ing the path through
/proc/PID/root and comparing it with the socket file the probe sees; nothing else (a process
name, a path string) counts, since any tenant can choose those. The pod comes from the
process's cgroup path, the resource name from the kubelet's checkpoint or the socket name.
"""
from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

from node_probe.host import containers, device_checkpoint, procfs

KUBELET_SOCKET = "kubelet.sock"
NET_UNIX_CAP = 32 << 20  # one /proc/PID/net/unix table; a netns with ~300k sockets, bounded
_ACCEPTCON = 0x00010000


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


def list_sockets(kubelet_dir: Path) -> list[Path]:
    """Plugin sockets in <kubelet-dir>/device-plugins/ (not the kubelet's own)."""
    d = Path(kubelet_dir) / "device-plugins"
    try:
        names = sorted(os.listdir(d))
    except OSError:
        return []
    out = []
    for n in names:
        if n == KUBELET_SOCKET:
            continue
        p = d / n
        try:
            if stat.S_ISSOCK(os.lstat(p).st_mode):
                out.append(p)
        except OSError:
            continue
    return out


def parse_net_unix(text: str) -> list[tuple[int, int, str]]:
    """(inode, flags, path) of path-bound sockets in a /proc/net/unix table."""
    out = []
    for line in text.splitlines()[1:]:
        parts = line.split(None, 7)
        if len(parts) < 8:
            continue
        path = parts[7].strip()
        if not path or path.startswith("@"):
            continue
        try:
            out.append((int(parts[6]), int(parts[3], 16), path))
        except ValueError:
            continue
    return out


def _netns(pid: int, proc: Path) -> str | None:
    try:
        return os.readlink(proc / str(pid) / "ns" / "net")
    except OSError:
        return None


def _socket_inodes(pid: int, proc: Path) -> set[int]:
    out = set()
    fd_dir = proc / str(pid) / "fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return out
    for fd in fds:
        try:
            link = os.readlink(fd_dir / fd)
        except OSError:
            continue
        if link.startswith("socket:["):
            try:
                out.add(int(link[8:-1]))
            except ValueError:
                pass
    return out


def _same_file(a: os.stat_result, path: Path) -> bool:
    try:
        b = os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def find_owners(sockets: list[Path], proc: Path = procfs.PROC) -> dict[Path, tuple[int, str, str]]:
    """socket path -> (pid, path inside the process, match kind) for sockets someone serves."""
    if not sockets:
        return {}
    by_base: dict[str, list[Path]] = {}
    for s in sockets:
        by_base.setdefault(s.name, []).append(s)
    # 1. candidate socket inodes whose bound path has one of our basenames, per netns
    all_pids = list(procfs.pids(proc))
    seen_ns: set[str] = set()
    ns_of: dict[int, str | None] = {}
    cand: dict[int, str] = {}  # socket inode -> bound path
    for pid in all_pids:
        ns = _netns(pid, proc)
        ns_of[pid] = ns
        if ns is None or ns in seen_ns:
            continue
        seen_ns.add(ns)
        text = procfs.read_str(proc / str(pid) / "net" / "unix", NET_UNIX_CAP)
        if text is None:
            continue
        for inode, _flags, path in parse_net_unix(text):
            if os.path.basename(path) in by_base:
                cand[inode] = path
    if not cand:
        return {}
    # 2. processes holding those inodes
    holders: dict[str, list[tuple[int, str]]] = {}  # basename -> [(pid, bound path)]
    for pid in all_pids:
        for inode in _socket_inodes(pid, proc) & cand.keys():
            path = cand[inode]
            holders.setdefault(os.path.basename(path), []).append((pid, path))
    # 3. confirm which socket file each holder serves
    out: dict[Path, tuple[int, str, str]] = {}
    for base, files in by_base.items():
        hs = sorted(set(holders.get(base, ())))
        for f in files:
            try:
                st = os.stat(f)
            except OSError:
                continue
            # Only the inode identifies the owner: any process can bind a socket with the
            # same path in its own mount namespace (or unlink it after binding), so a
            # matching path or basename alone would let it pose as the plugin.
            for pid, path in hs:
                if _same_file(st, proc / str(pid) / "root" / path.lstrip("/")):
                    out[f] = (pid, path, "inode")
                    break
    return out


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

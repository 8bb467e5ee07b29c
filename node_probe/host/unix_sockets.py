"""Who serves a unix socket: the process holding the socket's inode, found from the kernel.

Why here: the kubelet dir, the container runtime and the device plugins are all identified by
the sockets they serve, never by a process name (any tenant can choose one): host.layout,
host.kubeletconfig, host.runtime_config and deviceplugin.discovery all ask this module. The
serving process is found from the kernel's socket tables: /proc/PID/net/unix (one read per
network namespace, since plugins often run in a pod's netns) lists the socket inodes bound to
that path, and /proc/PID/fd/* links `socket:[inode]` name the process holding them. The path in
the table is the path inside the process's mount namespace, so a match on the basename is
confirmed by stat()ing the path through /proc/PID/root and comparing it with the socket file the
probe sees; nothing else (a process name, a path string) counts.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from node_probe.host import procfs

KUBELET_SOCKET = "kubelet.sock"
NET_UNIX_CAP = 32 << 20  # one /proc/PID/net/unix table; a netns with ~300k sockets, bounded
_ACCEPTCON = 0x00010000


def list_sockets(kubelet_dir: Path) -> list[Path]:
    """Device-plugin sockets in <kubelet-dir>/device-plugins/ (not the kubelet's own)."""
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

"""Which processes hold NVIDIA GPU device nodes (/dev/nvidiaN) open, from /proc/PID/fd.

Why: the kubelet's allocation (pod-resources) says which GPUs a container was *given*; what a
container *uses* is what its processes have open. A container started with
NVIDIA_VISIBLE_DEVICES=all under a default NVIDIA runtime, a privileged pod or a hostPath /dev
can open every GPU on the node without an allocation. The open file table is the kernel's own
record of that, whatever the container's environment or spec says.

A descriptor counts when its link target names an `nvidia<digits>` node and the inode it points
to is a character device with the driver's major (from /proc/devices): the name alone can be
faked, the major alone also matches unrelated devices. Bounded: at most MAX_FDS descriptors per
process and MAX_PIDS processes per call, and optionally a Budget of descriptors over many calls
(the watching agent's cap per pass: each descriptor read costs ~4-5 us of CPU, see
bench/isolation_scan.py); a process that exits mid-scan is skipped.
"""
from __future__ import annotations

import dataclasses
import os
import re
import stat
from pathlib import Path
from typing import Iterable

from node_probe.host import procfs

MAX_FDS = 4096
MAX_PIDS = 4096
_GPU_NODE = re.compile(r"/nvidia([0-9]{1,3})$")


@dataclasses.dataclass
class Budget:
    """Descriptors that may still be read (shared by the calls of one scan)."""

    left: int
    read: int = 0
    exhausted: bool = False

    def take(self) -> bool:
        if self.left <= 0:
            self.exhausted = True
            return False
        self.left -= 1
        self.read += 1
        return True


@dataclasses.dataclass(frozen=True)
class Holder:
    pid: int
    comm: str
    minor: int          # /dev/nvidia<minor>
    path: str           # the link target as the process sees it


def gpu_fds(pid: int, major: int, proc: Path = procfs.PROC,
            max_fds: int = MAX_FDS, budget: Budget | None = None) -> list[tuple[int, str]]:
    """(minor, path) of each distinct GPU device node `pid` holds open (those read before
    `budget` ran out: budget.exhausted then says the list may be short)."""
    fd_dir = proc / str(pid) / "fd"
    out: dict[int, str] = {}
    try:
        it = os.scandir(fd_dir)
    except OSError:
        return []
    with it:
        for n, entry in enumerate(it):
            if n >= max_fds or (budget is not None and not budget.take()):
                break
            try:
                target = os.readlink(entry.path)
            except OSError:
                continue
            m = _GPU_NODE.search(target)
            if not m:
                continue
            try:
                st = os.stat(entry.path)   # follows the fd to the open inode itself
            except OSError:
                continue
            if stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) == major:
                out.setdefault(os.minor(st.st_rdev), target[-256:])
    return sorted(out.items())


def holders(pids: Iterable[int], major: int, proc: Path = procfs.PROC,
            max_pids: int = MAX_PIDS, budget: Budget | None = None) -> list[Holder]:
    out = []
    for n, pid in enumerate(pids):
        if n >= max_pids or (budget is not None and budget.exhausted):
            break
        fds = gpu_fds(pid, major, proc, budget=budget)
        if fds:
            comm = procfs.read_comm(pid, proc)
            out.extend(Holder(pid, comm, minor, path) for minor, path in fds)
    return out

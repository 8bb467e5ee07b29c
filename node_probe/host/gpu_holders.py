"""Which processes hold NVIDIA GPU device nodes (/dev/nvidiaN) open, from /proc/PID/fd.

Why: the kubelet's allocation (pod-resources) says which GPUs a container was *given*; what a
container *uses* is what its processes have open. A container started with
NVIDIA_VISIBLE_DEVICES=all under a default NVIDIA runtime, a privileged pod or a hostPath /dev
can open every GPU on the node without an allocation. The open file table is the kernel's own
record of that, whatever the container's environment or spec says.

A descriptor counts when its link target names an `nvidia<digits>` node and the inode it points
to is a character device with the driver's major (from /proc/devices): the name alone can be
faked, the major alone also matches unrelated devices.

Bounded and linear: at most MAX_FDS descriptors per process and MAX_PIDS processes per scan,
optionally a Budget of descriptors (the watching agent's cap per pass: each descriptor read
costs ~4-5 us of CPU, see bench/isolation_scan.py) and a deadline shared by the calls of one
scan; a process that exits mid-scan is skipped. A scan that stops early never passes for a
clean one (round-4 audit I-02: 4,100 descriptors opened before the GPU ones hid a breach and
the check said ok): every process whose table was read in part, and every process left unread,
is in Scan.cuts with what stopped it.
"""
from __future__ import annotations

import dataclasses
import os
import re
import stat
import time
from pathlib import Path
from typing import Iterable

from node_probe.host import procfs

MAX_FDS = 1 << 16      # a process's descriptors read at most (~0.3 s of CPU), cut beyond: said
MAX_PIDS = 4096
DEADLINE_EVERY = 256     # descriptors read between two looks at the clock
_GPU_NODE = re.compile(r"/nvidia([0-9]{1,3})$")


@dataclasses.dataclass
class Budget:
    """What one scan may still read, shared by its calls: `left` descriptors (None: no count
    cap) until `deadline` (time.monotonic(); None: none). `exhausted` once either ran out."""

    left: int | None = None
    deadline: float | None = None
    read: int = 0
    exhausted: bool = False
    why: str = ""

    def take(self) -> bool:
        if self.exhausted:
            return False
        if self.left is not None and self.left <= 0:
            return self._out(f"the cap of {self.read} descriptors read per run")
        if self.deadline is not None and self.read % DEADLINE_EVERY == 0 \
                and time.monotonic() >= self.deadline:
            return self._out("the run's deadline")
        if self.left is not None:
            self.left -= 1
        self.read += 1
        return True

    def _out(self, why: str) -> bool:
        self.exhausted, self.why = True, why
        return False


@dataclasses.dataclass(frozen=True)
class Holder:
    pid: int
    comm: str
    minor: int          # /dev/nvidia<minor>
    path: str           # the link target as the process sees it


@dataclasses.dataclass(frozen=True)
class Cut:
    """A process whose descriptors were read in part (`read` of them) or not at all."""

    pid: int
    comm: str
    read: int
    why: str

    def to_dict(self) -> dict:
        return {"pid": self.pid, "comm": self.comm, "fds_read": self.read, "why": self.why}


@dataclasses.dataclass(frozen=True)
class Scan:
    holders: tuple[Holder, ...] = ()
    cuts: tuple[Cut, ...] = ()          # empty: every descriptor of every process was read

    @property
    def complete(self) -> bool:
        return not self.cuts


def gpu_fds(pid: int, major: int, proc: Path = procfs.PROC, max_fds: int = MAX_FDS,
            budget: Budget | None = None) -> tuple[list[tuple[int, str]], int, str | None]:
    """((minor, path) of each distinct GPU device node `pid` holds open, descriptors read, why
    the table was read only in part or None). A cut list may be short: never read it as all."""
    fd_dir = proc / str(pid) / "fd"
    out: dict[int, str] = {}
    cut = None
    n = 0
    try:
        it = os.scandir(fd_dir)
    except OSError:
        return [], 0, None     # gone, or not ours to read: no descriptors to judge
    with it:
        for entry in it:
            if n >= max_fds:
                cut = f"the per-process cap of {max_fds} descriptors"
                break
            if budget is not None and not budget.take():
                cut = budget.why
                break
            n += 1
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
    return sorted(out.items()), n, cut


def scan(pids: Iterable[int], major: int, proc: Path = procfs.PROC,
         max_pids: int | None = None, budget: Budget | None = None,
         max_fds: int | None = None) -> Scan:
    """The GPU nodes `pids` hold open, and every process read in part or not at all (caps:
    MAX_PIDS processes, MAX_FDS descriptors each, unless given)."""
    max_pids = MAX_PIDS if max_pids is None else max_pids
    max_fds = MAX_FDS if max_fds is None else max_fds
    out: list[Holder] = []
    cuts: list[Cut] = []
    comms: dict[int, str] = {}

    def comm(pid: int) -> str:
        if pid not in comms:
            comms[pid] = procfs.read_comm(pid, proc)
        return comms[pid]

    for n, pid in enumerate(pids):
        if n >= max_pids:
            cuts.append(Cut(pid, comm(pid), 0, f"the cap of {max_pids} processes per scan"))
            break     # one says the rest was not read; no need to list them
        if budget is not None and budget.exhausted:
            cuts.append(Cut(pid, comm(pid), 0, budget.why))
            break
        fds, read, why = gpu_fds(pid, major, proc, max_fds, budget)
        if why:
            cuts.append(Cut(pid, comm(pid), read, why))
        out.extend(Holder(pid, comm(pid), minor, path) for minor, path in fds)
    return Scan(tuple(out), tuple(cuts))

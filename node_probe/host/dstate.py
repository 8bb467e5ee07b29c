"""Threads in uninterruptible sleep (state D) whose process holds a GPU device node.

Why: a rank whose process is stuck in the kernel (an ioctl into the NVIDIA driver that never
returns, a read from a hung NFS or FUSE mount holding a checkpoint) stops taking part in its
job's collectives, and every other rank waits. The kernel's own record is the state letter of
each thread in /proc/PID/task/TID/stat ("D": uninterruptible, proc(5)) and the kernel function
it sleeps in, /proc/PID/task/TID/wchan. A process counts when its open file table holds a GPU
node (host.gpu_holders: the driver's major, not the name alone).

Only files that are safe to read from a process stuck in the kernel are read (stat, wchan,
comm, the fd links): never cmdline, environ or mem, which take the process's mm lock and
would leave the reader stuck beside it. Bounded: MAX_PIDS processes, MAX_THREADS threads each,
a deadline; a scan cut short says so (`cut`). Two samples a moment apart: a thread in D for a
few milliseconds (a disk read) is normal; one still in D in both is stuck.
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from node_probe.host import gpu_holders, procfs

MAX_PIDS = 32768
MAX_THREADS = 1024


@dataclasses.dataclass(frozen=True)
class Stuck:
    """A process holding GPU nodes with threads in D in both samples."""

    pid: int
    comm: str
    threads: tuple[dict, ...]      # {"tid", "comm", "state", "wchan"}
    gpu_minors: tuple[int, ...]
    cgroup: str

    def to_dict(self) -> dict:
        return {"pid": self.pid, "comm": self.comm, "threads": list(self.threads),
                "gpu_minors": list(self.gpu_minors), "cgroup": self.cgroup}


def state_of(stat_text: str) -> str | None:
    """The state letter of one /proc/.../stat line ("1234 (py thon) D 1 ..."): the comm may
    hold spaces and parentheses, so the state is the field after the LAST ')'."""
    head, sep, rest = stat_text.rpartition(")")
    if not sep or not head:
        return None
    fields = rest.split()
    return fields[0] if fields and len(fields[0]) == 1 else None


def _d_threads(pid: int, proc: Path) -> list[int]:
    out = []
    for tid in procfs.tids(pid, proc)[:MAX_THREADS]:
        text = procfs.read_str(proc / str(pid) / "task" / str(tid) / "stat", 4096)
        if text is not None and state_of(text) == "D":
            out.append(tid)
    return out


def _wchan(pid: int, tid: int, proc: Path) -> str | None:
    w = procfs.read_str(proc / str(pid) / "task" / str(tid) / "wchan", 256)
    w = (w or "").strip()
    return None if w in ("", "0") else w[:128]


def scan(proc: Path, major: int, deadline: float, gap_s: float = 0.5,
         pids=None) -> tuple[list[Stuck], str | None]:
    """(GPU-holding processes with threads in D in two samples `gap_s` apart, why the scan was
    cut or None). `pids`: only these (default: every process under `proc`)."""
    first: dict[int, list[int]] = {}
    cut = None
    for n, pid in enumerate(procfs.pids(proc) if pids is None else pids):
        if n >= MAX_PIDS:
            cut = f"the cap of {MAX_PIDS} processes"
            break
        if n % 64 == 0 and time.monotonic() >= deadline:
            cut = "the check's deadline"
            break
        ds = _d_threads(pid, proc)
        if ds:
            first[pid] = ds
    if not first:
        return [], cut
    time.sleep(max(0.0, min(gap_s, deadline - time.monotonic())))
    out = []
    for pid, ds in first.items():
        again = set(_d_threads(pid, proc)) & set(ds)
        if not again:
            continue
        fds, _, _ = gpu_holders.gpu_fds(pid, major, proc, max_fds=4096)
        if not fds:
            continue
        threads = tuple({"tid": t, "comm": procfs.read_comm(t, proc / str(pid) / "task")[:64],
                         "state": "D", "wchan": _wchan(pid, t, proc)} for t in sorted(again)[:16])
        cg = procfs.read_cgroups(pid, proc)
        out.append(Stuck(pid, procfs.read_comm(pid, proc)[:64], threads,
                         tuple(m for m, _ in fds), (cg.get("") or next(iter(cg.values()), ""))[:512]))
    return out, cut

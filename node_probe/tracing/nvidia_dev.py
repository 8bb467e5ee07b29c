"""Loader for bpf/nvidia_dev.bpf.c: device opens (with errno) and ioctls on those fds.

Why: turns the kernel side's ring buffer and maps into plain dicts for "trace.results":
every open under the device prefix with its result and the opener's device cgroup, ioctl
count/latency per process, fd and request, and ioctls still in flight at the end of the
window with how long they have waited. fds opened before the probe attached are seeded from
/proc/PID/fd so their ioctls are seen too.
"""
from __future__ import annotations

import errno as errno_mod
import os
import time
from pathlib import Path
from typing import Callable

from node_probe.host import procfs
from .bundle import cstr, mono_to_wall, TracepointSet
from .sources import cstring

NAME = "nvidia_dev"
PATH_LEN = 128
TGID_SLOTS = 65536   # NVDEV_TGID_SLOTS in the .bpf.c
EV_OPEN, EV_SLOW_IOCTL = 1, 2
TRACEPOINTS = (   # (syscall tracepoint, program): one program may serve several
    ("sys_enter_openat", "nvdev_enter_open"), ("sys_exit_openat", "nvdev_exit_open"),
    ("sys_enter_openat2", "nvdev_enter_open"), ("sys_exit_openat2", "nvdev_exit_open"),
    ("sys_enter_open", "nvdev_enter_open_legacy"), ("sys_exit_open", "nvdev_exit_open"),
    ("sys_enter_dup", "nvdev_enter_dup"), ("sys_exit_dup", "nvdev_exit_dup"),
    ("sys_enter_dup2", "nvdev_enter_dup2"), ("sys_exit_dup2", "nvdev_exit_dup"),
    ("sys_enter_dup3", "nvdev_enter_dup2"), ("sys_exit_dup3", "nvdev_exit_dup"),
    ("sys_enter_fcntl", "nvdev_enter_fcntl"), ("sys_exit_fcntl", "nvdev_exit_dup"),
    ("sys_enter_close", "nvdev_enter_close"),
    ("sys_enter_ioctl", "nvdev_enter_ioctl"), ("sys_exit_ioctl", "nvdev_exit_ioctl"),
)
REQUIRED = ("sys_enter_openat", "sys_exit_openat", "sys_enter_ioctl", "sys_exit_ioctl",
            "sys_enter_close")
MAX_OPENS = 2000


def _errname(code: int) -> str:
    return errno_mod.errorcode.get(code, str(code))


class NvidiaDev:
    name = NAME

    def __init__(self, dev_prefix: str = "/dev/nvidia", slow_s: float = 1.0,
                 self_tgid: int | None = None, proc: Path = procfs.PROC,
                 on_event: Callable[[str, dict], None] | None = None,
                 seed_budget_s: float = 0.3) -> None:
        if not dev_prefix or len(dev_prefix.encode()) >= PATH_LEN - 1:
            raise ValueError(f"device prefix must be 1..{PATH_LEN - 2} bytes: {dev_prefix!r}")
        self.prefix = dev_prefix
        self.slow_s = slow_s
        self.self_tgid = os.getpid() if self_tgid is None else self_tgid
        self.proc = proc
        self.on_event = on_event or (lambda kind, data: None)
        self.seed_budget_s = seed_budget_s
        self.b = None
        self.opens: list[dict] = []
        self.slow_ioctls: list[dict] = []
        self.seeded = 0
        self.dropped = 0

    def cflags(self) -> list[str]:
        return [f"-DNVDEV_PREFIX={cstring(self.prefix)}",
                f"-DNVDEV_SLOW_NS={int(self.slow_s * 1e9)}ULL",
                f"-DNVDEV_SELF_TGID={self.self_tgid}"]

    def attach(self, b, tps: TracepointSet, first_pids=()) -> None:
        self.b = b
        b[b"nvdev_events"].open_ring_buffer(self._on_ring)
        tps.attach(TRACEPOINTS, required=REQUIRED)
        self.seed_open_fds(first_pids)

    # -- fds opened before attach -------------------------------------------------------------
    def seed_open_fds(self, first_pids=()) -> int:
        """Put already-open device fds into nvdev_fds (targets first, then every process, within
        a time budget). Attached before seeding, so no open/close falls in between unseen."""
        fds = self.b[b"nvdev_fds"]
        deadline = time.monotonic() + self.seed_budget_s
        order = list(dict.fromkeys([*first_pids, *procfs.pids(self.proc)]))
        prefix = self.prefix
        for pid in order:
            if time.monotonic() > deadline:
                break
            if pid == self.self_tgid:
                continue
            fd_dir = self.proc / str(pid) / "fd"
            try:
                names = os.listdir(fd_dir)
            except OSError:
                continue
            for n in names:
                try:
                    target = os.readlink(fd_dir / n)
                except OSError:
                    continue
                if not target.startswith(prefix):
                    continue
                key = fds.Key(pid, int(n))
                leaf = fds.Leaf()
                leaf.open_ns = 0
                raw = target.encode()[:PATH_LEN - 1]
                leaf.path = raw
                fds[key] = leaf
                slots = self.b[b"nvdev_tgid_has_fds"]
                slots[slots.Key(pid & (TGID_SLOTS - 1))] = slots.Leaf(1)
                self.seeded += 1
        return self.seeded

    # -- ring buffer ----------------------------------------------------------------------------
    def _on_ring(self, ctx, data, size) -> None:
        e = self.b[b"nvdev_events"].event(data)
        if e.kind == EV_OPEN:
            err = -e.ret if e.ret < 0 else 0
            rec = {"pid": e.pid, "tid": e.tid, "comm": cstr(e.comm), "path": cstr(e.path),
                   "fd": e.fd if e.ret >= 0 else None, "ret": e.ret, "errno": err,
                   "errno_name": _errname(err) if err else None,
                   "cgroup_id": e.cgroup_id, "cgroup": procfs.read_cgroups(e.pid, self.proc),
                   "ts": mono_to_wall(e.ts)}
            rec["device"] = _device_of(self.proc, e.pid, rec["path"])
            if len(self.opens) < MAX_OPENS:
                self.opens.append(rec)
            else:
                self.dropped += 1
            self.on_event("open", rec)
        elif e.kind == EV_SLOW_IOCTL:
            rec = {"pid": e.pid, "tid": e.tid, "comm": cstr(e.comm), "fd": e.fd,
                   "path": cstr(e.path), "request": e.cmd, "request_hex": f"0x{e.cmd:08x}",
                   "duration_s": round(e.duration_ns / 1e9, 6), "ret": e.ret,
                   "ts": mono_to_wall(e.ts)}
            self.slow_ioctls.append(rec)
            self.on_event("slow_ioctl", rec)

    # -- end of window --------------------------------------------------------------------------
    def collect(self, now: int | None = None) -> dict:
        now = time.monotonic_ns() if now is None else now
        fds = {(k.tgid, k.fd): cstr(v.path) for k, v in self.b[b"nvdev_fds"].items()}
        ioctls = []
        infos = {(k.tgid, k.fd, k.cmd): v for k, v in self.b[b"nvdev_statinfo"].items()}
        for k, per_cpu in self.b[b"nvdev_stats"].items():
            count = sum(int(v.count) for v in per_cpu)
            total = sum(int(v.total_ns) for v in per_cpu)
            info = infos.get((k.tgid, k.fd, k.cmd))
            ioctls.append({"pid": k.tgid, "comm": cstr(info.comm) if info else "", "fd": k.fd,
                           "path": (cstr(info.path) if info else "") or fds.get((k.tgid, k.fd), ""),
                           "request": k.cmd, "request_hex": f"0x{k.cmd:08x}", "count": count,
                           "total_s": round(total / 1e9, 6),
                           "mean_s": round(total / 1e9 / count, 9) if count else 0.0,
                           "max_s": round(max(int(v.max_ns) for v in per_cpu) / 1e9, 6),
                           "errors": sum(int(v.errors) for v in per_cpu)})
        ioctls.sort(key=lambda r: (-r["max_s"], r["pid"], r["request"]))
        inflight = []
        for k, v in self.b[b"nvdev_inflight"].items():
            if v.ts == 0:
                continue  # the thread's last call returned
            pid, tid = k.value >> 32, k.value & 0xFFFFFFFF
            if not (self.proc / str(pid) / "task" / str(tid)).exists():
                continue  # the thread died inside the call (no exit tracepoint fires then)
            inflight.append({"pid": pid, "tid": tid,
                             "comm": _thread_comm(self.proc, pid, tid),
                             "fd": v.fd, "path": fds.get((pid, v.fd), ""),
                             "request": v.cmd, "request_hex": f"0x{v.cmd:08x}",
                             "wait_s": round((now - v.ts) / 1e9, 6)})
        inflight.sort(key=lambda r: -r["wait_s"])
        return {"opens": list(self.opens), "ioctls": ioctls, "ioctls_inflight": inflight,
                "ioctls_slow": list(self.slow_ioctls),
                "nvidia_dev": {"prefix": self.prefix, "seeded_fds": self.seeded,
                               "tracked_fds": len(fds), "opens_dropped": self.dropped}}


def _thread_comm(proc: Path, pid: int, tid: int) -> str:
    comm = procfs.read_str(proc / str(pid) / "task" / str(tid) / "comm")
    return comm.strip() if comm is not None else procfs.read_comm(pid, proc)


def _device_of(proc: Path, pid: int, path: str) -> dict | None:
    """major:minor of the node the process opened, seen through its own root (best effort)."""
    candidates = [proc / str(pid) / "root" / path.lstrip("/")] if path.startswith("/") else []
    candidates.append(Path(path))
    for c in candidates:
        try:
            st = os.stat(c)
        except OSError:
            continue
        if st.st_rdev:
            return {"major": os.major(st.st_rdev), "minor": os.minor(st.st_rdev)}
        return None
    return None

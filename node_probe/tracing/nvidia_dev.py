"""Loader for bpf/nvidia_dev.bpf.c: device opens (with errno) and ioctls on those fds.

Why: turns the kernel side's ring buffers and maps into plain dicts for "trace.results":
every open under the device prefix with its result and the opener's device cgroup (from the
shared fd tracker), ioctl count/duration per process, fd and request, and ioctls still in
flight at the end of the window with how long they have waited. Calls are timed with the
kernel tick when its rate is known (ticks.py; `ioctl_clock` in the results says which clock
and its resolution).
"""
from __future__ import annotations

import errno as errno_mod
import os
import time
from pathlib import Path

from node_probe.host import procfs
from . import ticks
from .abi import Constants
from .bundle import cstr, mono_to_wall, who, TracepointSet
from .fdtrack import FdTracker
from .loader import Emit, LoaderBase, Targets, TraceConfig

C = Constants("nvidia_dev")
TRACEPOINTS = (("sys_enter_ioctl", "nvdev_enter_ioctl"), ("sys_exit_ioctl", "nvdev_exit_ioctl"))
MAX_OPENS = 2000


def _errname(code: int) -> str:
    return errno_mod.errorcode.get(code, str(code))


class NvidiaDev(LoaderBase):
    name = "nvidia_dev"
    uses_fds = True

    def __init__(self, cfg: TraceConfig, emit: Emit, fds: FdTracker | None) -> None:
        super().__init__(cfg, emit, fds)
        self.opens: list[dict] = []
        self.slow_ioctls: list[dict] = []
        self.dropped = 0
        self.hz = None if cfg.precise_ioctl_clock else ticks.tick_hz(cfg.host_root, cfg.proc)
        self.unit_s = 1.0 / self.hz if self.hz else 1e-9
        self._tick0 = ticks.sample(cfg.proc) if self.hz else None   # (monotonic ns, jiffies)
        if self._tick0 is None:
            self.hz, self.unit_s = None, 1e-9
        fds.subscribe([C.FDT_KIND_NVDEV], self._on_open)

    def cflags(self) -> list[str]:
        slow = max(1, round(self.cfg.ioctl_slow_s / self.unit_s))
        return [f"-DNVDEV_SLOW={slow}ULL", *(["-DNVDEV_JIFFIES"] if self.hz else [])]

    def attach(self, b, tps: TracepointSet, targets: Targets) -> bool:
        self.b = b
        b[b"nvdev_events"].open_ring_buffer(self._on_ring)
        tps.attach(TRACEPOINTS, required=[e for e, _ in TRACEPOINTS])
        return True

    # -- clock ------------------------------------------------------------------------------
    def _clock_now(self) -> tuple[int, int]:
        """(now in the programs' clock, CLOCK_MONOTONIC ns at that moment)."""
        if self.hz:
            s = ticks.sample(self.proc)
            if s is None:   # unreadable now: carry the first sample forward
                mono0, jif0 = self._tick0
                mono = time.monotonic_ns()
                return jif0 + (mono - mono0) * self.hz // 10**9, mono
            return s[1], s[0]
        now = time.monotonic_ns()
        return now, now

    def _mono_ns(self, ts: int, clock_now: tuple[int, int]) -> int:
        now, mono = clock_now
        return mono - round((now - ts) * self.unit_s * 1e9)

    # -- ring buffers -------------------------------------------------------------------------
    def _on_open(self, e) -> None:
        err = -e.ret if e.ret < 0 else 0
        rec = {**who(e), "path": cstr(e.path),
               "fd": e.ret if e.ret >= 0 else None, "ret": e.ret, "errno": err,
               "errno_name": _errname(err) if err else None,
               "cgroup_id": e.cgroup_id, "cgroup": procfs.read_cgroups(e.pid, self.proc),
               "ts": mono_to_wall(e.ts)}
        rec["device"] = _device_of(self.proc, e.pid, rec["path"])
        if len(self.opens) < MAX_OPENS:
            self.opens.append(rec)
        else:
            self.dropped += 1
        self.emit("open", rec)

    def _on_ring(self, ctx, data, size) -> None:
        e = self.b[b"nvdev_events"].event(data)
        if e.kind != C.NVDEV_EV_SLOW_IOCTL:
            return
        clock_now = self._clock_now()
        rec = {**who(e), "fd": e.fd,
               "path": cstr(e.path), "request": e.cmd, "request_hex": f"0x{e.cmd:08x}",
               "duration_s": round(e.duration * self.unit_s, 6), "ret": e.ret,
               "ts": mono_to_wall(self._mono_ns(e.ts, clock_now))}
        self.slow_ioctls.append(rec)
        self.emit("slow_ioctl", rec)

    # -- end of window ------------------------------------------------------------------------
    def collect(self, out: dict, now_ns: int) -> None:
        clock_now = self._clock_now()
        tracked = self.fds.tracked()
        paths = {k: p for k, (kind, p) in tracked.items() if kind == C.FDT_KIND_NVDEV}
        infos = {(k.tgid, k.fd, k.cmd): v for k, v in self.b[b"nvdev_statinfo"].items()}
        acc: dict[tuple[int, int, int], list[int]] = {}   # key -> [count, total, max, errors]

        def add(key, count, total, mx, errors):
            a = acc.setdefault(key, [0, 0, 0, 0])
            a[0] += count
            a[1] += total
            a[2] = max(a[2], mx)
            a[3] += errors

        for k, per_cpu in self.b[b"nvdev_stats"].items():
            add((k.tgid, k.fd, k.cmd), sum(int(v.count) for v in per_cpu),
                sum(int(v.total) for v in per_cpu), max(int(v.max) for v in per_cpu),
                sum(int(v.errors) for v in per_cpu))
        inflight = []
        for _k, t in _array_items(self.b[b"nvdev_threads"]):
            if t.count:   # counts the thread has not flushed into nvdev_stats yet
                add((t.acc_tgid, t.acc_fd, t.acc_cmd), int(t.count), int(t.total), int(t.max),
                    int(t.errors))
            if t.ts:
                inflight.append((t.tgid, t.tid, t.fd, t.cmd, int(t.ts)))
        for k, c in self.b[b"nvdev_inflight"].items():
            if c.ts:
                inflight.append((k.value >> 32, k.value & 0xFFFFFFFF, c.fd, c.cmd, int(c.ts)))
        ioctls = []
        for (tgid, fd, cmd), (count, total, mx, errors) in acc.items():
            info = infos.get((tgid, fd, cmd))
            ioctls.append({"pid": tgid, "comm": cstr(info.comm) if info else "", "fd": fd,
                           "path": (cstr(info.path) if info else "") or paths.get((tgid, fd), ""),
                           "request": cmd, "request_hex": f"0x{cmd:08x}", "count": count,
                           "total_s": round(total * self.unit_s, 6),
                           "mean_s": round(total * self.unit_s / count, 9) if count else 0.0,
                           "max_s": round(mx * self.unit_s, 6), "errors": errors})
        ioctls.sort(key=lambda r: (-r["max_s"], r["pid"], r["request"]))
        waiting = []
        for pid, tid, fd, cmd, ts in inflight:
            if not (self.proc / str(pid) / "task" / str(tid)).exists():
                continue  # the thread died inside the call (no exit tracepoint fires then)
            waiting.append({"pid": pid, "tid": tid, "comm": _thread_comm(self.proc, pid, tid),
                            "fd": fd, "path": paths.get((pid, fd), ""),
                            "request": cmd, "request_hex": f"0x{cmd:08x}",
                            "wait_s": round(max(0, clock_now[0] - ts) * self.unit_s, 6)})
        waiting.sort(key=lambda r: -r["wait_s"])
        out.update({"opens": list(self.opens), "ioctls": ioctls, "ioctls_inflight": waiting,
                    "ioctls_slow": list(self.slow_ioctls),
                    "nvidia_dev": {"prefix": self.fds.prefix, "seeded_fds": self.fds.seeded,
                                   "tracked_fds": len(paths), "opens_dropped": self.dropped,
                                   "ioctl_clock": {"source": "jiffies" if self.hz else "ktime",
                                                   "resolution_s": self.unit_s}}})


def _array_items(table):
    """Entries of a BPF array in one syscall where the kernel allows (5.6+), else one by one."""
    try:
        return list(table.items_lookup_batch())
    except Exception:
        return list(table.items())


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

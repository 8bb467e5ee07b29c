"""Loader for bpf/futex_wait.bpf.c: long futex waits of the target processes.

Why: "the thread that entered nvmlInit_v2 is asleep in futex() for 4.8 s" is what separates a
hung library from a slow one. The kernel side filters by tgid (a map filled here) and only
captures user stacks for long waits; waits still in progress at the end are read from its
map, and threads that were already asleep in futex() before the probe attached are found in
/proc/PID/task/TID/syscall. In-progress waits get a stack scan (proctasks.symbolic_stack)
because BPF user stacks stop at glibc. Nothing is attached when there are no targets (futex() is hot).
Unfinished library calls of earlier loaders (out["_pending_calls"], e.g. nvml_calls) have their
threads scanned first and get the wait and its stack attached.
"""
from __future__ import annotations

import platform
import time
from pathlib import Path
from typing import Iterable

from node_probe.host import procfs, proctasks
from . import ucalls
from .bundle import mono_to_wall, who, TracepointSet
from .fdtrack import FdTracker
from .loader import Emit, LoaderBase, Targets, TraceConfig

TRACEPOINTS = (("sys_enter_futex", "futex_enter"), ("sys_exit_futex", "futex_exit"))
FUTEX_NR = {"x86_64": 202, "aarch64": 98}.get(platform.machine())
MAX_WAITS = 500
MAX_SCANS = 32
SCAN_BUDGET_S = 0.5   # stack scans of in-progress waits (first ELF parse of a big binary)


class FutexWait(LoaderBase):
    name = "futex_wait"

    def __init__(self, cfg: TraceConfig, emit: Emit, fds: FdTracker | None) -> None:
        super().__init__(cfg, emit, fds)
        self.targets: list[int] = []
        self.min_wait_s = cfg.futex_min_s
        self.waits: list[dict] = []
        self.attached = False
        self.attach_mono = 0

    def cflags(self) -> list[str]:
        return [f"-DFUTEX_MIN_NS={int(self.min_wait_s * 1e9)}ULL"]

    def attach(self, b, tps: TracepointSet, targets: Targets) -> bool:
        self.b = b
        self.targets = sorted(set(targets.deep))
        self.attach_mono = time.monotonic_ns()
        if not self.targets:
            return False
        t = b[b"futex_targets"]
        for pid in self.targets:
            t[t.Key(pid)] = t.Leaf(1)
        b[b"futex_events"].open_ring_buffer(self._on_ring)
        tps.attach(TRACEPOINTS, required=[e for e, _ in TRACEPOINTS])
        self.attached = True
        return True

    def _stack(self, stack_id: int, pid: int) -> list[str]:
        if stack_id < 0:
            return []
        out = []
        try:
            for addr in self.b[b"futex_stacks"].walk(stack_id):
                out.append(self.b.sym(addr, pid, show_module=True, show_offset=True)
                           .decode("utf-8", "replace"))
        except Exception:
            pass
        return out

    def _on_ring(self, ctx, data, size) -> None:
        e = self.b[b"futex_events"].event(data)
        rec = {**who(e),
               "wait_s": round(e.wait_ns / 1e9, 6), "in_progress": False,
               "op": e.op, "uaddr": f"0x{e.uaddr:x}", "ret": e.ret,
               "stack": self._stack(e.stack_id, e.pid), "stack_source": "bpf",
               "ts": mono_to_wall(e.ts)}
        if len(self.waits) < MAX_WAITS:
            self.waits.append(rec)
        self.emit("long_wait", rec)

    def collect(self, out: dict, now_ns: int) -> None:
        """Finished long waits, plus waits in progress now; threads inside an unfinished
        library call (out["_pending_calls"]) are stack-scanned first and get their wait."""
        pending = out.get("_pending_calls", [])
        out.update(self._collect([(c["pid"], c["tid"]) for c in pending], now_ns))
        waits = {(w["pid"], w["tid"]): w for w in out["futex_waits"] if w["in_progress"]}
        for c in pending:
            w = waits.get((c["pid"], c["tid"]))
            if w is not None:
                c["futex_wait_s"] = w["wait_s"]
                c["stack"] = w.get("stack", [])

    def _collect(self, scan_tids: Iterable[tuple[int, int]], now: int) -> dict:
        waits = list(self.waits)
        in_progress: dict[tuple[int, int], dict] = {}
        if self.attached:
            for pid, tid, v in ucalls.live_threads(self.b[b"futex_start"], self.proc):
                wait = (now - v.ts) / 1e9
                if wait < self.min_wait_s:
                    continue
                in_progress[(pid, tid)] = {
                    "pid": pid, "tid": tid, "comm": _comm(self.proc, pid, tid),
                    "wait_s": round(wait, 6), "in_progress": True, "op": v.op,
                    "uaddr": f"0x{v.uaddr:x}", "started_before_trace": False,
                    "ts": mono_to_wall(v.ts)}
        # Threads asleep in futex() since before we attached (no enter record exists).
        window = (now - self.attach_mono) / 1e9
        if FUTEX_NR is not None:
            for pid in self.targets:
                for tid in procfs.tids(pid, self.proc):
                    if (pid, tid) in in_progress:
                        continue
                    nr, args, _sp, _pc = proctasks.read_syscall(pid, tid, self.proc)
                    if nr == FUTEX_NR and len(args) > 1 and (args[1] & 0x7F) in (0, 6, 9, 11, 13):
                        in_progress[(pid, tid)] = {
                            "pid": pid, "tid": tid, "comm": _comm(self.proc, pid, tid),
                            "wait_s": round(window, 6), "in_progress": True,
                            "op": args[1], "uaddr": f"0x{args[0]:x}",
                            "started_before_trace": True}
        order = [k for k in dict.fromkeys(scan_tids) if k in in_progress]
        order += [k for k in sorted(in_progress, key=lambda k: -in_progress[k]["wait_s"])
                  if k not in order]
        scan_deadline = time.monotonic() + SCAN_BUDGET_S
        for i, key in enumerate(order):
            rec = in_progress[key]
            scanned = (proctasks.symbolic_stack(*key, proc=self.proc)
                       if i < MAX_SCANS and time.monotonic() < scan_deadline else None)
            rec["stack"] = scanned["frames"] if scanned else []
            rec["stack_source"] = "stack-scan" if scanned else None
            waits.append(rec)
        return {"futex_waits": waits,
                "futex_wait": {"targets": self.targets, "attached": self.attached,
                               "min_wait_s": self.min_wait_s}}


def _comm(proc: Path, pid: int, tid: int) -> str:
    comm = procfs.read_str(proc / str(pid) / "task" / str(tid) / "comm")
    return comm.strip() if comm is not None else procfs.read_comm(pid, proc)

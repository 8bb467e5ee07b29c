"""One trace window: compile all programs once, attach them together, poll, detach, collect.

Why: the four loaders share one BCC module (one compile, see bundle.py) and one polling loop;
this is the only place that knows all of them, so the `trace` check stays a short script and
the benchmark can drive exactly what the probe runs. Nothing stays attached after `close()`.
"""
from __future__ import annotations

import resource
import time
from pathlib import Path
from typing import Callable, Iterable

from . import bundle
from .cgroup_devices import CgroupDevices
from .futex_wait import FutexWait
from .nvidia_dev import NvidiaDev
from .nvml_calls import NvmlCalls

PROGRAMS = ("nvidia_dev", "cgroup_devices", "futex_wait", "nvml_calls")

OnEvent = Callable[[str, str, dict], None]   # (program, kind, record)


class TraceSession:
    def __init__(self, *, dev_prefix: str, cgroup_dir: Path, tracefs: str,
                 targets: Iterable[int] = (), futex_min_s: float = 0.5,
                 ioctl_slow_s: float = 1.0, proc: Path = Path("/proc"),
                 on_event: OnEvent | None = None) -> None:
        self.targets = sorted({int(p) for p in targets if int(p) > 0})
        self.tracefs = tracefs
        self.proc = proc
        cb = on_event or (lambda prog, kind, rec: None)
        self.nvidia_dev = NvidiaDev(dev_prefix, slow_s=ioctl_slow_s, proc=proc,
                                    on_event=lambda k, r: cb("nvidia_dev", k, r))
        self.cgroup_devices = CgroupDevices(cgroup_dir, proc=proc,
                                            on_event=lambda k, r: cb("cgroup_devices", k, r))
        self.futex_wait = FutexWait(self.targets, min_wait_s=futex_min_s, proc=proc,
                                    on_event=lambda k, r: cb("futex_wait", k, r))
        self.nvml_calls = NvmlCalls(self.targets, proc=proc,
                                    on_event=lambda k, r: cb("nvml_calls", k, r))
        self.loaders = (self.nvidia_dev, self.cgroup_devices, self.futex_wait, self.nvml_calls)
        self.b = None
        self.tps = None
        self.timings: dict[str, float] = {}
        self.attached_at = 0.0

    def compile(self) -> None:
        t0 = time.monotonic()
        cflags = [f for loader in self.loaders for f in loader.cflags()]
        self.b = bundle.compile_programs(PROGRAMS, cflags)
        self.timings["compile_s"] = round(time.monotonic() - t0, 3)

    def set_targets(self, targets: Iterable[int]) -> None:
        """Targets known only after compiling (the device plugin's pid): before attach()."""
        self.targets = sorted({*self.targets, *(int(p) for p in targets if int(p) > 0)})
        self.futex_wait.targets = self.targets
        self.nvml_calls.targets = self.targets

    def attach(self) -> list[str]:
        """Attach everything; returns the names of the programs that are live."""
        t0 = time.monotonic()
        self.tps = bundle.TracepointSet(self.b, self.tracefs)
        try:
            self.nvidia_dev.attach(self.b, self.tps, first_pids=self.targets)
            self.cgroup_devices.attach(self.b, self.tps)
            self.futex_wait.attach(self.b, self.tps)
            self.nvml_calls.attach(self.b)
        except BaseException:
            self.close()
            raise
        self.timings["attach_s"] = round(time.monotonic() - t0, 3)
        self.attached_at = time.monotonic()
        live = ["nvidia_dev", "cgroup_devices"]
        if self.futex_wait.attached:
            live.append("futex_wait")
        if self.nvml_calls.attached_pids:
            live.append("nvml_calls")
        return live

    def poll(self, until_monotonic: float, cancelled=None, step_ms: int = 100) -> None:
        while True:
            left = until_monotonic - time.monotonic()
            if left <= 0 or (cancelled is not None and cancelled.is_set()):
                break
            self.b.ring_buffer_poll(max(1, min(step_ms, int(left * 1000))))
        self.b.ring_buffer_consume()

    def collect(self) -> dict:
        """Read everything out (call before close: the maps go with the BPF object)."""
        t0 = time.monotonic()
        self.b.ring_buffer_consume()
        now = time.monotonic_ns()   # one "now" so waits and call durations compare
        out: dict = {"window_s": round(time.monotonic() - self.attached_at, 3)}
        nvml = self.nvml_calls.collect(now=now)
        pending = [(c["pid"], c["tid"]) for c in nvml["nvml_calls"] if not c["returned"]]
        out.update(nvml)
        out.update(self.futex_wait.collect(scan_tids=pending, now=now))
        out.update(self.nvidia_dev.collect(now=now))
        out.update(self.cgroup_devices.collect())
        waits = {(w["pid"], w["tid"]): w for w in out["futex_waits"] if w["in_progress"]}
        for c in out["nvml_calls"]:
            w = waits.get((c["pid"], c["tid"]))
            if not c["returned"] and w is not None:
                c["futex_wait_s"] = w["wait_s"]
                c["stack"] = w.get("stack", [])
        self.timings["collect_s"] = round(time.monotonic() - t0, 3)
        out["timings"] = self.timings   # the same dict: close() adds close_s
        out["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
        out["skipped_tracepoints"] = list(self.tps.skipped) if self.tps else []
        return out

    def close(self) -> None:
        t0 = time.monotonic()
        if self.tps is not None:
            self.tps.detach()
        self.timings["detach_s"] = round(time.monotonic() - t0, 3)
        if self.b is not None:
            try:
                self.b.cleanup()   # uprobes, ring buffers, program fds
            except Exception:
                pass
            self.b = None
        self.timings["close_s"] = round(time.monotonic() - t0, 3)

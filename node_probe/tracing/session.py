"""One trace window: compile all programs once, attach them together, poll, detach, collect.

Why: the loaders share one BCC module (one compile, see bundle.py), one fd tracker and one
polling loop; LOADERS below is the one list of probes (adding one: its bpf/<name>.bpf.c, its
loader class here, its verdict in node_probe/checks/_trace_verdicts.py). The `trace` check
stays a short script and the benchmark drives exactly what the probe runs. Nothing stays
attached after `close()`.
"""
from __future__ import annotations

import resource
import time
from typing import Callable, Iterable

from . import bundle
from .cgroup_devices import CgroupDevices
from .cuda_calls import CudaCalls
from .fdtrack import FdTracker
from .futex_wait import FutexWait
from .loader import Loader, Targets, TraceConfig
from .nvidia_dev import NvidiaDev
from .nvml_calls import NvmlCalls

# Collection order: a loader may read what an earlier one added (futex_wait: pending calls).
LOADERS: tuple[type[Loader], ...] = (NvidiaDev, CgroupDevices, NvmlCalls, CudaCalls, FutexWait)
PROGRAMS = tuple(cls.name for cls in LOADERS)

OnEvent = Callable[[str, str, dict], None]   # (program, kind, record)


class TraceSession:
    def __init__(self, cfg: TraceConfig, *, tracefs: str, targets: Iterable[int] = (),
                 on_event: OnEvent | None = None,
                 loaders: Iterable[type[Loader]] = LOADERS) -> None:
        self.cfg = cfg
        self.targets = sorted({int(p) for p in targets if int(p) > 0})
        self.gpu_pids: list[int] = []
        self.tracefs = tracefs
        cb = on_event or (lambda prog, kind, rec: None)
        classes = tuple(loaders)
        self.fds = (FdTracker(cfg.dev_prefix, self_tgid=cfg.self_tgid, proc=cfg.proc)
                    if any(c.uses_fds for c in classes) else None)
        self.loaders: list[Loader] = [
            c(cfg, (lambda name: lambda kind, rec: cb(name, kind, rec))(c.name), self.fds)
            for c in classes]
        self.b = None
        self.tps = None
        self.timings: dict[str, float] = {}
        self.attached_at = 0.0

    def loader(self, name: str) -> Loader:
        return next(ld for ld in self.loaders if ld.name == name)

    def compile(self) -> None:
        t0 = time.monotonic()
        cflags = [*(self.fds.cflags() if self.fds else []),
                  *(f for ld in self.loaders for f in ld.cflags())]
        self.b = bundle.compile_programs([ld.name for ld in self.loaders], cflags)
        self.timings["compile_s"] = round(time.monotonic() - t0, 3)

    def set_targets(self, targets: Iterable[int], gpu_pids: Iterable[int] = ()) -> None:
        """Targets known only after compiling (the device plugin's pid, the processes of GPU
        containers): before attach()."""
        self.targets = sorted({*self.targets, *(int(p) for p in targets if int(p) > 0)})
        self.gpu_pids = sorted({*self.gpu_pids, *(int(p) for p in gpu_pids if int(p) > 0)})

    def attach(self) -> list[str]:
        """Attach everything; returns the names of the programs that are live."""
        t0 = time.monotonic()
        self.tps = bundle.TracepointSet(self.b, self.tracefs)
        live = []
        targets = Targets(deep=tuple(self.targets), gpu=tuple(self.gpu_pids))
        try:
            for ld in self.loaders:
                if ld.attach(self.b, self.tps, targets):
                    live.append(ld.name)
            if self.fds is not None:   # last: its seeding must not miss what the others track
                self.fds.attach(self.b, self.tps, first_pids=self.targets)
        except BaseException:
            self.close()
            raise
        self.timings["attach_s"] = round(time.monotonic() - t0, 3)
        self.attached_at = time.monotonic()
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
        for ld in self.loaders:
            ld.collect(out, now)
        out.pop("_pending_calls", None)
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

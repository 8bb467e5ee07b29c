"""Loader for bpf/nvml_calls.bpf.c: NVML init calls of target processes, entered and returned.

Why: "entered nvmlInit_v2 and not returned, for N seconds" is the direct evidence of seed 000.
The library the device plugin really uses is found through /proc/PID (libs.py) and the uprobes
are attached by that path, for that pid only.
"""
from __future__ import annotations

import re
from pathlib import Path

from node_probe.host import procfs
from . import libs, ucalls
from .abi import Constants
from .bundle import mono_to_wall, who, TracepointSet
from .fdtrack import FdTracker
from .loader import Emit, LoaderBase, Targets, TraceConfig

C = Constants("nvml_calls")
FUNCS = ("nvmlInit_v2", "nvmlInit", "nvmlInitWithFlags")   # entry program N probes FUNCS[N]
RETURN_FN = "nvml_return_any"
_LIB_RE = re.compile(r"/libnvidia-ml\.so(\.[0-9.]+)?$")


def find_library(pid: int, proc: Path = procfs.PROC) -> tuple[str | None, str | None, str]:
    """(path inside the process's mount namespace, path to attach through /proc/PID/root,
    how it was found)."""
    return libs.find_in_process(pid, _LIB_RE, "libnvidia-ml.so.1", proc)


class NvmlCalls(LoaderBase):
    name = "nvml_calls"

    def __init__(self, cfg: TraceConfig, emit: Emit, fds: FdTracker | None) -> None:
        super().__init__(cfg, emit, fds)
        self.targets: list[int] = []
        self.calls: list[dict] = []
        self.attachments: list[dict] = []
        self._libs: dict[int, str] = {}

    def cflags(self) -> list[str]:
        if len(FUNCS) > C.NVML_MAX_FUNCS:
            raise ValueError("more NVML functions than entry programs in nvml_calls.bpf.c")
        return []

    def attach(self, b, tps: TracepointSet, targets: Targets) -> bool:
        self.b = b
        self.targets = sorted(set(targets.deep))
        if not self.targets:
            return False
        b[b"nvml_events"].open_ring_buffer(self._on_ring)
        for pid in self.targets:
            inner, path, how = find_library(pid, self.proc)
            rec = {"pid": pid, "library": inner, "attach_path": path, "found": how,
                   "functions": [], "errors": []}
            self.attachments.append(rec)
            if path is None:
                continue
            rec["functions"], rec["errors"] = ucalls.attach_pairs(b, path, FUNCS, "nvml_enter_",
                                                                  RETURN_FN, pid)
            if rec["functions"]:
                self._libs[pid] = inner
        return bool(self._libs)

    @property
    def attached_pids(self) -> list[int]:
        return sorted(self._libs)

    def _on_ring(self, ctx, data, size) -> None:
        e = self.b[b"nvml_events"].event(data)
        func = ucalls.func_name(FUNCS, e.func)
        if e.kind == C.NVML_EV_ENTER:
            rec = {**who(e), "func": func,
                   "library": self._libs.get(e.pid), "ts": mono_to_wall(e.ts)}
            self.emit("entered", rec)
        elif e.kind == C.NVML_EV_RETURN:
            rec = {**who(e), "func": func,
                   "library": self._libs.get(e.pid), "returned": True,
                   "duration_s": round(e.duration_ns / 1e9, 6), "ret": e.ret,
                   "ts": mono_to_wall(e.ts)}
            self.calls.append(rec)
            self.emit("returned", rec)

    def collect(self, out: dict, now_ns: int) -> None:
        calls = list(self.calls)
        if self.targets:
            calls += ucalls.unfinished(self.b[b"nvml_entered"], FUNCS, self._libs.get, now_ns,
                                       self.proc)
        out.update({"nvml_calls": calls, "nvml_attachments": self.attachments})
        out.setdefault("_pending_calls", []).extend(c for c in calls if not c["returned"])

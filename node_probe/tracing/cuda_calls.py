"""Loader for bpf/cuda_calls.bpf.c: CUDA driver-API calls that returned an error, per process.

Why: "CUDA error 999 in pod X" becomes useful when it comes with the container and what the
kernel saw at that moment. uprobes are per inode; GPU containers get the host's libcuda.so.1
bind-mounted by the NVIDIA container toolkit, so the library is found per process (libs.py),
attached by absolute path through /proc/PID/root once per distinct inode, for all
processes (containers that start during the window are covered). The host's own library
(under --host-root) is attached too. Functions a library does not export are skipped.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from node_probe.host import procfs
from . import libs, ucalls
from .abi import Constants
from .bundle import mono_to_wall, who, TracepointSet
from .fdtrack import FdTracker
from .loader import Emit, LoaderBase, Targets, TraceConfig

C = Constants("cuda_calls")
# Init, device, context and memory-allocation calls (the program's entry function N probes
# FUNCS[N]). Not calls a program makes in its hot loop (cuCtxSetCurrent, cuMemGetInfo, kernel
# launches): every probed call costs a trap into the kernel on entry and on return.
FUNCS = ("cuInit", "cuDeviceGetCount", "cuDeviceGet", "cuDevicePrimaryCtxRetain",
         "cuCtxCreate_v2", "cuCtxCreate_v3", "cuCtxCreate_v4",
         "cuMemAlloc_v2", "cuMemAllocManaged", "cuMemAllocHost_v2", "cuMemAllocAsync",
         "cuMemCreate")
RETURN_FN = "cuda_return"
MAX_LIBS = 16
MAX_FAILED = 500
_LIB_RE = re.compile(r"/libcuda\.so(\.[0-9.]+)?$")

# CUresult (cuda.h, enum cudaError_enum): the codes a failing init/context/memory call returns.
CURESULT = {
    0: "CUDA_SUCCESS", 1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY",
    3: "CUDA_ERROR_NOT_INITIALIZED", 4: "CUDA_ERROR_DEINITIALIZED",
    34: "CUDA_ERROR_STUB_LIBRARY", 46: "CUDA_ERROR_DEVICE_UNAVAILABLE",
    100: "CUDA_ERROR_NO_DEVICE", 101: "CUDA_ERROR_INVALID_DEVICE",
    102: "CUDA_ERROR_DEVICE_NOT_LICENSED", 201: "CUDA_ERROR_INVALID_CONTEXT",
    214: "CUDA_ERROR_ECC_UNCORRECTABLE", 216: "CUDA_ERROR_CONTEXT_ALREADY_IN_USE",
    220: "CUDA_ERROR_NVLINK_UNCORRECTABLE", 304: "CUDA_ERROR_OPERATING_SYSTEM",
    400: "CUDA_ERROR_INVALID_HANDLE", 401: "CUDA_ERROR_ILLEGAL_STATE",
    700: "CUDA_ERROR_ILLEGAL_ADDRESS", 708: "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE",
    709: "CUDA_ERROR_CONTEXT_IS_DESTROYED", 800: "CUDA_ERROR_NOT_PERMITTED",
    801: "CUDA_ERROR_NOT_SUPPORTED", 802: "CUDA_ERROR_SYSTEM_NOT_READY",
    803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", 804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
    999: "CUDA_ERROR_UNKNOWN",
}


def error_name(code: int) -> str:
    return CURESULT.get(code, f"CUresult {code}")


def find_library(pid: int, proc: Path = procfs.PROC) -> str | None:
    """The libcuda.so.1 the process maps, or would load, as a path through /proc/PID/root."""
    return libs.find_in_process(pid, _LIB_RE, "libcuda.so.1", proc)[1]


class CudaCalls(LoaderBase):
    name = "cuda_calls"

    def __init__(self, cfg: TraceConfig, emit: Emit, fds: FdTracker | None) -> None:
        if len(FUNCS) > C.CUDA_MAX_FUNCS:
            raise ValueError("more CUDA functions than entry programs in cuda_calls.bpf.c")
        super().__init__(cfg, emit, fds)
        self.failed: list[dict] = []
        self.dropped = 0
        self.attachments: list[dict] = []

    def _candidates(self, targets: Targets) -> list[tuple[str, str]]:
        """(path to attach, where it came from) for each distinct libcuda inode."""
        out, seen = [], set()
        host = [(str(p), "host") for p in libs.find_on_host(self.cfg.host_root, "libcuda.so.1")]
        procs = [(find_library(pid, self.proc), f"pid {pid}")
                 for pid in dict.fromkeys([*targets.deep, *targets.gpu])]
        for path, origin in [*procs, *host]:
            if path is None:
                continue
            try:
                st = os.stat(path)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            out.append((path, origin))
        return out[:MAX_LIBS]

    def attach(self, b, tps: TracepointSet, targets: Targets) -> bool:
        self.b = b
        libs = self._candidates(targets)
        if not libs:
            return False
        b[b"cuda_events"].open_ring_buffer(self._on_ring)
        for path, origin in libs:
            done, errors = ucalls.attach_pairs(b, path, FUNCS, "cuda_enter_", RETURN_FN, -1)
            self.attachments.append({"library": path, "found": origin, "functions": done,
                                     "errors": errors})
        return any(a["functions"] for a in self.attachments)

    def _on_ring(self, ctx, data, size) -> None:
        e = self.b[b"cuda_events"].event(data)
        rec = {**who(e), "func": ucalls.func_name(FUNCS, e.func),
               "result": e.ret, "error": error_name(e.ret),
               "duration_s": round(e.duration_ns / 1e9, 6), "mono_s": round(e.ts / 1e9, 6),
               "ts": mono_to_wall(e.ts), "cgroup_id": e.cgroup_id,
               # read now: a process whose cuInit failed usually exits right after
               "cgroup": procfs.read_cgroups(e.pid, self.proc)}
        if len(self.failed) < MAX_FAILED:
            self.failed.append(rec)
        else:
            self.dropped += 1
        self.emit("failed", rec)

    def collect(self, out: dict, now_ns: int) -> None:
        counts = []
        pending = []
        if self.attachments:
            for k, v in self.b[b"cuda_counts"].items():
                counts.append({"pid": k.tgid, "func": ucalls.func_name(FUNCS, k.func),
                               "calls": int(v.calls), "failed": int(v.failed)})
            pending = ucalls.unfinished(self.b[b"cuda_entered"], FUNCS,
                                        lambda _pid: "libcuda.so.1", now_ns, self.proc)
        counts.sort(key=lambda c: (c["pid"], c["func"]))
        out.update({"cuda_failed_calls": list(self.failed), "cuda_calls_pending": pending,
                    "cuda_call_counts": counts,
                    "cuda_calls": {"attachments": self.attachments, "dropped": self.dropped}})
        out.setdefault("_pending_calls", []).extend(pending)

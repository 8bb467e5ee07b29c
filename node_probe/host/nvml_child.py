"""The NVML child: loads the host's libnvidia-ml.so.1 by absolute path and reports as JSON.

Why a separate process: nvmlInit can block forever inside the driver (seed 000), and a thread
stuck in a C call cannot be interrupted. The parent runs
`python -m node_probe.host.nvml_child --host-root ROOT [--kubelet-dir D]... [--runtime-dir D]... LIB`
through node_probe.host.subproc with a deadline and kills it when it passes. Stage lines printed
before each risky step tell the parent where a hang happened.

The child runs the library's code as root, so it loads nothing but a library that is the host's
own (host.host_owned: in no pod volume, container root or runtime dir, root-owned and not
writable by others from the host root down), whoever called it: anything else is refused with
the reason, before any byte of it is mapped. The file is held open from the check to the load,
and the library is dlopen()ed by its own path (libraries find their siblings through it with
dladdr) only if that path still names the checked file: only root, writing in root-owned
directories that no tenant reaches, could swap it in between.

Output: JSON lines on stdout: {"stage": ...} progress markers, then one {"result": {...}}.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import stat
import sys
from pathlib import Path

from node_probe.host import host_owned, procfs


def _say(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _s(v) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _try(fn, *args, default=None):
    try:
        return fn(*args)
    except Exception:
        return default


GPU_IS_LOST = 15


def _code(exc) -> int | None:
    return getattr(exc, "value", None)


def fabric(pynvml, h) -> dict | None:
    """Per-GPU NVSwitch fabric registration (nvmlDeviceGetGpuFabricInfo); None where the
    driver or GPU does not support it (pre-Hopper, no NVSwitch)."""
    cls = getattr(pynvml, "c_nvmlGpuFabricInfo_t", None)
    if cls is None:
        return None
    info = cls()
    try:
        pynvml.nvmlDeviceGetGpuFabricInfo(h, ctypes.byref(info))
    except Exception:
        return None
    state = int(info.state) & 0xFF  # nvmlGpuFabricState_t is an unsigned char in nvml.h
    if state == 0:
        return None
    return {"state": {1: "not_started", 2: "in_progress", 3: "completed"}.get(state, str(state)),
            "state_code": state, "status": int(info.status), "clique_id": int(info.cliqueId)}


def processes(pynvml, h) -> list[dict] | None:
    try:
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    except Exception:
        return None
    return [{"pid": int(p.pid), "used_memory_bytes": (None if p.usedGpuMemory is None
                                                       else int(p.usedGpuMemory))}
            for p in procs]


def remapped_rows(pynvml, h) -> dict | None:
    """nvmlDeviceGetRemappedRows (rows remapped for correctable / uncorrectable errors, a
    remapping waiting for a GPU reset, a remapping that failed) and the remapper's histogram of
    spare rows left per bank; None where the GPU has no row remapper (before Ampere)."""
    rows = _try(pynvml.nvmlDeviceGetRemappedRows, h)
    if rows is None:
        return None
    out = {"correctable": int(rows[0]), "uncorrectable": int(rows[1]),
           "pending": bool(rows[2]), "failure": bool(rows[3])}
    hist = _try(pynvml.nvmlDeviceGetRowRemapperHistogram, h)
    if hist is not None:
        out["histogram"] = {k: int(getattr(hist, k)) for k in ("max", "high", "partial", "low",
                                                                 "none")}
    return out


def _ints(pairs) -> dict:
    """{key: int(value)} for the (key, zero-arg query) pairs NVML answers; a query NVML refuses
    (NOT_SUPPORTED on this GPU or driver) leaves its key out: not known, never invented."""
    out = {}
    for key, fn in pairs:
        v = _try(fn)
        if v is not None:
            out[key] = int(v)
    return out


def event_reasons(pynvml, h) -> int | None:
    """nvmlDeviceGetCurrentClocksEventReasons; the older ...ThrottleReasons name (same bits)
    on drivers before 535."""
    for name in ("nvmlDeviceGetCurrentClocksEventReasons",
                 "nvmlDeviceGetCurrentClocksThrottleReasons"):
        fn = getattr(pynvml, name, None)
        v = None if fn is None else _try(fn, h)
        if v is not None:
            return int(v)
    return None


def slow_facts(pynvml, h, g: dict) -> None:
    """What says whether a GPU runs slow (issue 38): the record keys of the contract in
    node_probe/checks/slow/__init__.py. Each is optional: a query NVML refuses stays absent."""
    g["pcie"] = _ints((
        ("gen_cur", lambda: pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h)),
        ("width_cur", lambda: pynvml.nvmlDeviceGetCurrPcieLinkWidth(h)),
        ("gen_max", lambda: pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h)),
        ("width_max", lambda: pynvml.nvmlDeviceGetMaxPcieLinkWidth(h)),
        ("gen_gpu_max", lambda: pynvml.nvmlDeviceGetGpuMaxPcieLinkGeneration(h))))
    util = _try(pynvml.nvmlDeviceGetUtilizationRates, h)
    if util is not None:
        g["utilization_gpu_pct"] = int(util.gpu)
    clocks = _ints((
        ("sm_mhz", lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)),
        ("sm_max_mhz", lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)),
        ("mem_mhz", lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)),
        ("mem_max_mhz", lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM))))
    reasons = event_reasons(pynvml, h)
    if reasons is not None:
        clocks["event_reasons"] = reasons
    g["clocks"] = clocks
    g["temperature"] = _ints((
        ("gpu_c", lambda: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)),
        ("slowdown_c", lambda: pynvml.nvmlDeviceGetTemperatureThreshold(
            h, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)),
        ("shutdown_c", lambda: pynvml.nvmlDeviceGetTemperatureThreshold(
            h, pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN))))
    power = {}
    for key, name in (("draw_w", "nvmlDeviceGetPowerUsage"),
                      ("limit_w", "nvmlDeviceGetEnforcedPowerLimit"),
                      ("default_limit_w", "nvmlDeviceGetPowerManagementDefaultLimit")):
        mw = _try(getattr(pynvml, name), h)
        if mw is not None:
            power[key] = round(int(mw) / 1000.0, 3)   # NVML reports milliwatts
    g["power"] = power
    g["nvlink"] = nvlinks(pynvml, h)
    g["ecc"] = _ints((
        ("sbe_volatile", lambda: pynvml.nvmlDeviceGetTotalEccErrors(h, 0, 0)),
        ("dbe_volatile", lambda: pynvml.nvmlDeviceGetTotalEccErrors(h, 1, 0))))
    pending = _try(pynvml.nvmlDeviceGetRetiredPagesPendingStatus, h)
    if pending is not None:
        g["ecc"]["retired_pending"] = bool(pending)


INVALID_ARGUMENT, NOT_SUPPORTED = 2, 3
NVLINK_COUNTERS = (("replay", 0), ("recovery", 1), ("crc_flit", 2), ("crc_data", 3))


def nvlinks(pynvml, h) -> list[dict]:
    """Each NVLink NVML answers for (nvmlDeviceGetNvLinkState; a link the GPU lacks returns
    NOT_SUPPORTED or INVALID_ARGUMENT and is left out) with its DL error counters."""
    out = []
    for link in range(int(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            state = pynvml.nvmlDeviceGetNvLinkState(h, link)
        except Exception as exc:  # noqa: BLE001 - pynvml raises NVMLError subclasses
            if _code(exc) in (NOT_SUPPORTED, INVALID_ARGUMENT):
                break   # no NVLink, or past the GPU's last link: the rest answer the same
            continue
        errors = {}
        for key, counter in NVLINK_COUNTERS:
            v = _try(pynvml.nvmlDeviceGetNvLinkErrorCounter, h, link, counter)
            if v is not None:
                errors[key] = int(v)
        out.append({"link": link, "active": bool(state), "errors": errors})
    return out


def details(pynvml, h, g: dict) -> None:
    """Fields beyond the basic inventory; each one is optional (older drivers lack some)."""
    pci = _try(pynvml.nvmlDeviceGetPciInfo, h)
    if pci is not None:
        g["pci_bus_id"] = _s(pci.busId) or _s(pci.busIdLegacy)
    pm = _try(pynvml.nvmlDeviceGetPersistenceMode, h)
    if pm is not None:
        g["persistence_mode"] = bool(pm)
    g["fabric"] = fabric(pynvml, h)
    try:
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        g["memory_used_bytes"] = int(mem.used)
        g["memory_total_bytes"] = int(mem.total)
    except Exception as exc:  # noqa: BLE001 - pynvml raises NVMLError subclasses
        if _code(exc) == GPU_IS_LOST:
            g["lost"] = True
    if not g.get("lost"):
        g["processes"] = processes(pynvml, h)
        slow_facts(pynvml, h, g)


def inventory(pynvml) -> dict:
    gpus = []
    lost = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
        except pynvml.NVMLError as exc:
            if _code(exc) != GPU_IS_LOST:
                raise
            lost.append({"index": i, "nvml_return": GPU_IS_LOST, "error": "GPU is lost"})
            continue
        mig_modes = _try(pynvml.nvmlDeviceGetMigMode, h, default=None) or [0, 0]
        mig_cur = mig_modes[0]
        g = {
            "index": i,
            "uuid": _s(pynvml.nvmlDeviceGetUUID(h)),
            "name": _s(_try(pynvml.nvmlDeviceGetName, h, default="")),
            "minor": _try(pynvml.nvmlDeviceGetMinorNumber, h),
            "mig_mode": bool(mig_cur),
            "mig_pending_mode": bool(mig_modes[1]),
            "mig_devices": [],
        }
        details(pynvml, h, g)
        if g.get("lost"):
            lost.append({"index": i, "uuid": g["uuid"], "pci_bus_id": g.get("pci_bus_id"),
                         "nvml_return": GPU_IS_LOST, "error": "GPU is lost"})
        ecc = _try(pynvml.nvmlDeviceGetTotalEccErrors, h, 1, 0)  # uncorrected, volatile
        if ecc is not None:
            g["ecc_uncorrected_volatile"] = int(ecc)
        g["remapped_rows"] = remapped_rows(pynvml, h)
        if mig_cur:
            n = _try(pynvml.nvmlDeviceGetMaxMigDeviceCount, h, default=0) or 0
            for j in range(n):
                m = _try(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, h, j)
                if m is None:
                    continue
                name = _s(_try(pynvml.nvmlDeviceGetName, m, default=""))
                g["mig_devices"].append({
                    "index": j,
                    "uuid": _s(pynvml.nvmlDeviceGetUUID(m)),
                    "profile": name.rsplit("MIG ", 1)[-1] if "MIG " in name else name,
                    "gpu_instance_id": _try(pynvml.nvmlDeviceGetGpuInstanceId, m),
                    "compute_instance_id": _try(pynvml.nvmlDeviceGetComputeInstanceId, m),
                })
        gpus.append(g)
    cuda = _try(pynvml.nvmlSystemGetCudaDriverVersion)
    return {
        "driver_version": _s(pynvml.nvmlSystemGetDriverVersion()),
        "nvml_version": _s(_try(pynvml.nvmlSystemGetNVMLVersion, default="")),
        "cuda_version": f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None,
        "gpus": gpus,
        "lost_gpus": lost,
    }


class _Usage(Exception):
    pass


class _Args(argparse.ArgumentParser):
    def error(self, message):
        raise _Usage(message)


def open_host_library(path: str, host_root: str, kubelet_dirs=(), runtime_dirs=()) -> int:
    """An fd of `path` once it is provably the host's own library; raises PermissionError with
    the reason otherwise (host.host_owned)."""
    root = Path(host_root)
    areas = host_owned.tenant_areas(root, procfs.PROC, kubelet_dirs, runtime_dirs)
    no = host_owned.path_refusal(Path(path), root, areas)
    if no:
        raise PermissionError(f"not the host's own library: {no}")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        os.close(fd)
        raise PermissionError(f"not the host's own library: {path} changed under the check")
    return fd


def _same_file(fd: int, path: str) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def main(argv: list[str]) -> int:
    ap = _Args(prog="nvml_child", add_help=False)
    ap.add_argument("--host-root", required=True)
    ap.add_argument("--kubelet-dir", action="append", default=[])
    ap.add_argument("--runtime-dir", action="append", default=[])
    ap.add_argument("library")
    try:
        args = ap.parse_args(argv)
    except _Usage as exc:
        _say({"result": {"status": "error", "error": f"usage: nvml_child --host-root ROOT "
                         f"[--kubelet-dir D]... [--runtime-dir D]... LIBRARY ({exc})"}})
        return 2
    try:
        import pynvml
    except ImportError:
        _say({"result": {"status": "no_client",
                         "error": "the pynvml module (nvidia-ml-py) is not installed"}})
        return 0
    _say({"stage": "load"})
    try:
        fd = open_host_library(args.library, args.host_root, args.kubelet_dir, args.runtime_dir)
        if not _same_file(fd, args.library):
            raise PermissionError(f"not the host's own library: {args.library} changed "
                                  "under the check")
        lib = ctypes.CDLL(args.library)
    except PermissionError as exc:
        _say({"result": {"status": "refused", "error": str(exc)}})
        return 0
    except OSError as exc:
        _say({"result": {"status": "load_error", "error": str(exc)}})
        return 0
    pynvml.nvmlLib = lib  # never let pynvml search the image's library path
    _say({"stage": "init"})
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        code = getattr(exc, "value", None)
        lib_msg = None
        try:  # the library's own string, as nvidia-smi prints it
            f = lib.nvmlErrorString
            f.restype = ctypes.c_char_p
            lib_msg = _s(f(ctypes.c_int(code)))
        except Exception:
            pass
        _say({"result": {"status": "error", "code": code, "error": lib_msg or str(exc),
                         "client_error": str(exc)}})
        return 0
    _say({"stage": "query"})
    try:
        inv = inventory(pynvml)
    except pynvml.NVMLError as exc:
        _say({"result": {"status": "error", "code": getattr(exc, "value", None),
                         "error": f"query failed after init: {exc}"}})
        return 0
    finally:
        _try(pynvml.nvmlShutdown)
    _say({"result": {"status": "ok", **inv}})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

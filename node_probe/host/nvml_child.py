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


# nvml.h nvmlGpuVirtualizationMode_t
VIRT_MODES = {0: "none", 1: "passthrough", 2: "vgpu", 3: "host_vgpu", 4: "host_vsga"}


def slow_facts(pynvml, h, g: dict) -> None:
    """What says whether a GPU runs slow (issue 38): the record keys of the contract in
    node_probe/checks/slow/__init__.py. Each is optional: a query NVML refuses stays absent."""
    g["pcie"] = _ints((
        ("gen_cur", lambda: pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h)),
        ("width_cur", lambda: pynvml.nvmlDeviceGetCurrPcieLinkWidth(h)),
        ("gen_max", lambda: pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h)),
        ("width_max", lambda: pynvml.nvmlDeviceGetMaxPcieLinkWidth(h)),
        ("gen_gpu_max", lambda: pynvml.nvmlDeviceGetGpuMaxPcieLinkGeneration(h))))
    mode = _try(pynvml.nvmlDeviceGetVirtualizationMode, h)
    if mode is not None:
        g["virtualization"] = VIRT_MODES.get(int(mode), str(int(mode)))
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
        rec = {"link": link, "active": bool(state), "errors": errors}
        remote = _try(pynvml.nvmlDeviceGetNvLinkRemotePciInfo, h, link) if state else None
        if remote is not None:
            rec["remote_bus_id"] = _s(remote.busId) or _s(remote.busIdLegacy)
        out.append(rec)
    return out


# nvml.h's nvmlGpuP2PCapsIndex_t (literal: pynvml spells NVML_P2P_CAPS_INDEX_READ as the tuple
# `0,`) and nvmlGpuP2PStatus_t names
P2P_READ, P2P_NVLINK = 0, 2
P2P_STATUS = {0: "ok", 1: "chipset_not_supported", 2: "gpu_not_supported",
              3: "ioh_topology_not_supported", 4: "disabled_by_regkey", 5: "not_supported",
              6: "unknown"}
MAX_P2P_PAIRS = 64   # 8 GPUs make 28 pairs; a 16-GPU node's first 64


def _bdf(bus_id) -> str:
    """`00000000:3B:00.0` and `0000:3b:00.0` as one key (the remote end and the GPU's own)."""
    parts = str(bus_id or "").strip().lower().split(":")
    try:
        return ":".join([f"{int(parts[0], 16):x}", *parts[1:]]) if len(parts) == 3 else ""
    except ValueError:
        return ""


def nvlink_pairs(gpus: list[dict]) -> list[tuple[int, int]]:
    """Pairs of GPUs (list positions) that the NVLink topology connects: an active link of one
    ends at the other's bus id, or both have active links ending at the same non-GPU device
    (an NVSwitch). At most MAX_P2P_PAIRS."""
    own = {_bdf(g.get("pci_bus_id")): i for i, g in enumerate(gpus) if g.get("pci_bus_id")}
    ends = [{_bdf(x.get("remote_bus_id")) for x in g.get("nvlink") or ()
             if x.get("active") and x.get("remote_bus_id")} - {""} for g in gpus]
    out = []
    for i in range(len(gpus)):
        for j in range(i + 1, len(gpus)):
            a, b = ends[i], ends[j]
            direct = any(own.get(e) == j for e in a) or any(own.get(e) == i for e in b)
            switch = bool({e for e in a & b if e not in own})
            if direct or switch:
                out.append((i, j))
                if len(out) >= MAX_P2P_PAIRS:
                    return out
    return out


def p2p_status(pynvml, handles: list, gpus: list[dict]) -> list[dict]:
    """nvmlDeviceGetP2PStatus (NVLink and read capabilities) for each NVLink-connected pair:
    {"a": uuid, "b": uuid, "nvlink": status name, "read": status name} (None: NVML refused)."""
    out = []
    for i, j in nvlink_pairs(gpus):
        rec = {"a": gpus[i]["uuid"], "b": gpus[j]["uuid"]}
        for key, caps in (("nvlink", P2P_NVLINK), ("read", P2P_READ)):
            v = _try(pynvml.nvmlDeviceGetP2PStatus, handles[i], handles[j], caps)
            rec[key] = None if v is None else P2P_STATUS.get(int(v), str(int(v)))
        out.append(rec)
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
    handles = []
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
        handles.append(h)
    live = [k for k, g in enumerate(gpus) if not g.get("lost")]
    pairs = p2p_status(pynvml, [handles[k] for k in live], [gpus[k] for k in live])
    cuda = _try(pynvml.nvmlSystemGetCudaDriverVersion)
    return {
        "driver_version": _s(pynvml.nvmlSystemGetDriverVersion()),
        "nvml_version": _s(_try(pynvml.nvmlSystemGetNVMLVersion, default="")),
        "cuda_version": f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None,
        "gpus": gpus,
        "lost_gpus": lost,
        "p2p": pairs,
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

"""The NVML child: loads the host's libnvidia-ml.so.1 by absolute path and reports as JSON.

Why a separate process: nvmlInit can block forever inside the driver (seed 000), and a thread
stuck in a C call cannot be interrupted. The parent runs `python -m node_probe.host.nvml_child LIB`
through node_probe.host.subproc with a deadline and kills it when it passes. Stage lines printed
before each risky step tell the parent where a hang happened.

Output: JSON lines on stdout: {"stage": ...} progress markers, then one {"result": {...}}.
"""
from __future__ import annotations

import ctypes
import json
import sys


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


def inventory(pynvml) -> dict:
    gpus = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        mig_cur = _try(lambda: pynvml.nvmlDeviceGetMigMode(h)[0], default=0)
        g = {
            "index": i,
            "uuid": _s(pynvml.nvmlDeviceGetUUID(h)),
            "name": _s(_try(pynvml.nvmlDeviceGetName, h, default="")),
            "minor": _try(pynvml.nvmlDeviceGetMinorNumber, h),
            "mig_mode": bool(mig_cur),
            "mig_devices": [],
        }
        ecc = _try(pynvml.nvmlDeviceGetTotalEccErrors, h, 1, 0)  # uncorrected, volatile
        if ecc is not None:
            g["ecc_uncorrected_volatile"] = int(ecc)
        rows = _try(pynvml.nvmlDeviceGetRemappedRows, h)
        if rows is not None:
            g["remapped_rows"] = {"correctable": rows[0], "uncorrectable": rows[1],
                                  "pending": bool(rows[2]), "failure": bool(rows[3])}
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
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        _say({"result": {"status": "error", "error": "usage: nvml_child LIBRARY"}})
        return 2
    path = argv[0]
    try:
        import pynvml
    except ImportError:
        _say({"result": {"status": "no_client",
                         "error": "the pynvml module (nvidia-ml-py) is not installed"}})
        return 0
    _say({"stage": "load"})
    try:
        lib = ctypes.CDLL(path)
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

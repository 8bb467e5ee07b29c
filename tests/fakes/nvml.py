"""Build the test libnvidia-ml.so.1 (tests/fakes/fake_nvml.c) with gcc, configured per test.

Why: tests need a real shared object that pynvml loads by absolute path and that uprobes can
attach to, with chosen behaviour (init blocks on a futex, fails, or reports a driver version and
a MIG layout). The compiled object is cached per source hash; each call copies it into
`dest_dir` with its own `fake_nvml.conf` beside it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SRC = Path(__file__).with_name("fake_nvml.c")
_CACHE = Path(tempfile.gettempdir()) / "gpu-doctor-fake-nvml"


@dataclasses.dataclass(frozen=True)
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H20"
    minor: int = 0
    mig: bool = False
    ecc_uncorrected: int = 0
    remap_pending: bool = False
    remap_failed: bool = False
    # (uuid, profile name, gpu instance id, compute instance id)
    mig_devices: tuple[tuple[str, str, int, int], ...] = ()
    pci_bus_id: str = ""             # default 00000000:<minor+1>:00.0
    persistence: bool = True
    mig_pending: bool | None = None  # None: same as `mig`
    fabric_state: int = 0            # 0 not supported, 1 not started, 2 in progress, 3 completed
    fabric_status: int = 0           # nvmlReturn_t of the fabric registration
    lost: int = 0                    # 1: handle by index fails GPU_IS_LOST; 2: queries do
    memory_used_mib: int = 0
    memory_total_mib: int = 97871
    # (pid, used GPU memory bytes) of running compute processes
    processes: tuple[tuple[int, int], ...] = ()
    remap_correctable_rows: int = 0
    remap_uncorrectable_rows: int | None = None   # None: 1 when pending or failed, else 0
    remap_supported: bool = True                  # False: a pre-Ampere GPU (NOT_SUPPORTED)
    # banks with (max, high, partial, low, none) spare rows left; None: all banks at max
    remap_histogram: tuple[int, int, int, int, int] | None = None
    # what says whether it runs slow (fake_nvml.c's set= attributes: pcie_gen_cur, util_gpu,
    # clock_reasons, temp_c, power_limit_mw, nvlinks, nvlink_down, ecc_sbe, ...): name -> value
    # ("none" = the query is NOT_SUPPORTED); unset ones keep a healthy idle default
    attrs: tuple[tuple[str, int | str], ...] = ()
    # (link, counter 0 replay 1 recovery 2 crc flit 3 crc data, count)
    nvlink_errors: tuple[tuple[int, int, int], ...] = ()

    @property
    def bus_id(self) -> str:
        return self.pci_bus_id or f"00000000:{self.minor + 1:02X}:00.0"


def compiled_library() -> Path:
    """The compiled .so for the current source (built once per source hash)."""
    digest = hashlib.sha256(SRC.read_bytes()).hexdigest()[:16]
    out = _CACHE / digest / "libnvidia-ml.so.1"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".tmp{os.getpid()}")
        subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-g", "-fno-omit-frame-pointer",
                        "-Wall", "-Wno-unused-result", "-o", str(tmp), str(SRC), "-ldl"],
                       check=True, capture_output=True, timeout=60)
        tmp.replace(out)
    return out


def config_text(init: str = "ok", driver_version: str = "550.54.15",
                cuda_version: int = 12040, gpus: tuple[FakeGpu, ...] | list[FakeGpu] = (),
                init_log: str | os.PathLike | None = None) -> str:
    """init_log: a file each nvmlInit call appends its process id to (which process asked)."""
    lines = [f"init={init}", f"driver_version={driver_version}",
             f"nvml_version=12.{driver_version}", f"cuda_version={cuda_version}"]
    if init_log:
        lines.append(f"init_log={init_log}")
    for i, g in enumerate(gpus):
        pending = "" if g.mig_pending is None else int(g.mig_pending)
        lines.append(f"gpu={g.uuid}|{g.name}|{g.minor}|{int(g.mig)}|{g.ecc_uncorrected}|"
                     f"{int(g.remap_pending)}|{int(g.remap_failed)}|{g.pci_bus_id}|"
                     f"{int(g.persistence)}|{pending}|{g.fabric_state}|{g.fabric_status}|"
                     f"{g.lost}|{g.memory_used_mib}|{g.memory_total_mib}|"
                     f"{g.remap_correctable_rows}|"
                     f"{'' if g.remap_uncorrectable_rows is None else g.remap_uncorrectable_rows}|"
                     f"{int(g.remap_supported)}|"
                     f"{','.join(map(str, g.remap_histogram)) if g.remap_histogram else ''}")
        for name, value in g.attrs:
            lines.append(f"set={i}|{name}|{value}")
        for link, counter, n in g.nvlink_errors:
            lines.append(f"set={i}|nvlink_err|{link},{counter},{n}")
        for pid, used in g.processes:
            lines.append(f"proc={i}|{pid}|{used}")
        for uuid, profile, gi, ci in g.mig_devices:
            lines.append(f"mig={i}|{uuid}|{g.name} MIG {profile}|{gi}|{ci}")
    return "\n".join(lines) + "\n"


def build_fake_nvml(dest_dir: Path | str, init: str = "ok", driver_version: str = "550.54.15",
                    cuda_version: int = 12040, gpus=(), init_log=None) -> Path:
    """Install libnvidia-ml.so.1 + fake_nvml.conf into dest_dir; returns the library path.

    init: "ok" | "block" (futex wait forever) | "error:<code>" (e.g. "error:18", version
    mismatch) | "slow:<seconds>".
    """
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    lib = dest / "libnvidia-ml.so.1"
    shutil.copyfile(compiled_library(), lib)
    (dest / "fake_nvml.conf").write_text(config_text(init, driver_version, cuda_version, gpus,
                                                     init_log))
    return lib


H20_MIXED = (
    FakeGpu("GPU-2f815c32-768d-d782-1073-db01d7b90215", "NVIDIA H20", 0, mig=True,
            mig_devices=(("MIG-e76cc178-e1f3-5596-a9e1-84fa6bffa030", "3g.48gb", 2, 0),
                         ("MIG-160ae368-7334-5d1e-91ad-d6eb55ec6f67", "1g.24gb", 5, 0))),
    FakeGpu("GPU-bafcf1f7-1006-01e5-85e2-684fee364617", "NVIDIA H20", 1, mig=False),
)
"""Seed 000's layout in miniature: a MIG-partitioned H20 beside a full H20."""

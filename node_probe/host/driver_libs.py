"""Where the NVIDIA driver's libraries (libnvidia-ml.so.1) are on this node, and how that was
decided: what the device plugin was told (NVIDIA_DRIVER_ROOT / --nvidia-driver-root), the host,
the GPU Operator's /run/nvidia/driver, GKE's /home/kubernetes/bin/nvidia, Bottlerocket's
/usr/lib/nvidia/tesla/<version>, Talos' glibc extension.

Why a module of its own: a library the probe loads must be the host's own (never a tenant's
planted copy), so the search and the trust rule live in one place; layout.driver_root asks it
once per run, and LIB_DIRS is the one list of library dirs tracing/ reads.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from node_probe.host import host_owned, hostfs, procfs

from node_probe.host.daemon_args import MAX_SHOWN, flag


# --- driver root ---------------------------------------------------------------------------
LIB = "libnvidia-ml.so.1"
LIB_SUBDIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64", "usr/lib",
               "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu", "lib64",
               "usr/local/nvidia/lib64")
GKE_DRIVER_ROOT = "home/kubernetes/bin/nvidia"
TALOS_DRIVER_ROOT = "usr/local/glibc"
DRIVER_ROOTS = (
    ("", "the host"),
    ("run/nvidia/driver", "the GPU Operator's driver container"),
    (GKE_DRIVER_ROOT, "GKE's driver installer"),
    (TALOS_DRIVER_ROOT, "Talos's NVIDIA extension (its glibc subroot)"),
)
# Where a driver's libraries live, as paths under a root: every driver root's library dirs
# (checks/nvml, and tracing/libs for the libraries uprobes attach to in a process's root).
LIB_DIRS = tuple(f"{r}/{d}".lstrip("/") for r, _why in DRIVER_ROOTS
                 for d in LIB_SUBDIRS + (("lib64",) if r else ()))
BOTTLEROCKET_LIBS = "usr/lib/nvidia/tesla"    # <version>/libnvidia-ml.so.1
MAX_VERSIONS = 8
PLUGIN_ROOT_ENV = "NVIDIA_DRIVER_ROOT"
PLUGIN_ROOT_FLAGS = ("--nvidia-driver-root", "--driver-root")


@dataclasses.dataclass(frozen=True)
class DriverRoot:
    root: str | None                # "" (the host), "run/nvidia/driver", ...; None: not found
    library: Path | None            # libnvidia-ml.so.1 as the probe can open it
    how: str
    kernel_module: bool = False     # proc/driver/nvidia/version exists
    device_nodes: bool = False      # dev/nvidiactl under the host or the driver root
    tried: tuple[str, ...] = ()
    refused: tuple[tuple[str, str], ...] = ()   # (library, why it is not the host's own)

    @property
    def present(self) -> bool:
        """Is there an NVIDIA driver on this node at all (library, module or devices)."""
        return self.library is not None or self.kernel_module or self.device_nodes

    def to_dict(self) -> dict:
        return {"root": None if self.root is None else "/" + self.root,
                "library": str(self.library) if self.library else None, "how": self.how,
                "kernel_module": self.kernel_module, "device_nodes": self.device_nodes,
                "tried": list(self.tried),
                "refused": [{"library": lib, "why": why} for lib, why in self.refused]}


def _library_under(root: Path, droot: str) -> Path | None:
    for d in LIB_SUBDIRS + (("lib64",) if droot else ()):
        p = hostfs.resolve(root, f"{droot}/{d}/{LIB}".lstrip("/"))
        if p is not None and p.is_file():
            return p
    return None


def _plugin_driver_roots(proc: Path, plugin_pids) -> list[tuple[str, str]]:
    """(driver root, how) the NVIDIA device plugins were told (env or flag)."""
    out = []
    for pid in plugin_pids:
        v = procfs.read_environ(pid, proc).get(PLUGIN_ROOT_ENV)
        src = f"{PLUGIN_ROOT_ENV}={v} in the device plugin (pid {pid})"
        if not v:
            v = flag(procfs.read_cmdline(pid, proc), *PLUGIN_ROOT_FLAGS)
            src = f"the device plugin's (pid {pid}) driver-root flag {v}"
        if v and v.startswith("/"):
            out.append((v.strip("/"), src))
    return out


def resolve_driver_root(host_root: Path, proc: Path = procfs.PROC, plugin_pids=(),
                        areas: host_owned.TenantAreas | None = None) -> DriverRoot:
    """The first driver root whose libnvidia-ml.so.1 is the host's own (host.host_owned); a
    library found where a tenant can write is never loaded: it is listed in `refused`."""
    root = Path(host_root)
    areas = areas if areas is not None else host_owned.tenant_areas(root, proc)
    kmod = hostfs.resolve(root, "proc/driver/nvidia/version") is not None
    told = _plugin_driver_roots(proc, plugin_pids)
    cands = told + list(DRIVER_ROOTS)
    tried: list[str] = []
    refused: list[tuple[str, str]] = []
    devs = hostfs.resolve(root, "dev/nvidiactl") is not None

    def trusted(lib: Path | None) -> Path | None:
        no = None if lib is None else host_owned.path_refusal(lib, root, areas)
        if no:
            tried[-1] += f" ({LIB} there is not the host's own: not loaded)"
            refused.append(("/" + str(lib.relative_to(root)).lstrip("/"), no))
            return None
        return lib

    def found(droot: str, lib: Path, how: str) -> DriverRoot:
        return DriverRoot(droot, lib, how, kmod, devs, tuple(tried), tuple(refused))

    for droot, why in cands:
        tried.append("/" + droot[:MAX_SHOWN])
        lib = trusted(_library_under(root, droot))
        if droot and hostfs.resolve(root, f"{droot}/dev/nvidiactl") is not None:
            devs = True
        if lib is not None:
            return found(droot, lib, f"{LIB} under /{droot} ({why})")
    bdir = hostfs.resolve(root, BOTTLEROCKET_LIBS)
    tried.append("/" + BOTTLEROCKET_LIBS + "/<version>")
    if bdir is not None and bdir.is_dir():
        for v in sorted(os.listdir(bdir), reverse=True)[:MAX_VERSIONS]:
            p = hostfs.resolve(root, f"{BOTTLEROCKET_LIBS}/{v}/{LIB}")
            if p is not None and p.is_file() and trusted(p) is not None:
                return found("", p, f"{LIB} in /{BOTTLEROCKET_LIBS}/{v} (Bottlerocket)")
    how = ("no " + LIB + " found" + (" that is the host's own" if refused else "")
           + ("; the kernel module is loaded" if kmod else "")
           + ("; NVIDIA device nodes exist" if devs else ""))
    return DriverRoot(None, None, how, kmod, devs, tuple(tried), tuple(refused))

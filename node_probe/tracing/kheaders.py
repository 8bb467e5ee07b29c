"""The kernel header set shipped with the probe, for nodes that have no headers of their own.

Why: BCC compiles bpf/*.bpf.c on the node and needs kernel headers, which GKE's COS,
Bottlerocket, Talos, Flatcar and many driver-container nodes do not have. Our programs read no
kernel structures: only syscall tracepoint arguments (whose layout bundle.py checks against the
running kernel's tracefs format files), user memory and BPF helpers. So a fixed set of Debian's
headers compiles them for any kernel the programs can run on. The set holds only the files a
traced compile opened (scripts/build-kheaders.py, packaging/kheaders-<arch>.manifest) with a
metadata.json saying which kernel's and machine's headers they are. Where a set ships, and the
name `bundle` the report gives it:
  image            /opt/gpu-doctor/kheaders (beside node_probe; scripts/build-image.sh)
  plugin artifact  _internal/kheaders in the frozen krew archive (scripts/build-plugin.sh)
  wheel            node_probe/kheaders/<uname -m>/ (one set per machine; scripts/build-wheel.sh)
  checkout         build/kheaders (`scripts/build-kheaders.py build build/kheaders`)
and GPU_DOCTOR_KHEADERS_DIR overrides them all.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import node_probe

ENV = "GPU_DOCTOR_KHEADERS_DIR"
META = "metadata.json"
KCONFIG = "include/linux/kconfig.h"
MAX_META_BYTES = 64 << 10


@dataclasses.dataclass(frozen=True)
class HeaderSet:
    path: Path
    kernel_version: str   # the kernel the headers come from (not the running one)
    abi: str
    machine: str          # uname -m they are for (arch/<x86> headers)
    files: int
    size_bytes: int
    packages: tuple[str, ...]
    bundle: str = ""      # what carried it: image, plugin artifact, wheel, checkout, ENV

    def describe(self) -> str:
        carried = f" from the {self.bundle}" if self.bundle and self.bundle != ENV else ""
        return (f"the probe's bundled Linux {self.kernel_version} headers{carried} ({self.files}"
                f" files of {', '.join(self.packages) or 'Debian linux-headers'})")

    def to_dict(self) -> dict:
        return {"path": str(self.path), "kernel_version": self.kernel_version, "abi": self.abi,
                "machine": self.machine, "files": self.files, "size_bytes": self.size_bytes,
                "packages": list(self.packages), "bundle": self.bundle}


def candidates() -> list[tuple[Path, str]]:
    """(where a set may be, the bundle that puts it there), in the order they are tried."""
    env = os.environ.get(ENV)
    if env:
        return [(Path(env), ENV)]
    pkg = Path(node_probe.__file__).resolve().parent
    top = pkg.parent
    beside = "plugin artifact" if getattr(sys, "frozen", False) else "image"
    return [(top / "kheaders", beside), (pkg / "kheaders" / os.uname().machine, "wheel"),
            (top / "build" / "kheaders", "checkout")]


def load(path: Path, bundle: str = "") -> tuple[HeaderSet | None, str]:
    """The set at `path`, or (None, why it is not usable)."""
    meta_path = path / META
    try:
        with open(meta_path, "rb") as f:
            raw = f.read(MAX_META_BYTES + 1)
    except OSError as exc:
        return None, f"{meta_path}: {exc.strerror or exc}"
    try:
        if len(raw) > MAX_META_BYTES:
            raise ValueError(f"larger than {MAX_META_BYTES} bytes")
        meta = json.loads(raw)
        hs = HeaderSet(path=path, kernel_version=str(meta["kernel_version"]),
                       abi=str(meta.get("abi", "")), machine=str(meta["machine"]),
                       files=int(meta["files"]), size_bytes=int(meta["bytes"]),
                       packages=tuple(str(p) for p in meta.get("packages", ())), bundle=bundle)
    except (ValueError, KeyError, TypeError) as exc:
        return None, f"{meta_path}: not a header set's metadata ({exc})"
    machine = os.uname().machine
    if hs.machine != machine:
        return None, f"{path} holds {hs.machine} headers, this machine is {machine}"
    if not (path / KCONFIG).is_file():
        return None, f"{path} has no {KCONFIG}"
    return hs, ""


def find() -> tuple[HeaderSet | None, str]:
    """The first usable bundled set, or (None, why none is)."""
    why = []
    for c, bundle in candidates():
        hs, err = load(c, bundle)
        if hs is not None:
            return hs, ""
        why.append(err)
    return None, "; ".join(why)

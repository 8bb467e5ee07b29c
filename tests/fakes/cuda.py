"""Build the test libcuda.so.1 (tests/fakes/fake_libcuda.c) with gcc.

Why: the CUDA-call probe attaches uprobes to the libcuda.so.1 a GPU process maps; the tests
need a real shared object with the driver-API symbols whose cuInit really opens the UVM device
node. Built once per source hash; behaviour is chosen per process through FAKE_CUDA_* variables.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SRC = Path(__file__).with_name("fake_libcuda.c")
_CACHE = Path(tempfile.gettempdir()) / "gpu-doctor-fake-libcuda"


def build_fake_libcuda(dest_dir: Path) -> Path:
    """dest_dir/libcuda.so.1 (a copy of the cached build)."""
    digest = hashlib.sha256(SRC.read_bytes()).hexdigest()[:16]
    built = _CACHE / digest / "libcuda.so.1"
    if not built.exists():
        built.parent.mkdir(parents=True, exist_ok=True)
        tmp = built.with_suffix(f".tmp{os.getpid()}")
        subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-g", "-fno-omit-frame-pointer", "-Wall",
                        "-o", str(tmp), str(SRC)], check=True, capture_output=True, timeout=60)
        tmp.replace(built)
    dest_dir.mkdir(parents=True, exist_ok=True)
    out = dest_dir / "libcuda.so.1"
    shutil.copyfile(built, out)
    return out

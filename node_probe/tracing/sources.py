"""Where the BPF C sources live, in a checkout and in the probe image.

Why: the sources are data, not Python; the image copies `bpf/` next to `node_probe` at
/opt/gpu-doctor/{node_probe,bpf}, a checkout has them at the repository root, and tests or
operators can point elsewhere with GPU_DOCTOR_BPF_DIR. A wheel installs them as data under
<prefix>/share/gpu-doctor/bpf.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import node_probe

ENV = "GPU_DOCTOR_BPF_DIR"


def bpf_dir() -> Path:
    env = os.environ.get(ENV)
    if env:
        return Path(env)
    beside = Path(node_probe.__file__).resolve().parent.parent / "bpf"
    if beside.is_dir():
        return beside
    installed = Path(sys.prefix) / "share" / "gpu-doctor" / "bpf"
    return installed if installed.is_dir() else beside


def source_path(name: str) -> Path:
    """bpf/<name>.bpf.c (FileNotFoundError if missing, naming where it looked)."""
    p = bpf_dir() / f"{name}.bpf.c"
    if not p.is_file():
        raise FileNotFoundError(f"BPF source {p} not found (set {ENV} to the bpf/ directory)")
    return p


def cstring(value: str) -> str:
    """A C string literal for a -D cflag (BCC passes cflags to clang as argv, no shell)."""
    out = ['"']
    for ch in value:
        if ch in '"\\':
            out.append("\\" + ch)
        elif 32 <= ord(ch) < 127:
            out.append(ch)
        else:
            out.extend(f"\\{b:03o}" for b in ch.encode())  # octal: at most 3 digits
    out.append('"')
    return "".join(out)

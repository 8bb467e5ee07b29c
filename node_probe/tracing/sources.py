"""Where the BPF C sources live, in a checkout and in the probe image.

Why: the sources are data, not Python; the image copies `bpf/` next to `node_probe` at
/opt/gpu-doctor/{node_probe,bpf}, a checkout has them at the repository root, and tests or
operators can point elsewhere with GPU_DOCTOR_BPF_DIR. A wheel installs them as data under
<prefix>/share/gpu-doctor/bpf.

Shared C (bpf/include/*.h) is pasted into the program text here rather than left to the
compiler: BCC rewrites map calls (`m.lookup(&k)`) only in the main file it compiles, so a map
used in a header must be part of that text. Each header goes in once per compile unit (the
first program that includes it), behind #line directives so compiler errors name real files.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Iterable

import node_probe

ENV = "GPU_DOCTOR_BPF_DIR"
_LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s+"([A-Za-z0-9_./-]+\.h)"\s*$')


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


def _expand(path: Path, seen: set[Path], out: list[str]) -> None:
    out.append(f'#line 1 "{path}"\n')
    for n, line in enumerate(path.read_text().splitlines(), 1):
        m = _LOCAL_INCLUDE.match(line)
        if not m:
            out.append(line + "\n")
            continue
        inc = (path.parent / m.group(1)).resolve()
        if inc.parent.name != "include" or not inc.is_file():
            raise FileNotFoundError(f"{path}:{n}: {m.group(1)} is not a file of bpf/include")
        if inc not in seen:
            seen.add(inc)
            _expand(inc, seen, out)
        out.append(f'#line {n + 1} "{path}"\n')


def unit_text(names: Iterable[str]) -> str:
    """The C text of one compile unit: bpf/<name>.bpf.c for each name, in order, with the
    headers they include pasted in once."""
    seen: set[Path] = set()
    out: list[str] = []
    for name in names:
        _expand(source_path(name), seen, out)
    return "".join(out)


def header_text(rel: str) -> str:
    """The text of bpf/include/<rel> with the headers it includes pasted in."""
    path = bpf_dir() / "include" / rel
    if not path.is_file():
        raise FileNotFoundError(f"BPF header {path} not found (set {ENV} to the bpf/ directory)")
    out: list[str] = []
    _expand(path.resolve(), {path.resolve()}, out)
    return "".join(out)


def included(name: str) -> list[Path]:
    """The headers bpf/<name>.bpf.c pulls in (directly or through other headers)."""
    seen: set[Path] = set()
    _expand(source_path(name), seen, [])
    return sorted(seen)


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

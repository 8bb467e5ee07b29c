"""Reading the host's filesystem through --host-root without escaping it.

Why: in the debug pod the host's / is mounted at /host, and host symlinks are absolute
(`/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 -> /usr/lib/.../libnvidia-ml.so.570.158.01`,
or into /run/nvidia/driver for the GPU Operator). Following them naively would read the
probe image's files instead of the host's. `resolve()` follows links inside the root.
"""
from __future__ import annotations

import os
from pathlib import Path

MAX_LINKS = 40


def resolve(root: Path, rel: str | os.PathLike) -> Path | None:
    """Resolve `rel` (host-absolute or relative) under `root`, following symlinks as the host
    would see them. Returns the real path under root, or None if it does not exist."""
    root = Path(root)
    parts = [p for p in str(rel).split("/") if p not in ("", ".")]
    cur: list[str] = []
    links = 0
    while parts:
        name = parts.pop(0)
        if name == "..":
            if cur:
                cur.pop()
            continue
        candidate = root.joinpath(*cur, name)
        try:
            if candidate.is_symlink():
                links += 1
                if links > MAX_LINKS:
                    return None
                target = os.readlink(candidate)
                if target.startswith("/"):
                    cur = []
                parts = [p for p in target.split("/") if p not in ("", ".")] + parts
                continue
        except OSError:
            return None
        cur.append(name)
    final = root.joinpath(*cur)
    return final if final.exists() else None


def read_text(root: Path, rel: str, limit: int = 1 << 20) -> str | None:
    p = resolve(root, rel)
    if p is None:
        return None
    try:
        with open(p, "rb") as f:
            return f.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


def proc_devices(root: Path) -> dict[str, int]:
    """Character device majors by name from <root>/proc/devices (nvidia-uvm's is dynamic)."""
    text = read_text(root, "proc/devices") or ""
    out: dict[str, int] = {}
    section = None
    for line in text.splitlines():
        s = line.strip()
        if s.endswith("devices:"):
            section = s.split()[0].lower()
            continue
        if section != "character" or not s:
            continue
        num, _, name = s.partition(" ")
        if num.isdigit() and name:
            out.setdefault(name.strip(), int(num))
    return out

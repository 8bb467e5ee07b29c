"""The `bcc` module for a probe whose own Python has none: the host's python3-bpfcc.

Why: `kubectl gpu-doctor local` from the krew archive runs the probe in the frozen interpreter,
which never bundles bcc (libbcc with its LLVM and clang is the host's, ~100 MB, built for the
host's libc), and a pip install into a venv without system site packages has none either; both
used to skip eBPF on every host. BCC's Python package is pure Python over ctypes
(`libbcc.so.0`), so the one the host's package manager installed works from any CPython 3. It
is imported from its own directory alone (never the whole dist-packages, whose compiled
packages were built for another interpreter), without writing bytecode there, and only when
that directory and every module in it are the host's own by host_owned's rule (no tenant area,
root's alone from / down): the probe runs as root. Only the probe's own filesystem is
searched, never --host-root: the image must not run the node's code.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import stat
import sys
from pathlib import Path
from types import ModuleType

from node_probe.host import host_owned

# Where distributions install python3-bpfcc / python3-bcc (Debian and Ubuntu; Fedora, RHEL,
# Arch, SUSE: site-packages of their CPython; BCC's own `make install` uses either).
SEARCH = ("/usr/lib/python3/dist-packages", "/usr/lib/python3.*/site-packages",
          "/usr/lib64/python3.*/site-packages")
MAX_FILES = 64      # bcc 0.26 has 11 modules


def candidates(search: tuple[str, ...] = SEARCH) -> list[Path]:
    """Existing bcc package directories, in SEARCH order (newest CPython first per pattern)."""
    out: list[Path] = []
    for pattern in search:
        for d in sorted(glob.glob(pattern), reverse=True):
            pkg = Path(d) / "bcc"
            if (pkg / "__init__.py").is_file() and pkg not in out:
                out.append(pkg)
    return out


def check_dir(pkg: Path, areas: host_owned.TenantAreas | None = None) -> str:
    """Why the package at pkg must not be imported as root, or "": the host's own path rule
    (host_owned.path_refusal: in no tenant-writable area, and every directory from / down to
    each module root's alone) for the package directory and each of its modules."""
    root = Path("/")
    areas = areas if areas is not None else host_owned.tenant_areas(root)
    try:
        files = sorted(p for p in pkg.iterdir() if p.suffix == ".py")
    except OSError as exc:
        return f"{pkg}: {exc.strerror or exc}"
    if len(files) > MAX_FILES:
        return f"{pkg} holds {len(files)} modules (more than {MAX_FILES})"
    for path in (pkg, *files):
        why = host_owned.path_refusal(path, root, areas)
        if why:
            return why
        if path != pkg and not stat.S_ISREG(os.lstat(path).st_mode):
            return f"{path} is not a regular file"
    return ""


def load(pkg: Path) -> ModuleType:
    """Import the package at pkg as `bcc` (its submodules through its __path__)."""
    spec = importlib.util.spec_from_file_location("bcc", pkg / "__init__.py",
                                                  submodule_search_locations=[str(pkg)])
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {pkg}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bcc"] = module
    saved, sys.dont_write_bytecode = sys.dont_write_bytecode, True   # no .pyc into the host's dir
    try:
        spec.loader.exec_module(module)
    except BaseException:
        for name in [n for n in sys.modules if n == "bcc" or n.startswith("bcc.")]:
            del sys.modules[name]
        raise
    finally:
        sys.dont_write_bytecode = saved
    return module


def import_bcc(search: tuple[str, ...] = SEARCH) -> tuple[ModuleType | None, bool, str]:
    """(the bcc module, whether it is the host's rather than this Python's, why none could be
    imported). This Python's own bcc first; when it has none, the host's (then
    sys.modules["bcc"] is that one, so `from bcc import BPF` anywhere gets it)."""
    try:
        import bcc
        return bcc, False, ""
    except ModuleNotFoundError as exc:
        if exc.name != "bcc":
            return None, False, f"{type(exc).__name__}: {exc}"
        own = f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # a libbcc that fails to load: the host's would fail the same way
        return None, False, f"{type(exc).__name__}: {exc}"
    why = [own]
    found = candidates(search)
    if not found:
        why.append(f"no host python3-bpfcc in {', '.join(search)}")
    for pkg in found:
        bad = check_dir(pkg)
        if bad:
            why.append(f"not importing {pkg}: {bad}")
            continue
        try:
            module = load(pkg)
        except Exception as exc:
            why.append(f"{pkg}: {type(exc).__name__}: {exc}")
            continue
        return module, True, ""
    return None, False, "; ".join(why)

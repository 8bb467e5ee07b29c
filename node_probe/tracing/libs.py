"""Where a process's copy of a driver library is, as a path uprobes can be attached to.

Why one place: uprobes are per inode, and the library a containerised process uses may exist
only in its own mount namespace; attaching "by name" would pick the probe's own (or no)
library and ignore the process's LD_LIBRARY_PATH. So the library is found in /proc/PID/maps, or
(not loaded yet) in the standard driver library directories under /proc/PID/root, and returned
as a path through /proc/PID/root. Symlinks are followed inside that root (a tenant's link never
leads to a host file) and only a regular file is returned (BCC reads it; a FIFO would block).
"""
from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from node_probe.host import hostfs, procfs
from node_probe.host.driver_libs import LIB_DIRS   # where a driver's libraries live, one list


def regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def find_in_process(pid: int, mapped: re.Pattern, soname: str,
                    proc: Path = procfs.PROC) -> tuple[str | None, str | None, str]:
    """(path inside the process's mount namespace, path to attach through /proc/PID/root, how
    it was found) for the first mapped file matching `mapped`, else `soname` in LIB_DIRS."""
    root = proc / str(pid) / "root"
    try:
        maps = hostfs.read_file(proc / str(pid) / "maps", 16 << 20).text.splitlines()
    except OSError as exc:
        return None, None, f"cannot read maps: {exc.strerror or exc}"
    for line in maps:
        parts = line.split(None, 5)
        if len(parts) == 6 and mapped.search(parts[5].strip()):
            inner = parts[5].strip()
            p = hostfs.resolve(root, inner)
            if p is not None and regular(p):
                return inner, str(p), "mapped"
    for d in LIB_DIRS:
        p = hostfs.resolve(root, f"{d}/{soname}")
        if p is not None and regular(p):
            return "/" + str(p.relative_to(root)), str(p), "not loaded yet; standard path"
    return None, None, f"{soname} neither mapped nor in the standard library paths"


def find_on_host(host_root: Path, soname: str) -> list[Path]:
    """`soname` in the standard driver library directories under the host root."""
    return [p for d in LIB_DIRS
            if (p := hostfs.resolve(host_root, f"{d}/{soname}")) is not None and regular(p)]

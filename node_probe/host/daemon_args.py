"""The host's own daemons as the layout resolvers read them: processes found by name but
believed only when they are the host's own, their flags parsed as the daemons parse them, and
their TOML config files read bounded.

Why a module of its own: the kubelet dir (kubelet_root_dir.py) and the container runtime
(runtime_layout.py) are both found from a daemon's command line and config; one reading, with
the same caps (MAX_PROCS_SEEN processes, MAX_CONFIG_BYTES of config), so a decoy named
`kubelet` in a tenant's container is passed over the same way by both.
"""
from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path
from typing import Callable

from node_probe.host import host_owned, hostfs, procfs


MAX_PROCS_SEEN = 16
MAX_SHOWN = 200          # characters of a tenant-chosen path kept in `tried`
MAX_CONFIG_BYTES = 1 << 20


# --- helpers -------------------------------------------------------------------------------
def is_socket(p: Path | None) -> bool:
    try:
        return p is not None and stat.S_ISSOCK(os.lstat(p).st_mode)
    except OSError:
        return False


def flag(argv: list[str], *names: str) -> str | None:
    """--name=value / --name value / -n value (last one wins)."""
    val = None
    for i, a in enumerate(argv):
        for n in names:
            if a.startswith(n + "="):
                val = a[len(n) + 1:]
            elif a == n and i + 1 < len(argv):
                val = argv[i + 1]
    return val


def host_procs(comms: tuple[str, ...], proc: Path, host_root: Path, refused: list | None = None,
               keep: Callable[[int, list[str]], bool] | None = None) -> list[tuple[int, list[str]]]:
    """(pid, argv) of the first MAX_PROCS_SEEN processes named in `comms` that are the host's
    own (host_owned.process_refusal) and that `keep` keeps (one that names nothing to look at
    is of no use). Any other is passed over without taking a slot: sixteen decoys named
    `kubelet` (prctl(PR_SET_NAME) in a tenant's container) started before the kubelet once
    filled the slots and hid it (audit round 5, HK-01). The scan goes on through every process
    until the slots are full. The first MAX_PROCS_SEEN refusals go to `refused` as (pid,
    argv, why)."""
    out = []
    for pid in procfs.pids(proc):
        if procfs.read_comm(pid, proc) not in comms:
            continue
        no = host_owned.process_refusal(pid, proc, host_root)
        if no:
            if refused is not None and len(refused) < MAX_PROCS_SEEN:
                refused.append((pid, procfs.read_cmdline(pid, proc), no))
            continue
        argv = procfs.read_cmdline(pid, proc)
        if keep is not None and not keep(pid, argv):
            continue
        out.append((pid, argv))
        if len(out) >= MAX_PROCS_SEEN:
            break
    return out


def read_toml(root: Path, rel: str) -> dict:
    text = hostfs.read_text(root, rel.lstrip("/"), limit=MAX_CONFIG_BYTES)
    if not text:
        return {}
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return {}


def as_str(v) -> str | None:
    return v if isinstance(v, str) and v else None

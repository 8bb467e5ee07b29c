"""Loader of the shared fd tracker (bpf/include/fdtrack.h): tracked opens, dup family, close.

Why one: the programs that look at fds (nvidia_dev's ioctls, cgroup_devices' rule writes) need
the same answer, "which fds of which process name a device node or a rule file", and the node
should pay one prefilter per open/dup/close for all of them. This attaches the tracker's
tracepoints once, reads its ring buffer of opens and hands each open to the loader that
subscribed to its kind, and seeds fds opened before attach from /proc/PID/fd. Kinds and sizes
come from the header (abi.Constants).
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Iterable

from node_probe.host import procfs
from .abi import Constants
from .bundle import TracepointSet
from .sources import cstring

C = Constants("include/fdtrack.h")
TRACEPOINTS = (   # (syscall tracepoint, program): one program may serve several
    ("sys_enter_openat", "fdt_enter_open"), ("sys_exit_openat", "fdt_exit_open"),
    ("sys_enter_openat2", "fdt_enter_open"), ("sys_exit_openat2", "fdt_exit_open"),
    ("sys_enter_open", "fdt_enter_open_legacy"), ("sys_exit_open", "fdt_exit_open"),
    ("sys_enter_dup", "fdt_enter_dup"), ("sys_exit_dup", "fdt_exit_dup"),
    ("sys_enter_dup2", "fdt_enter_dup2"), ("sys_exit_dup2", "fdt_exit_dup"),
    ("sys_enter_dup3", "fdt_enter_dup2"), ("sys_exit_dup3", "fdt_exit_dup"),
    ("sys_enter_fcntl", "fdt_enter_fcntl"), ("sys_exit_fcntl", "fdt_exit_dup"),
    ("sys_enter_close", "fdt_enter_close"),
)
REQUIRED = ("sys_enter_openat", "sys_exit_openat", "sys_enter_close")

OnOpen = Callable[[object], None]   # the raw ring-buffer event (struct fdt_open_event)


class FdTracker:
    def __init__(self, dev_prefix: str, self_tgid: int | None = None, proc: Path = procfs.PROC,
                 seed_budget_s: float = 0.3) -> None:
        cap = C.FDT_FD_PATH_LEN
        if not dev_prefix or len(dev_prefix.encode()) >= cap - 1:
            raise ValueError(f"device prefix must be 1..{cap - 2} bytes: {dev_prefix!r}")
        self.prefix = dev_prefix
        self.self_tgid = os.getpid() if self_tgid is None else self_tgid
        self.proc = proc
        self.seed_budget_s = seed_budget_s
        self.b = None
        self.seeded = 0
        self._subscribers: dict[int, OnOpen] = {}

    def cflags(self) -> list[str]:
        return [f"-DFDT_NV_PREFIX={cstring(self.prefix)}", f"-DFDT_SELF_TGID={self.self_tgid}"]

    def subscribe(self, kinds: Iterable[int], on_open: OnOpen) -> None:
        for k in kinds:
            self._subscribers[k] = on_open

    def kind_of(self, path: str) -> int:
        """The kind the kernel side gives a path (fdt_classify), 0 if untracked."""
        if path.startswith(self.prefix):
            return C.FDT_KIND_NVDEV
        base = path.rsplit("/", 1)[-1]
        return {"devices.allow": C.FDT_KIND_CG_ALLOW,
                "devices.deny": C.FDT_KIND_CG_DENY}.get(base, 0)

    def attach(self, b, tps: TracepointSet, first_pids: Iterable[int] = ()) -> None:
        """Attach, then seed: no open or close falls in between unseen."""
        self.b = b
        b[b"fdt_events"].open_ring_buffer(self._on_ring)
        tps.attach(TRACEPOINTS, required=REQUIRED)
        self.seed_open_fds(first_pids)

    def _on_ring(self, ctx, data, size) -> None:
        e = self.b[b"fdt_events"].event(data)
        fn = self._subscribers.get(e.kind)
        if fn is not None:
            fn(e)

    def seed_open_fds(self, first_pids: Iterable[int] = ()) -> int:
        """Put already-open tracked fds into fdt_fds (targets first, then every process,
        within a time budget)."""
        fds = self.b[b"fdt_fds"]
        procs = self.b[b"fdt_procs"]
        deadline = time.monotonic() + self.seed_budget_s
        order = list(dict.fromkeys([*first_pids, *procfs.pids(self.proc)]))
        for pid in order:
            if time.monotonic() > deadline:
                break
            if pid == self.self_tgid:
                continue
            fd_dir = self.proc / str(pid) / "fd"
            try:
                names = os.listdir(fd_dir)
            except OSError:
                continue
            for n in names:
                try:
                    target = os.readlink(fd_dir / n)
                except OSError:
                    continue
                kind = self.kind_of(target)
                if not kind or not n.isdigit():
                    continue
                leaf = fds.Leaf()
                leaf.open_ns = 0
                leaf.kind = kind
                leaf.path = target.encode()[:C.FDT_FD_PATH_LEN - 1]
                fds[fds.Key(pid, int(n))] = leaf
                slot = procs.Key(pid & (C.FDT_TGID_SLOTS - 1))
                p = procs[slot]
                p.kinds[kind] = 1
                procs[slot] = p
                self.seeded += 1
        return self.seeded

    def tracked(self) -> dict[tuple[int, int], tuple[int, str]]:
        """(tgid, fd) -> (kind, path) of every fd the tracker holds now."""
        from .bundle import cstr
        return {(k.tgid, k.fd): (v.kind, cstr(v.path)) for k, v in self.b[b"fdt_fds"].items()}

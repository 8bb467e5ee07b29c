"""What every probe loader offers the trace session, and what the session gives it.

Why: adding a probe should mean its bpf/<name>.bpf.c, its loader and its verdict (in
node_probe/checks/_trace_verdicts.py), nothing else. The session knows loaders only through
this protocol and the one list in session.LOADERS: it builds each from the same TraceConfig,
compiles their sources as one unit with all their -D cflags, attaches them, and asks each to
add its results to one dict, in list order (a later loader may read an earlier one's output,
e.g. futex_wait scans the threads of unfinished library calls first). LoaderBase holds what
every loader keeps, so a loader writes only its own state.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Callable, ClassVar, Protocol

from node_probe.host import procfs
from .bundle import TracepointSet
from .fdtrack import FdTracker

Emit = Callable[[str, dict], None]    # (kind, record): a live event of this loader


@dataclasses.dataclass(frozen=True)
class TraceConfig:
    dev_prefix: str = "/dev/nvidia"
    cgroup_dir: Path = Path("/sys/fs/cgroup")
    host_root: Path = Path("/")
    futex_min_s: float = 0.5
    ioctl_slow_s: float = 1.0
    precise_ioctl_clock: bool = False   # time ioctls in ns, not ticks (costs ~2x per call)
    proc: Path = procfs.PROC
    self_tgid: int = dataclasses.field(default_factory=os.getpid)


@dataclasses.dataclass(frozen=True)
class Targets:
    """Processes the probes look at closely, known only after compiling."""
    deep: tuple[int, ...] = ()   # device plugin + --trace-pid: futex waits, NVML calls
    gpu: tuple[int, ...] = ()    # processes of GPU containers: their CUDA library

    def __iter__(self):          # the deep targets, for probes that need only those
        return iter(self.deep)


class Loader(Protocol):
    name: ClassVar[str]           # its source is bpf/<name>.bpf.c
    uses_fds: ClassVar[bool]      # needs the shared fd tracker (bpf/include/fdtrack.h)

    def __init__(self, cfg: TraceConfig, emit: Emit, fds: FdTracker | None) -> None: ...

    def cflags(self) -> list[str]:
        """-D options of its program (the fd tracker's are the session's)."""

    def attach(self, b, tps: TracepointSet, targets: Targets) -> bool:
        """Attach its programs; True when it is live (a probe with nothing to watch, e.g.
        no target pids, may stay detached)."""

    def collect(self, out: dict, now_ns: int) -> None:
        """Add its results to `out` (the ring buffers were drained just before)."""


class LoaderBase:
    """What every loader keeps: its TraceConfig, where /proc is, its live-event callback, the fd
    tracker (when it uses one) and, once attached, the BPF module. Subclasses set `name` (and
    `uses_fds`), add their own state after calling this __init__, and implement attach/collect."""
    name: ClassVar[str]
    uses_fds: ClassVar[bool] = False

    def __init__(self, cfg: TraceConfig, emit: Emit, fds: FdTracker | None) -> None:
        if self.uses_fds and fds is None:
            raise ValueError(f"{self.name} needs the shared fd tracker")
        self.cfg = cfg
        self.proc = cfg.proc
        self.emit = emit
        self.fds = fds
        self.b = None

    def cflags(self) -> list[str]:
        return []

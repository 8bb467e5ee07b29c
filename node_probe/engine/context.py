"""What a check gets to work with: host paths, options, a deadline, a way to emit, shared facts.

Why: checks run concurrently and some depend on each other's discoveries (the tracer needs the
device plugin's pid before it attaches; the device-plugin verdict needs the tracer's results).
Instead of ordering checks by hand, a check `publish`es a typed fact (engine.facts) and another
reads it with `ctx.fact(KEY, timeout=..., default=...)`. A check that ends without publishing
what it declared in `provides` has its facts failed by the runner, so nobody waits on a dead
producer. A check that could not look says so with `ctx.skip(reason)` (or by returning
`Skipped(reason)`): its status becomes `skipped` with that reason.
"""
from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, NoReturn, TypeVar

from node_probe import protocol
from node_probe.engine import facts
from node_probe.engine.facts import FactKey, T


@dataclasses.dataclass(frozen=True)
class ProbeOptions:
    host_root: Path = Path("/")
    cgroup_root: Path | None = None   # default: <host_root>/sys/fs/cgroup
    kubelet_dir: Path | None = None   # default: resolved (host.layout.kubelet_dir)
    proc_root: Path = Path("/proc")   # live processes (the pod runs with hostPID)
    timeout_s: float = 30.0           # whole run, summary included
    trace_s: float = 5.0              # eBPF trace window; 0 disables tracing
    kmsg_file: Path | None = None     # offline kernel log instead of <host_root>/dev/kmsg
    nvml_timeout_s: float = 8.0
    dev_prefix: str = "/dev/nvidia"   # path prefix the eBPF open tracer matches
    focus_pods: tuple[str, ...] = ()  # pod UIDs (for `kubectl gpu-doctor pod Y`)
    only: tuple[str, ...] = ()        # check ids to run (empty: all)
    skip: tuple[str, ...] = ()        # check ids to skip
    plugin_log: Path | None = None    # a device plugin's log file to scan (HAMi)
    trace_pids: tuple[int, ...] = ()  # extra pids for the eBPF futex/NVML probes (--trace-pid)
    # call a plugin's GetPreferredAllocation (the watching agent does only on a cheap signal)
    provoke_plugin: bool = True
    # ask the device plugins and pod-resources over gRPC (the watching agent's quiet passes do
    # not, unless the plugin sockets or processes changed since `plugin_targets_seen` or a
    # plugin thread sits in nvmlInit: watch/detect.RpcPacer)
    plugin_rpc: bool = True
    plugin_targets_seen: tuple[str, ...] = ()
    # /proc/PID/fd entries the GPU isolation check may read in one run (0: no cap but its
    # per-process and per-container ones and the deadline; the watching agent sets one)
    isolation_max_fds: int = 0
    # namespaces whose pods may hold GPUs unallocated (GPU agents); None: the environment's
    # GPU_DOCTOR_TRUSTED_NAMESPACES, else the defaults (checks/gpu_isolation.trusted_namespaces)
    trusted_namespaces: tuple[str, ...] | None = None
    # records read from --nvidia-smi-file / --lspci-file / --bug-report before the run
    # (host.offline.load.OfflineInput, which holds dicts: kept out of eq and hash); None: none
    offline: Any = dataclasses.field(default=None, compare=False)

    @property
    def cgroup_dir(self) -> Path:
        return self.cgroup_root or self.host_root / "sys/fs/cgroup"

    @property
    def kubelet_path(self) -> Path:
        """--kubelet-dir, else what host.layout resolved (the running kubelet's --root-dir,
        then the distributions' defaults)."""
        if self.kubelet_dir:
            return self.kubelet_dir
        from node_probe.host import layout   # lazy: the engine does not depend on host/
        return layout.kubelet_dir(self.host_root, self.proc_root).path

    def host(self, rel: str | os.PathLike) -> Path:
        """A host path under --host-root. `rel` may start with '/'."""
        return self.host_root / str(rel).lstrip("/")


class FactUnavailable(Exception):
    """The fact's producer failed, timed out or never published it in time."""


class CheckSkipped(Exception):
    """Raised by `ProbeContext.skip`: the check could not look (the reason says why)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class Skipped:
    """Returned by a check (or a check generator's `return`) that could not look."""

    reason: str


_MISSING: Any = object()
D = TypeVar("D")


class Facts:
    """A small blackboard of typed one-shot values shared between concurrent checks."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._values: dict[str, Any] = {}
        self._failed: dict[str, str] = {}

    def publish(self, key: FactKey | str, value: Any) -> None:
        """Publish once (later publishes and fails are ignored); TypeError on a wrong payload."""
        key = facts.resolve(key)
        self._settle(self._values, key.name, key.check(value))

    def fail(self, key: FactKey | str, reason: str) -> None:
        self._settle(self._failed, facts.resolve(key).name, reason)

    def _settle(self, into: dict[str, Any], name: str, value: Any) -> None:
        """A fact is settled once: published or failed, whichever comes first."""
        with self._cond:
            if name in self._values or name in self._failed:
                return
            into[name] = value
            self._cond.notify_all()

    def wait(self, key: FactKey | str, timeout: float) -> Any:
        """The value, or FactUnavailable once it failed or `timeout` passed."""
        name = facts.resolve(key).name
        end = time.monotonic() + max(0.0, timeout)
        with self._cond:
            while True:
                if name in self._values:
                    return self._values[name]
                if name in self._failed:
                    raise FactUnavailable(f"{name}: {self._failed[name]}")
                left = end - time.monotonic()
                if left <= 0:
                    raise FactUnavailable(f"{name}: not published within {timeout:.1f}s")
                self._cond.wait(left)

    def why(self, key: FactKey | str) -> str:
        """Why the fact is not (yet) there, for evidence: its producer's failure, or pending."""
        name = facts.resolve(key).name
        with self._cond:
            if name in self._values:
                return f"{name}: published"
            return f"{name}: {self._failed.get(name, 'not published yet')}"

    def get(self, key: FactKey | str, default: Any = None) -> Any:
        """The value if already published (no waiting)."""
        name = facts.resolve(key).name
        with self._cond:
            return self._values.get(name, default)


class ProbeContext:
    """Per-run state handed to every check."""

    def __init__(self, options: ProbeOptions, emit: Callable[[dict], None]) -> None:
        self.options = options
        self._emit = emit
        self.facts = Facts()
        self.started = time.monotonic()
        self.run_deadline = self.started + options.timeout_s
        self.cancelled = threading.Event()

    # -- time -------------------------------------------------------------------------------
    def remaining(self) -> float:
        """Seconds left before the whole run must wrap up (summary needs a little slack)."""
        return max(0.0, self.run_deadline - time.monotonic())

    def budget(self, want: float, reserve: float = 0.5) -> float:
        """`want` seconds, capped so that `reserve` seconds remain for the rest of the run."""
        return max(0.05, min(want, self.remaining() - reserve))

    # -- output -----------------------------------------------------------------------------
    def event(self, name: str, subject: str, message: str, **data: Any) -> None:
        self._emit(protocol.event(name, subject, message, **data))

    def log(self, level: str, message: str, **fields: Any) -> None:
        self._emit(protocol.log(level, message, **fields))

    def progress(self, **fields: Any) -> None:
        self._emit(protocol.progress(**fields))

    # -- facts ------------------------------------------------------------------------------
    def publish(self, key: FactKey | str, value: Any) -> None:
        self.facts.publish(key, value)

    def fact(self, key: FactKey[T], timeout: float | None = None,
             default: D = _MISSING) -> T | D:
        """The fact once published, waiting at most `timeout` seconds (default: the rest of
        the run). Returns at once when its producer failed or is not part of the run. Without
        a `default`, a fact that does not come raises FactUnavailable."""
        left = self.remaining()
        try:
            return self.facts.wait(key, left if timeout is None else min(timeout, left))
        except FactUnavailable:
            if default is _MISSING:
                raise
            return default

    # -- could not look -----------------------------------------------------------------------
    @staticmethod
    def skip(reason: str) -> NoReturn:
        """End the calling check as `skipped` with this reason (findings already yielded stay)."""
        raise CheckSkipped(reason)

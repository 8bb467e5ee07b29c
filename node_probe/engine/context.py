"""What a check gets to work with: host paths, options, a deadline, a way to emit, shared facts.

Why: checks run concurrently and some depend on each other's discoveries (the tracer needs the
device plugin's pid before it attaches; the device-plugin verdict needs the tracer's results).
Instead of ordering checks by hand, a check `publish`es a fact and another `wait_for`s it with a
deadline. A check that ends without publishing what it declared in `provides` has its facts
failed by the runner, so nobody waits on a dead producer.
"""
from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from node_probe import protocol


@dataclasses.dataclass(frozen=True)
class ProbeOptions:
    host_root: Path = Path("/")
    cgroup_root: Path | None = None   # default: <host_root>/sys/fs/cgroup
    kubelet_dir: Path | None = None   # default: <host_root>/var/lib/kubelet
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
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def cgroup_dir(self) -> Path:
        return self.cgroup_root or self.host_root / "sys/fs/cgroup"

    @property
    def kubelet_path(self) -> Path:
        return self.kubelet_dir or self.host_root / "var/lib/kubelet"

    def host(self, rel: str | os.PathLike) -> Path:
        """A host path under --host-root. `rel` may start with '/'."""
        return self.host_root / str(rel).lstrip("/")


class FactUnavailable(Exception):
    """The fact's producer failed, timed out or never published it in time."""


class Facts:
    """A small blackboard of named one-shot values shared between concurrent checks."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._values: dict[str, Any] = {}
        self._failed: dict[str, str] = {}

    def publish(self, key: str, value: Any) -> None:
        with self._cond:
            if key in self._values or key in self._failed:
                return
            self._values[key] = value
            self._cond.notify_all()

    def fail(self, key: str, reason: str) -> None:
        with self._cond:
            if key in self._values or key in self._failed:
                return
            self._failed[key] = reason
            self._cond.notify_all()

    def wait_for(self, key: str, timeout: float) -> Any:
        end = time.monotonic() + max(0.0, timeout)
        with self._cond:
            while True:
                if key in self._values:
                    return self._values[key]
                if key in self._failed:
                    raise FactUnavailable(f"{key}: {self._failed[key]}")
                left = end - time.monotonic()
                if left <= 0:
                    raise FactUnavailable(f"{key}: not published within {timeout:.1f}s")
                self._cond.wait(left)

    def get(self, key: str, default: Any = None) -> Any:
        with self._cond:
            return self._values.get(key, default)

    def has(self, key: str) -> bool:
        with self._cond:
            return key in self._values


class ProbeContext:
    """Per-run state handed to every check."""

    def __init__(self, options: ProbeOptions, emit: Callable[[dict], None],
                 run_deadline: float | None = None) -> None:
        self.options = options
        self._emit = emit
        self.facts = Facts()
        self.started = time.monotonic()
        self.run_deadline = run_deadline or (self.started + options.timeout_s)
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
    def publish(self, key: str, value: Any) -> None:
        self.facts.publish(key, value)

    def wait_for(self, key: str, timeout: float | None = None) -> Any:
        return self.facts.wait_for(key, self.remaining() if timeout is None
                                   else min(timeout, self.remaining()))

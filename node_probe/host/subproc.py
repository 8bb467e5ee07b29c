"""Killable child processes: the only way the probe runs anything that might hang.

Why: NVML init can block forever in the kernel (seed 000) and a thread stuck in a C call cannot
be cancelled; a child process can. Every child runs in its own process group, is killed (the
whole group) when its deadline passes, and is killed on probe exit or interruption, so the probe
never leaves anything behind and never waits past its deadline.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Mapping, Sequence

_LIVE: set[subprocess.Popen] = set()
_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True)
class ChildResult:
    returncode: int | None   # None when killed at the deadline
    stdout: bytes
    stderr: bytes
    timed_out: bool
    duration_s: float

    def json_lines(self) -> list[dict]:
        """The JSON objects a helper printed one per line (other lines ignored): how the
        probe's helper children report, partial output of a killed child included."""
        out = []
        for line in self.stdout.decode("utf-8", "replace").splitlines():
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                out.append(obj)
        return out


def python_module_argv(module: str) -> list[str]:
    """argv that runs `python -m module` in a child, also from a frozen (PyInstaller) build,
    whose executable dispatches `__run_module MODULE` (see kubectl_gpudoctor.cli)."""
    if getattr(sys, "frozen", False):
        return [sys.executable, "__run_module", module]
    return [sys.executable, "-m", module]


def run(argv: Sequence[str], timeout_s: float, *, env: Mapping[str, str] | None = None,
        input: bytes | None = None, cwd: str | None = None,
        preexec_fn=None) -> ChildResult:
    """Run argv with a hard deadline; on timeout kill its process group and return timed_out."""
    t0 = time.monotonic()
    proc = subprocess.Popen(
        list(argv), stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(env) if env is not None else None,
        cwd=cwd, start_new_session=True, preexec_fn=preexec_fn,
    )
    with _LOCK:
        _LIVE.add(proc)
    try:
        try:
            out, err = proc.communicate(input=input, timeout=max(0.01, timeout_s))
            return ChildResult(proc.returncode, out, err, False, time.monotonic() - t0)
        except subprocess.TimeoutExpired:
            _kill(proc)
            try:
                out, err = proc.communicate(timeout=2.0)
            except subprocess.TimeoutExpired:  # uninterruptible (D state): give up on output
                out, err = b"", b""
            return ChildResult(None, out or b"", err or b"", True, time.monotonic() - t0)
    finally:
        with _LOCK:
            _LIVE.discard(proc)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            proc.kill()
        except ProcessLookupError:
            pass


def kill_all() -> int:
    """Kill every live child (probe exit, SIGTERM, Ctrl-C). Returns how many were killed."""
    with _LOCK:
        procs = list(_LIVE)
    for p in procs:
        if p.poll() is None:
            _kill(p)
    return len(procs)

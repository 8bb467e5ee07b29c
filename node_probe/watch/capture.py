"""Captures the evidence when a problem starts: the full probe once, in a child, into the ring.

Why a child: the full probe (eBPF trace window, GetPreferredAllocation, every check) is what a
user would have run at that moment; running it as `python -m node_probe -o jsonl` in its own
process group keeps its memory and its stuck threads out of the watching agent, and a deadline
kills it. One capture at a time, and at most one per class per `min_gap_s`: a flapping fault
costs one bundle per gap, and the ring's bounds hold whatever happens. The output read is
bounded in bytes and lines.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
import time
from typing import Callable, Sequence

from node_probe.host import subproc
from node_probe.protocol import bundle

from .ring import Ring

MAX_OUTPUT = 32 * 1024 * 1024
MAX_LINES = 20000
DEFAULT_MIN_GAP_S = 300.0


class Capturer:
    def __init__(self, ring: Ring, probe_args: Sequence[str], deadline_s: float, node: str,
                 min_gap_s: float = DEFAULT_MIN_GAP_S,
                 log: Callable[[str], None] = lambda m: None) -> None:
        self.ring = ring
        self.probe_args = list(probe_args)
        self.deadline_s = deadline_s
        self.node = node
        self.min_gap_s = min_gap_s
        self.log = log
        self._lock = threading.Lock()
        self._busy = False
        self._last: dict[str, float] = {}
        self.captured = 0
        self.skipped = 0
        self.failed = 0
        self._thread: threading.Thread | None = None
        self._proc: subprocess.Popen | None = None

    def argv(self) -> list[str]:
        return [*subproc.python_module_argv("node_probe"), "-o", "jsonl", "--fail-on",
                "warning", "--target-name", self.node, *self.probe_args]

    def trigger(self, ctype: str, note: dict) -> bool:
        """Start a capture for this transition unless one runs or the class had one lately."""
        now = time.monotonic()
        with self._lock:
            last = self._last.get(ctype)
            if self._busy or (last is not None and now - last < self.min_gap_s):
                self.skipped += 1
                return False
            self._busy = True
            self._last[ctype] = now
        self._thread = threading.Thread(target=self._run, args=(ctype, note),
                                        name="watch-capture", daemon=True)
        self._thread.start()
        return True

    def wait(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def kill(self) -> None:
        """End a capture in flight (the agent is stopping): its whole process group."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass

    @property
    def busy(self) -> bool:
        with self._lock:
            return self._busy

    def _run(self, ctype: str, note: dict) -> None:
        try:
            started = time.time()
            lines, why = self._probe()
            doc = bundle.from_probe_lines(
                lines, {"kind": "node", "name": self.node, "node": self.node}, self.argv(),
                started_at=started, note={**note, "captured_at": started},
                incomplete_reason=why)
            name = self.ring.add(doc, ctype)
            if name is None:
                self.failed += 1
                self.log(f"evidence for {ctype} not kept: larger than the ring")
            else:
                self.captured += 1
                self.log(f"evidence for {ctype} kept as {name}")
        except Exception as exc:  # noqa: BLE001 - a capture failure never ends the agent
            self.failed += 1
            self.log(f"evidence capture for {ctype} failed: {type(exc).__name__}: {exc}")
        finally:
            with self._lock:
                self._busy = False

    def _probe(self) -> tuple[list[bytes], str]:
        proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        self._proc = proc
        end = time.monotonic() + self.deadline_s
        buf, size, why = bytearray(), 0, ""
        fd = proc.stdout.fileno()
        try:
            while True:
                left = end - time.monotonic()
                if left <= 0:
                    why = f"the probe did not finish within {self.deadline_s:.0f}s"
                    break
                r, _, _ = select.select([fd], [], [], min(left, 1.0))
                if not r:
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                size += len(chunk)
                if size > MAX_OUTPUT:
                    why = f"the probe wrote more than {MAX_OUTPUT} bytes"
                    break
                buf += chunk
        finally:
            self.kill()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            proc.stdout.close()
        return bytes(buf).split(b"\n")[:MAX_LINES], why

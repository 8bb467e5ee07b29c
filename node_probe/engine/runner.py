"""Runs the selected checks concurrently, each with a deadline, and always ends with a summary.

Why: one hung check (NVML in the kernel, a device plugin that never answers, a wedged /proc
read on a dying node) must never keep the on-call engineer from a verdict. Each check runs in a
daemon thread; a check past its deadline is reported as `timeout` and abandoned (its later
output is dropped), a crash becomes an `error` status with a log record, a check that could not
look ends `skipped` with its reason, and the summary record is always the last line.
"""
from __future__ import annotations

import dataclasses
import queue
import threading
import time
import traceback
from typing import Callable, Iterable

from node_probe import protocol
from node_probe.host import subproc
from node_probe.engine import facts
from node_probe.engine.context import CheckSkipped, ProbeContext, Skipped
from node_probe.protocol import CheckResult, Finding
from node_probe.engine import registry
from node_probe.engine.registry import Check

SUMMARY_RESERVE_S = 0.3


@dataclasses.dataclass
class RunResult:
    findings: list[Finding]
    checks: list[CheckResult]
    complete: bool
    duration_s: float
    exit_status: protocol.ExitStatus


class _Sink:
    """Thread-safe emitter that goes quiet once the summary is out."""

    def __init__(self, emit: Callable[[dict], None]) -> None:
        self._emit = emit
        self._lock = threading.Lock()
        self.closed = False

    def __call__(self, rec: dict) -> None:
        with self._lock:
            if not self.closed:
                self._emit(rec)

    def close_with(self, rec: dict) -> None:
        with self._lock:
            if not self.closed:
                self._emit(rec)
                self.closed = True


class Runner:
    def __init__(self, checks: Iterable[Check], options, emit: Callable[[dict], None],
                 fail_on: str = "warning") -> None:
        self.checks = list(checks)
        self.sink = _Sink(emit)
        self.ctx = ProbeContext(options, self.sink)
        self.fail_on = fail_on
        self._findings: list[Finding] = []
        self._seen: set[tuple] = set()
        self._lock = threading.Lock()
        self._abandoned: set[str] = set()
        # A fact whose producer is not part of this run will never come: fail it now, so a
        # consumer's wait returns at once instead of spending its timeout.
        provided = {key.name for c in self.checks for key in c.provides}
        for key in facts.declared():
            if key.name in provided:
                continue
            producer = registry.producer_of(key)
            self.ctx.facts.fail(key, f"check {producer.id} is not part of this run"
                                if producer else "no check provides it")

    # -- per-check thread -------------------------------------------------------------------
    def _deadline(self, c: Check) -> float:
        allowance = c.timeout_s + (self.ctx.options.trace_s if c.uses_trace_window else 0.0)
        return min(self.ctx.started + allowance, self.ctx.run_deadline - SUMMARY_RESERVE_S)

    def _add(self, c: Check, f: Finding) -> None:
        if not isinstance(f, Finding):
            raise TypeError(f"check {c.id} yielded {type(f).__name__}, not a Finding")
        if not f.check:
            f = dataclasses.replace(f, check=c.id)
        with self._lock:
            if c.id in self._abandoned or f.key() in self._seen:
                return
            self._seen.add(f.key())
            self._findings.append(f)
        self.sink(f.to_record())

    def _call(self, c: Check) -> Skipped | None:
        """Run the check, adding its findings; its Skipped return value, if any."""
        out = c.fn(self.ctx)
        if out is None or isinstance(out, Skipped):
            return out
        it = iter(out)
        while True:
            try:
                f = next(it)
            except StopIteration as stop:   # a generator's `return Skipped(...)`
                return stop.value if isinstance(stop.value, Skipped) else None
            self._add(c, f)

    def _thread(self, c: Check, done: "queue.Queue[tuple[str, str, str, str]]") -> None:
        status, message, reason = "ok", "", ""
        try:
            skipped = self._call(c)
            if skipped is not None:
                status, reason = "skipped", skipped.reason
        except CheckSkipped as exc:
            status, reason = "skipped", exc.reason
        except Exception as exc:  # a crash in one check must not end the run
            status = "error"
            message = f"{type(exc).__name__}: {exc}"
            tb = traceback.extract_tb(exc.__traceback__)
            where = f"{tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno}" if tb else ""
            with self._lock:
                abandoned = c.id in self._abandoned
            if not abandoned:
                self.sink(protocol.log("error", f"check {c.id} failed: {message}",
                                       check=c.id, where=where))
        finally:
            why = (f"check {c.id} skipped: {reason}" if status == "skipped"
                   else f"check {c.id} ended without publishing it")
            for key in c.provides:
                self.ctx.facts.fail(key, why)
            done.put((c.id, status, message, reason))

    # -- main loop --------------------------------------------------------------------------
    def run(self) -> RunResult:
        ctx = self.ctx
        ids = [c.id for c in self.checks]
        self.sink(protocol.progress(phase="start", checks=ids,
                                    host_root=str(ctx.options.host_root),
                                    timeout_s=ctx.options.timeout_s,
                                    trace_s=ctx.options.trace_s))
        done: "queue.Queue[tuple[str, str, str, str]]" = queue.Queue()
        starts: dict[str, float] = {}
        pending: dict[str, Check] = {}
        results: dict[str, CheckResult] = {}
        for c in self.checks:
            starts[c.id] = time.monotonic()
            pending[c.id] = c
            threading.Thread(target=self._thread, args=(c, done), name=f"check:{c.id}",
                             daemon=True).start()
        interrupted = False
        try:
            while pending:
                next_deadline = min(self._deadline(c) for c in pending.values())
                try:
                    cid, status, message, reason = done.get(
                        timeout=max(0.0, next_deadline - time.monotonic()))
                except queue.Empty:
                    now = time.monotonic()
                    for c in [c for c in pending.values() if self._deadline(c) <= now]:
                        self._expire(c, "timeout",
                                     f"no result within {self._deadline(c) - starts[c.id]:.1f}s",
                                     starts, results, pending)
                    continue
                if cid in pending:
                    del pending[cid]
                    dur = time.monotonic() - starts[cid]
                    results[cid] = CheckResult(cid, status, dur, message, reason)
                    self.sink(protocol.progress(phase="check", check=cid, status=status,
                                                duration_s=round(dur, 3),
                                                **({"message": message} if message else {}),
                                                **({"reason": reason} if reason else {})))
        except KeyboardInterrupt:
            interrupted = True
            ctx.cancelled.set()
            for c in list(pending.values()):
                self._expire(c, "interrupted", "run interrupted", starts, results, pending)
        finally:
            subproc.kill_all()
        ordered = [results[c.id] for c in self.checks if c.id in results]
        complete = not interrupted and all(r.status in ("ok", "skipped") for r in ordered)
        with self._lock:
            findings = list(self._findings)
        status = (protocol.ExitStatus.INTERRUPTED if interrupted
                  else protocol.exit_status_for(findings, self.fail_on, complete))
        duration = time.monotonic() - ctx.started
        self.sink.close_with(protocol.summary(findings, ordered, complete, duration, int(status)))
        return RunResult(findings, ordered, complete, duration, status)

    def _expire(self, c: Check, status: str, message: str, starts, results, pending) -> None:
        with self._lock:
            self._abandoned.add(c.id)
        pending.pop(c.id, None)
        for key in c.provides:
            self.ctx.facts.fail(key, f"check {c.id}: {status}")
        dur = time.monotonic() - starts[c.id]
        results[c.id] = CheckResult(c.id, status, dur, message)
        self.sink(protocol.progress(phase="check", check=c.id, status=status,
                                    duration_s=round(dur, 3), message=message))

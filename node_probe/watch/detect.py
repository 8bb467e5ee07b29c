"""One watch pass: the cheap checks through the engine's runner, reduced to problems per class.

Why: the watch must reuse the probe's checks (their deadlines, their killable NVML child, their
verdicts) rather than re-implement them, but only the cheap ones: no eBPF (trace window 0, the
`trace` check not selected), never Allocate, and GetPreferredAllocation only when the Provoker
says a cheaper signal points at the plugin. A check whose thread from an earlier pass is still
stuck (a read on a dying node) is not started again: it costs one thread, not one per pass.
Kernel-log reports count only while recent (the ring buffer keeps last week's Xid too).
"""
from __future__ import annotations

import dataclasses
import threading
import time

from node_probe.engine import registry
from node_probe.engine.context import ProbeOptions
from node_probe.engine.runner import Runner
from node_probe.protocol import CheckResult, Finding, conditions

from .state import CLASS_CHECKS, Problem

# cheap checks the watch runs each pass (their fact producers join through `needs`)
WATCH_CHECKS = ("nvml", "deviceplugin", "containers", "kubelet", "cgroup.devices", "kmsg",
                "memory", "gpu_lost", "fabric")
RECENT_S = 600.0        # a kernel-log report older than this (since boot clock) is history
PROVOKE_MIN_GAP_S = 600.0
# findings that point at the device plugin without provoking it
PLUGIN_SIGNALS = ("nvml.init_hang", "deviceplugin.rpc_timeout")


@dataclasses.dataclass
class PassResult:
    started: float                      # wall clock
    duration_s: float
    findings: list[Finding]
    checks: list[CheckResult]
    problems: dict[str, list[Problem]]
    unsure: set[str]                    # classes whose detectors could not look
    stuck: tuple[str, ...]              # checks not started: still stuck from before
    provoked: bool


def is_active(f: Finding, recent_s: float = RECENT_S) -> bool:
    """Does this finding hold a condition True? Warning or worse, in a watched class, and for
    kernel-log reports, recent (an offline --kmsg-file has no clock: counted)."""
    if conditions.class_of(f.id) is None or f.severity.value not in ("warning", "critical"):
        return False
    if f.id in ("gpu.xid", "kernel.hung_task"):
        age = f.evidence.get("last_age_s")
        if isinstance(age, (int, float)) and age > recent_s:
            return False
    return True


def problems_of(findings: list[Finding], recent_s: float = RECENT_S) -> dict[str, list[Problem]]:
    out: dict[str, list[Problem]] = {}
    for f in findings:
        if is_active(f, recent_s):
            ct = conditions.class_of(f.id)
            out.setdefault(ct, []).append(Problem(ct, f.id, f.severity.value, f.subject, f.title))
    return out


def stuck_checks() -> tuple[str, ...]:
    """Checks whose thread from an earlier pass is still running (abandoned at its deadline)."""
    return tuple(sorted({t.name[len("check:"):] for t in threading.enumerate()
                         if t.name.startswith("check:") and t.is_alive()}))


class Provoker:
    """Rate limit for GetPreferredAllocation: only after a cheap signal, at most once a gap."""

    def __init__(self, min_gap_s: float = PROVOKE_MIN_GAP_S) -> None:
        self.min_gap_s = min_gap_s
        self.last: float | None = None
        self.signal = False

    def observe(self, findings: list[Finding]) -> None:
        self.signal = any(f.id in PLUGIN_SIGNALS for f in findings)

    def want(self, now: float | None = None) -> bool:
        t = time.monotonic() if now is None else now
        return self.signal and (self.last is None or t - self.last >= self.min_gap_s)

    def used(self, now: float | None = None) -> None:
        self.last = time.monotonic() if now is None else now


def run_pass(base: ProbeOptions, timeout_s: float, provoke: bool = False,
             recent_s: float = RECENT_S) -> PassResult:
    stuck = stuck_checks()
    skip = tuple(c for c in stuck if c in WATCH_CHECKS)
    only = tuple(c for c in WATCH_CHECKS if c not in skip)
    opts = dataclasses.replace(base, trace_s=0.0, timeout_s=timeout_s, only=only,
                               skip=("trace", *skip), provoke_plugin=provoke, focus_pods=())
    checks = registry.select(opts.only, opts.skip)
    started = time.time()
    result = Runner(checks, opts, lambda rec: None, fail_on="never").run()
    ran = {c.id: c.status for c in result.checks}
    unsure = {ct for ct, ids in CLASS_CHECKS.items()
              if any(ran.get(cid) not in ("ok", "skipped") for cid in ids)}
    return PassResult(started, result.duration_s, result.findings, result.checks,
                      problems_of(result.findings, recent_s), unsure, stuck, provoke)

"""One watch pass: the cheap checks through the engine's runner, reduced to problems per class.

Why: the watch must reuse the probe's checks (their deadlines, their killable NVML child, their
verdicts) rather than re-implement them, but only the cheap ones: no eBPF (trace window 0, the
`trace` check not selected), never Allocate, and GetPreferredAllocation only when the Provoker
says a cheaper signal points at the plugin. A check whose thread from an earlier pass is still
stuck (a read on a dying node) is not started again: it costs one thread, not one per pass.
Kernel-log reports count only while recent (the ring buffer keeps last week's Xid too).

The GPU isolation check's /proc fd scan costs ~4-5 us of CPU per descriptor (bench/isolation_scan
.py: 50 containers x 20 processes x 32 descriptors is 0.16 s, 0.5% of a CPU at 30 s; the caps'
worst case 1 s per container), more than the agent's 1% budget leaves. So it reads at most
ISOLATION_MAX_FDS descriptors a run and runs only as often as IsolationPacer allows: the CPU its
last scan took, spread at ISOLATION_SHARE of one CPU. A pass without it is unsure for its class.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from typing import Iterable

from node_probe.deviceplugin import podresources
from node_probe.engine import registry
from node_probe.engine.context import ProbeOptions
from node_probe.engine.runner import Runner
from node_probe.protocol import CheckResult, Finding, conditions

from .state import CLASS_CHECKS, LOOKED, Problem

# cheap checks the watch runs each pass (their fact producers join through `needs`)
WATCH_CHECKS = ("nvml", "deviceplugin", "containers", "kubelet", "cgroup.devices", "kmsg",
                "memory", "gpu_lost", "fabric", "gpu.isolation", "gpu.slow")
ISOLATION = "gpu.isolation"
ISOLATION_MAX_FDS = 200_000     # ~1 s of CPU here: a node's scan, cut beyond (said, unsure)
ISOLATION_SHARE = 0.001         # of one CPU, averaged: 0.1% of the agent's 1%
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
    isolation_cpu_s: float | None = None    # CPU the isolation check took (None: not run)
    gpus: list = dataclasses.field(default_factory=list)   # gpu_gauges: the per-GPU metrics
    # the device plugins the pass found (checks/deviceplugin.targets_seen), None: not looked
    plugin_targets: tuple[str, ...] | None = None
    plugin_rpc: bool = True                 # whether the pass asked them over gRPC


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


def problems_of(findings: list[Finding], recent_s: float = RECENT_S,
                hit: dict[str, tuple[str, ...]] | None = None) -> dict[str, list[Problem]]:
    """The active findings per class; each names the pods on the GPU it is about (`hit`,
    gpu_users) -- issue 31 item 6."""
    out: dict[str, list[Problem]] = {}
    for f in findings:
        if is_active(f, recent_s):
            ct = conditions.class_of(f.id)
            out.setdefault(ct, []).append(Problem(ct, f.id, f.severity.value, f.subject, f.title,
                                                  users_of(f.subject, hit or {})))
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


# the classes whose verdicts come from the device plugins' and pod-resources' RPCs
RPC_CLASSES = tuple(ct for ct, ids in CLASS_CHECKS.items() if "deviceplugin" in ids)
RPC_MAX_GAP_S = 120.0   # the RPCs at least this often, whatever else says (4 passes at 30 s)


class RpcPacer:
    """When a pass asks the device plugins and pod-resources over gRPC (loading grpc and
    protobuf costs the pass child ~80 ms of CPU: half the agent's 5m budget at 30 s). Due:
    the first pass; RPC_MAX_GAP_S after the last; while any condition they judge is True (so
    it clears on what they say) or one of their classes is unsure; after a pass that found any
    problem.
    The check itself asks anyway when the plugins found differ from the ones last asked or a
    plugin thread sits in nvmlInit (checks/deviceplugin.py): those need no RPC to be seen, so
    a quiet pass loses none of its detection latency."""

    def __init__(self, max_gap_s: float = RPC_MAX_GAP_S) -> None:
        self.max_gap_s = max_gap_s
        self.last: float | None = None
        self.seen: tuple[str, ...] = ()    # the plugins when last asked
        self.signal = True

    def want(self, active: Iterable[str] = (), now: float | None = None) -> bool:
        t = time.monotonic() if now is None else now
        return (self.signal or self.last is None or t - self.last >= self.max_gap_s
                or any(ct in RPC_CLASSES for ct in active))

    def observe(self, res: "PassResult", now: float | None = None) -> None:
        t = time.monotonic() if now is None else now
        if res.plugin_rpc and res.plugin_targets is not None:
            self.last, self.seen = t, res.plugin_targets
        elif res.plugin_rpc:
            self.last = t
        # a class they judge that could not be judged asks again; others (the isolation scan
        # that the pacer left out, unsure on most passes) do not
        self.signal = bool(res.problems) or res.plugin_targets is None or any(
            ct in RPC_CLASSES for ct in res.unsure)


class IsolationPacer:
    """When the isolation scan may run again: after the CPU its last run took, divided by
    `share`, has passed (a 0.02 s scan every pass, a 0.16 s one every ~3 min)."""

    def __init__(self, share: float = ISOLATION_SHARE) -> None:
        self.share = share
        self.next_at: float | None = None

    def want(self, now: float | None = None) -> bool:
        t = time.monotonic() if now is None else now
        return self.next_at is None or t >= self.next_at

    def used(self, cpu_s: float, now: float | None = None) -> None:
        t = time.monotonic() if now is None else now
        self.next_at = t + max(0.0, cpu_s) / self.share


def run_pass(base: ProbeOptions, timeout_s: float, provoke: bool = False,
             recent_s: float = RECENT_S, isolation: bool = True,
             skip: tuple[str, ...] | None = None, emit=None) -> PassResult:
    """One pass in this process. `skip`: checks known stuck (the forked pass gets them from
    its parent, passchild.py); None: those whose threads from earlier passes still run here.
    `emit` sees every record the runner writes (progress of each check)."""
    stuck = stuck_checks() if skip is None else tuple(skip)
    skip = tuple(c for c in stuck if c in WATCH_CHECKS) + (() if isolation else (ISOLATION,))
    only = tuple(c for c in WATCH_CHECKS if c not in skip)
    opts = dataclasses.replace(base, trace_s=0.0, timeout_s=timeout_s, only=only,
                               skip=("trace", *skip), provoke_plugin=provoke, focus_pods=(),
                               isolation_max_fds=base.isolation_max_fds or ISOLATION_MAX_FDS)
    checks = registry.select(opts.only, opts.skip)
    started = time.time()
    scan_cpu: list[float] = []
    plugins: list[tuple[str, ...]] = []

    def sink(rec: dict) -> None:   # the isolation check reports its scan's CPU
        v = rec.get("isolation_scan_cpu_s") if rec.get("kind") == "progress" else None
        if isinstance(v, (int, float)):
            scan_cpu.append(float(v))
        t = rec.get("plugin_targets") if rec.get("kind") == "progress" else None
        if isinstance(t, list):
            plugins.append(tuple(str(x) for x in t))
        if emit is not None:
            emit(rec)

    runner = Runner(checks, opts, sink, fail_on="never")
    result = runner.run()
    problems = problems_of(result.findings, recent_s)
    dp = next((c for c in result.checks if c.id == "deviceplugin"), None)
    # the deviceplugin check asked anyway when something changed (it then is not skipped)
    asked = opts.plugin_rpc or (dp is not None and dp.status != "skipped")
    hit = gpu_users(runner.ctx, None if asked or not problems else _pod_rows(opts))
    gauges = gpu_gauges(runner.ctx)
    ran = {c.id: c.status for c in result.checks}
    unsure = {ct for ct, ids in CLASS_CHECKS.items()
              if any(ran.get(cid) not in LOOKED.get(cid, ("ok", "skipped")) for cid in ids)}
    return PassResult(started, result.duration_s, result.findings, result.checks,
                      problems_of(result.findings, recent_s, hit), unsure, stuck, provoke,
                      _isolation_cost(result.checks, scan_cpu), gauges,
                      plugin_targets=plugins[-1] if plugins else None, plugin_rpc=asked)


def _pod_rows(opts: ProbeOptions) -> tuple | None:
    """pod-resources' List, asked only to name the pods of a problem a pass without RPCs found
    (grpc is loaded then, and only then)."""
    try:
        path = podresources.socket_path(opts.kubelet_path)
        if not path.is_socket():
            return None
        lst, _ = podresources.query(path, 2.0)
        return tuple(lst.value) if lst.ok else None
    except Exception:  # noqa: BLE001 - naming pods is a courtesy: no names then
        return None


MAX_USERS = podresources.MAX_USERS


def _pci(text: str) -> str | None:
    """`pci 0000:3b:00`, `00000000:3B:00.0` -> `0000:3b:00.0` (podresources.pci_key)."""
    return podresources.pci_key(text)


def gpu_users(ctx, rows: tuple | None = None) -> dict[str, tuple[str, ...]]:
    """{GPU key: ("ns/pod/container", ...)} from the pod-resources and NVML facts
    (podresources.gpu_users, the join the probe's own findings use too). Empty when either
    fact is missing."""
    from node_probe.engine.facts import NVML, PODRESOURCES
    try:
        if rows is None:
            rows = ctx.fact(PODRESOURCES, timeout=0, default=None) or ()
        inv = ctx.fact(NVML, timeout=0, default=None)
    except Exception:  # noqa: BLE001 - a fact that is not there names no pod
        return {}
    return podresources.gpu_users(rows, getattr(inv, "gpus", ()) or ())


MAX_GPUS = 64   # GPUs a pass hands back gauges for (a node has 8; 16 at most today)
GAUGES = ("pcie_gen_cur", "pcie_gen_max", "pcie_width_cur", "pcie_width_max",
          "clocks_event_reasons", "thermal_margin_c", "nvlink_errors", "sbe_volatile")


def gpu_gauges(ctx) -> list[dict]:
    """Per GPU, what the agent's metrics show of a slow GPU (issue 38): PCIe link generation and
    width, current and max; the clock event reasons bitmask; the thermal margin (slowdown
    threshold minus temperature); NVLink error and corrected-ECC totals (for rising). A value
    NVML could not give is None (no sample written). Empty when NVML did not answer."""
    from node_probe.engine.facts import NVML
    try:
        inv = ctx.fact(NVML, timeout=0, default=None)
    except Exception:  # noqa: BLE001 - no inventory, no gauges
        return []
    out = []
    for g in (inv.gpu_records() if inv is not None else [])[:MAX_GPUS]:
        rec = g
        if rec.get("lost"):
            continue
        p, c, t = rec.get("pcie") or {}, rec.get("clocks") or {}, rec.get("temperature") or {}
        temp, slow = t.get("gpu_c"), t.get("slowdown_c")
        nvl = rec.get("nvlink")
        out.append({
            "uuid": str(rec.get("uuid") or "")[:96], "pci_bus_id": str(rec.get("pci_bus_id") or "")[:32],
            "pcie_gen_cur": _n(p.get("gen_cur")), "pcie_gen_max": _n(p.get("gen_max")),
            "pcie_width_cur": _n(p.get("width_cur")), "pcie_width_max": _n(p.get("width_max")),
            "clocks_event_reasons": _n(c.get("event_reasons")),
            "thermal_margin_c": (_n(slow) - _n(temp) if _n(slow) is not None
                                 and _n(temp) is not None else None),
            "nvlink_errors": (None if not nvl else sum(
                int(v) for x in nvl for v in (x.get("errors") or {}).values()
                if isinstance(v, int) and not isinstance(v, bool))),
            "sbe_volatile": _n((rec.get("ecc") or {}).get("sbe_volatile"))})
    return out


DEGRADED = "GpuDoctorGpuDegraded"


def rising(before: list[dict], now: list[dict]) -> list[Problem]:
    """What two passes' gauges say that one cannot: NVLink error counters that rose, corrected
    ECC errors that rose by memory.SBE_RISING or more (counters count since the driver loaded;
    one sample says only that they are non-zero). Matched by GPU UUID; a counter that went
    down (driver reloaded) says nothing."""
    from node_probe.checks.slow.memory import SBE_RISING
    prev = {g.get("uuid"): g for g in before or () if g.get("uuid")}
    out = []
    for g in now or ():
        p = prev.get(g.get("uuid"))
        if p is None:
            continue
        who = f"{g.get('uuid')} ({g.get('pci_bus_id')})"
        a, b = _n(p.get("nvlink_errors")), _n(g.get("nvlink_errors"))
        if a is not None and b is not None and b > a:
            out.append(Problem(DEGRADED, "gpu.nvlink_degraded", "warning", str(g.get("uuid")),
                               f"GPU {who}: NVLink error counters rose by {b - a} since the "
                               "last pass"))
        a, b = _n(p.get("sbe_volatile")), _n(g.get("sbe_volatile"))
        if a is not None and b is not None and b - a >= SBE_RISING:
            out.append(Problem(DEGRADED, "gpu.memory_degrading", "warning", str(g.get("uuid")),
                               f"GPU {who}: corrected ECC errors rose by {b - a} since the "
                               "last pass"))
    return out


def _n(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def users_of(subject: str, hit: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    """The pods on the GPU a finding's subject names (its UUID or PCI id), else ()."""
    return podresources.users_of(subject, hit)


def _isolation_cost(checks: list[CheckResult], reported: list[float]) -> float | None:
    """CPU of the isolation check this pass: what its scan reported (thread CPU); a skip
    before the scan cost next to nothing; a run that timed out or failed without reporting,
    its wall time (its one thread used at most that)."""
    r = next((c for c in checks if c.id == ISOLATION), None)
    if r is None:
        return None
    if reported:
        return sum(reported)
    return 0.0 if r.status in ("ok", "skipped") else r.duration_s

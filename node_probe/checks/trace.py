"""The eBPF trace window: what the kernel sees while the other checks run.

Why: the seed incidents left no log lines; syscalls told the story (an EPERM open of
/dev/nvidia-uvm, a runtime rewriting a container's device rules, a device plugin stuck inside
nvmlInit on a futex). This check attaches the BCC programs from bpf/ for --trace-seconds,
publishes "trace.ready" as soon as they are live (the device-plugin check waits for it before
provoking GetPreferredAllocation), emits live `event` records, and at the end publishes
"trace.results" and yields the findings. It never names a probe: the probes are
tracing.session.LOADERS and their judgement is _trace_verdicts.VERDICTS. Without BCC, headers
or tracefs it says exactly what is missing (probe.ebpf_unavailable) and every other check
still runs.
"""
from __future__ import annotations

import time

from node_probe.engine.facts import (CONTAINERS, DEVICEPLUGIN_TARGETS, KMSG_LOG, TRACE_READY,
                                     TRACE_RESULTS)
from node_probe.engine.context import Skipped
from node_probe.engine.registry import check
from node_probe.protocol import tracefit
from ..tracing import bcc_env
from ..tracing.cgroup_devices import read_devices_list
from . import _trace_verdicts as verdicts
from . import kmsg

TARGETS_WAIT_S = 1.0
CONTAINERS_WAIT_S = 1.0
EVENTS_PER_KIND = 50
IOCTL_STALL_S = 2.0
FUTEX_MIN_S = 0.5
RESULT_KEYS = ("nvml_calls", "futex_waits", "ioctls", "ioctls_inflight", "opens",
               "cgroup_writes", "bpf_attaches")


def _empty_results(reason: str, **extra) -> dict:
    return {"available": False, "reason": reason, **{k: [] for k in RESULT_KEYS}, **extra}


class _Events:
    """Live event records, capped per kind so a busy node cannot flood the stream."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.counts: dict[str, int] = {}
        self.state: dict = {}   # shared by the verdicts' live() of this window

    def emit(self, name: str, subject: str, message: str, **data) -> None:
        n = self.counts.get(name, 0)
        self.counts[name] = n + 1
        if n < EVENTS_PER_KIND:
            self.ctx.event(name, subject, message, **data)

    def __call__(self, program: str, kind: str, r: dict) -> None:
        v = verdicts.VERDICTS.get(program)
        said = v.live(kind, r, self.state) if v is not None else None
        if said is not None:
            self.emit(*said, **r)


def _plugin_targets(ctx, wait_s: float) -> list[dict]:
    targets = ctx.fact(DEVICEPLUGIN_TARGETS, timeout=max(0.0, wait_s), default=())
    return [t.to_dict() for t in targets if t.pid]


@check("trace", title="eBPF: NVIDIA device opens/ioctls, device cgroup rules, futex waits, NVML init",
       timeout_s=10.0, provides=(TRACE_READY, TRACE_RESULTS),
       uses=(DEVICEPLUGIN_TARGETS, CONTAINERS, KMSG_LOG), uses_trace_window=True)
def trace_check(ctx):
    opts = ctx.options
    started = time.monotonic()
    if opts.trace_s <= 0:
        ctx.publish(TRACE_READY, {"available": False, "probes": [], "target_pids": [],
                                    "reason": "disabled"})
        ctx.publish(TRACE_RESULTS, _empty_results("disabled"))
        return
    window_s, fit_note = tracefit.fit(opts.timeout_s, opts.trace_s)
    if window_s <= 0:  # not even a short window fits in --timeout: say so, do not time out
        ctx.publish(TRACE_READY, {"available": False, "probes": [], "target_pids": [],
                                    "reason": fit_note})
        ctx.publish(TRACE_RESULTS, _empty_results("skipped", error=fit_note))
        ctx.skip(fit_note)
    if fit_note:
        ctx.log("info", fit_note, check="trace")
    env = bcc_env.check(opts.host_root, ctx.log)
    if not env.ok:
        ctx.publish(TRACE_READY, {"available": False, "probes": [], "target_pids": [],
                                    "reason": "; ".join(env.missing)})
        ctx.publish(TRACE_RESULTS, _empty_results("unavailable", missing=env.missing))
        yield verdicts.unavailable_finding(env.missing, env.remedies,
                                  {"kernel_release": env.kernel_release, "tracefs": env.tracefs})
        return Skipped("eBPF unavailable: " + "; ".join(env.missing))

    from ..tracing.loader import TraceConfig
    from ..tracing.session import TraceSession  # imports bcc lazily
    events = _Events(ctx)
    cache: dict = {}

    def containers(timeout: float = CONTAINERS_WAIT_S):
        if cache.get("v") is None:   # waited for only when something needs it
            cache["v"] = ctx.fact(CONTAINERS, timeout=timeout, default=None)
        return cache["v"]

    session = None
    probes: list[str] = []
    plugin: list[dict] = []
    try:
        try:
            cfg = TraceConfig(dev_prefix=opts.dev_prefix, cgroup_dir=opts.cgroup_dir,
                              host_root=opts.host_root, futex_min_s=FUTEX_MIN_S)
            session = TraceSession(cfg, tracefs=env.tracefs, targets=opts.trace_pids,
                                   on_event=events)
            session.compile()
            # compiling took most of the second already; still give discovery a moment
            plugin = _plugin_targets(ctx, max(0.25, TARGETS_WAIT_S - (time.monotonic() - started)))
            listed = containers(timeout=0.1)   # GPU containers' libcuda for the CUDA probe
            session.set_targets((t["pid"] for t in plugin),
                                gpu_pids=[p for c in (listed.gpu if listed else ()) for p in c.pids])
            probes = session.attach()
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            ctx.publish(TRACE_READY, {"available": False, "probes": [],
                                        "target_pids": session.targets if session else [],
                                        "reason": reason})
            ctx.publish(TRACE_RESULTS, _empty_results("failed", error=reason))
            yield verdicts.unavailable_finding(
                [f"compiling or attaching the BPF programs failed ({reason})"],
                ["check that the kernel headers match the running kernel's version "
                 "(BCC_KERNEL_SOURCE) and that the probe has CAP_BPF, CAP_PERFMON and "
                 "CAP_SYS_ADMIN"],
                {"kernel_release": env.kernel_release, "kernel_source": env.kernel_source,
                 "kernel_headers": env.headers})
            return Skipped(f"eBPF programs could not be loaded: {reason}")
        ctx.publish(TRACE_READY, {"available": True, "probes": probes,
                                    "target_pids": session.targets})
        said = ({"message": f"eBPF compiled with {env.headers['how']}"}
                if env.headers.get("source") == "bundled" else {})
        ctx.progress(phase="trace", check="trace", probes=probes, target_pids=session.targets,
                     kernel_headers=env.headers, compile_s=session.timings.get("compile_s"),
                     **said,
                     attach_s=session.timings.get("attach_s"))
        window = ctx.budget(window_s, reserve=1.0)
        session.poll(time.monotonic() + window, ctx.cancelled)
        results = session.collect()
        results.update(available=True, probes=probes, target_pids=session.targets,
                       plugin_targets=plugin, bcc=env.to_dict())
        # published before detaching: checks waiting on it should not wait for the kernel
        ctx.publish(TRACE_RESULTS, results)
    finally:
        if session is not None:
            session.close()
    ctx.log("debug", "trace window done", check="trace", timings=results["timings"],
            window_s=results["window_s"], since_start_s=round(time.monotonic() - started, 3))

    def kernel_log():
        # the kmsg check ends by its own deadline (5 s): a storm's read may still be going on
        # when a short trace window ends, and reading the log again here would be a second read
        done = ctx.fact(KMSG_LOG, timeout=ctx.budget(kmsg.KMSG_TIMEOUT_S, reserve=0.5),
                        default=None)
        if done is not None:          # the kmsg check read the log: its Xid lines, not again
            yield from done.get("xid_lines") or ()
            return
        try:
            yield from kmsg.kernel_log(opts)
        except OSError as exc:
            ctx.log("info", f"kernel log not readable for the trace verdicts: {exc.strerror}",
                    check="trace")

    inputs = verdicts.Inputs(results=results, stall_s=IOCTL_STALL_S, targets=session.targets,
                             containers=containers,
                             read_list=lambda rel: read_devices_list(opts.cgroup_dir, rel),
                             event=events.emit, kernel_log=kernel_log)
    for v in verdicts.VERDICTS.values():
        yield from v.findings(inputs)

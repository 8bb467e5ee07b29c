"""The eBPF trace window: what the kernel sees while the other checks run.

Why: the seed incidents left no log lines; syscalls told the story (an EPERM open of
/dev/nvidia-uvm, a runtime rewriting a container's device rules, a device plugin stuck inside
nvmlInit on a futex). This check attaches the BCC programs from bpf/ for --trace-seconds,
publishes "trace.ready" as soon as they are live (the device-plugin check waits for it before
provoking GetPreferredAllocation), emits live `event` records, and at the end publishes
"trace.results" and yields the findings. Without BCC, headers or tracefs it says exactly what
is missing (probe.ebpf_unavailable) and every other check still runs.
"""
from __future__ import annotations

import time

from node_probe.engine.context import FactUnavailable
from node_probe.engine.registry import check
from ..tracing import bcc_env, verdicts
from ..tracing.cgroup_devices import read_devices_list

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
        self.in_nvml: set[tuple[int, int]] = set()   # threads inside an NVML init call

    def emit(self, name: str, subject: str, message: str, **data) -> None:
        n = self.counts.get(name, 0)
        self.counts[name] = n + 1
        if n < EVENTS_PER_KIND:
            self.ctx.event(name, subject, message, **data)

    def __call__(self, program: str, kind: str, r: dict) -> None:
        who = f"pid {r.get('pid')} ({r.get('comm', '')})"
        if program == "nvidia_dev" and kind == "open" and r["errno"] == 1:
            self.emit("nvidia.open_denied", who, f"open({r['path']}) = EPERM", **r)
        elif program == "nvidia_dev" and kind == "slow_ioctl":
            self.emit("ioctl.slow", who,
                      f"ioctl {r['request_hex']} on {r['path']} took {r['duration_s']:.2f}s", **r)
        elif program == "cgroup_devices" and kind == "write":
            self.emit("cgroup.device_rule_write", who,
                      f"wrote {r['text']!r} to {r['path'] or 'devices.' + r['which']}"
                      + (f" ({r['errno_name']})" if r.get("errno") else ""), **r)
        elif program == "cgroup_devices" and kind == "bpf_attach":
            self.emit("cgroup.device_prog_attach", who,
                      f"{r['cmd']} BPF_CGROUP_DEVICE on {r['cgroup'] or 'fd ' + str(r['target_fd'])}",
                      **r)
        elif program == "futex_wait" and kind == "long_wait":
            # Idle runtime threads (Go's) sleep in futex all the time: live only when the
            # thread is inside an NVML call; every long wait is in trace.results anyway.
            if (r["pid"], r["tid"]) in self.in_nvml:
                self.emit("futex.long_wait", f"{who} tid {r['tid']}",
                          f"futex wait of {r['wait_s']:.2f}s inside an NVML call", **r)
        elif program == "nvml_calls" and kind == "entered":
            self.in_nvml.add((r["pid"], r["tid"]))
            self.emit("nvml.entered", f"{who} tid {r['tid']}", f"entered {r['func']}", **r)
        elif program == "nvml_calls" and kind == "returned":
            self.in_nvml.discard((r["pid"], r["tid"]))
            self.emit("nvml.returned", f"{who} tid {r['tid']}",
                      f"{r['func']} returned {r['ret']} after {r['duration_s']:.3f}s", **r)


def _plugin_targets(ctx, wait_s: float) -> list[dict]:
    try:
        value = ctx.wait_for("deviceplugin.targets", timeout=max(0.0, wait_s))
    except FactUnavailable:
        return []
    return [t for t in (value or []) if isinstance(t, dict) and t.get("pid")]


@check("trace", title="eBPF: NVIDIA device opens/ioctls, device cgroup rules, futex waits, NVML init",
       timeout_s=10.0, provides=("trace.ready", "trace.results"), uses_trace_window=True)
def trace_check(ctx):
    opts = ctx.options
    started = time.monotonic()
    if opts.trace_s <= 0:
        ctx.publish("trace.ready", {"available": False, "probes": [], "target_pids": [],
                                    "reason": "disabled"})
        ctx.publish("trace.results", _empty_results("disabled"))
        return
    env = bcc_env.check(opts.host_root, ctx.log)
    if not env.ok:
        ctx.publish("trace.ready", {"available": False, "probes": [], "target_pids": [],
                                    "reason": "; ".join(env.missing)})
        ctx.publish("trace.results", _empty_results("unavailable", missing=env.missing))
        yield verdicts.unavailable_finding(env.missing, env.remedies,
                                           {"kernel_release": env.kernel_release,
                                            "tracefs": env.tracefs})
        return

    from ..tracing.session import TraceSession  # imports bcc lazily
    events = _Events(ctx)
    session = None
    probes: list[str] = []
    plugin: list[dict] = []
    try:
        try:
            session = TraceSession(dev_prefix=opts.dev_prefix, cgroup_dir=opts.cgroup_dir,
                                   tracefs=env.tracefs, targets=opts.trace_pids,
                                   futex_min_s=FUTEX_MIN_S,
                                   on_event=events)
            session.compile()
            # compiling took most of the second already; still give discovery a moment
            plugin = _plugin_targets(ctx, max(0.25, TARGETS_WAIT_S - (time.monotonic() - started)))
            session.set_targets(t["pid"] for t in plugin)
            probes = session.attach()
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            ctx.publish("trace.ready", {"available": False, "probes": [],
                                        "target_pids": session.targets if session else [],
                                        "reason": reason})
            ctx.publish("trace.results", _empty_results("failed", error=reason))
            yield verdicts.unavailable_finding(
                [f"compiling or attaching the BPF programs failed ({reason})"],
                ["check that the kernel headers match the running kernel's version "
                 "(BCC_KERNEL_SOURCE) and that the probe has CAP_BPF, CAP_PERFMON and "
                 "CAP_SYS_ADMIN"],
                {"kernel_release": env.kernel_release, "kernel_source": env.kernel_source})
            return
        ctx.publish("trace.ready", {"available": True, "probes": probes,
                                    "target_pids": session.targets})
        ctx.progress(phase="trace", check="trace", probes=probes, target_pids=session.targets,
                     compile_s=session.timings.get("compile_s"),
                     attach_s=session.timings.get("attach_s"))
        window = ctx.budget(opts.trace_s, reserve=1.0)
        session.poll(time.monotonic() + window, ctx.cancelled)
        results = session.collect()
        results.update(available=True, probes=probes, target_pids=session.targets,
                       plugin_targets=plugin, bcc=env.to_dict())
        # published before detaching: checks waiting on it should not wait for the kernel
        ctx.publish("trace.results", results)
    finally:
        if session is not None:
            session.close()

    for c in results["nvml_calls"]:
        if not c["returned"]:
            futex = (f", thread asleep in futex() for {c['futex_wait_s']:.2f}s"
                     if "futex_wait_s" in c else "")
            events.emit("nvml.call_blocked", f"pid {c['pid']} ({c['comm']}) tid {c['tid']}",
                        f"{c['func']} entered {c['duration_s']:.2f}s ago and has not returned"
                        + futex, **c)
    ctx.log("debug", "trace window done", check="trace", timings=results["timings"],
            window_s=results["window_s"], since_start_s=round(time.monotonic() - started, 3))

    containers = None
    if results["cgroup_writes"] or any(o.get("errno") == 1 for o in results["opens"]):
        try:  # only then does the container list matter
            containers = ctx.wait_for("containers", timeout=CONTAINERS_WAIT_S)
        except FactUnavailable:
            pass
    stall_s = IOCTL_STALL_S
    yield from verdicts.eperm_findings(results["opens"], containers)
    yield from verdicts.stall_findings(results["ioctls_inflight"], results["ioctls"], stall_s,
                                       critical_pids=session.targets)
    yield from verdicts.rewrite_findings(
        results["cgroup_writes"], results["cgroup_devices"]["gpu_cgroups_at_attach"], containers,
        lambda rel: read_devices_list(opts.cgroup_dir, rel))

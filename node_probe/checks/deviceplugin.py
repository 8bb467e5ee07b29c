"""Device plugins: provoke each one the way the kubelet does, with deadlines, and watch it.

Why (seed 000): a plugin whose GetPreferredAllocation never returns wedges the kubelet's pod
admission for the whole node, and nothing is logged anywhere. On the node this is provable in
seconds: find the plugin's socket and process, publish its pid (the eBPF `trace` check attaches
uprobes on nvmlInit* and watches futex waits and /dev/nvidia* ioctls of that pid), call the
read-only RPCs with deadlines, and when one does not answer, join the evidence: which RPC, which
thread entered nvmlInit and never came back (from eBPF, or from the /proc stack scan of
node_probe.host.proctasks when eBPF is unavailable or the thread was stuck before we came), what it
waits on, the driver version and the known-bad driver match, and which pods hold the devices.
Also: plugins missing on a GPU node, unhealthy devices, and a plugin /dev that lacks nodes the
host has (seed 002). Publishes "deviceplugin.targets" and "podresources".
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

from node_probe.protocol import catalog
from node_probe.host import kubeletconfig, proctasks
from node_probe.engine.facts import (DEVICEPLUGIN_TARGETS, KMSG_XIDS, NVML, PODRESOURCES,
                                     TRACE_READY, TRACE_RESULTS, PluginTargetInfo)
from ..deviceplugin import discovery, podresources, rpc, sharing
from node_probe.engine.context import Skipped
from node_probe.engine.registry import check
from ._deviceplugin_findings import (_blocked, _checkpoint_mismatch, _inventory, _missing,
                                     _stale_dev, _timeouts, _unhealthy, merge_per_process)

OPTIONS_DEADLINE_S = 2.0
LIST_DEADLINE_S = 3.0
GPA_DEADLINE_S = 5.0
PODRES_DEADLINE_S = 3.0
CONFIRM_S = 1.0  # second /proc sample of a thread seen inside nvmlInit, without RPC timeout
TRACE_READY_WAIT_S = 10.0  # BCC compiles+attaches in ~1.1-1.5 s here; a loaded node can take 3-4x

class _PluginProbe:
    """Everything learned about one plugin socket."""

    def __init__(self, target: discovery.PluginTarget) -> None:
        self.t = target
        self.outcomes: list[rpc.RpcOutcome] = []
        self.devices: list[dict] | None = None
        self.options: dict | None = None
        self.gpa_skipped: str | None = None
        self.after: list[proctasks.ThreadView] | None = None  # /proc view after a timeout
        self.after_at: float | None = None
        self.error: str | None = None

    @property
    def timeouts(self) -> list[rpc.RpcOutcome]:
        return [o for o in self.outcomes if o.status == "timeout"]

    @property
    def unreachable(self) -> bool:
        return bool(self.outcomes) and self.outcomes[0].status == "unavailable"


def _probe_plugin(ctx, p: _PluginProbe) -> None:
    try:
        client = rpc.PluginClient(p.t.socket)
    except Exception as exc:  # grpc missing is handled before; anything else is reported
        p.error = f"{type(exc).__name__}: {exc}"
        return
    with client:
        o = client.options(ctx.budget(OPTIONS_DEADLINE_S, reserve=2.0))
        p.outcomes.append(o)
        if o.status == "unavailable":
            return
        p.options = o.value
        lw = client.first_list(ctx.budget(LIST_DEADLINE_S, reserve=2.0))
        p.outcomes.append(lw)
        if lw.ok:
            p.devices = lw.value
        if not (o.ok and o.value.get("get_preferred_allocation_available")):
            p.gpa_skipped = ("the plugin does not offer GetPreferredAllocation" if o.ok
                             else "GetDevicePluginOptions did not answer")
        elif not lw.ok:
            p.gpa_skipped = "no device list to build a request from"
        elif not ctx.options.provoke_plugin:
            p.gpa_skipped = ("not provoked in this watch pass (only after a cheaper signal "
                             "points at the plugin)")
        else:
            req = rpc.plausible_request(p.devices or [])
            if req is None:
                p.gpa_skipped = "no healthy device to build a request from"
            else:
                available, size = req
                ctx.progress(message=f"GetPreferredAllocation on {Path(p.t.socket).name} "
                                     f"({len(available)} available, size {size})")
                g = client.preferred_allocation(available, size,
                                                ctx.budget(GPA_DEADLINE_S, reserve=2.0))
                p.outcomes.append(g)
    if p.timeouts and p.t.pid:
        p.after = proctasks.process_threads(p.t.pid, ctx.options.proc_root)
        p.after_at = time.monotonic()


def _podresources(ctx, kubelet_dir: Path, state: dict) -> None:
    path = podresources.socket_path(kubelet_dir)
    try:
        if not path.is_socket():
            state["rows"] = []
            state["note"] = f"{path} not found"
            ctx.publish(PODRESOURCES, ())
            return
        lst, alloc = podresources.query(path, ctx.budget(PODRES_DEADLINE_S, reserve=2.0))
    except Exception as exc:
        state["note"] = f"{type(exc).__name__}: {exc}"
        ctx.facts.fail(PODRESOURCES, state["note"])
        return
    state["list"], state["allocatable"] = lst, alloc
    if lst.ok:
        state["rows"] = lst.value
        ctx.publish(PODRESOURCES, tuple(lst.value))
    else:
        state["note"] = f"List {lst.status}: {lst.detail}"
        ctx.facts.fail(PODRESOURCES, state["note"])


def _kubelet_down(kdir: Path, here: dict, targets):
    live = [t for t in targets if t.pid]
    return catalog.make(
        "kubelet.down", "critical", "node",
        f"The kubelet is not running: {len(live)} device plugin(s) serve their sockets in "
        f"{kdir / 'device-plugins'} but no kubelet serves "
        + "device-plugins/kubelet.sock (absent) and no kubelet process runs; no pod on this "
        "node can start or stop until it is back",
        {"kubelet_dir": str(kdir), "kubelet_sock": here.get("kubelet_sock"),
         "kubelet_pids": here.get("kubelet_pids"),
         "plugins": [{"socket": t.socket, "pid": t.pid, "comm": t.comm} for t in live]},
        "Find why the kubelet stopped and start it: `systemctl status kubelet` and "
        "`journalctl -u kubelet -n 200` (k3s/RKE2: the k3s/rke2 service; microk8s: "
        "snap.microk8s.daemon-kubelite; k0s: k0sworker), then restart it. The device plugins "
        "re-register when kubelet.sock comes back.",
        ("https://kubernetes.io/docs/tasks/debug/debug-cluster/#looking-at-logs",))


@check("deviceplugin", title="Device plugins: sockets, processes, RPCs with deadlines, /dev view",
       timeout_s=16.0, provides=(DEVICEPLUGIN_TARGETS, PODRESOURCES),
       uses=(TRACE_READY, TRACE_RESULTS, NVML, KMSG_XIDS), uses_trace_window=True)
def deviceplugin_check(ctx):
    opts = ctx.options
    kdir = opts.kubelet_path
    proc = opts.proc_root
    t0 = time.monotonic()
    here = kubeletconfig.presence(kdir, proc, opts.host_root)
    targets = discovery.discover(kdir, proc)
    if not here["kubelet"] and not any(t.pid for t in targets):
        # No kubelet, no device plugins to serve it: a missing plugin is not a fault here.
        yield catalog.make(
            "node.not_kubernetes", "info", "node",
            "Not a Kubernetes node: no kubelet socket and no kubelet process; the "
            "kubelet-facing checks were skipped", here,
            "Nothing to do on a host that is not a node. If it should be one, start the "
            "kubelet; if its root directory is not /var/lib/kubelet, pass --kubelet-dir.",
            ("https://kubernetes.io/docs/reference/command-line-tools-reference/kubelet/",))
        ctx.skip(f"not a Kubernetes node: no {kdir}/device-plugins/kubelet.sock and no "
                 f"kubelet process")
    if not here["kubelet"]:
        # a plugin serves its socket, no kubelet socket or process: provoke the plugin anyway
        yield _kubelet_down(kdir, here, targets)
    ctx.publish(DEVICEPLUGIN_TARGETS, tuple(PluginTargetInfo.of(t) for t in targets))
    ctx.progress(message=f"{len(targets)} device plugin socket(s) in {kdir / 'device-plugins'}",
                 discovery_s=round(time.monotonic() - t0, 3))
    live = [t for t in targets if t.pid]
    baseline = {t.pid: proctasks.process_threads(t.pid, proc) for t in live}
    baseline_at = time.monotonic()
    seen = targets_seen(targets)
    ctx.progress(plugin_targets=list(seen))  # the watch's next pass compares with these
    if not (opts.plugin_rpc or seen != tuple(opts.plugin_targets_seen)
            or any(tv.nvml_init for tvs in baseline.values() for tv in tvs)):
        # a quiet watch pass: the same plugins as when last asked, none in nvmlInit; no gRPC
        # loaded (~80 ms of CPU a pass: bench/watch_pass_cost.py), what /proc shows still read
        ctx.facts.fail(PODRESOURCES, "not asked in this watch pass (nothing changed)")
        for t in targets:
            if t.pid:
                yield from _stale_dev(ctx, _PluginProbe(t))
        return Skipped("device plugins unchanged since they were last asked: RPCs not due")

    try:
        rpc.load_grpc()
        grpc_error = None
    except Exception as exc:  # ImportError, or a gencode/runtime version guard
        grpc_error = f"{type(exc).__name__}: {exc}"
    pr_state: dict = {}
    pr_thread = None
    if grpc_error is None:
        pr_thread = threading.Thread(target=_podresources, args=(ctx, kdir, pr_state),
                                     name="podresources", daemon=True)
        pr_thread.start()
    else:
        ctx.facts.fail(PODRESOURCES, f"grpcio unavailable: {grpc_error}")
        yield catalog.make(
            "deviceplugin.inventory", "info", "node",
            "Device-plugin RPC checks skipped: they need grpcio (and protobuf) in the probe",
            {"error": grpc_error, "sockets": [t.socket for t in targets],
             "targets": [t.fact() for t in targets]},
            "Install the versions pyproject.toml names (pip install 'grpcio>=1.85.1' "
            "'protobuf>=7.35.1'); the probe image ships them.")

    trace_ready, trace_note = None, None
    if grpc_error is None and live and opts.trace_s > 0:
        trace_ready = ctx.fact(TRACE_READY, timeout=max(0.05, ctx.budget(TRACE_READY_WAIT_S,
                                                                         reserve=8.0)),
                               default=None)
        trace_note = ctx.facts.why(TRACE_READY) if trace_ready is None else None

    probes = [_PluginProbe(t) for t in targets]
    if grpc_error is None:
        threads = [threading.Thread(target=_probe_plugin, args=(ctx, p), daemon=True,
                                    name=f"dp:{Path(p.t.socket).name}") for p in probes]
        for th in threads:
            th.start()
        end = time.monotonic() + ctx.budget(OPTIONS_DEADLINE_S + LIST_DEADLINE_S
                                            + GPA_DEADLINE_S + 1.0, reserve=1.0)
        for th in threads:
            th.join(max(0.0, end - time.monotonic()))
    if pr_thread is not None:
        pr_thread.join(ctx.budget(2 * PODRES_DEADLINE_S, reserve=1.0))
    rows = pr_state.get("rows") or []
    allocatable = pr_state.get("allocatable")
    ckpt = discovery.read_checkpoint(kdir)
    for p in probes:
        ids = [d["id"] for d in p.devices or ()]
        if allocatable is not None and allocatable.ok and allocatable.value:
            discovery.refine_resource(p.t, ids, allocatable.value, "pod-resources")
        elif ckpt.get("registered"):
            discovery.refine_resource(p.t, ids, ckpt["registered"], "kubelet-checkpoint")

    trace, trace_res_note = None, None
    any_timeout = any(p.timeouts for p in probes)
    blocked_before = {pid: [tv for tv in tvs if tv.nvml_init] for pid, tvs in baseline.items()}
    # A thread seen inside nvmlInit once may just be initialising; without an RPC timeout to
    # confirm it, look again at least CONFIRM_S later (paid only when such a thread exists).
    for p in probes:
        if p.after is None and blocked_before.get(p.t.pid):
            wait = CONFIRM_S - (time.monotonic() - baseline_at)
            if wait > 0:
                time.sleep(min(wait, ctx.budget(wait, reserve=1.5)))
            p.after = proctasks.process_threads(p.t.pid, proc)
            p.after_at = time.monotonic()
    if (any_timeout or any(blocked_before.values())) and opts.trace_s > 0 and trace_ready \
            and trace_ready.get("available"):
        trace = ctx.fact(TRACE_RESULTS, timeout=max(0.05, ctx.budget(opts.trace_s + 2.0,
                                                                     reserve=1.5)),
                         default=None)
        trace_res_note = ctx.facts.why(TRACE_RESULTS) if trace is None else None
    elif trace_ready is not None and not trace_ready.get("available"):
        trace_res_note = "eBPF tracing unavailable"
    else:
        trace_res_note = trace_note

    nv = None
    unhealthy = any(d.get("health") != "Healthy" for p in probes for d in p.devices or ())
    need_driver = any_timeout or any(blocked_before.values()) or unhealthy
    if need_driver or (targets or (kdir / "device-plugins").is_dir()):
        nv = ctx.fact(NVML, timeout=max(0.05, ctx.budget(4.0 if need_driver else 1.0,
                                                         reserve=1.0)), default=None)
    xid_groups = ctx.fact(KMSG_XIDS, timeout=max(0.05, ctx.budget(2.0, reserve=1.0)),
                          default=None) if unhealthy else None

    all_devices = [d for p in probes for d in p.devices or ()]
    per_process: list = []  # one plugin process serving several resources: one finding each
    for p in probes:
        yield _inventory(p, rows, ckpt, baseline.get(p.t.pid))
        per_process += _timeouts(p, rows)
        per_process += _blocked(ctx, p, baseline.get(p.t.pid) or [], baseline_at, trace,
                                trace_res_note, nv, rows, all_devices)
    yield from merge_per_process(per_process)
    for p in probes:
        yield from _unhealthy(p, rows, nv, xid_groups)
        yield from _checkpoint_mismatch(p, ckpt, kdir, proc)
        if p.t.pid:
            yield from _stale_dev(ctx, p)
            if p.devices is not None and (p.t.resource or "").startswith("nvidia.com/"):
                yield from sharing.judge(p.t.resource, [d["id"] for d in p.devices], p.t.pid,
                                         proc)
    yield from _missing(ctx, kdir, targets, probes, nv)
    if grpc_error is not None and targets:
        return Skipped(f"the device plugins' RPCs were not asked: grpcio unavailable in the "
                       f"probe ({grpc_error})")


def targets_seen(targets) -> tuple[str, ...]:
    """What identifies the plugins found (socket, serving pid, resource): a change asks them."""
    return tuple(sorted(f"{t.socket}|{t.pid}|{t.resource}" for t in targets))[:64]

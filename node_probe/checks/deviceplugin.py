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
from node_probe.protocol import known_drivers
from node_probe.engine.facts import (DEVICEPLUGIN_TARGETS, KMSG_XIDS, NVML, PODRESOURCES,
                                     TRACE_READY, TRACE_RESULTS, NvmlInventory, PluginTargetInfo)
from ..deviceplugin import devview, discovery, podresources, rpc, sharing, stale_health
from node_probe.engine.context import Skipped
from node_probe.engine.registry import check
from .nvml import kernel_module_version

OPTIONS_DEADLINE_S = 2.0
LIST_DEADLINE_S = 3.0
GPA_DEADLINE_S = 5.0
PODRES_DEADLINE_S = 3.0
CONFIRM_S = 1.0  # second /proc sample of a thread seen inside nvmlInit, without RPC timeout
TRACE_READY_WAIT_S = 10.0  # BCC compiles+attaches in ~1.1-1.5 s here; a loaded node can take 3-4x

K8S_REFS = ("https://github.com/kubernetes/kubernetes/issues/117435",
            "https://github.com/kubernetes/kubernetes/issues/130855")
DP_DOC = "https://kubernetes.io/docs/concepts/extend-kubernetes/compute-storage-net/device-plugins/"


def _is_nvidia(t: discovery.PluginTarget, devices: list[dict] | None = None) -> bool:
    if t.resource and t.resource.startswith("nvidia.com/"):
        return True
    if "nvidia" in (t.comm or "").lower():
        return True
    return any(str(d.get("id", "")).startswith(("GPU-", "MIG-")) for d in devices or ())


def _subject(t: discovery.PluginTarget) -> str:
    name = t.resource or Path(t.socket).name
    return f"{name} plugin (pid {t.pid})" if t.pid else f"{name} plugin socket"


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


def _gpus_on_host(root: Path) -> list[str]:
    """GPUs the host shows without NVML: proc/driver/nvidia/gpus/* or dev/nvidia<N>."""
    out = []
    gdir = root / "proc/driver/nvidia/gpus"
    try:
        out = [f"pci {n}" for n in sorted(p.name for p in gdir.iterdir())]
    except OSError:
        pass
    if not out:
        try:
            out = sorted(f"/dev/{p.name}" for p in (root / "dev").iterdir()
                         if p.name.startswith("nvidia") and p.name[6:].isdigit())
        except OSError:
            pass
    return out


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


MERGED_IDS = ("deviceplugin.blocked_in_nvml", "deviceplugin.rpc_timeout")
MAX_NAMED = 3  # resources named in a merged finding's title before "+N more"


def merge_per_process(findings: list) -> list:
    """One finding per plugin process and cause: NVIDIA's plugin with the mixed MIG strategy
    serves nvidia.com/gpu and every MIG profile from ONE process (a socket each), so a thread
    stuck in nvmlInit showed as four blocked_in_nvml findings -- and four rpc_timeouts -- for
    one cause. Findings of MERGED_IDS with the same id, pid (and RPC) become one, the first
    resource's, whose evidence keeps `resource` (the first) and adds `resources` and
    `sockets` (all, in order), the pods holding any of their devices, and whose title names
    the resources. Others pass through unchanged."""
    import dataclasses

    groups: dict[tuple, list] = {}
    out: list = []
    for f in findings:
        pid = f.evidence.get("pid")
        if f.id not in MERGED_IDS or not pid:
            out.append(f)
            continue
        key = (f.id, pid, f.evidence.get("rpc"))
        if key not in groups:
            groups[key] = []
            out.append(key)
        groups[key].append(f)
    merged = []
    for item in out:
        if not isinstance(item, tuple):
            merged.append(item)
            continue
        group = sorted(groups[item], key=lambda f: (f.evidence.get("resource") != "nvidia.com/gpu",
                                                    str(f.evidence.get("resource") or "")))
        first = group[0]
        if len(group) == 1:
            merged.append(first)
            continue
        resources = [str(f.evidence.get("resource") or Path(str(f.evidence.get("socket"))).name)
                     for f in group]
        holders, seen = [], set()
        for f in group:
            for h in f.evidence.get("pods_holding_devices") or ():
                k = repr(sorted(h.items())) if isinstance(h, dict) else repr(h)
                if k not in seen:
                    seen.add(k)
                    holders.append(h)
        ev = dict(first.evidence, resources=resources,
                  sockets=[f.evidence.get("socket") for f in group],
                  pods_holding_devices=holders)
        named = ", ".join(resources[:MAX_NAMED]) + (
            f" (+{len(resources) - MAX_NAMED} more)" if len(resources) > MAX_NAMED else "")
        if first.id == "deviceplugin.rpc_timeout":
            title = (f"{ev['rpc']} on {named} (one plugin process, pid {item[1]}) did not "
                     f"answer within {float(ev.get('deadline_s') or 0):.1f} s")
        else:
            title = f"{first.title}; the same process serves {named}"
        subject = f"{resources[0]} plugin (pid {item[1]}, {len(resources)} resources)"
        merged.append(dataclasses.replace(first, title=title, evidence=ev, subject=subject))
    return merged


def _holders(p: _PluginProbe, rows: list[dict], ckpt: dict | None = None) -> list[dict]:
    ids = [d["id"] for d in p.devices or ()]
    held = podresources.holders(rows, ids, p.t.resource) if (ids or p.t.resource) else []
    if not held and ckpt:
        held = [a for a in ckpt.get("allocations", ())
                if (p.t.resource and a.get("resource") == p.t.resource)
                or set(a.get("device_ids") or ()) & set(ids)]
    return held


def _inventory(p: _PluginProbe, rows, ckpt, before):
    t = p.t
    devs = p.devices or []
    ev = {"socket": t.socket, "pid": t.pid, "comm": t.comm, "resource": t.resource,
          "resource_source": t.resource_source, "pod_uid": t.pod_uid,
          "container_id": t.container_id, "socket_path_in_process": t.socket_path_in_process,
          "process_match": t.match, "options": p.options,
          "devices_total": len(devs),
          "devices_healthy": sum(1 for d in devs if d.get("health") == "Healthy"),
          "devices": devs[:64], "rpcs": [o.to_dict() for o in p.outcomes],
          "pods_holding_devices": _holders(p, rows, ckpt)}
    if p.gpa_skipped:
        ev["get_preferred_allocation"] = f"not called: {p.gpa_skipped}"
    if p.error:
        ev["error"] = p.error
    if t.nvml_library:
        ev["nvml_library"] = t.nvml_library
    if before:
        ev["threads"] = len(before)
    if p.unreachable:
        title = f"{Path(t.socket).name}: socket present but nothing answers on it"
    elif t.pid is None and not p.outcomes:
        title = f"{Path(t.socket).name}: no process found serving it"
    elif not p.outcomes:
        title = f"{t.resource or Path(t.socket).name}: pid {t.pid} ({t.comm}); RPCs not called"
    else:
        title = (f"{t.resource or Path(t.socket).name}: pid {t.pid} ({t.comm}), "
                 f"{ev['devices_healthy']}/{len(devs)} device(s) healthy")
    return catalog.make("deviceplugin.inventory", "info", _subject(t), title, ev)


def _timeouts(p: _PluginProbe, rows):
    for o in p.timeouts:
        ev = {"rpc": o.rpc, "deadline_s": round(o.deadline_s, 2),
              "waited_s": round(o.duration_s, 2), "socket": p.t.socket, "pid": p.t.pid,
              "comm": p.t.comm, "resource": p.t.resource, "pod_uid": p.t.pod_uid,
              "pods_holding_devices": _holders(p, rows)}
        why = ("The kubelet calls it with no timeout while admitting each pod, so every pod "
               "admission on this node (GPU or not) waits behind it: pods stay Pending with "
               "only a Scheduled event and deletions hang in Terminating."
               if o.rpc == "GetPreferredAllocation" else
               "The kubelet waits on this call to learn the plugin's devices; until it "
               "answers, the node's GPU capacity and pod admission are stale.")
        yield catalog.make(
            "deviceplugin.rpc_timeout", "critical", _subject(p.t),
            f"{o.rpc} on {p.t.resource or Path(p.t.socket).name} did not answer within "
            f"{o.deadline_s:.1f} s",
            ev,
            f"{why} See deviceplugin.blocked_in_nvml for where the plugin is stuck. Stopgap "
            "(a human decides; it interrupts allocations in progress): restart the device "
            "plugin pod, e.g. `kubectl -n <plugin namespace> delete pod <plugin pod>`, then "
            "restart kubelet if pods stay Pending (`systemctl restart kubelet`). Kubelet has "
            "no timeout on this call (k/k #117435, #130855).",
            K8S_REFS + (DP_DOC,))


def _driver(ctx, nv: NvmlInventory | None) -> tuple[str | None, list[dict], str]:
    if nv is not None and nv.version:
        return nv.version, nv.gpu_records(), f"nvml fact ({nv.status})"
    v = kernel_module_version(ctx.options.host_root)
    return v, [], "proc/driver/nvidia/version" if v else "unknown"


def _mig_hint(devices: list[dict]) -> list[dict]:
    """A stand-in GPU list for the known-bad match when NVML gave none: MIG-* and GPU-* device
    ids served side by side mean MIG slices next to full GPUs."""
    ids = [str(d.get("id", "")) for d in devices]
    has_mig = any(i.startswith("MIG-") for i in ids)
    has_full = any(i.startswith("GPU-") for i in ids)
    if has_mig and has_full:
        return [{"mig_mode": True, "source": "plugin device ids"},
                {"mig_mode": False, "source": "plugin device ids"}]
    return []


def _blocked(ctx, p: _PluginProbe, before: list[proctasks.ThreadView], before_at: float,
             trace, trace_note, nv, rows, all_devices):
    t = p.t
    if not t.pid:
        return
    pid = t.pid
    threads: dict[int, dict] = {}
    before_tids = {tv.tid for tv in before if tv.nvml_init}
    traced = False
    if trace:
        traced = True
        futex = {w.get("tid"): w for w in trace.get("futex_waits") or ()
                 if w.get("pid") == pid and w.get("in_progress")}
        ioctl = {i.get("tid"): i for i in trace.get("ioctls_inflight") or ()
                 if i.get("pid") == pid}
        for c in trace.get("nvml_calls") or ():
            if c.get("pid") != pid or c.get("returned"):
                continue
            tid = c.get("tid")
            th = threads.setdefault(tid, {"tid": tid, "sources": []})
            th.setdefault("func", c.get("func"))
            th["sources"].append("ebpf uprobe")
            th["in_call_s"] = c.get("duration_s")
            if tid in ioctl:
                th["waits_on"] = f"an ioctl on {ioctl[tid].get('path') or 'fd %s' % ioctl[tid].get('fd')}"
                th["wait_s"] = ioctl[tid].get("wait_s")
            elif tid in futex:
                th["waits_on"] = "a futex"
                th["wait_s"] = futex[tid].get("wait_s")
                if futex[tid].get("stack"):
                    th["stack"] = futex[tid]["stack"][:12]
    view = p.after or []
    confirmed_by_rpc = bool(p.timeouts)
    for tv in view:
        if not tv.nvml_init:
            continue
        if not confirmed_by_rpc and tv.tid not in before_tids:
            continue  # seen once only: may be a normal, short init
        th = threads.setdefault(tv.tid, {"tid": tv.tid, "sources": []})
        th.setdefault("func", tv.nvml_init)
        th["sources"].append("stack scan")
        th.setdefault("waits_on", tv.waits_on)
        th["proc"] = tv.to_dict()
    seen_apart = round(p.after_at - before_at, 2) if p.after_at else None
    for tid, th in threads.items():
        th["blocked_before_probe"] = tid in before_tids
        if tid in before_tids and "stack scan" in th["sources"] and seen_apart:
            th["seen_inside_for_s"] = seen_apart  # at least this long (two /proc samples)
        if "proc" not in th:
            tv = next((x for x in view if x.tid == tid), None)
            if tv is not None:
                th["proc"] = tv.to_dict()
                th.setdefault("waits_on", tv.waits_on)
    if not threads:
        return
    gpa = next((o for o in p.timeouts if o.rpc == "GetPreferredAllocation"), None)
    first = sorted(threads.values(), key=lambda x: (not x["blocked_before_probe"], x["tid"]))
    main = next((x for x in first if not x["blocked_before_probe"] and gpa), first[0])
    func = main.get("func") or "nvmlInit"
    waits = main.get("waits_on") or "something the probe could not see"
    head = (f"{gpa.rpc} did not answer in {round(gpa.deadline_s, 1):g} s; " if gpa else "")
    verb = "entered" if gpa or "ebpf uprobe" in main["sources"] else "is inside"
    more = f" (and {len(threads) - 1} more thread(s))" if len(threads) > 1 else ""
    title = (f"{head}thread {main['tid']} of pid {pid} ({t.comm}) {verb} {func} and has not "
             f"returned; it waits on {waits}{more}")
    version, gpus, vsource = _driver(ctx, nv)
    gpus_for_match = gpus or _mig_hint(all_devices)
    matches = known_drivers.match(version, gpus_for_match)
    ev = {"pid": pid, "comm": t.comm, "resource": t.resource, "socket": t.socket,
          "pod_uid": t.pod_uid, "threads": sorted(threads.values(), key=lambda x: x["tid"]),
          "blocked_tids": sorted(threads), "nvml_library": t.nvml_library,
          "rpc_timeout": gpa.to_dict() if gpa else None,
          "ebpf": "used" if traced else f"not used: {trace_note or 'no trace results'}",
          "driver_version": version, "driver_version_source": vsource,
          "known_bad_driver": [{"driver_version": m.driver_version,
                                "trigger": m.issue.condition_text,
                                "trigger_present": m.condition_met,
                                "fixed_in": list(m.issue.fixed_in)} for m in matches],
          "pods_holding_devices": _holders(p, rows)}
    fix = ("The plugin is stuck inside the NVIDIA driver library, so every pod admission on this "
           "node waits (the kubelet calls GetPreferredAllocation with no timeout). ")
    refs = list(K8S_REFS)
    if matches:
        m = matches[0]
        fix += (f"Driver {m.driver_version} is a known-bad build "
                f"({m.issue.condition_text}); {m.issue.workaround}. ")
        refs = list(m.issue.refs) + [r for r in refs if r not in m.issue.refs]
    else:
        fix += ("Check nvml.init_hang and driver.known_bad; `nvidia-smi` on the node will "
                "hang the same way if the driver is at fault. ")
    fix += ("Stopgap (a human decides): restart the device plugin pod and then kubelet; the "
            "hang returns on the next allocation until the cause is fixed.")
    yield catalog.make("deviceplugin.blocked_in_nvml", "critical", _subject(t), title, ev, fix,
                       tuple(refs))


def _unhealthy(p: _PluginProbe, rows, nv, xid_groups):
    devs = p.devices or []
    bad = [d for d in devs if d.get("health") != "Healthy"]
    if not bad:
        return
    verdicts = stale_health.classify(bad, nv.to_dict() if nv is not None else None, xid_groups)
    stale_ids = {v["id"] for v in verdicts if v["verdict"] == "stale"}
    sick = [d for d in bad if d["id"] not in stale_ids]
    stale = [d for d in bad if d["id"] in stale_ids]
    base = {"devices_total": len(devs), "pid": p.t.pid, "comm": p.t.comm,
            "resource": p.t.resource, "socket": p.t.socket}
    if stale:
        yield catalog.make(
            "deviceplugin.unhealthy_stale", "warning", _subject(p.t),
            f"{len(stale)} of {len(devs)} device(s) of the {p.t.resource or Path(p.t.socket).name} "
            "plugin are still reported Unhealthy, but NVML reports their GPUs fine now and the "
            "kernel log has no Xid that needs a reset: the plugin never re-checks them",
            {**base, "unhealthy": stale,
             "verdicts": [v for v in verdicts if v["id"] in stale_ids],
             "pods_holding_devices": podresources.holders(rows, [d["id"] for d in stale])},
            "NVIDIA's device plugin (and HAMi's) marks a GPU Unhealthy on an Xid and never "
            "marks it Healthy again, so the node's allocatable stays below capacity. Restart "
            "the device plugin pod on this node (delete it; its daemonset recreates it) to "
            "re-advertise the GPU. Risk: while it restarts no new GPU pod is admitted on the "
            "node; running pods keep their GPUs. If the GPU turns Unhealthy again soon, treat "
            "it as sick (gpu.xid).",
            (DP_DOC, "https://github.com/NVIDIA/k8s-device-plugin/issues/1014",
             "https://github.com/Project-HAMi/HAMi/issues/2200"))
    if not sick:
        return
    sev = "critical" if len(sick) == len(devs) else "warning"
    yield catalog.make(
        "deviceplugin.unhealthy", sev, _subject(p.t),
        f"{len(sick)} of {len(devs)} device(s) reported {', '.join(sorted({str(d.get('health')) for d in sick}))} "
        f"by the {p.t.resource or Path(p.t.socket).name} plugin",
        {**base, "unhealthy": sick,
         "verdicts": [v for v in verdicts if v["id"] not in stale_ids],
         "pods_holding_devices": podresources.holders(rows, [d["id"] for d in sick])},
        "The kubelet removes unhealthy devices from allocatable, so pods needing them stay "
        "Pending. The NVIDIA plugin marks a device unhealthy on critical Xid errors: see "
        "gpu.xid and the verdicts' reasons for the GPU, fix or drain it (reset or replace); "
        "the plugin reports it healthy again only after it restarts, so restart it after the "
        "GPU is fixed, not before.",
        (DP_DOC, "https://github.com/NVIDIA/k8s-device-plugin#health-checks"))


def _checkpoint_mismatch(p: _PluginProbe, ckpt: dict, kdir: Path, proc: Path):
    """Containers the kubelet's device checkpoint gives devices this plugin does not advertise:
    when they restart the kubelet rejects them with "previously allocated devices are no longer
    healthy; cannot allocate unhealthy devices <resource>" (UnexpectedAdmissionError)."""
    if p.devices is None or not p.t.resource or not ckpt.get("allocations"):
        return
    ids = {d["id"] for d in p.devices}
    healthy = {d["id"] for d in p.devices if d.get("health") == "Healthy"}
    gone = [dict(a, missing=[i for i in a.get("device_ids") or () if i not in ids])
            for a in ckpt["allocations"] if a.get("resource") == p.t.resource]
    gone = [a for a in gone if a["missing"]]
    if not gone:
        return
    now = time.time()
    kubelet = kubeletconfig.kubelet_pid(kdir, proc)
    started = {k: devview.process_start_time(pid, proc) if pid else None
               for k, pid in (("kubelet", kubelet), ("plugin", p.t.pid))}
    yield catalog.make(
        "deviceplugin.checkpoint_mismatch", "warning", _subject(p.t),
        f"The kubelet's device checkpoint gives {len(gone)} container(s) {p.t.resource} "
        f"devices the plugin does not advertise ({', '.join(sorted({i for a in gone for i in a['missing']}))[:200]})",
        {"resource": p.t.resource, "containers": gone[:20], "advertised": sorted(ids)[:64],
         "advertised_healthy": len(healthy),
         "kubelet_started_s_ago": None if started["kubelet"] is None
         else round(now - started["kubelet"]),
         "plugin_started_s_ago": None if started["plugin"] is None
         else round(now - started["plugin"]),
         "pid": p.t.pid, "socket": p.t.socket},
        "When these containers restart (or the kubelet re-admits them after a restart) the "
        "kubelet refuses them with UnexpectedAdmissionError \"previously allocated devices are "
        "no longer healthy\". The ids changed under the kubelet: the plugin's device-id "
        "strategy (uuid vs index), a MIG layout or a driver change, or a GPU that is gone. "
        "Drain the node, delete those pods so their checkpoint entries go, and let them be "
        "recreated; keep the plugin's deviceIDStrategy stable across upgrades.",
        ("https://github.com/kubernetes/kubernetes/issues/117955",
         "https://github.com/kubernetes/kubernetes/issues/124345", DP_DOC))


def _stale_dev(ctx, p: _PluginProbe):
    res = devview.compare(ctx.options.host("dev"), p.t.pid, ctx.options.proc_root)
    if res is None or not (_is_nvidia(p.t, p.devices) or res["plugin_sees"]):
        return
    names = [n["name"] for n in res["missing"]]
    res.update(pid=p.t.pid, comm=p.t.comm, resource=p.t.resource, pod_uid=p.t.pod_uid)
    yield catalog.make(
        "deviceplugin.stale_dev_view", "warning", _subject(p.t),
        f"The device plugin's /dev lacks {', '.join('/dev/' + n for n in names)} that the "
        "host has",
        res,
        "The plugin started before these device nodes existed (typically nvidia-uvm, created "
        "on first CUDA use or by nvidia-modprobe), so it leaves them out of the device specs "
        "it gives containers and their device cgroup denies them (CUDA error 30, EPERM on "
        "open). Restart the device plugin pod so it sees the current /dev (a human decides: "
        "`kubectl -n <plugin namespace> delete pod <plugin pod>`), and create the nodes at "
        "boot before the plugin starts (nvidia-persistenced / `nvidia-modprobe -u -c=0`).",
        ("https://github.com/NVIDIA/k8s-device-plugin/issues/332",
         "https://github.com/NVIDIA/nvidia-container-toolkit/issues/48"))


def _missing(ctx, kdir: Path, targets, probes, nv):
    if not (kdir / "device-plugins").is_dir():
        return  # not a kubelet node (or a different --kubelet-dir): nothing to say
    gpus = [g.uuid for g in nv.gpus] if nv is not None else []
    source = "nvml" if gpus else None
    if not gpus:
        gpus = _gpus_on_host(ctx.options.host_root)
        source = "host files" if gpus else None
    if not gpus:
        return
    serving = [p for p in probes if p.t.pid and not p.unreachable and _is_nvidia(p.t, p.devices)]
    if serving:
        return
    stale = [p.t.socket for p in probes if _is_nvidia(p.t, p.devices) or p.unreachable]
    yield catalog.make(
        "deviceplugin.missing", "critical", "node",
        f"No device plugin serves nvidia.com resources, but the node has {len(gpus)} GPU(s)",
        {"gpus": gpus, "gpus_source": source, "kubelet_dir": str(kdir),
         "sockets": [t.socket for t in targets], "dead_sockets": stale},
        "GPU pods cannot be scheduled or admitted here: the node advertises no nvidia.com/gpu. "
        "Check the NVIDIA device plugin daemonset (GPU Operator: "
        "`kubectl -n gpu-operator get pods -o wide | grep device-plugin`): is a pod on this "
        "node, Running, and does its log show registration with the kubelet? A socket file "
        "with no process behind it is left over from a plugin that died.",
        (DP_DOC, "https://github.com/NVIDIA/k8s-device-plugin"))

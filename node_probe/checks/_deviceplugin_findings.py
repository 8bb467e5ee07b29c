"""The device-plugin check's findings in words: what it learned about each plugin, in, findings out.

Why: checks/deviceplugin.py provokes each plugin (its RPCs with deadlines, the /proc and eBPF
look at a thread inside nvmlInit, pod-resources); this module turns what it learned into the
findings -- the inventory, an RPC that did not answer, a plugin blocked in nvmlInit (with the
driver and the known-bad match), unhealthy devices, a checkpoint that disagrees, a stale /dev
view, a plugin missing on a GPU node -- and merges the ones one plugin process caused once. It
reads no socket and calls no RPC.
"""
from __future__ import annotations

import time
from pathlib import Path

from node_probe.protocol import catalog
from node_probe.host import kubeletconfig, proctasks
from node_probe.protocol import known_drivers
from node_probe.engine.facts import NvmlInventory
from ..deviceplugin import devview, discovery, podresources, stale_health
from .nvml import kernel_module_version

# `_PluginProbe` in the annotations below: checks/deviceplugin.py's record of what it learned
# about one plugin (not imported: the check imports this module, never the other way)

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

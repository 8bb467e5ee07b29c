"""Turn one trace window's results into findings (no BPF here: plain dicts in, Findings out).

Why separate from the loaders: the rules (an EPERM open is a denial, ENXIO is not; a rewrite
matters only for a GPU container and only if it dropped the NVIDIA major; an ioctl is stalled
when it has waited longer than a threshold) are the product's judgement and are tested on
their own, with recorded results as input.
"""
from __future__ import annotations

import errno
from collections import OrderedDict
from typing import Any, Iterable, Mapping

from node_probe.protocol import catalog
from .cgroup_devices import NVIDIA_MAJOR, allows_major, parse_rules

EPERM_REFS = (
    "https://github.com/NVIDIA/k8s-device-plugin/issues/222",
    "https://github.com/NVIDIA/nvidia-docker/issues/966",
    "https://github.com/NVIDIA/nvidia-container-toolkit/issues/48",
    "https://docs.kernel.org/admin-guide/cgroup-v1/devices.html",
)
REWRITE_REFS = (
    "https://github.com/NVIDIA/nvidia-docker/issues/966",
    "https://github.com/kubernetes/kubernetes/issues/77073",
    "https://github.com/NVIDIA/k8s-device-plugin/commit/ea604b28beccf9eaf45f3b26ce01c6821b3fa4a6",
    "https://github.com/NVIDIA/nvidia-container-toolkit/issues/48",
    "https://docs.kernel.org/admin-guide/cgroup-v1/devices.html",
)
STALL_REFS = (
    "https://github.com/NVIDIA/go-nvml/issues/152",
    "https://github.com/kubernetes/kubernetes/issues/117435",
)
GPU_KEYS = ("gpu", "is_gpu", "gpus", "gpu_devices", "nvidia_devices", "expected_devices",
            "nvidia_visible_devices")


def _container_of(containers, pid: int, cgroup: str | None):
    """The containers-fact entry holding this pid (or this devices cgroup), if any."""
    for c in containers or ():
        if pid in (c.get("pids") or ()):
            return c
    if cgroup:
        return _gpu_container(containers, cgroup)[0]
    return None


def _who(container) -> str:
    if not container:
        return ""
    if container.get("pod"):
        return (f" in {container.get('namespace') or '?'}/{container['pod']}"
                f" container {container.get('container') or '?'}")
    return f" in container {str(container.get('container_id', ''))[:13]}"


def eperm_findings(opens: Iterable[Mapping[str, Any]], containers=None) -> list:
    """container.nvidia_eperm: one finding per process whose device opens failed with EPERM."""
    by_pid: "OrderedDict[int, list]" = OrderedDict()
    for o in opens:
        if o.get("errno") == errno.EPERM:
            by_pid.setdefault(o["pid"], []).append(o)
    out = []
    for pid, items in by_pid.items():
        comm = items[0].get("comm", "")
        devices: "OrderedDict[str, dict]" = OrderedDict()
        for o in items:
            d = devices.setdefault(o["path"], {"path": o["path"], "count": 0,
                                               **(o.get("device") or {})})
            d["count"] += 1
        cgroups = items[0].get("cgroup") or {}
        cg = cgroups.get("devices") or cgroups.get("")
        names = ", ".join(devices)
        container = _container_of(containers, pid, cg)
        out.append(catalog.make(
            "container.nvidia_eperm", "critical", f"pid {pid} ({comm})",
            f"{comm} (pid {pid}){_who(container)} was denied {names} by its device cgroup "
            f"({len(items)} EPERM open{'s' if len(items) != 1 else ''})",
            evidence={"pid": pid, "comm": comm, "errno": errno.EPERM,
                      **({"container": {k: container.get(k) for k in (
                          "namespace", "pod", "container", "pod_uid", "container_id",
                          "cgroup_path")}} if container else {}),
                      "count": len(items), "devices": list(devices.values()),
                      "cgroup": cg, "cgroup_id": items[0].get("cgroup_id"),
                      "tids": sorted({o["tid"] for o in items}),
                      "first_ts": items[0].get("ts")},
            remediation=(
                "The process's device cgroup does not allow these NVIDIA devices. Check the "
                "container's devices.list (cgroup v1) or its device program (v2); if the device "
                "plugin started before /dev/nvidia-uvm existed, restart the plugin pod so its "
                "device specs include it; with cpuManagerPolicy static, make the plugin pass "
                "device specs (PASS_DEVICE_SPECS=true / --pass-device-specs). Then recreate the "
                "pod."),
            refs=EPERM_REFS))
    return out


def stall_findings(inflight: Iterable[Mapping[str, Any]], ioctls: Iterable[Mapping[str, Any]],
                   stall_s: float, critical_pids: Iterable[int] = ()) -> list:
    """ioctl.stall: ioctls on device fds still waiting after stall_s (critical for the device
    plugin and other target processes, warning otherwise: some CUDA programs legitimately
    sleep in the driver while waiting for the GPU), or that took that long (warning)."""
    critical = set(critical_pids)
    out = []
    for r in inflight:
        if r["wait_s"] < stall_s:
            continue
        out.append(catalog.make(
            "ioctl.stall", "critical" if r["pid"] in critical else "warning", f"pid {r['pid']} ({r['comm']}) tid {r['tid']}",
            f"ioctl {r['request_hex']} on {r['path'] or 'fd ' + str(r['fd'])} has not returned "
            f"after {r['wait_s']:.1f}s",
            evidence={**dict(r), "in_progress": True, "threshold_s": stall_s},
            remediation=(
                "A thread is blocked inside the NVIDIA driver. Check the kernel log for Xid "
                "errors and hung-task reports, and the driver version against known-bad ones; a "
                "process stuck in the driver usually needs the GPU (or node) to be drained and "
                "the driver reloaded or the node rebooted."),
            refs=STALL_REFS))
    for r in ioctls:
        if r["max_s"] < stall_s:
            continue
        out.append(catalog.make(
            "ioctl.stall", "warning", f"pid {r['pid']} ({r['comm']}) request {r['request_hex']}",
            f"ioctl {r['request_hex']} on {r['path'] or 'fd ' + str(r['fd'])} took up to "
            f"{r['max_s']:.1f}s ({r['count']} calls)",
            evidence={**dict(r), "in_progress": False, "threshold_s": stall_s},
            remediation=("Driver calls this slow point at a GPU or driver in trouble: check Xid "
                         "errors and GPU health."),
            refs=STALL_REFS))
    return out


def _gpu_container(containers: Iterable[Mapping[str, Any]] | None, cgroup: str):
    """(container entry or None, is it a GPU container per the fact?) for a devices relpath."""
    if not cgroup or cgroup == "/":
        return None, False
    for c in containers or ():
        for key in ("cgroup_rel", "cgroup_path"):
            rel = str(c.get(key) or "").rstrip("/")
            if rel and rel != "/" and (cgroup == rel or cgroup.endswith(rel)
                                       or rel.endswith(cgroup)):
                return c, any(c.get(k) for k in GPU_KEYS)
    return None, False


def rewrite_findings(writes: list[Mapping[str, Any]], gpu_cgroups_at_attach: Iterable[str],
                     containers: Iterable[Mapping[str, Any]] | None,
                     read_list) -> list:
    """cgroup.device_rules_rewritten: a GPU container's device rules reset ("a" denied) or the
    NVIDIA major denied, and not allowed again afterwards in the window.

    `read_list(cgroup_relpath) -> str | None` reads the cgroup's devices.list now."""
    at_attach = set(gpu_cgroups_at_attach)
    by_cg: "OrderedDict[str, list]" = OrderedDict()
    for w in writes:
        key = w.get("cgroup") or w.get("path") or "?"
        by_cg.setdefault(key, []).append(w)
    out = []
    for cg, ws in by_cg.items():
        container, fact_gpu = _gpu_container(containers, cg)
        gpu_evidence = []
        if cg in at_attach:
            gpu_evidence.append("its devices.list allowed major 195 when tracing started")
        if fact_gpu:
            gpu_evidence.append("the containers fact marks it as a GPU container")
        removal = None        # the write that removed NVIDIA access
        allowed_after = False
        for w in ws:
            if w.get("ret", 0) < 0:
                continue  # a rejected write changes nothing
            rules = w.get("rules") or parse_rules(w.get("text", ""))
            if w.get("which") == "allow":
                if allows_major(rules, NVIDIA_MAJOR):
                    allowed_after = True
                    if removal is None and "an earlier write in the window allowed major 195" not in gpu_evidence:
                        gpu_evidence.append("an earlier write in the window allowed major 195")
            elif w.get("which") == "deny":
                if any(r.get("type") == "a" for r in rules) or allows_major(rules, NVIDIA_MAJOR):
                    removal, allowed_after = w, False
        if removal is None or allowed_after or not gpu_evidence:
            continue
        now = read_list(cg) if cg.startswith("/") else None
        if now is not None and allows_major(parse_rules(now), NVIDIA_MAJOR):
            continue  # access came back through a path we did not see
        writers = list(OrderedDict(((w["pid"], w["comm"]), None) for w in ws))
        subject = (f"container {str(container.get('container_id', ''))[:13]} "
                   f"(pod {container.get('pod_uid', '?')})" if container else f"cgroup {cg}")
        who = ", ".join(f"{c} (pid {p})" for p, c in writers)
        out.append(catalog.make(
            "cgroup.device_rules_rewritten", "critical", subject,
            f"{who} rewrote the device rules of {cg} without the NVIDIA devices (major 195)",
            evidence={"cgroup": cg, "writers": [{"pid": p, "comm": c} for p, c in writers],
                      "writes": [{"which": w["which"], "text": w["text"], "pid": w["pid"],
                                  "comm": w["comm"], "ret": w.get("ret"), "ts": w.get("ts")}
                                 for w in ws],
                      "gpu_evidence": gpu_evidence, "devices_list_now": now,
                      "container": dict(container) if container else None},
            remediation=(
                "Something (usually the runtime, on behalf of kubelet's CPU manager or a systemd "
                "daemon-reload) rewrote this container's device allow-list from the container "
                "spec, which lacks the NVIDIA devices the NVIDIA runtime hook added. Make the "
                "device plugin pass device specs (PASS_DEVICE_SPECS=true / --pass-device-specs), "
                "or use CDI / the /dev/char symlinks on systemd-driver nodes, then recreate the "
                "affected pods."),
            refs=REWRITE_REFS))
    return out


def unavailable_finding(missing: list[str], remedies: list[str], detail: Mapping[str, Any]):
    what = "; ".join(missing) or "unknown reason"
    return catalog.make(
        "probe.ebpf_unavailable", "info", "probe",
        f"eBPF tracing could not run: {what}",
        evidence={"missing": missing, **dict(detail)},
        remediation="To enable tracing: " + "; ".join(remedies) if remedies else "",
        refs=("https://github.com/iovisor/bcc/blob/master/INSTALL.md",
              "https://docs.kernel.org/trace/ftrace.html"))

"""Verdicts of the trace window, one per probe: live events and findings from its results.

Why here and not in node_probe/tracing: the rules (an EPERM open is a denial, ENXIO is not; a
rewrite matters only for a GPU container and only if it took the NVIDIA major away; an ioctl is
stalled when it has waited longer than a threshold) are the product's judgement, tested on
recorded results without BPF; tracing/ only loads programs and returns plain dicts. Each probe
of tracing.session.LOADERS has one Verdict here, registered with @verdict("<loader name>"), so
the `trace` check never names a probe. Device cgroup rules are read with host/cgroup_rules (the
one grammar, the kernel's semantics).
"""
from __future__ import annotations

import dataclasses
import errno
from collections import OrderedDict, deque
from typing import Any, Callable, Iterable, Mapping

from node_probe.host import cgroup_rules
from node_probe.host.cgroup_rules import RuleSet, parse_lines
from node_probe.engine.facts import ContainerList
from node_probe.checks.kmsg import XID_RE
from node_probe.host.nvidia_devices import NVIDIA_MAJOR
from node_probe.protocol import catalog

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
EVIDENCE_KEYS = ("namespace", "pod", "container", "pod_uid", "container_id", "cgroup_path")


def _container_of(containers: ContainerList | None, pid: int, cgroup: str | None):
    """The container holding this pid (or this devices cgroup), if any."""
    if containers is None:
        return None
    return containers.by_pid(pid) or containers.by_cgroup(cgroup)


def _who(container) -> str:
    if container is None:
        return ""
    if container.meta.get("pod"):
        return f" in {container.pod_label} container {container.meta.get('container') or '?'}"
    return f" in container {container.ref.container_id[:13]}"


def eperm_findings(opens: Iterable[Mapping[str, Any]],
                   containers: ContainerList | None = None) -> list:
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
                      **({"container": {k: container.to_fact().get(k) for k in EVIDENCE_KEYS}}
                         if container is not None else {}),
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


EARLIER = f"an earlier write in the window allowed major {NVIDIA_MAJOR}"
OPEN_ACCESS = "rw"   # what opening a device node for CUDA/NVML (O_RDWR) needs


def grants_nvidia(rules) -> bool:
    """A devices.allow write of these rules lets the cgroup open NVIDIA devices again ('a', or
    195 with read and write; 'c 195:* m', mknod only, does not)."""
    return cgroup_rules.grants(rules, "c", NVIDIA_MAJOR, OPEN_ACCESS)


def revokes_nvidia(rules) -> bool:
    """A devices.deny write of these rules takes NVIDIA open access away ('a', or 195 with
    read or write)."""
    return cgroup_rules.revokes(rules, "c", NVIDIA_MAJOR, OPEN_ACCESS)


def _list_allows_nvidia(devices_list: str) -> bool:
    try:
        return RuleSet.parse(devices_list).allows_major("c", NVIDIA_MAJOR, OPEN_ACCESS)
    except ValueError:
        return False


def rewrite_findings(writes: list[Mapping[str, Any]], gpu_cgroups_at_attach: Iterable[str],
                     containers: ContainerList | None,
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
        container = containers.by_cgroup(cg) if containers is not None else None
        fact_gpu = container is not None and container.is_gpu
        gpu_evidence = []
        if cg in at_attach:
            gpu_evidence.append(f"its devices.list allowed major {NVIDIA_MAJOR} when tracing started")
        if fact_gpu:
            gpu_evidence.append("the containers fact marks it as a GPU container")
        removal = None        # the write that removed NVIDIA access
        allowed_after = False
        for w in ws:
            if w.get("ret", 0) < 0:
                continue  # a rejected write changes nothing
            rules = parse_lines(w.get("text", ""))
            if w.get("which") == "allow":
                if grants_nvidia(rules):
                    allowed_after = True
                    if removal is None and EARLIER not in gpu_evidence:
                        gpu_evidence.append(EARLIER)
            elif w.get("which") == "deny":
                if revokes_nvidia(rules):
                    removal, allowed_after = w, False
        if removal is None or allowed_after or not gpu_evidence:
            continue
        now = read_list(cg) if cg.startswith("/") else None
        if now is not None and _list_allows_nvidia(now):
            continue  # access came back through a path we did not see
        writers = list(OrderedDict(((w["pid"], w["comm"]), None) for w in ws))
        subject = (f"container {container.ref.container_id[:13]} (pod {container.ref.pod_uid})"
                   if container is not None else f"cgroup {cg}")
        who = ", ".join(f"{c} (pid {p})" for p, c in writers)
        out.append(catalog.make(
            "cgroup.device_rules_rewritten", "critical", subject,
            f"{who} rewrote the device rules of {cg} without the NVIDIA devices (major {NVIDIA_MAJOR})",
            evidence={"cgroup": cg, "writers": [{"pid": p, "comm": c} for p, c in writers],
                      "writes": [{"which": w["which"], "text": w["text"], "pid": w["pid"],
                                  "comm": w["comm"], "ret": w.get("ret"), "ts": w.get("ts")}
                                 for w in ws],
                      "gpu_evidence": gpu_evidence, "devices_list_now": now,
                      "container": container.to_fact() if container is not None else None},
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


# -- one Verdict per probe ------------------------------------------------------------------

@dataclasses.dataclass
class Inputs:
    """What a verdict may use besides its probe's results."""
    results: Mapping[str, Any]
    stall_s: float
    targets: list[int]
    containers: Callable[[], ContainerList | None]   # the fact, waited for on first call
    read_list: Callable[[str], str | None]  # a v1 cgroup's devices.list now, by relpath
    event: Callable[..., None]              # (name, subject, message, **data): a live event
    # (seconds since boot or None, message), streamed on demand, or the kmsg check's decoded
    # Xid lines ({uptime_s, pci, xid, text}) when it ran: the log is then not read again
    kernel_log: Callable[[], Iterable] = list


Said = Callable[[dict], "str | None"]   # a record -> the live message, or None: nothing to say


class Verdict:
    """Live events while the window is open, findings once it is read out. Most probes say
    one thing per record kind about its process: they list it in `says` (kind -> (event name,
    message)); a verdict that keeps state across records overrides live()."""
    program = ""
    says: Mapping[str, tuple[str, Said]] = {}

    def live(self, kind: str, rec: dict, state: dict) -> tuple[str, str, str] | None:
        """(event name, subject, message) for a record as it arrives, or None. `state` is
        shared by all verdicts of one window."""
        name, message = self.says.get(kind, ("", None))
        text = message(rec) if message is not None else None
        return (name, _actor(rec), text) if text is not None else None

    def findings(self, inp: Inputs) -> Iterable:
        return ()


VERDICTS: dict[str, Verdict] = {}


def verdict(program: str):
    """Register the Verdict of the loader named `program` (tracing.session.LOADERS)."""
    def deco(cls):
        v = cls()
        v.program = program
        VERDICTS[program] = v
        return cls
    return deco


def _actor(rec: Mapping[str, Any]) -> str:
    return f"pid {rec.get('pid')} ({rec.get('comm', '')})"


@verdict("nvidia_dev")
class _NvidiaDev(Verdict):
    says = {
        "open": ("nvidia.open_denied",
                 lambda r: f"open({r['path']}) = EPERM" if r["errno"] == errno.EPERM else None),
        "slow_ioctl": ("ioctl.slow", lambda r: (f"ioctl {r['request_hex']} on {r['path']} "
                                                f"took {r['duration_s']:.2f}s")),
    }

    def findings(self, inp):
        opens = inp.results.get("opens", [])
        containers = (inp.containers() if any(o.get("errno") == errno.EPERM for o in opens)
                      else None)
        yield from eperm_findings(opens, containers)
        yield from stall_findings(inp.results.get("ioctls_inflight", []),
                                  inp.results.get("ioctls", []), inp.stall_s,
                                  critical_pids=inp.targets)


@verdict("cgroup_devices")
class _CgroupDevices(Verdict):
    says = {
        "write": ("cgroup.device_rule_write",
                  lambda r: (f"wrote {r['text']!r} to {r['path'] or 'devices.' + r['which']}"
                             + (f" ({r['errno_name']})" if r.get("errno") else ""))),
        "bpf_attach": ("cgroup.device_prog_attach",
                       lambda r: (f"{r['cmd']} BPF_CGROUP_DEVICE on "
                                  f"{r['cgroup'] or 'fd ' + str(r['target_fd'])}")),
    }

    def findings(self, inp):
        writes = inp.results.get("cgroup_writes", [])
        if not writes:
            return
        at_attach = (inp.results.get("cgroup_devices") or {}).get("gpu_cgroups_at_attach", [])
        yield from rewrite_findings(writes, at_attach, inp.containers(), inp.read_list)


@verdict("nvml_calls")
class _NvmlCalls(Verdict):
    def live(self, kind, r, state):
        inside = state.setdefault("in_nvml", set())   # threads inside an NVML init call
        who = f"{_actor(r)} tid {r['tid']}"
        if kind == "entered":
            inside.add((r["pid"], r["tid"]))
            return "nvml.entered", who, f"entered {r['func']}"
        if kind == "returned":
            inside.discard((r["pid"], r["tid"]))
            return "nvml.returned", who, f"{r['func']} returned {r['ret']} after {r['duration_s']:.3f}s"
        return None

    def findings(self, inp):
        for c in inp.results.get("nvml_calls", []):
            if not c["returned"]:
                futex = (f", thread asleep in futex() for {c['futex_wait_s']:.2f}s"
                         if "futex_wait_s" in c else "")
                inp.event("nvml.call_blocked", f"pid {c['pid']} ({c['comm']}) tid {c['tid']}",
                          f"{c['func']} entered {c['duration_s']:.2f}s ago and has not returned"
                          + futex, **c)
        return ()


CUDA_REFS = (
    "https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__TYPES.html",
    "https://github.com/NVIDIA/nvidia-container-toolkit/issues/48",
    "https://github.com/NVIDIA/k8s-device-plugin/issues/222",
    "https://docs.nvidia.com/deploy/xid-errors/",
)
# calls without which the process cannot use the GPU at all (memory errors may be the job's own)
CUDA_FATAL = ("cuInit", "cuDeviceGetCount", "cuDeviceGet", "cuDevicePrimaryCtxRetain",
              "cuCtxCreate_v2", "cuCtxCreate_v3", "cuCtxCreate_v4")
NEAR_S = 2.0        # "at the same moment": within this many seconds of the call


def _near(a0: float, a1: float, t: float | None) -> bool:
    return t is not None and a0 - NEAR_S <= t <= a1 + NEAR_S


MAX_XIDS_KEPT = 4096      # newest Xid lines matched against the failed calls' window


def cuda_findings(failed: Iterable[Mapping[str, Any]], opens: Iterable[Mapping[str, Any]],
                  containers: ContainerList | None, kernel_log: Callable[[], list]) -> list:
    """cuda.call_failed: one finding per process whose CUDA driver calls returned errors, with
    what the kernel saw around them: its own failed opens of NVIDIA device nodes (EPERM from
    the device cgroup, ...) and Xid lines in the kernel log."""
    by_pid: "OrderedDict[int, list]" = OrderedDict()
    for c in failed:
        by_pid.setdefault(c["pid"], []).append(c)
    if not by_pid:
        return []
    opens = list(opens)
    xids: deque = deque(maxlen=MAX_XIDS_KEPT)   # the newest: the calls are the trace window's
    for item in kernel_log() or ():
        if isinstance(item, Mapping):   # already decoded by the kmsg check (fact KMSG_LOG)
            xids.append(dict(item))
            continue
        t, msg = item
        m = XID_RE.search(msg)
        if m:
            xids.append({"uptime_s": t, "pci": m.group(1).strip(), "xid": int(m.group(2)),
                         "text": (m.group(3) or "").strip()[:200]})
    out = []
    for pid, calls in by_pid.items():
        first, comm = calls[0], calls[0].get("comm", "")
        w0 = min(c["ts"] for c in calls)
        w1 = max(c["ts"] + c.get("duration_s", 0) for c in calls)
        m0 = min(c["mono_s"] for c in calls)
        m1 = max(c["mono_s"] + c.get("duration_s", 0) for c in calls)
        denied = [o for o in opens if o.get("pid") == pid and o.get("errno")
                  and _near(w0, w1, o.get("ts"))]
        near_xids = [x for x in xids if _near(m0, m1, x["uptime_s"])]
        summary: "OrderedDict[tuple[str, int], dict]" = OrderedDict()
        for c in calls:
            s = summary.setdefault((c["func"], c["result"]), {
                "func": c["func"], "result": c["result"], "error": c["error"], "count": 0,
                "first_ts": c["ts"]})
            s["count"] += 1
        cgroups = first.get("cgroup") or {}
        container = _container_of(containers, pid, cgroups.get("devices") or cgroups.get(""))
        fatal = any(c["func"] in CUDA_FATAL for c in calls)
        what = "; ".join(f"{s['func']} returned {s['error']} ({s['result']})"
                         + (f" x{s['count']}" if s["count"] > 1 else "")
                         for s in summary.values())
        cause = []
        if denied:
            paths = ", ".join(dict.fromkeys(f"{o['path']} ({o.get('errno_name') or o['errno']})"
                                            for o in denied))
            cause.append(f"the kernel refused it {paths} at the same moment")
        if near_xids:
            cause.append("Xid " + ", ".join(dict.fromkeys(f"{x['xid']} on {x['pci']}"
                                                         for x in near_xids)))
        title = (f"{what} in {comm} (pid {pid}){_who(container)}"
                 + (f": {'; '.join(cause)}" if cause else ""))
        if denied and any(o.get("errno") == errno.EPERM for o in denied):
            fix = ("The device cgroup denied the NVIDIA device nodes CUDA opens (usually "
                   "/dev/nvidia-uvm or /dev/nvidiactl): see container.nvidia_eperm and "
                   "cgroup.device_rules_rewritten for why, then recreate the pod.")
        elif near_xids:
            fix = ("The driver reported an Xid at the same moment: see gpu.xid for what it "
                   "means; the GPU may need a reset or the node a drain.")
        else:
            fix = ("No kernel-side cause was seen in the window. Check the error name: "
                   "CUDA_ERROR_NO_DEVICE / NOT_PERMITTED point at device visibility "
                   "(NVIDIA_VISIBLE_DEVICES, the device plugin's allocation), "
                   "SYSTEM_NOT_READY at fabric manager, SYSTEM_DRIVER_MISMATCH at a library "
                   "of another driver version in the image, OUT_OF_MEMORY at the job or "
                   "another process holding the GPU's memory.")
        out.append(catalog.make(
            "cuda.call_failed", "critical" if fatal else "warning", f"pid {pid} ({comm})",
            title,
            evidence={"pid": pid, "comm": comm, "calls": list(summary.values()),
                      "tids": sorted({c["tid"] for c in calls}),
                      **({"container": {k: container.to_fact().get(k) for k in EVIDENCE_KEYS}}
                         if container is not None else {}),
                      "cgroup": cgroups.get("devices") or cgroups.get(""),
                      "kernel": {"denied_opens": [
                          {k: o.get(k) for k in ("path", "errno", "errno_name", "ts", "device")}
                          for o in denied],
                          "xids": near_xids, "window_s": NEAR_S}},
            remediation=fix, refs=CUDA_REFS))
    return out


@verdict("cuda_calls")
class _CudaCalls(Verdict):
    says = {"failed": ("cuda.call_failed",
                       lambda r: f"{r['func']} returned {r['error']} ({r['result']})")}

    def findings(self, inp):
        failed = inp.results.get("cuda_failed_calls", [])
        if not failed:
            return []
        return cuda_findings(failed, inp.results.get("opens", []), inp.containers(),
                             inp.kernel_log)


@verdict("futex_wait")
class _FutexWait(Verdict):
    def live(self, kind, r, state):
        # Idle runtime threads (Go's) sleep in futex all the time: live only when the thread
        # is inside an NVML call; every long wait is in trace.results anyway.
        if kind == "long_wait" and (r["pid"], r["tid"]) in state.get("in_nvml", ()):
            return ("futex.long_wait", f"{_actor(r)} tid {r['tid']}",
                    f"futex wait of {r['wait_s']:.2f}s inside an NVML call")
        return None

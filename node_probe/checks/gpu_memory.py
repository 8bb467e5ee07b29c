"""GPU memory held by nobody: compute processes that are gone or belong to no live pod, and GPUs
with memory in use but no process.

Why: memory a dead or orphaned process still holds is invisible to Kubernetes: the device plugin
hands the GPU to the next pod, which fails with CUDA out-of-memory on an "idle" GPU. NVML's list
of running compute processes (from the NVML child) is matched against live processes, their
pod cgroups, and the pods the kubelet still knows (<kubelet-dir>/pods/<uid>).
"""
from __future__ import annotations

from node_probe.checks import _gpufacts
from node_probe.engine.registry import check
from node_probe.host import containers, procfs
from node_probe.protocol import catalog

REFS = ("https://github.com/NVIDIA/k8s-device-plugin/issues/12",
        "https://github.com/NVIDIA/gpu-operator/issues/2880",
        "https://docs.nvidia.com/deploy/nvml-api/group__nvmlDeviceQueries.html")
MIN_UNOWNED_BYTES = 1 << 30     # driver-reserved memory stays well below this
MIN_UNOWNED_FRACTION = 0.02
MAX_ROWS = 10                   # processes named in evidence per GPU (counts are complete)


def classify(pid: int, proc, kubelet_pods) -> tuple[str, dict]:
    """(state, details) of a process NVML says holds GPU memory:
    gone | pod_gone | host (alive, in no pod container) | pod (alive, in a live pod)."""
    if not (proc / str(pid)).exists():
        return "gone", {}
    comm = procfs.read_comm(pid, proc)
    ref = containers.pod_of_pid(pid, proc)
    if ref is None:
        return "host", {"comm": comm}
    details = {"comm": comm, "pod_uid": ref.pod_uid, "container_id": ref.container_id[:12]}
    if kubelet_pods is not None and kubelet_pods.is_dir() and \
            not (kubelet_pods / ref.pod_uid).exists():
        return "pod_gone", details
    return "pod", details


@check("gpu_memory", title="GPU memory held by gone processes or by no process",
       timeout_s=14.0, needs=(_gpufacts.NVML,))
def gpu_memory_check(ctx):
    nv = _gpufacts.nvml_or_skip(ctx)
    proc = ctx.options.proc_root
    kubelet_pods = ctx.options.kubelet_path / "pods"
    for g in nv.get("gpus") or ():
        procs = g.get("processes")
        if procs is None or g.get("lost"):
            continue
        subject = _gpufacts.gpu_subject(g)
        orphans, hosts = [], []
        for p in procs:
            state, details = classify(int(p["pid"]), proc, kubelet_pods)
            row = {"pid": p["pid"], "used_memory_bytes": p.get("used_memory_bytes"),
                   "state": state, **details}
            if state in ("gone", "pod_gone"):
                orphans.append(row)
            elif state == "host":
                hosts.append(row)
        used = g.get("memory_used_bytes")
        total = g.get("memory_total_bytes") or 0
        ev_base = {"pci_bus_id": g.get("pci_bus_id"), "memory_used_bytes": used,
                   "memory_total_bytes": total, "processes": len(procs)}
        if orphans:
            held = sum(r["used_memory_bytes"] or 0 for r in orphans)
            yield catalog.make(
                "gpu.memory_orphaned", "warning", subject,
                f"{len(orphans)} process(es) NVML lists on this GPU are gone or belong to a "
                f"pod the kubelet no longer has; they hold {held / 2**20:.0f} MiB",
                {**ev_base, "orphans": orphans[:MAX_ROWS], "orphan_count": len(orphans),
                 "orphaned_bytes": held, "host_processes": hosts[:MAX_ROWS],
                 "host_process_count": len(hosts)},
                "The next pod given this GPU can run out of memory on an idle-looking GPU. "
                "If the pid still exists, find it (`ps -o pid,stat,cmd -p PID`): a process in "
                "D state is stuck in the driver and needs a GPU reset. If the pid is gone, the "
                "driver still holds its context: drain the node, then reset the GPU "
                "(`nvidia-smi -r -i <bus id>`) or reboot.", REFS)
        elif hosts:
            yield catalog.make(
                "gpu.memory_orphaned", "info", subject,
                f"{len(hosts)} process(es) outside any pod use this GPU (not accounted for "
                "by Kubernetes)",
                {**ev_base, "orphans": [], "host_processes": hosts[:MAX_ROWS],
                 "host_process_count": len(hosts)},
                "A host process (a test run, a monitoring agent with a CUDA context) shares "
                "the GPU with the pods the device plugin assigns to it. Stop it if it is not "
                "meant to run there.", REFS)
        elif (not procs and used is not None and not g.get("mig_mode")
                and used >= max(MIN_UNOWNED_BYTES, MIN_UNOWNED_FRACTION * total)):
            yield catalog.make(
                "gpu.memory_orphaned", "warning", subject,
                f"{used / 2**20:.0f} MiB of GPU memory in use with no process on the GPU",
                {**ev_base, "orphaned_bytes": used},
                "Memory held by a context whose process is gone (or by a process in another "
                "PID namespace NVML cannot name). Drain the node and reset the GPU "
                "(`nvidia-smi -r -i <bus id>`) or reboot.", REFS)

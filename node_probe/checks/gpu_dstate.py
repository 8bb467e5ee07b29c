"""Processes holding a GPU that are stuck in the kernel: threads in uninterruptible sleep (D).

Why: a rank whose process sits in D (an ioctl into the NVIDIA driver that never returns, a
read from a hung NFS/FUSE checkpoint mount) does not take part in its job's collectives, so
every other rank waits (their GPUs show gpu.collective_spin). The process cannot even be
killed until the kernel call returns. The state letter and the kernel function the thread
sleeps in (wchan) are the kernel's own record (proc(5): "D  Waiting in uninterruptible disk
sleep"); host.dstate reads them without touching anything a stuck process holds locked, and
counts a thread only when it is in D in two samples a moment apart.
"""
from __future__ import annotations

import re

from node_probe.engine.facts import CONTAINERS
from node_probe.engine.registry import check
from node_probe.host import dstate, hostfs
from node_probe.protocol import catalog

FID = "process.gpu_d_state"
TIMEOUT_S = 8.0
POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
REFS = ("https://man7.org/linux/man-pages/man5/proc_pid_stat.5.html",
        "https://www.kernel.org/doc/html/latest/filesystems/proc.html")


def finding(s: dstate.Stuck, pod: str | None):
    ws = sorted({t["wchan"] for t in s.threads if t.get("wchan")})
    m = POD_UID.search(s.cgroup or "")
    gpus = ", ".join(f"/dev/nvidia{n}" for n in s.gpu_minors[:4])
    where = f" in {', '.join(ws[:3])}" if ws else ""
    return catalog.make(
        FID, "warning", f"pid/{s.pid}",
        f"process {s.pid} ({s.comm}) holding {gpus} has {len(s.threads)} thread(s) stuck in "
        f"uninterruptible sleep (D){where}" + (f"; pod {pod}" if pod else ""),
        {**s.to_dict(), "wchan": ws, "pod": pod,
         "pod_uid": m.group(1).replace("_", "-") if m else None, "samples": 2},
        "A process in D cannot be killed until its kernel call returns: the wchan says where "
        "it waits (nvidia/os_* or uvm_*: the GPU driver, drain and reboot the node; nfs_*, "
        "fuse_* or rpc_*: a hung mount, fix the storage). Its job's other ranks wait on it: "
        "cordon the node and restart the job from its checkpoint elsewhere.", REFS)


@check("gpu.d_state", title="GPU processes stuck in uninterruptible sleep (D)",
       timeout_s=TIMEOUT_S, uses=(CONTAINERS,))
def dstate_check(ctx):
    opts = ctx.options
    majors = hostfs.proc_devices(opts.host_root)
    major = majors.get("nvidia-frontend") or majors.get("nvidia")
    if major is None:
        ctx.skip("no NVIDIA driver major in /proc/devices: no GPU device node to look for")
    deadline = min(ctx.started + TIMEOUT_S, ctx.run_deadline) - 1.5
    stuck, cut = dstate.scan(opts.proc_root, major, deadline)
    found = ctx.fact(CONTAINERS, timeout=min(1.0, ctx.budget(1.0)), default=None) if stuck \
        else None
    pods = {p: c.pod_label for c in (found or ()) for p in c.pids}
    if cut:
        ctx.log("warning", f"the D-state scan stopped early ({cut}): processes after it were "
                "not looked at", check="gpu.d_state")
    for s in stuck:
        yield finding(s, pods.get(s.pid))
    if cut and not stuck:
        ctx.skip(f"the scan of processes stopped early ({cut})")

"""Node memory pressure: PSI, refaults, major faults, and who is re-reading pages from disk.

Why (seed 004): when a pod's memory limit is close to the node's memory, reclaim empties the
page cache that holds the code of running binaries (kubelet, containerd, ...). They then take
major faults on every code path, re-reading their own executables from disk in a loop: disk
read IOPS saturate, nothing is OOM-killed, the node goes NotReady and its pods are evicted to
the next node, which dies the same way. `free` and `top` look unremarkable; the witnesses are
PSI (`/proc/pressure/{memory,io}`), refault and major-fault counters in `/proc/vmstat`, and the
per-process major-fault counters in `/proc/PID/stat`, all sampled at both ends of a window.

Collection (`sample`) is separate from the verdict (`analyze`) so the rules are unit-tested on
numbers and the real run only has to produce them.
"""
from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Iterable

from node_probe.protocol import catalog
from node_probe.host import containers, procfs
from ..protocol import Finding, Severity
from node_probe.engine.context import Skipped
from node_probe.engine.registry import check

IDLE_WINDOW_S = 0.5          # without tracing the whole `local` run must stay under 1.5 s
TOP_N = 5
# comm names (as in /proc/PID/comm, at most 15 chars) of the daemons whose thrash kills a node
SYSTEM_DAEMONS = ("kubelet", "containerd", "containerd-shim", "dockerd", "crio", "conmon",
                  "systemd", "systemd-journal", "sshd")
NODE_CRITICAL_DAEMONS = ("kubelet", "containerd", "containerd-shim", "dockerd", "crio")

# Thresholds (per window). Major faults and refaults are counted in pages.
MAJFLT_WARN_PER_S = 200.0
MAJFLT_CRIT_PER_S = 1000.0
REFAULT_WARN_PER_S = 1000.0
REFAULT_CRIT_PER_S = 5000.0
DAEMON_MAJFLT_PER_S = 20.0    # a node daemon re-faulting this often is re-reading its binary
FULL_WARN_PCT = 5.0           # share of wall time all non-idle tasks were stalled
FULL_CRIT_PCT = 20.0
SOME_WARN_PCT = 20.0
SOME_INFO_PCT = 2.0
AVAIL_WARN_PCT = 5.0
AVAIL_INFO_PCT = 10.0

REFS = (
    "https://docs.kernel.org/accounting/psi.html",
    "https://kubernetes.io/docs/tasks/administer-cluster/reserve-compute-resources/",
    "https://kubernetes.io/docs/concepts/scheduling-eviction/node-pressure-eviction/",
    "https://github.com/Azure/aks-engine/pull/604",
)


@dataclasses.dataclass
class Psi:
    some_avg10: float
    full_avg10: float | None
    some_total_us: int
    full_total_us: int | None


@dataclasses.dataclass
class Sample:
    t: float                                 # time.monotonic()
    psi: dict[str, Psi | None]               # "memory", "io" -> Psi (None: PSI unavailable)
    vmstat: dict[str, int]
    meminfo_kib: dict[str, int]
    procs: dict[int, tuple[int, str, int]]   # pid -> (starttime, comm, majflt)


def parse_psi(text: str) -> Psi | None:
    """`some avg10=0.00 avg60=0.00 avg300=0.00 total=0` (+ a `full` line on newer kernels)."""
    lines: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        kind, _, rest = line.strip().partition(" ")
        if kind in ("some", "full"):
            lines[kind] = dict(kv.split("=", 1) for kv in rest.split() if "=" in kv)
    if "some" not in lines:
        return None
    try:
        some = lines["some"]
        full = lines.get("full")
        return Psi(some_avg10=float(some["avg10"]), some_total_us=int(some["total"]),
                   full_avg10=float(full["avg10"]) if full else None,
                   full_total_us=int(full["total"]) if full else None)
    except (KeyError, ValueError):
        return None


def read_psi(proc: Path, resource: str) -> Psi | None:
    text = procfs.read_str(proc / "pressure" / resource)
    if text is None:  # no CONFIG_PSI, or booted with psi=0 (EOPNOTSUPP)
        return None
    return parse_psi(text)


def read_kv(path: Path) -> dict[str, int]:
    """`/proc/vmstat` (`key value`) and `/proc/meminfo` (`Key:   value kB`)."""
    out: dict[str, int] = {}
    text = procfs.read_str(path)
    if text is None:
        return out
    for line in text.splitlines():
        parts = line.replace(":", " ").split()
        if len(parts) >= 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                pass
    return out


def read_procs(proc: Path) -> dict[int, tuple[int, str, int]]:
    out: dict[int, tuple[int, str, int]] = {}
    for pid in procfs.pids(proc):
        st = procfs.read_stat(pid, proc=proc)
        if st is not None:
            out[pid] = (st["starttime"], st["comm"], st["majflt"])
    return out


def sample(proc: Path) -> Sample:
    return Sample(t=time.monotonic(),
                  psi={"memory": read_psi(proc, "memory"), "io": read_psi(proc, "io")},
                  vmstat=read_kv(proc / "vmstat"), meminfo_kib=read_kv(proc / "meminfo"),
                  procs=read_procs(proc))


def major_fault_deltas(a: Sample, b: Sample) -> list[dict]:
    """Per-process major faults taken during the window, most first. A process born in the
    window (new pid, or a reused pid with another start time) took all its faults in it."""
    out = []
    me = os.getpid()  # the probe loading its own libraries is not the node's problem
    for pid, (start, comm, maj) in b.procs.items():
        if pid == me:
            continue
        before = a.procs.get(pid)
        base = before[2] if before is not None and before[0] == start else 0
        delta = maj - base
        if delta > 0:
            out.append({"pid": pid, "comm": comm, "major": delta})
    out.sort(key=lambda p: (-p["major"], p["pid"]))
    return out


def _pct_of_window(a: Psi | None, b: Psi | None, attr: str, window_s: float) -> float | None:
    if a is None or b is None or window_s <= 0:
        return None
    x, y = getattr(a, attr), getattr(b, attr)
    if x is None or y is None:
        return None
    return round(max(0, y - x) / (window_s * 1e6) * 100.0, 2)


def measurements(a: Sample, b: Sample, proc: Path = procfs.PROC) -> dict:
    """Everything the verdict needs, as plain evidence values (units in the key names)."""
    window = max(1e-3, b.t - a.t)
    ev: dict = {"window_s": round(window, 3)}
    for res in ("memory", "io"):
        pa, pb = a.psi.get(res), b.psi.get(res)
        if pb is None:
            ev[f"psi_{res}"] = "unavailable (kernel without CONFIG_PSI, or booted with psi=0)"
            continue
        ev[f"psi_{res}_some_avg10_pct"] = pb.some_avg10
        if pb.full_avg10 is not None:
            ev[f"psi_{res}_full_avg10_pct"] = pb.full_avg10
        ev[f"psi_{res}_some_window_pct"] = _pct_of_window(pa, pb, "some_total_us", window)
        full = _pct_of_window(pa, pb, "full_total_us", window)
        if full is not None:
            ev[f"psi_{res}_full_window_pct"] = full

    def rate(key: str) -> float | None:
        if key not in a.vmstat or key not in b.vmstat:
            return None
        return round(max(0, b.vmstat[key] - a.vmstat[key]) / window, 1)

    for key, name in (("pgmajfault", "pgmajfault_per_s"),
                      ("workingset_refault_file", "refault_file_per_s"),
                      ("workingset_refault_anon", "refault_anon_per_s"),
                      ("workingset_refault", "refault_per_s")):  # kernels before 5.9
        r = rate(key)
        if r is not None:
            ev[name] = r
    total = b.meminfo_kib.get("MemTotal")
    avail = b.meminfo_kib.get("MemAvailable")
    if total:
        ev["mem_total_mib"] = total // 1024
        if avail is not None:
            ev["mem_available_mib"] = avail // 1024
            ev["mem_available_pct"] = round(100.0 * avail / total, 1)
    faulters = major_fault_deltas(a, b)
    for p in faulters:
        p["major_per_s"] = round(p["major"] / window, 1)
    ev["top_major_faulters"] = faulters[:TOP_N]
    ev["processes_with_major_faults"] = len(faulters)
    # a node daemon runs outside every pod: a tenant's process may take the name `kubelet`, but
    # its cgroup says which pod it is in (and it must not raise the verdict to critical)
    ev["daemons_faulting"] = [p for p in faulters if is_node_daemon(p["comm"])
                              and p["major_per_s"] >= DAEMON_MAJFLT_PER_S
                              and containers.pod_of_pid(p["pid"], proc) is None][:TOP_N]
    return ev


def is_node_daemon(comm: str) -> bool:
    return any(comm == d or (d == "containerd-shim" and comm.startswith(d))
               for d in NODE_CRITICAL_DAEMONS)


def _max(*vals: float | None) -> float:
    return max([v for v in vals if v is not None] or [0.0])


def analyze(ev: dict, subject: str = "node") -> Finding:
    """The verdict over `measurements()`: critical "binary page cache thrash" when the node
    re-reads pages from disk at a high rate while tasks stall (or a node daemon is among the
    faulters), warning/info for lesser pressure, ok when idle."""
    full = _max(ev.get("psi_memory_full_window_pct"), ev.get("psi_memory_full_avg10_pct"))
    some = _max(ev.get("psi_memory_some_window_pct"), ev.get("psi_memory_some_avg10_pct"))
    io_full = _max(ev.get("psi_io_full_window_pct"), ev.get("psi_io_full_avg10_pct"))
    majflt = ev.get("pgmajfault_per_s") or 0.0
    refault = _max(ev.get("refault_file_per_s"), ev.get("refault_per_s"))
    avail_pct = ev.get("mem_available_pct")
    daemons = ev.get("daemons_faulting") or []
    # a faulter at 0/s (rounded) over the window is not evidence of anything
    top = [p for p in ev.get("top_major_faulters") or () if p.get("major_per_s", 0) >= 1.0]

    thrash = majflt >= MAJFLT_CRIT_PER_S or refault >= REFAULT_CRIT_PER_S
    # IO stall counts only when memory is involved (a memory stall, refaults or little
    # MemAvailable): a busy disk on a node with ample memory is not memory pressure
    mem_involved = bool(full >= FULL_WARN_PCT or some >= SOME_INFO_PCT
                        or refault >= REFAULT_WARN_PER_S
                        or (avail_pct is not None and avail_pct < AVAIL_INFO_PCT))
    io_stall = io_full >= FULL_WARN_PCT and mem_involved
    # something the node as a whole feels: stalls, little MemAvailable, daemons re-faulting
    node_signal = bool(daemons or full >= FULL_WARN_PCT or some >= SOME_INFO_PCT
                       or io_stall
                       or (avail_pct is not None and avail_pct < AVAIL_INFO_PCT))
    stall = full >= FULL_CRIT_PCT or some >= 2 * SOME_WARN_PCT
    reasons = []
    if majflt >= MAJFLT_WARN_PER_S:
        reasons.append(f"{majflt:.0f} major faults/s")
    if refault >= REFAULT_WARN_PER_S:
        reasons.append(f"{refault:.0f} page-cache refaults/s")
    if full >= FULL_WARN_PCT:
        reasons.append(f"memory PSI full {full:.1f}%")
    elif some >= SOME_INFO_PCT:
        reasons.append(f"memory PSI some {some:.1f}%")
    if io_stall:
        reasons.append(f"io PSI full {io_full:.1f}%")
    if avail_pct is not None and avail_pct < AVAIL_INFO_PCT:
        reasons.append(f"MemAvailable {avail_pct:.1f}%")
    who = ", ".join(f"{p['comm']}[{p['pid']}] {p['major_per_s']:.0f}/s" for p in
                    (daemons or top)[:3])

    if (thrash and (stall or daemons)) or (daemons and stall):
        sev = Severity.CRITICAL
        title = "Binary page cache thrash: processes re-read their pages from disk"
        if daemons:
            title += " (node daemons among them: " + ", ".join(
                sorted({p["comm"] for p in daemons})) + ")"
    elif (daemons or full >= FULL_WARN_PCT or some >= SOME_WARN_PCT
          or io_stall
          or (avail_pct is not None and avail_pct < AVAIL_WARN_PCT)
          or ((thrash or majflt >= MAJFLT_WARN_PER_S or refault >= REFAULT_WARN_PER_S)
              and node_signal)):
        sev = Severity.WARNING
        title = "Memory pressure: " + "; ".join(reasons or ["pages re-read from disk"])
    elif reasons and not node_signal and (majflt >= MAJFLT_WARN_PER_S
                                          or refault >= REFAULT_WARN_PER_S):
        # Re-reads with no stall and plenty of MemAvailable: one memory cgroup at its limit,
        # not the node (seed 004 needs the node itself short of memory).
        sev = Severity.INFO
        title = ("Pages re-read from disk without node pressure (a memory cgroup at its "
                 "limit?): " + "; ".join(reasons))
    elif reasons:
        sev = Severity.INFO
        title = "Some memory pressure: " + "; ".join(reasons)
    else:
        sev = Severity.OK
        title = "No memory pressure"
    if who and sev in (Severity.CRITICAL, Severity.WARNING):
        title += f"; top major faulters: {who}"

    if sev == Severity.OK:
        remediation = ""
    else:
        remediation = (
            "Find the workload that holds the memory (largest cgroups: "
            "`systemd-cgtop -m` or `cat /sys/fs/cgroup/kubepods*/**/memory.current`) and lower "
            "its memory limit so the container is OOM-killed inside its cgroup instead of "
            "starving the node; reserve memory for the system (kubelet `systemReserved`/"
            "`kubeReserved` memory) and raise `evictionHard` `memory.available` (e.g. 5-10%) so "
            "the kubelet evicts before binaries lose their page cache. See memory.overcommit "
            "(`kubectl gpu-doctor node X`) for the pods whose limits leave too little.")
    return catalog.make("memory.pressure", sev, subject, title, ev, remediation, REFS)


def window_s(trace_s: float) -> float:
    return trace_s if trace_s and trace_s > 0 else IDLE_WINDOW_S


@check("memory", title="Memory/IO pressure: PSI, refaults, major faults per process",
       timeout_s=5.0, uses_trace_window=True)
def memory_check(ctx) -> Iterable[Finding]:
    proc = Path(ctx.options.proc_root)
    want = window_s(ctx.options.trace_s)
    first = sample(proc)
    # leave time for the end sample and the verdict
    ctx.cancelled.wait(ctx.budget(want, reserve=1.0))
    last = sample(proc)
    if last.psi["memory"] is None and not last.vmstat and not last.meminfo_kib:
        return Skipped(f"cannot read {proc}/pressure/memory, {proc}/vmstat or {proc}/meminfo: "
                       "no memory signal to judge")
    ev = measurements(first, last, proc)
    if ev.get("psi_memory", "").startswith("unavailable"):
        ctx.log("info", "PSI unavailable: /proc/pressure/memory cannot be read")
    yield analyze(ev, subject="node")


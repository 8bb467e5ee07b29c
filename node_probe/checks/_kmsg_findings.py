"""How each thing the kernel-log check found is worded as a finding: Xid (per GPU, worst code
first), SXid (per NVSwitch), PCIe AER, driver errors without an Xid, the driver/library version
mismatch, NVRM lines this tool does not know, hung tasks and lockups.

Why a module of its own: checks/kmsg.py reads the log once and folds what it saw (the readers in
host/: xid, sxid, aer, nvrm, lockup); this module only turns those folded records into findings
(title, evidence, fix, references), so the reading, where a storm's cost is paid, and the
words, which change with each catalog and issue, are read and changed apart. Pure: records in,
findings out; nothing here reads the host.
"""
from __future__ import annotations

from node_probe.host import aer, lockup, nvrm, sxid, xid
from node_probe.protocol import catalog
from node_probe.protocol.evidence import cut
from node_probe.protocol.render import terminal_safe

HUNG_CRITICAL_COMMS = ("kubelet", "containerd", "dockerd", "crio", "nvidia", "runc")


def aer_finding(dev: aer.AerDevice, gpus: tuple[str, ...], how: str | None, age, wall):
    """gpu.pcie_aer: what the PCIe link of a GPU reported; quiet for a corrected error on a
    port with no GPU below it."""
    fatal = dev.worst == aer.FATAL or bool(dev.cant_recover)
    if not gpus and not fatal:
        return None            # a corrected / non-fatal error on some other device's link
    counts = dict(dev.counts)
    what = []
    if dev.surprise_down:
        what.append("the link went down (Surprise Down)" if not dev.link_down
                    else "the slot's link went down")
    if dev.completion_timeout:
        what.append("completion timeouts")
    if dev.cant_recover:
        what.append("the nvidia driver can't recover (no error_detected callback)")
    label = {aer.FATAL: "uncorrected fatal", aer.NONFATAL: "uncorrected non-fatal",
             aer.CORRECTED: "corrected"}[dev.worst]
    place = (f"GPU {dev.bdf}" if dev.driver == "nvidia" else
             f"PCIe port {dev.bdf} above GPU {', '.join(gpus)}" if gpus else
             f"PCIe device {dev.bdf} ({dev.driver}; no GPU known below it)")
    n = sum(counts.values()) + dev.link_down
    times = "once" if n == 1 else f"{n} times"
    if fatal and gpus:
        sev = "critical"
        fix = ("The GPU is gone from the PCIe bus: the kernel's AER recovery cannot bring it "
               "back (the nvidia driver has no AER callbacks), and every Xid that follows on "
               "it is a consequence. Drain the node and reboot it; check the GPU's seating, "
               "riser/cable, slot power and the port's link (`lspci -vvv -s <port>`: LnkSta); "
               "replace the GPU or the riser if it repeats.")
    elif fatal:
        sev = "warning"
        fix = ("A fatal PCIe error on a device this tool cannot tie to a GPU (no sysfs "
               "topology, no nvidia line in the report): check `lspci -t` for what sits "
               "below it; if a GPU does, treat it as gone (drain and reboot).")
    elif dev.worst == aer.NONFATAL:
        sev = "warning"
        fix = ("The GPU's link had uncorrected (non-fatal) errors: transactions were lost and "
               "the application may have seen errors. Watch for a fatal one; check the link's "
               "seating and signal integrity (riser, cable) if it repeats.")
    else:
        sev = "info"
        fix = ("Corrected errors on the GPU's link: the hardware retried and nothing was "
               "lost. A rising rate is a link going bad (riser, cable, seating): compare "
               "with the GPU's PCIe replay counter (nvidia-smi -q -d PCIE).")
    return catalog.make(
        "gpu.pcie_aer", sev, f"pci {gpus[0] if gpus else dev.bdf}",
        f"PCIe AER {label} error {times} on {place}" + (f": {'; '.join(what)}" if what else ""),
        {"device": dev.bdf, "driver": dev.driver, "severity_class": dev.worst,
         "counts": counts, "status_bits": list(dev.bits), "link_down": dev.link_down,
         "cant_recover": list(dev.cant_recover), "gpus": list(gpus), "joined_by": how,
         "surprise_down": dev.surprise_down, "completion_timeout": dev.completion_timeout,
         "sample": cut(terminal_safe(dev.sample), aer.MAX_LINE),
         "first_fatal_s_since_boot": dev.first_fatal_s, "last_s_since_boot": dev.last_s,
         "last_seen": wall(dev.last_s), "last_age_s": age(dev.last_s)},
        fix,
        ("https://docs.kernel.org/PCI/pcieaer-howto.html", xid.CATALOG_URL))


def lockup_finding(r: lockup.Lockup, xid_pids: set[str], age):
    """kernel.lockup: a soft/hard lockup, RCU stall or BUG whose stack names an NVIDIA module
    (critical), whose task is a GPU process (warning) or that has only the driver loaded
    (info); none when nothing ties it to the GPUs."""
    gpu_proc = r.gpu_process or (r.pid is not None and str(r.pid) in xid_pids)
    if r.in_driver:
        sev, why = "critical", f"inside the NVIDIA driver ({', '.join(r.stack_modules)})"
    elif gpu_proc:
        sev, why = "warning", f"in a GPU process ({r.comm})"
    elif r.nvidia_loaded:
        sev, why = "info", "on a node with the NVIDIA driver loaded (not in its stack)"
    else:
        return None
    task = f" [{r.comm}:{r.pid}]" if r.comm else ""
    times = "once" if r.count == 1 else f"{r.count} times"
    fix = ("A CPU spun or stalled inside the NVIDIA kernel driver: the GPUs' work and often "
           "the node freeze, and the task cannot be killed. Drain the node and reboot it; "
           "update the driver and report the stack to NVIDIA (nvidia-bug-report.sh) if it "
           "recurs." if r.in_driver else
           "A CPU stalled while running a GPU process's task: look at the job and the stack "
           "that follows the report (dmesg); a repeat needs a drain and reboot." if gpu_proc
           else "A kernel lockup or BUG that does not name the NVIDIA driver in its stack: "
                "look at the stack for the module that did; it may still stall GPU jobs.")
    return catalog.make(
        "kernel.lockup", sev, f"{r.comm}:{r.pid}" if r.comm else "node",
        f"Kernel {lockup.KINDS[r.kind]} ({cut(terminal_safe(r.what), 80)}){task} {times} "
        f"{why}",
        {"kind": r.kind, "what": cut(terminal_safe(r.what), 120), "comm": r.comm, "pid": r.pid,
         "reports": r.count, "nvidia_modules": list(r.stack_modules),
         "in_nvidia_driver": r.in_driver, "gpu_process": gpu_proc,
         "nvidia_loaded": r.nvidia_loaded, "sample": cut(terminal_safe(r.sample), 300),
         "last_age_s": age(r.last_s)},
        fix,
        ("https://docs.kernel.org/admin-guide/lockup-watchdogs.html",
         "https://docs.kernel.org/RCU/stallwarn.html"))


def hung_finding(comm: str, pid: int, d: dict, age):
    # by prefix (containerd-shim, runc:[2:INIT], nvidia-device-p), not substring: a task
    # named `prunc-job` or `my-kubelet-test` is not a node daemon; a task is in the NVIDIA
    # driver by the modules of its stack (`nvc:[driver]` ... `[nvidia_uvm]`), not by its name
    daemon = comm.lower().startswith(HUNG_CRITICAL_COMMS)
    mods = d["modules"]
    blocked = (f" blocked for more than {d['blocked_s']} s" if d["blocked_s"] is not None
               else " blocked")
    title = (f"Task {comm} (pid {pid}){blocked}" + (f" in state {d['state']}" if d["state"] else "")
             + (f" inside the NVIDIA driver ({', '.join(mods)})" if mods else ""))
    fix = ("A task stuck in uninterruptible sleep (D) is waiting in the kernel, often on a "
           "driver (nvidia ioctl), storage or memory reclaim. Its kernel stack is in "
           "/proc/<pid>/stack; a node whose kubelet/containerd/driver tasks hang usually needs "
           "draining and a reboot.")
    if mods:
        fix = (f"The task is stuck inside the NVIDIA kernel driver ({', '.join(mods)} in its "
               "stack): it cannot be killed, and the GPUs it holds cannot be reset while it "
               "waits. Drain the node and reboot it; if it recurs, update the driver and "
               "report the stack to NVIDIA (nvidia-bug-report.sh).")
    return catalog.make(
        "kernel.hung_task", "critical" if daemon or mods else "warning", f"{comm}:{pid}",
        title,
        {"comm": comm, "pid": pid, "blocked_s": d["blocked_s"], "state": d["state"],
         "reports": d["count"], "last_age_s": age(d["last_s"]), "nvidia_modules": list(mods),
         "in_nvidia_driver": bool(mods)},
        fix,
        ("https://www.kernel.org/doc/html/latest/admin-guide/sysctl/kernel.html#hung-task-timeout-secs",))


def _code_evidence(g: xid.XidGroup, age, wall) -> dict:
    info = xid.describe(g.code)
    bucket = g.bucket
    ev = {"xid": g.code, "known": xid.known(g.code), "mnemonic": info.mnemonic,
          "meaning": info.meaning,
          "severity": xid.SEVERITY[bucket], "resolution_bucket": bucket,
          "nvidia_resolution_bucket": info.nvidia_bucket, "usual_cause": info.blame,
          "count": g.count, "last_message": g.last_message, "pids": list(g.pids),
          "first_s_since_boot": g.first_s, "last_s_since_boot": g.last_s,
          "first_seen": wall(g.first_s), "last_seen": wall(g.last_s),
          "last_age_s": age(g.last_s)}
    if g.code in xid.NVLINK5:
        ev.update(fatal_lines=g.fatal, nonfatal_lines=g.nonfatal)
    if g.caused_by is not None:
        ev["caused_by_xid"] = g.caused_by
    return ev


def xid_finding(gs: list[xid.XidGroup], uuid: str | None, age, wall, dropped: int,
                 aer_dev: aer.AerDevice | None = None):
    """One finding per GPU: every Xid code it logged (grouped per code, worst first), the
    worst one setting the severity, the headline and the action. The top-level evidence keys
    are the worst code's (as before, when a GPU had one code); `codes` has them all."""
    g = gs[0]
    info = xid.describe(g.code)
    bucket = g.bucket
    gpu = f"GPU {uuid} (pci {g.pci})" if uuid else f"the GPU at pci {g.pci}"
    times = "once" if g.count == 1 else f"{g.count} times"
    name = f"{info.mnemonic}, " if info.mnemonic else ""
    why = ""
    if g.code in xid.NVLINK5 and (g.fatal or g.nonfatal):
        why = " (the driver says Fatal)" if g.fatal else " (the driver says Nonfatal)"
    elif g.caused_by is not None:
        why = f" (caused by a previous Xid {g.caused_by})"
    others = [f"Xid {o.code} x{o.count}" for o in gs[1:]]
    also = f"; also {', '.join(others[:6])}" + (" ..." if len(others) > 6 else "") if others else ""
    codes = [_code_evidence(o, age, wall) for o in gs]
    ev = dict(codes[0])
    ev.pop("severity", None)
    ev.update(pci=g.pci, gpu_uuid=uuid, xids=[o.code for o in gs], codes=codes,
              groups_dropped_events=dropped)
    action = info.action
    if aer_dev is not None:
        # a fatal AER before the GPU's first Xid: the link went first, the Xid follows it
        bits = ", ".join(aer_dev.bits) or aer_dev.worst
        why = (f" after a PCIe AER fatal error ({bits}) on "
               f"{'the GPU' if aer_dev.driver == 'nvidia' else 'its port ' + aer_dev.bdf}: "
               "the GPU is gone")
        bucket = xid.REBOOT
        ev["caused_by_aer"] = {"device": aer_dev.bdf, "status_bits": list(aer_dev.bits),
                               "cant_recover": list(aer_dev.cant_recover)}
        ev["resolution_bucket"] = bucket
        action = ("The PCIe link failed before the driver logged this Xid, so the Xid is its "
                  "consequence, whatever its own bucket says: the GPU is off the bus until the "
                  "node reboots. Check the GPU's seating, riser and slot power; replace the "
                  "GPU or riser if it repeats.")
    elif g.caused_by is not None and g.code == 45:
        cause = xid.describe(g.caused_by)
        action = (f"Xid 45 tears down contexts after another error: here Xid {g.caused_by} "
                  f"({cause.meaning}). {cause.action}")
    elif g.code in xid.NVLINK5 and not g.fatal and g.nonfatal:
        action = ("The driver marks this NVLink error Nonfatal: workloads go on; watch the "
                  "rate, and reset the GPU if a Fatal one follows.")
    severity = xid.SEVERITY[bucket]
    parsed = aer.full_bdf(g.pci) is not None
    ev["bus_id_parsed"] = parsed
    if not parsed:
        # `Xid (PCI:zz:zz)` (a forged or garbled line) names no GPU: what was seen, not a
        # critical for "a GPU" on its own
        gpu = f"a GPU whose bus id did not parse ({cut(terminal_safe(g.pci), 24)!r})"
        severity = "warning" if severity == "critical" else severity
    return catalog.make(
        "gpu.xid", severity, f"pci {g.pci}" if g.pci else "gpu",
        (f"Xid {g.code} ({name}{info.meaning}){why} {times} on {gpu}: "
         + ("reboot the node" if aer_dev is not None else
            f"NVIDIA says {bucket.replace('_', ' ')}") + also if xid.known(g.code) else
         f"Xid {g.code} (unknown: not in NVIDIA's catalog as this tool carries it) {times} on "
         f"{gpu}: {cut(terminal_safe(g.last_message), 120)}{also}"),
        ev,
        f"{xid.BUCKET_TEXT[bucket][0].upper()}{xid.BUCKET_TEXT[bucket][1:]}. {action}",
        (xid.CATALOG_URL,))


_SXID_FIX = {
    sxid.FATAL: ("NVLink traffic through this NVSwitch port stalls: the GPUs behind it hang or "
                 "abort their CUDA jobs (Xid 45), and NCCL collectives wait forever. Drain the "
                 "node and reboot it, which resets the GPUs and the NVSwitches and starts the "
                 "fabric manager again; if the same SXid returns, have the NVSwitch baseboard "
                 "inspected (NVIDIA / the system vendor)."),
    sxid.NONFATAL: ("Non-fatal: the switch hardware corrected it or the link recovered; no "
                    "action. Watch the rate, and act on the fatal SXids or GPU Xids next to it, "
                    "if any."),
    sxid.UNKNOWN: ("This SXid is not in the Fabric Manager guide's tables this tool carries: "
                   "look the code up in the guide and compare with the GPU Xids on the node."),
}
_SXID_FIX[sxid.ALWAYS_FATAL] = ("Always fatal to the whole NVLink fabric: every GPU behind "
                                "the NVSwitches is affected. " + _SXID_FIX[sxid.FATAL])


def sxid_finding(gs: list[sxid.SxidGroup], age, wall, dropped: int):
    """One finding per NVSwitch: every SXid code it logged, the worst class deciding."""
    g = gs[0]
    cls, name = g.klass, sxid.describe(g.code)[1]
    said = ("the driver says Fatal" if g.fatal else "the driver says Non-fatal" if g.nonfatal
            else f"the Fabric Manager guide lists it as {cls.replace('_', ' ')}"
            if cls != sxid.UNKNOWN else "not in the Fabric Manager guide's tables")
    others = [f"SXid {o.code} x{o.lines}" for o in gs[1:]]
    also = f"; also {', '.join(others[:6])}" + (" ..." if len(others) > 6 else "") if others else ""
    links = f", link {', '.join(map(str, g.links[:8]))}" if g.links else ""
    cut_key = g.cuts
    cuts_text = sxid.CUTS_TEXT.get(cut_key or "", "")
    codes = [{"sxid": o.code, "name": sxid.describe(o.code)[1] or None, "class": o.klass,
              "cuts": o.cuts, "severity": o.severity,
              "lines": o.lines, "fatal_lines": o.fatal, "nonfatal_lines": o.nonfatal,
              "links": list(o.links), "sample": cut(terminal_safe(o.sample), sxid.MAX_MESSAGE),
              "first_s_since_boot": o.first_s, "last_s_since_boot": o.last_s,
              "first_seen": wall(o.first_s), "last_seen": wall(o.last_s),
              "last_age_s": age(o.last_s)} for o in gs]
    return catalog.make(
        "nvswitch.sxid", g.severity, f"nvswitch pci {g.pci}",
        f"SXid {g.code}" + (f" ({name})" if name else "") + f" on NVSwitch {g.switch} "
        f"(pci {g.pci}{links}): {said}" + (f"; it cuts {cuts_text}" if cut_key not in
                                           (None, "none") else "") + also,
        {"switch": g.switch, "pci": g.pci, "sxid": g.code, "name": name or None, "class": cls,
         "cuts": cut_key, "cuts_text": cuts_text or None,
         "sxids": [o.code for o in gs], "codes": codes, "groups_dropped_lines": dropped},
        _SXID_FIX[sxid.FATAL] if cls == sxid.NONFATAL and g.severity == "critical" else
        _SXID_FIX_WATCH if cls == sxid.NONFATAL and g.severity == "warning" else _SXID_FIX[cls],
        (sxid.FM_GUIDE_URL,))


_SXID_FIX_WATCH = ("Not fatal by itself, but not corrected either: it cuts the port's throughput "
                   "or precedes a fatal SXid on the same port. Check the NVLink cabling and "
                   "cooling, and act on a fatal SXid or a GPU Xid 74/45 next to it: those need "
                   "the node drained and rebooted.")


DRIVER_REFS = ("https://github.com/NVIDIA/open-gpu-kernel-modules",
               xid.CATALOG_URL)


def driver_finding(e: nvrm.DriverError, age, wall):
    like = xid.describe(e.xid_like)
    unparsed = e.gpu == nvrm.UNPARSED
    where = ("a GPU whose bus id did not parse" if unparsed else f"GPU {e.gpu}" if e.gpu
             else "a GPU")
    times = "once" if e.count == 1 else f"{e.count} times"
    severity = nvrm.SEVERITY_OVERRIDE.get(e.kind, xid.SEVERITY[e.bucket])
    if unparsed and severity == "critical":
        severity = "warning"   # a garbled bus id: never a critical for "a GPU" on its own
    return catalog.make(
        "gpu.driver_error", severity,
        f"pci {e.gpu}" if e.gpu and ":" in e.gpu and not unparsed
        else ("gpu" if unparsed else e.gpu.lower() or "gpu"),
        f"NVIDIA driver on {where}: {e.what}, {times} (no Xid line; the state of Xid "
        f"{e.xid_like}, {like.meaning})",
        {"kind": e.kind, "gpu": None if unparsed else e.gpu or None, "bus_id_parsed":
         not unparsed, "like_xid": e.xid_like,
         "resolution_bucket": e.bucket, "count": e.count,
         "sample": cut(terminal_safe(e.sample), nvrm.MAX_LINE),
         "first_s_since_boot": e.first_s, "last_s_since_boot": e.last_s,
         "first_seen": wall(e.first_s), "last_seen": wall(e.last_s),
         "last_age_s": age(e.last_s)},
        f"{xid.BUCKET_TEXT[e.bucket][0].upper()}{xid.BUCKET_TEXT[e.bucket][1:]}. "
        f"Same state as Xid {e.xid_like}: {like.action}",
        DRIVER_REFS)


def mismatch_finding(d: dict, age, wall):
    """`NVRM: API mismatch`: the kernel's word for NVML's "driver/library version mismatch"."""
    cv, mv = d.get("client_version"), d.get("module_version")
    versions = (f": user-space driver {cv}, loaded kernel module {mv}" if cv and mv else "")
    times = "once" if d["count"] == 1 else f"{d['count']} times"
    return catalog.make(
        "driver.version_mismatch", "critical", "node",
        f"The NVIDIA kernel module refused a client of another driver version {times} (NVRM: "
        f"API mismatch){versions}",
        {"kernel_module_version": mv, "library_version": cv, "reports": d["count"],
         "sample": cut(terminal_safe(d.get("sample") or ""), nvrm.MAX_LINE),
         "first_s_since_boot": d["first_s"], "last_s_since_boot": d["last_s"],
         "first_seen": wall(d["first_s"]), "last_seen": wall(d["last_s"]),
         "last_age_s": age(d["last_s"]), "source": "kernel log"},
        "The user-space driver was upgraded but the old kernel module is still loaded, so "
        "every NVML and CUDA client fails (nvidia-smi: \"Driver/library version mismatch\"). "
        "Drain the node and reboot it (or stop everything using the GPU and reload the nvidia "
        "modules); when the module installed on disk is itself the old version (DKMS did not "
        "rebuild it, an image shipped mismatched packages), reinstall the module of the "
        "driver's version first.",
        ("https://docs.nvidia.com/deploy/nvml-api/group__nvmlDeviceEnumvs.html",
         "https://github.com/NVIDIA/open-gpu-kernel-modules"))


def unrecognized_finding(unknown: list[nvrm.Unrecognized], dropped: int, age):
    total = sum(u.count for u in unknown) + dropped
    lines = [{"count": u.count, "line": cut(terminal_safe(u.sample), 200),
              "last_age_s": age(u.last_s)} for u in unknown]
    return catalog.make(
        "gpu.driver_message", "info", "kernel log",
        f"{total} NVIDIA driver error line(s) of {len(unknown) + (1 if dropped else 0)} kind(s) "
        f"this tool does not recognise: {cut(terminal_safe(unknown[0].sample), 120)}",
        {"lines": lines, "kinds_not_kept": dropped, "total": total},
        "Read, not judged: these NVRM lines are not in this tool's catalog. Look them up "
        "(NVIDIA's Xid catalog, the driver's release notes) and compare with the findings "
        "above; report them if they come with GPU failures.",
        DRIVER_REFS)

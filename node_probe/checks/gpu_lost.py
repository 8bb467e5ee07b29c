"""Lost GPUs: fallen off the bus (Xid 79), NVML GPU_IS_LOST, or present to the kernel driver but
missing from NVML.

Why: a lost GPU does not only take itself out. The NVIDIA device plugin builds its device list
through NVML for every GetPreferredAllocation call, and one GPU that NVML cannot open makes that
call fail for every pod on the node ("GPU is lost, which is unexpected"), so healthy GPUs stop
being allocatable too. The driver keeps the GPU under /proc/driver/nvidia/gpus/<pci id>, so
comparing that list with NVML's names the lost GPU by PCI bus id even when NVML cannot.
"""
from __future__ import annotations

import re
from pathlib import Path

from node_probe.checks import _gpufacts
from node_probe.checks.kmsg import XID_RE, kernel_log, with_pods
from node_probe.engine.facts import DEVICEPLUGIN_TARGETS, KMSG_LOG, PODRESOURCES
from node_probe.engine.registry import check
from node_probe.host import hostfs
from node_probe.protocol import catalog

REFS = ("https://docs.nvidia.com/deploy/xid-errors/",
        "https://github.com/NVIDIA/k8s-device-plugin/issues/231",
        "https://github.com/NVIDIA/k8s-device-plugin/issues/2038")
MAX_GPUS = 64
_UUID_LINE = re.compile(r"^GPU UUID:\s*(\S+)", re.M)
_MODEL_LINE = re.compile(r"^Model:\s*(.+)$", re.M)


def driver_gpus(root: Path) -> dict[str, dict]:
    """GPUs the kernel driver knows: {normalized bus id: {model, uuid}} from
    /proc/driver/nvidia/gpus/<bus id>/information."""
    d = hostfs.resolve(root, "proc/driver/nvidia/gpus")
    out: dict[str, dict] = {}
    if d is None or not d.is_dir():
        return out
    for entry in sorted(d.iterdir())[:MAX_GPUS]:
        bus = _gpufacts.norm_bus_id(entry.name)
        info = hostfs.read_text(root, f"proc/driver/nvidia/gpus/{entry.name}/information",
                                limit=16384) or ""
        m, u = _MODEL_LINE.search(info), _UUID_LINE.search(info)
        out[bus] = {"model": m.group(1).strip() if m else None,
                    "uuid": u.group(1) if u else None}
    return out


def from_kmsg(lost: dict) -> tuple[dict[str, int], dict[str, dict]]:
    """The kmsg check's one read of the log (fact KMSG_LOG's `lost`): ({bus: Xid 79 count},
    {bus: the other signs: off_the_bus lines, a fatal AER})."""
    xids: dict[str, int] = {}
    other: dict[str, dict] = {}
    for full, e in list(lost.items())[:MAX_GPUS]:
        bus = _gpufacts.norm_bus_id(full) or full
        if e.get("xid79"):
            xids[bus] = int(e["xid79"])
        if e.get("off_the_bus") or e.get("aer_fatal"):
            other[bus] = {"off_the_bus": int(e.get("off_the_bus") or 0),
                          "aer_fatal": bool(e.get("aer_fatal"))}
    return xids, other


def xid79(ctx) -> tuple[dict[str, int], str | None]:
    """{normalized bus id: count} of Xid 79 in the kernel log; (.., why not) if unreadable.
    Only when the kmsg check is not part of the run: otherwise its fact says it (the log is
    read once)."""
    out: dict[str, int] = {}
    try:
        for _, msg in kernel_log(ctx.options):      # streamed: a storm costs the counts only
            m = XID_RE.search(msg)
            if m and int(m.group(2)) == 79:
                pci = m.group(1).strip()
                bus = _gpufacts.norm_bus_id(pci if pci.count(".") else pci + ".0") or pci
                if bus in out or len(out) < MAX_GPUS:
                    out[bus] = out.get(bus, 0) + 1
    except OSError as exc:
        return {}, f"kernel log not readable: {exc.strerror}"
    return out, None


@check("gpu_lost", title="Lost GPUs: Xid 79, NVML GPU_IS_LOST, GPUs NVML no longer lists",
       timeout_s=14.0, needs=(_gpufacts.NVML,), uses=(DEVICEPLUGIN_TARGETS, KMSG_LOG,
                                                             PODRESOURCES))
def gpu_lost_check(ctx):
    root = ctx.options.host_root
    known = driver_gpus(root)
    summary = ctx.fact(KMSG_LOG, timeout=ctx.budget(6.0, reserve=4.0), default=None)
    if summary is not None:
        xids, signs = from_kmsg(summary.get("lost") or {})
        kmsg_why = None
    else:
        xids, kmsg_why = xid79(ctx)
        signs = {}
    nv, why = _gpufacts.nvml(ctx)
    lost: dict[str, dict] = {}

    def entry(bus: str | None, key: str) -> dict:
        e = lost.setdefault(bus or key, {"pci_bus_id": bus, "uuid": None, "model": None,
                                         "sources": [], "xid79_count": 0})
        info = known.get(bus or "") or {}
        e["uuid"] = e["uuid"] or info.get("uuid")
        e["model"] = e["model"] or info.get("model")
        return e

    for bus, n in xids.items():
        e = entry(bus, bus)
        e["sources"].append("xid_79")
        e["xid79_count"] = n
    for bus, sg in signs.items():
        e = entry(bus, bus)
        if sg["off_the_bus"]:
            e["sources"].append("kernel_off_the_bus")
            e["off_the_bus_lines"] = sg["off_the_bus"]
        if sg["aer_fatal"]:
            e["sources"].append("pcie_aer_fatal")
    nvml_listed: set[str] = set()
    if why is None:
        gpus = list((nv or {}).get("gpus") or ())
        lost_nvml = list((nv or {}).get("lost_gpus") or ())
        for g in gpus:
            b = _gpufacts.norm_bus_id(g.get("pci_bus_id"))
            if b and not g.get("lost"):
                nvml_listed.add(b)
        with_bus = [g for g in lost_nvml if _gpufacts.norm_bus_id(g.get("pci_bus_id"))]
        no_bus = [g for g in lost_nvml if not _gpufacts.norm_bus_id(g.get("pci_bus_id"))]
        seen = nvml_listed | {_gpufacts.norm_bus_id(g.get("pci_bus_id")) for g in with_bus}
        has_bus_ids = bool(nvml_listed) or not gpus
        missing = [b for b in sorted(known) if b not in seen] if has_bus_ids else []
        for g in with_bus:
            e = entry(_gpufacts.norm_bus_id(g.get("pci_bus_id")), "")
            e["uuid"] = e["uuid"] or g.get("uuid")
            e["nvml_index"] = g.get("index")
            e["sources"].append("nvml_gpu_is_lost")
        # A GPU NVML cannot even open has no bus id. NVML enumerates GPUs in PCI bus order, so
        # it is the one GPU of the driver's list NVML does not name that sits between its
        # neighbours by index; only an unambiguous match is used.
        by_index = {g.get("index"): _gpufacts.norm_bus_id(g.get("pci_bus_id"))
                    for g in gpus + with_bus if g.get("pci_bus_id")}
        for g in no_bus:
            i = g.get("index")
            lo = max((j for j in by_index if i is not None and j < i), default=None)
            hi = min((j for j in by_index if i is not None and j > i), default=None)
            cands = [b for b in missing if (lo is None or b > by_index[lo])
                     and (hi is None or b < by_index[hi])]
            bus = cands[0] if len(cands) == 1 else None
            if bus:
                missing.remove(bus)
            e = entry(bus, f"nvml index {i}")
            e["nvml_index"] = i
            e["pci_bus_id_inferred"] = bool(bus)
            e["sources"].append("nvml_gpu_is_lost")
        for bus in missing:
            entry(bus, bus)["sources"].append("missing_from_nvml")
    if not lost:
        if why is not None and not known:   # nothing to compare: no driver GPUs, no NVML
            ctx.skip(f"no GPU in {ctx.options.host('proc/driver/nvidia/gpus')}; {why}"
                     + (f"; {kmsg_why}" if kmsg_why else ""))
        return
    # who pays for it: the NVIDIA device plugin enumerates every GPU in GetPreferredAllocation
    targets = ctx.fact(DEVICEPLUGIN_TARGETS, timeout=ctx.budget(3.0, reserve=2.0), default=None)
    nv_plugins = [{"pid": t.pid, "resource": t.resource, "socket": t.socket}
                  for t in targets or () if t.is_nvidia_resource]
    if nv_plugins:
        impact = (f"the NVIDIA device plugin here (pid {nv_plugins[0]['pid']}, "
                  f"{nv_plugins[0]['resource']}) then fails GetPreferredAllocation for every "
                  "GPU pod on the node, not only for this GPU")
    else:
        impact = ("with the NVIDIA device plugin this makes GetPreferredAllocation fail for "
                  "every GPU pod on the node, not only for this GPU")
    out = []
    for key, e in lost.items():
        name = e["pci_bus_id"] or key
        what = []
        if "pcie_aer_fatal" in e["sources"]:
            what.append("a fatal PCIe AER error on its link")
        if "xid_79" in e["sources"]:
            what.append(f"Xid 79 x{e['xid79_count']} (fallen off the bus)")
        if "kernel_off_the_bus" in e["sources"] and "xid_79" not in e["sources"]:
            what.append("the driver says it has fallen off the bus (no Xid line)")
        if "nvml_gpu_is_lost" in e["sources"]:
            what.append("NVML returns GPU_IS_LOST")
        if "missing_from_nvml" in e["sources"]:
            what.append("the driver lists it but NVML does not")
        ev = dict(e, nvml=why, kernel_log=kmsg_why, driver_gpus=len(known),
                  nvml_gpus=len(nvml_listed), nvidia_device_plugins=nv_plugins)
        out.append(catalog.make(
            "gpu.lost", "critical", f"pci {name}",
            f"GPU {name} is lost: " + "; ".join(what) + "; " + impact,
            ev,
            "Drain the node (`kubectl drain <node> --ignore-daemonsets`) and reboot it: a GPU "
            "that fell off the bus does not come back without a reset of the PCIe device or "
            "the node. Check power, cooling and the PCIe slot, and replace the GPU if it "
            "repeats. Until then GPU pods on this node fail admission with "
            "'GetPreferredAllocation rpc failed ... GPU is lost'.",
            REFS))
    # the pods on each lost GPU (issue 40.6), from pod-resources joined to NVML's GPUs
    yield from with_pods(ctx, out, ctx.started + 14.0 - 1.0)

"""PCIe link downtrained: the link runs at a lower generation or width than GPU and slot allow.

Why: a GPU that trained its link at Gen2 instead of Gen5, or at x8 instead of x16, raises no
Xid and no error: it just moves host<->device data at a fraction of the speed (issue 38: 3.5 h
of training at Gen2 x16 at 100 % utilisation, nothing logged). NVIDIA GPUs drop the link to
Gen1 when idle to save power and retrain on load, so the GENERATION is judged only while the
GPU is busy; a WIDTH below the maximum is wrong at any time (widths do not idle down).

On a virtual machine (the GPU passed through, or a vGPU) the guest sees no real slot: the
GPU hangs off a virtual root complex (AWS g5's A10G sits at 00:1e.0 on bus 0 with no bridge
above it), so a width below the GPU's max is not proof of a fault there -- the host may wire
the slot at that width. It is said as info, with what would prove it (a sibling of the same
instance type), unless another GPU of the same host with the same max runs wider (then this
one differs: a warning), or a bridge above it shows a wider link.

Sources, in order: NVML's view of the GPU's own link (record "pcie"), then sysfs/lspci link
records of the GPU function and each bridge above it (a switch uplink at Gen1 throttles every
GPU below it just the same).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from node_probe.checks.slow import _common
from node_probe.protocol import Finding, catalog

FID = "gpu.pcie_downtrained"
GEN_OF_GTS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}
# usable bandwidth per lane and direction, GB/s (8b/10b for Gen1-2, 128b/130b for Gen3-5,
# FLIT mode for Gen6): only the ratio between two links is ever said
LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
MAX_CHAIN = 8     # bridges walked above a GPU (real trees are 2-4 deep)
REFS = ("https://docs.nvidia.com/deploy/nvml-api/group__nvmlDeviceQueries.html",
        "https://www.kernel.org/doc/Documentation/ABI/testing/sysfs-bus-pci",
        "https://github.com/NVIDIA/NVSentinel/issues/890")


def gen_of(gts: Any) -> int | None:
    """The PCIe generation of a link speed in GT/s (None when not a known rate)."""
    v = _common.num(gts)
    if v is None:
        return None
    for rate, gen in GEN_OF_GTS.items():
        if abs(v - rate) < 0.05:
            return gen
    return None


def bandwidth_gbps(gen: int | None, width: int | None) -> float | None:
    if gen not in LANE_GBPS or not width:
        return None
    return LANE_GBPS[gen] * width


def share(cur_gen, cur_w, max_gen, max_w) -> tuple[float | None, str]:
    """(fraction of the maximum bandwidth, how a person says it: "1/8", "50 %")."""
    cur, top = bandwidth_gbps(cur_gen, cur_w), bandwidth_gbps(max_gen, max_w)
    if not cur or not top:
        return None, "unknown share"
    f = cur / top
    inv = round(1 / f)
    if f <= 0.5 and inv >= 2 and abs(1 / f - inv) / inv < 0.06:
        return f, f"1/{inv}"
    return f, f"{f * 100:.0f} %"


def _link(gen, width) -> str:
    return f"Gen{gen if gen else '?'} x{width if width else '?'}"


def _from_nvml(g: Mapping[str, Any]) -> dict | None:
    p = g.get("pcie") or {}
    gc, wc = _common.num(p.get("gen_cur")), _common.num(p.get("width_cur"))
    gm, wm = _common.num(p.get("gen_max")), _common.num(p.get("width_max"))
    if gc is None and wc is None:
        return None
    return {"where": "gpu", "bdf": g.get("pci_bus_id"), "source": "nvml",
            "gen_cur": gc, "width_cur": wc, "gen_max": gm, "width_max": wm,
            "gen_gpu_max": _common.num(p.get("gen_gpu_max"))}


def _from_links(bdf: str | None, links: Mapping[str, Mapping[str, Any]] | None) -> list[dict]:
    """The GPU function's link and each bridge link above it, nearest first. A link's max is the
    lower of its two ends' maxima (the end above is the next record up)."""
    out: list[dict] = []
    if not bdf or not links:
        return out
    seen = set()
    cur = links.get(bdf)
    while cur is not None and len(out) < MAX_CHAIN and cur.get("bdf") not in seen:
        seen.add(cur.get("bdf"))
        up = links.get(cur.get("upstream") or "")
        gm, wm = gen_of(cur.get("speed_max_gts")), _common.num(cur.get("width_max"))
        if up is not None:
            ugm, uwm = gen_of(up.get("speed_max_gts")), _common.num(up.get("width_max"))
            gm = min(x for x in (gm, ugm) if x) if (gm or ugm) else None
            wm = min(x for x in (wm, uwm) if x) if (wm or uwm) else None
        out.append({"where": "gpu" if not out else "bridge", "bdf": cur.get("bdf"),
                    "source": "sysfs", "gen_cur": gen_of(cur.get("speed_cur_gts")),
                    "width_cur": _common.num(cur.get("width_cur")), "gen_max": gm,
                    "width_max": wm})
        cur = up
        # a root port's own "link" upward is the CPU: stop when a record has no link
        if cur is not None and cur.get("speed_cur_gts") is None:
            break
    return out


def _faults(link: dict, is_busy: bool | None) -> tuple[bool, bool]:
    """(generation below max and judged, width below max)."""
    gen_low = (is_busy is True and link["gen_cur"] is not None and link["gen_max"] is not None
               and link["gen_cur"] < link["gen_max"])
    width_low = (link["width_cur"] is not None and link["width_max"] is not None
                 and 0 < link["width_cur"] < link["width_max"])
    return gen_low, width_low


VM_MODES = ("passthrough", "vgpu")


def on_vm(g: Mapping[str, Any]) -> str | None:
    """How the GPU is seen to be in a virtual machine ("passthrough", "vgpu", "hypervisor"),
    or None: bare metal, or not known."""
    mode = g.get("virtualization")
    if mode in VM_MODES:
        return str(mode)
    if mode is None and g.get("hypervisor") is True:
        return "hypervisor"
    return None


def _wider_elsewhere(g, link: dict, chain: list[dict],
                     peers: Sequence[Mapping[str, Any]]) -> list[str]:
    """What shows the slot could be wider than this GPU's link: siblings (same name and max
    width) running wider, or a bridge above it whose link is wider."""
    out = []
    for p in peers:
        if p is g or p.get("lost"):
            continue
        pp = p.get("pcie") or {}
        w, wm = _common.num(pp.get("width_cur")), _common.num(pp.get("width_max"))
        if (p.get("name") == g.get("name") and wm == link["width_max"] and w is not None
                and w > link["width_cur"]):
            out.append(f"{_common.label(p)} x{w}")
    for up in chain:
        if up["where"] == "bridge" and up["width_cur"] and up["width_cur"] > link["width_cur"]:
            out.append(f"the bridge {up['bdf']} x{up['width_cur']}")
    return out


def judge(g: Mapping[str, Any], links: Mapping[str, Mapping[str, Any]] | None = None,
          holders: Mapping[str, Sequence[str]] | None = None, bdf: str | None = None,
          peers: Sequence[Mapping[str, Any]] = ()) -> list[Finding]:
    """gpu.pcie_downtrained for one GPU record (contract a), with the sysfs/lspci link records
    (contract b) keyed by normalised bdf, `bdf` the GPU's key among them, and the node's other
    GPU records (siblings on a VM). At most one finding: the worst link on the GPU's path to
    the CPU."""
    if g.get("lost"):
        return []
    is_busy = _common.busy(g)
    chain = [x for x in (_from_nvml(g), *_from_links(bdf, links)) if x]
    bad = []
    for link in chain:
        gen_low, width_low = _faults(link, is_busy)
        if gen_low or width_low:
            f, said = share(link["gen_cur"] if gen_low else link["gen_max"], link["width_cur"],
                            link["gen_max"], link["width_max"])
            if not gen_low and link["gen_cur"] is not None and link["gen_max"] is not None:
                # idle generation is not a fault, but the width share is said at full speed
                said = share(link["gen_max"], link["width_cur"], link["gen_max"],
                             link["width_max"])[1]
            bad.append((f if f is not None else 1.0, link, gen_low, width_low, said))
    if not bad:
        return []
    frac, link, gen_low, width_low, said = min(bad, key=lambda b: b[0])
    shown_gen = link["gen_cur"] if gen_low else link["gen_max"]
    now, top = _link(shown_gen, link["width_cur"]), _link(link["gen_max"], link["width_max"])
    where = "" if link["where"] == "gpu" else f" (the bridge {link['bdf']} above it)"
    what = " and ".join(w for w, on in (("generation", gen_low), ("width", width_low)) if on)
    ev = _common.evidence(g, holders)
    ev.update({"link": now, "link_max": top, "bandwidth_share": said,
               "bandwidth_fraction": None if frac is None else round(frac, 4),
               "generation_low": gen_low, "width_low": width_low, "at": link["where"],
               "at_bdf": link["bdf"], "source": link["source"], "busy": is_busy,
               "gen_gpu_max": link.get("gen_gpu_max"),
               "links": chain})
    pods = _common.held_by(ev)
    vm = on_vm(g) if width_low and not gen_low and link["where"] == "gpu" else None
    if vm is not None:
        wider = _wider_elsewhere(g, link, chain, peers)
        ev.update({"vm": vm, "wider_elsewhere": wider})
        if not wider:
            return [catalog.make(
                FID, "info", _common.subject(g),
                f"{_common.label(g)}: PCIe link width {now} of {top} on a virtual machine "
                f"({vm}): on a VM the slot's width is not visible; compare with a sibling of "
                f"the same instance type{pods}", ev,
                "Not proof of a fault: the host may wire this slot at that width. Run "
                "`nvidia-smi -q -x` on another machine of the same instance type: the same "
                "width there is the platform's; a wider one there means this GPU trained "
                "narrow (stop and start the instance to move it to another host).", REFS)]
        pods += f"; on this VM {', '.join(wider[:3])} runs wider"
    return [catalog.make(
        FID, "warning", _common.subject(g),
        f"{_common.label(g)}: PCIe link {what} downtrained{where}: {now} of {top}: "
        f"{said} of host bandwidth{pods}", ev,
        "Host<->GPU copies run at that share of the speed; nothing else reports it. Drain the "
        "node (kubectl drain), then retrain the link: reset the GPU (nvidia-smi -r) or reboot; "
        "if it comes back narrow or slow, reseat the GPU and its riser/cable, check the slot's "
        "BIOS link setting, and see the kernel log for PCIe AER errors.", REFS)]

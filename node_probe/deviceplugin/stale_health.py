"""Is a device the plugin reports Unhealthy really sick now, or only never re-checked?

Why: NVIDIA's device plugin (and HAMi's fork of it) marks a GPU Unhealthy on an Xid event and
never marks it Healthy again; only a plugin restart re-advertises it (NVIDIA/k8s-device-plugin
#1014, #234: "Once marked unhealthy, the plugin will then leave it unhealthy forever";
Project-HAMi/HAMi #2200; the DRA driver's health reporting, NVIDIA/k8s-dra-driver-gpu #904).
After a transient Xid the node keeps allocatable below capacity for days while the GPU works.
The opposite mistake is as costly: restarting the plugin on a GPU that is really failing puts
it back in service. Told apart here from what NVML reports about the GPU now and the Xids the
kernel logged for it this boot.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from node_probe.host import xid as xids

ACTION_BUCKETS = (xids.RESET_GPU, xids.REBOOT, xids.CONTACT_SUPPORT)


def _gpu_for(dev_id: str, gpus: list[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    base = dev_id.partition("::")[0].lower()
    for g in gpus:
        if str(g.get("uuid") or "").lower() == base:
            return g
        if any(str(m.get("uuid") or "").lower() == base for m in g.get("mig_devices") or ()):
            return g
    return None


def nvml_problems(g: Mapping[str, Any]) -> list[str]:
    out = []
    if g.get("lost"):
        out.append("NVML: GPU is lost")
    rows = g.get("remapped_rows") or {}
    if rows.get("failure"):
        out.append("NVML: row remapping failed")
    if rows.get("pending"):
        out.append("NVML: row remapping pending (reset needed)")
    if g.get("ecc_uncorrected_volatile"):
        out.append(f"NVML: {g['ecc_uncorrected_volatile']} uncorrected ECC error(s)")
    return out


def classify(unhealthy: Iterable[Mapping[str, Any]], nvml: Mapping[str, Any] | None,
             xid_groups: Iterable[xids.XidGroup] | None) -> list[dict]:
    """One verdict per Unhealthy device: {"id", "gpu_uuid", "verdict": stale | sick |
    unknown, "reasons": [...], "xids": [...]}. `nvml` is the nvml fact's record (status ok);
    `xid_groups` None when the kernel log was not read."""
    gpus = list((nvml or {}).get("gpus") or ())
    lost = {str(x.get("uuid") or "").lower() for x in (nvml or {}).get("lost_gpus") or ()}
    by_bus: dict[str, list[xids.XidGroup]] = {}
    for g in xid_groups or ():
        b = xids.short_bus(g.pci)
        if b:
            by_bus.setdefault(b, []).append(g)
    out = []
    for d in unhealthy:
        dev_id = str(d.get("id") or "")
        v: dict[str, Any] = {"id": dev_id, "gpu_uuid": None, "reasons": [], "xids": []}
        out.append(v)
        if (nvml or {}).get("status") != "ok":
            v["verdict"] = "unknown"
            v["reasons"].append("NVML could not be asked")
            continue
        if dev_id.partition("::")[0].lower() in lost:
            v.update(verdict="sick", gpu_uuid=dev_id.partition("::")[0])
            v["reasons"].append("NVML: GPU is lost")
            continue
        g = _gpu_for(dev_id, gpus)
        if g is None:
            v["verdict"] = "sick"
            v["reasons"].append("NVML does not list this device")
            continue
        v["gpu_uuid"] = g.get("uuid")
        v["reasons"].extend(nvml_problems(g))
        for x in by_bus.get(xids.short_bus(g.get("pci_bus_id")) or "", ()):
            info = xids.describe(x.code)
            bucket = x.recovery or info.bucket
            v["xids"].append({"xid": x.code, "count": x.count, "bucket": bucket,
                              "last_s_since_boot": x.last_s})
            if bucket in ACTION_BUCKETS:
                v["reasons"].append(f"Xid {x.code} ({info.meaning}) x{x.count}: "
                                    f"NVIDIA says {bucket.replace('_', ' ')}")
        v["verdict"] = "sick" if v["reasons"] else "stale"
        if v["verdict"] == "stale" and xid_groups is None:
            v["reasons"].append("kernel log not read: Xids unknown")
    return out

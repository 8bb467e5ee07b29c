"""MIG mode change pending: the GPU's pending MIG mode differs from its current one.

Why: enabling or disabling MIG only takes effect after a GPU reset. Until then the MIG manager
(or an admin) believes the change is done, the device plugin still advertises the old layout,
and pods asking for MIG slices stay Pending. A reset fails while any process holds the GPU, and
on some platforms (GPU passthrough VMs) only a reboot applies it.
"""
from __future__ import annotations

from node_probe.checks import _gpufacts
from node_probe.engine.registry import check
from node_probe.protocol import catalog

REFS = ("https://docs.nvidia.com/datacenter/tesla/mig-user-guide/",
        "https://github.com/NVIDIA/mig-parted/issues/9",
        "https://github.com/NVIDIA/mig-parted/pull/484")


def _mode(v) -> str:
    return "enabled" if v else "disabled"


@check("mig_pending", title="MIG mode change pending a GPU reset",
       timeout_s=14.0, needs=(_gpufacts.NVML,))
def mig_pending_check(ctx):
    nv = _gpufacts.nvml_or_skip(ctx)
    for g in nv.get("gpus") or ():
        if "mig_pending_mode" not in g or bool(g["mig_pending_mode"]) == bool(g.get("mig_mode")):
            continue
        procs = g.get("processes") or []
        yield catalog.make(
            "mig.mode_pending", "warning", _gpufacts.gpu_subject(g),
            f"MIG mode is {_mode(g.get('mig_mode'))} but {_mode(g['mig_pending_mode'])} is "
            "pending: the change needs a GPU reset or a reboot"
            + (f" ({len(procs)} process(es) on the GPU block the reset)" if procs else ""),
            {"pci_bus_id": g.get("pci_bus_id"), "mig_mode_current": bool(g.get("mig_mode")),
             "mig_mode_pending": bool(g["mig_pending_mode"]), "processes": len(procs),
             "process_pids": [p.get("pid") for p in procs][:10]},
            "Drain the GPU's pods, stop host clients of the GPU (nvidia-persistenced, DCGM / "
            "dcgm-exporter, the device plugin), then `nvidia-smi -r -i <bus id>`; or drain and "
            "reboot the node (the only way in passthrough VMs). With the GPU Operator the MIG "
            "manager does this when its config asks for it; see mig.config_failed on the node.",
            REFS)

"""Fabric manager on NVSwitch systems (HGX boards): running, same version as the driver, and
every GPU registered with the fabric.

Why: on a board whose GPUs talk through NVSwitches, the driver will not let CUDA use a GPU until
nv-fabricmanager has trained the fabric and registered the GPU. If the daemon is not running,
refuses to start because its version differs from the driver's, or has not finished, every
CUDA program on the node fails with error 802 "system not yet initialized" while nvidia-smi
looks healthy. Only nodes with NVSwitches (or GPUs reporting a fabric state) are judged. The
daemon counts only where this node's driver lives (daemons.of_driver, as for persistence): a
tenant's process named nv-fabricmanager must not hide a fabric manager that is not running.
"""
from __future__ import annotations

import re

from node_probe.checks import _gpufacts
from node_probe.engine.registry import check
from node_probe.host import daemons, hostfs
from node_probe.protocol import catalog

FM_NAMES = ("nv-fabricmanager",)
TALOS_SERVICE = "nvidia-fabricmanager"   # Talos's extension service runs it in its own root
REFS = ("https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/index.html",
        "https://github.com/NVIDIA/gpu-operator/issues/544",
        "https://github.com/NVIDIA/gpu-operator/issues/2781",
        "https://github.com/pytorch/pytorch/issues/35710")
_SWITCH_DEV = re.compile(r"^nvidia-nvswitch\d+$")
MAX_ROOTS = 4   # distinct roots of running fabric managers read (one is normal)


def nvswitches(root) -> list[str]:
    """NVSwitch devices the driver exposes: /proc/driver/nvidia-nvswitch/devices/<pci id>, or
    /dev/nvidia-nvswitch<N> nodes."""
    found: list[str] = []
    d = hostfs.resolve(root, "proc/driver/nvidia-nvswitch/devices")
    if d is not None and d.is_dir():
        found += sorted(p.name for p in d.iterdir())[:64]
    dev = hostfs.resolve(root, "dev")
    if not found and dev is not None and dev.is_dir():
        found += sorted(p.name for p in dev.iterdir() if _SWITCH_DEV.match(p.name))[:64]
    return found


@check("fabric", title="Fabric manager on NVSwitch systems: running, version, GPU registration",
       timeout_s=14.0, needs=(_gpufacts.NVML,))
def fabric_check(ctx):
    root = ctx.options.host_root
    switches = nvswitches(root)
    nv, why = _gpufacts.nvml(ctx)
    gpus = (nv or {}).get("gpus") or [] if why is None else []
    fabric_gpus = [g for g in gpus if g.get("fabric")]
    if not switches and not fabric_gpus:
        if why is not None:   # no switch in procfs/dev, and no NVML to ask the GPUs
            ctx.skip(f"no NVSwitch in {ctx.options.host('proc/driver/nvidia-nvswitch')} or "
                     f"{ctx.options.host('dev')}, and {why}")
        return  # not an NVSwitch/NVLink-fabric system: nothing to judge
    driver = ((nv or {}).get("driver_version") or (nv or {}).get("kernel_module_version"))
    named = daemons.find(FM_NAMES, ctx.options.proc_root)
    # only a fabric manager where this node's driver lives counts: a tenant can name any
    # process nv-fabricmanager, and one in its container configures no fabric
    fm, fm_roots = daemons.of_driver(named, ctx.options.proc_root, root, service=TALOS_SERVICE)
    # the running fabric manager's version comes from its own root (host, or the driver
    # container); without one, from what the host and the driver container have installed
    if fm:
        roots = list(dict.fromkeys(daemons.process_root(d.pid, ctx.options.proc_root, root)
                                   for d in fm))[:MAX_ROOTS]
        where = ("",)
    else:
        roots, where = [root], daemons.driver_roots(root, ctx.options.proc_root)
    pkgs: dict[str, str] = {}
    logs: list[tuple[str, str]] = []
    for r in roots:
        for prefix in ("nvidia-fabricmanager", "cuda-drivers-fabricmanager"):
            pkgs.update(daemons.dpkg_versions(r, prefix, where))
        log_v, log_path = daemons.fabricmanager_log_version(r, where)
        if log_v:
            logs.append((log_v, log_path))
    log_path = logs[0][1] if logs else None
    fm_versions = sorted({v for v in (daemons.driver_version_of(x) for x in pkgs.values()) if v}
                         | {v for v, _ in logs})
    not_done = [{"uuid": g.get("uuid"), "pci_bus_id": g.get("pci_bus_id"),
                 "state": g["fabric"].get("state"), "status": g["fabric"].get("status")}
                for g in fabric_gpus
                if g["fabric"].get("state") != "completed" or g["fabric"].get("status")]
    evidence = {"nvswitches": switches[:16], "nvswitch_count": len(switches),
                "fabricmanager_pids": [d.pid for d in fm], "fabricmanager_versions": fm_versions,
                # processes of that name elsewhere (a container): not the node's fabric manager
                "not_host_pids": [d.pid for d in named if d not in fm][:16],
                "daemon_roots": ["/" + r for r in fm_roots],
                "fabricmanager_packages": pkgs, "fabricmanager_log": log_path,
                "driver_version": driver, "gpus_not_registered": not_done,
                "gpus_with_fabric_state": len(fabric_gpus)}
    if why is not None:
        evidence["nvml"] = why
    problems: list[str] = []
    severity = "warning"
    if switches and not fm:
        problems.append("nv-fabricmanager is not running")
        severity = "critical"
    mismatch = [v for v in fm_versions if driver and v != driver]
    if switches and mismatch:
        problems.append(f"fabric manager {', '.join(mismatch)} differs from driver {driver}")
        severity = "critical"
    if not_done:
        states = sorted({f"{g['state']}/status {g['status']}" for g in not_done})
        problems.append(f"{len(not_done)} GPU(s) not registered with the fabric "
                        f"({', '.join(states)})")
        if any(g["state"] != "in_progress" or g["status"] for g in not_done):
            severity = "critical"
    if not problems:
        return
    yield catalog.make(
        "fabric.not_ready", severity, "node",
        "NVSwitch fabric not ready: " + "; ".join(problems)
        + " (CUDA programs fail with error 802 'system not yet initialized')",
        evidence,
        "Start the fabric manager (`systemctl enable --now nvidia-fabricmanager`, or the GPU "
        "Operator driver container's fabric manager) and make its package exactly the driver "
        "version (nvidia-fabricmanager-<branch>=<driver version>); it refuses to start on a "
        "mismatch. Read its log (/var/log/fabricmanager.log). GPUs stay unusable until every "
        "GPU's fabric state is completed with status success; a GPU stuck there after the "
        "fabric manager runs needs a GPU reset or node reboot (drain first).",
        REFS)

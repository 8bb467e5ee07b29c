"""Persistence: nvidia-persistenced running, or persistence mode on for every GPU.

Why: without either, the driver tears the GPUs down when the last client closes them and
initialises them again on the next open. Every container start then pays the init (seconds
per GPU on large boards), and nvidia-container-cli fails with "driver rpc error: timed out"
under load. The daemon counts only when it runs where this node's driver lives -- the host, the
driver root host.layout resolved (GKE's installer directory, Talos's extension service, the GPU
Operator's driver container) -- decided by its root, not its name: a tenant can name any
process nvidia-persistenced (daemons.of_driver).
"""
from __future__ import annotations

from node_probe.checks import _gpufacts
from node_probe.engine.registry import check
from node_probe.host import daemons
from node_probe.protocol import catalog

DAEMON = "nvidia-persistenced"   # its binary, and on Talos its extension service's name
REFS = ("https://docs.nvidia.com/deploy/driver-persistence/index.html",
        "https://github.com/NVIDIA/nvidia-container-toolkit/issues/202",
        "https://github.com/NVIDIA/nvidia-docker/issues/1648")


@check("persistence", title="Persistence: nvidia-persistenced or persistence mode",
       timeout_s=14.0, needs=(_gpufacts.NVML,))
def persistence_check(ctx):
    nv = _gpufacts.nvml_or_skip(ctx)
    gpus = [g for g in nv.get("gpus") or () if "persistence_mode" in g]
    off = [g for g in gpus if not g["persistence_mode"]]
    if not off:
        return
    named = daemons.find((DAEMON,), ctx.options.proc_root)
    theirs, roots = daemons.of_driver(named, ctx.options.proc_root, ctx.options.host_root,
                                      service=DAEMON)
    if theirs:
        return
    yield catalog.make(
        "persistence.off", "warning", "node",
        f"Persistence is off on {len(off)} of {len(gpus)} GPU(s) and nvidia-persistenced is "
        "not running: the driver re-initialises the GPUs on every container start",
        {"gpus_persistence_off": [{"uuid": g.get("uuid"), "pci_bus_id": g.get("pci_bus_id")}
                                  for g in off],
         "gpus": len(gpus), "nvidia_persistenced_pids": [],
         # processes of that name in a container: not the driver's daemon
         "not_host_pids": [d.pid for d in named],
         # where the daemon would have counted (host paths; "/" = the host)
         "daemon_roots": ["/" + r for r in roots]},
        "Run nvidia-persistenced on the host (`systemctl enable --now nvidia-persistenced`; the "
        "GPU Operator's driver container runs it) rather than `nvidia-smi -pm 1`, which NVIDIA "
        "deprecates. Expect slow container starts and `nvidia-container-cli: driver rpc "
        "error: timed out` until it runs.",
        REFS)

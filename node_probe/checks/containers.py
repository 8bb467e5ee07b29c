"""The kubelet's containers on this node, with their pids, names and GPUs: the "containers" fact.

Why its own check: the device-cgroup audit, the HAMi check and the eBPF verdicts all need to name
the pod and container behind a cgroup or a pid. When discovery was a side effect of the cgroup
audit, `--only hami` silently ran without containers; as a producer it is pulled into any run
whose checks `need` it. No findings of its own: it looks, and says it could not look when the
node has no devices (v1) or unified (v2) cgroup hierarchy.
"""
from __future__ import annotations

import dataclasses

from node_probe.engine.facts import CONTAINERS, PODRESOURCES, ContainerList
from node_probe.engine.registry import check
from node_probe.host import containers, device_checkpoint, podnames

PODRESOURCES_WAIT_S = 1.0


@check("containers", title="Containers: kubelet containers from their cgroups, with GPUs",
       timeout_s=10.0, provides=(CONTAINERS,), uses=(PODRESOURCES,))
def containers_check(ctx):
    opts = ctx.options
    entries = device_checkpoint.load(opts.kubelet_path)
    ckpt = device_checkpoint.index(entries)
    gpu_pods = {e.pod_uid for e in entries or ()
                if e.resource.startswith(containers.GPU_RESOURCE_PREFIXES)}

    def want_meta(ref, env) -> bool:
        # names are needed to join pod-resources; with the kubelet checkpoint readable, only
        # its GPU pods (and containers with NVIDIA_* in their environment) can be GPU ones
        return entries is None or ref.pod_uid in gpu_pods or \
            any(k.startswith("NVIDIA_") for k in env)

    h, found = containers.discover(opts.cgroup_dir, opts.host_root, opts.proc_root,
                                   opts.focus_pods, want_meta)
    # pod-resources rows, if the deviceplugin check is running and answers soon (it queries
    # the kubelet first thing); else the checkpoint and the environment decide
    podres = ctx.fact(PODRESOURCES, timeout=min(PODRESOURCES_WAIT_S,
                                                max(0.0, ctx.remaining() - 1.0)), default=None)
    # names the runtime's bundle did not give: the kubelet's own mounts and records
    uid_names = podnames.pods_by_uid(entries, podres)
    found = [c if (c.meta.get("pod") and c.meta.get("container")) or not want_meta(c.ref, c.env)
             else dataclasses.replace(c, meta=podnames.fill(c.meta, c.ref.pod_uid, c.pids,
                                                            uid_names, opts.proc_root))
             for c in found]
    idx = containers.podresources_index(podres) if podres is not None else None
    items = tuple(containers.assign_gpus(c, idx, ckpt) for c in found)
    ctx.publish(CONTAINERS, ContainerList(h, items))
    if h is None:
        ctx.skip(f"no devices (v1) or unified (v2) cgroup hierarchy under {opts.cgroup_dir}")
    ctx.progress(message=f"cgroup v{h.version} at {h.root}: {len(items)} containers, "
                         f"{sum(1 for c in items if c.is_gpu)} with GPUs")


def containers_or_skip(ctx) -> ContainerList:
    """The containers fact for a check that cannot judge without it: ends the calling check as
    `skipped` with the reason when the list did not come or the node has no cgroup hierarchy."""
    found = ctx.fact(CONTAINERS, timeout=ctx.budget(ctx.options.timeout_s, reserve=1.0),
                     default=None)
    if found is None:
        ctx.skip("the container list did not come (containers check failed or timed out)")
    if found.hierarchy is None:
        ctx.skip(f"no devices (v1) or unified (v2) cgroup hierarchy under "
                 f"{ctx.options.cgroup_dir}")
    return found

"""The kubelet's containers on this node, with their pids, names and GPUs: the "containers" fact.

Why its own check: the device-cgroup audit, the HAMi check and the eBPF verdicts all need to name
the pod and container behind a cgroup or a pid. When discovery was a side effect of the cgroup
audit, `--only hami` silently ran without containers; as a producer it is pulled into any run
whose checks `need` it. No findings of its own: it looks, and says it could not look when the
node has no devices (v1) or unified (v2) cgroup hierarchy.

A pod that just started (`pod Y` right after it was created) may have its containers running
before the kubelet's pod-resources List names them; with no checkpoint entry and no NVIDIA_*
environment (CDI, volume-mounts) such a container would look GPU-less and the audit would say
nothing. So for --focus-pod containers that no source gives a GPU yet, pod-resources is asked
again, a few times, for at most RELIST_WAIT_S.
"""
from __future__ import annotations

import dataclasses
import time

from node_probe.engine.facts import CONTAINERS, PODRESOURCES, ContainerList
from node_probe.engine.registry import check
from node_probe.host import containers, device_checkpoint, layout, podnames

PODRESOURCES_WAIT_S = 1.0
RELIST_WAIT_S = 3.0
RELIST_EVERY_S = 0.25
RELIST_DEADLINE_S = 1.0      # one List call


def _unlisted(items, podres) -> set[tuple]:
    """(namespace, pod, container) of named app containers with no GPU from any source that
    pod-resources does not list (yet)."""
    listed = {(r.get("namespace"), r.get("pod"), r.get("container")) for r in podres or ()}
    out = set()
    for c in items:
        m = c.meta
        if c.is_gpu or not (m.get("pod") and m.get("container")) or \
                m.get("container_type") in ("sandbox", "podsandbox"):
            continue
        key = (m.get("namespace"), m["pod"], m["container"])
        if key not in listed:
            out.add(key)
    return out


def _relist(ctx, kubelet_dir, want: set[tuple], podres):
    """Ask pod-resources again until it lists `want` or RELIST_WAIT_S pass; the last rows."""
    from node_probe.deviceplugin import podresources
    path = podresources.socket_path(kubelet_dir)
    if not path.is_socket():
        return podres
    end = time.monotonic() + min(RELIST_WAIT_S, max(0.0, ctx.remaining() - 2.0))
    tries = 0
    while time.monotonic() < end and not ctx.cancelled.is_set():
        tries += 1
        try:
            lst, _alloc = podresources.query(path, min(RELIST_DEADLINE_S,
                                                       max(0.1, end - time.monotonic())))
        except Exception as exc:   # grpc missing or broken: keep what we had
            ctx.log("info", f"pod-resources re-list failed: {type(exc).__name__}: {exc}",
                    check="containers")
            return podres
        if lst.ok:
            podres = lst.value
            listed = {(r.get("namespace"), r.get("pod"), r.get("container")) for r in podres}
            if want <= listed:
                ctx.log("info", f"pod-resources listed the focused pod's containers after "
                                f"{tries} re-list(s)", check="containers")
                return podres
        time.sleep(RELIST_EVERY_S)
    ctx.log("info", f"pod-resources did not list {len(want)} focused container(s) within "
                    f"{RELIST_WAIT_S:.0f}s: GPUs decided from the checkpoint and environment",
            check="containers")
    return podres


@check("containers", title="Containers: kubelet containers from their cgroups, with GPUs",
       timeout_s=10.0, provides=(CONTAINERS,), uses=(PODRESOURCES,))
def containers_check(ctx):
    opts = ctx.options
    got, unreadable = device_checkpoint.state(opts.kubelet_path)
    entries = None if got is None else got[0]
    if unreadable:   # GPUs come from pod-resources and the environment: said, not hidden
        ctx.log("warning", f"{unreadable}: each container's GPUs come from pod-resources or "
                           f"its environment only", check="containers")
    ckpt = device_checkpoint.index(entries)
    gpu_pods = {e.pod_uid for e in entries or ()
                if e.resource.startswith(containers.GPU_RESOURCE_PREFIXES)}

    def want_meta(ref, env) -> bool:
        # names are needed to join pod-resources; with the kubelet checkpoint readable, only
        # its GPU pods (and containers with NVIDIA_* in their environment) can be GPU ones
        return entries is None or ref.pod_uid in gpu_pods or \
            any(k.startswith("NVIDIA_") for k in env)

    runtime = layout.runtime(opts.host_root, opts.proc_root)   # where its OCI bundles are
    h, found = containers.discover(opts.cgroup_dir, opts.host_root, opts.proc_root,
                                   opts.focus_pods, want_meta, runtime.bundle_configs())
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
    want = _unlisted(items, podres) if opts.focus_pods else set()
    if want:
        podres = _relist(ctx, opts.kubelet_path, want, podres)
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

"""GPU isolation: containers hold open only the GPUs the kubelet gave them.

Why: in a multi-tenant cluster a container can reach GPUs it was never allocated:
NVIDIA_VISIBLE_DEVICES=all baked into CUDA images under a default NVIDIA runtime, privileged
pods, a hostPath /dev. The scheduler and the kubelet still count those GPUs as free and hand
them to someone else, whose job then shares memory and compute with a stranger (or fails with
out-of-memory). The kubelet's pod-resources API (else its device checkpoint) says what each
container was given; /proc/PID/fd says what its processes hold (host.gpu_holders). Two pods
given the same whole GPU that is not shared (no time-slicing replicas, no MIG) is the other
breach: a double allocation.

Cost: ~4-5 us of CPU per descriptor read (bench/isolation_scan.py). The watching agent caps the
descriptors one run may read (options.isolation_max_fds) and paces its runs by the CPU this
scan reports (watch/detect.IsolationPacer); containers left unread are said, never judged
absent.

GPU node agents (device plugin, DCGM, persistenced, MPS, feature discovery) hold GPUs without an
allocation by design. They are told apart by what the node knows and a tenant cannot set, never
by anything a tenant controls (its process name, argv, pod name, labels, image or environment:
round-4 audit I-01, a process calling itself `nvidia-smi` hid a breach):
- the container serves a device-plugin socket in the kubelet's device-plugins directory (matched
  by the socket's inode, deviceplugin.discovery), or
- its pod runs in a namespace the operator trusts (`--trusted-namespace`, repeatable, else
  GPU_DOCTOR_TRUSTED_NAMESPACES, comma-separated, else TRUSTED_NAMESPACES: the GPU Operator's
  (`gpu-operator`, OpenShift's `nvidia-gpu-operator`), `kube-system` and gpu-doctor's own). The
  namespace comes from the runtime's bundle, written from the kubelet's request: creating a pod
  there takes the API's permission, not a process's say-so.
Host processes (nvidia-smi run on the host) are in no pod's cgroup and never scanned. Each
exempted container and why is in the check's progress record (`exempt`).
"""
from __future__ import annotations

import dataclasses
import os
import time

from node_probe.engine.facts import CONTAINERS, DEVICEPLUGIN_TARGETS, NVML, PODRESOURCES
from node_probe.engine.registry import check
from node_probe.host import containers, device_checkpoint, gpu_holders, layout, nvidia_devices
from node_probe.protocol import catalog

from .containers import containers_or_skip

# namespaces whose pods hold GPUs by design: the GPU Operator's (docs.nvidia.com/datacenter/
# cloud-native/gpu-operator/latest/getting-started.html; OpenShift: nvidia-gpu-operator), the
# device plugin's static manifest's (kube-system) and gpu-doctor's own probe namespace
TRUSTED_NAMESPACES = ("gpu-operator", "nvidia-gpu-operator", "kube-system", "gpu-doctor")
TRUSTED_ENV = "GPU_DOCTOR_TRUSTED_NAMESPACES"
TIMEOUT_S = 10.0
SCAN_RESERVE_S = 1.0     # left after the fd scan, for the verdicts and the summary
SHARED_SUFFIX = ".shared"   # renameByDefault: nvidia.com/gpu.shared
REFS = ("https://github.com/NVIDIA/k8s-device-plugin#shared-access-to-gpus",
        "https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/docker-specialized.html",
        "https://kubernetes.io/docs/concepts/extend-kubernetes/compute-storage-net/device-plugins/#monitoring-device-plugin-resources")


def trusted_namespaces(opts, environ=None) -> tuple[tuple[str, ...], str]:
    """(namespaces whose pods may hold GPUs unallocated, where that list came from)."""
    if opts.trusted_namespaces is not None:
        return tuple(opts.trusted_namespaces), "--trusted-namespace"
    env = (os.environ if environ is None else environ).get(TRUSTED_ENV)
    if env is not None:
        return tuple(n for n in (x.strip() for x in env.split(",")) if n), f"${TRUSTED_ENV}"
    return TRUSTED_NAMESPACES, "the default list"


def _plugin_containers(targets, proc) -> dict[str, str]:
    """container id -> the device-plugin socket its process serves (matched by inode)."""
    out: dict[str, str] = {}
    for t in targets or ():
        if t.pid:
            ref = containers.pod_of_pid(t.pid, proc)
            if ref is not None:
                out.setdefault(ref.container_id, t.socket)
    return out


def _exempt_why(c, plugins: dict[str, str], trusted: tuple[str, ...],
                source: str) -> str | None:
    """Why this container may hold GPUs it was not given, from what a tenant cannot set: the
    socket it serves, the namespace the runtime recorded for its pod (never a name it chose)."""
    sock = plugins.get(c.ref.container_id)
    if sock:
        return f"it serves the device-plugin socket {sock} (matched by inode)"
    namespace = c.meta.get("namespace")
    if namespace and namespace in trusted:
        return f"its pod's namespace {namespace} is trusted ({source})"
    return None


def _given(c, source: str) -> list[str]:
    """Device ids the kubelet allocated to container `c` (never its environment)."""
    return list(c.gpu_ids) if c.gpu_source == source else []


def _gpu_of(dev_id: str, inv: nvidia_devices.Inventory) -> tuple[str, bool]:
    """(parent GPU uuid, shared) of an allocated device id: time-slicing replicas are
    `GPU-...::N`, MIG devices `MIG-...` (their parent GPU is split by design)."""
    base, sep, _ = dev_id.partition("::")
    if base.upper().startswith("MIG-"):
        p = inv.mig_parent(base)
        return (p[0].uuid if p and p[0].uuid else base), True
    return base, bool(sep)


@check("gpu.isolation", title="GPU isolation: containers use only the GPUs they were given",
       timeout_s=TIMEOUT_S, needs=(CONTAINERS,), uses=(PODRESOURCES, NVML, DEVICEPLUGIN_TARGETS))
def gpu_isolation(ctx):
    opts = ctx.options
    found = containers_or_skip(ctx)
    podres = ctx.fact(PODRESOURCES, timeout=min(2.0, max(0.0, ctx.remaining() - 2.0)),
                      default=None)
    ckpt, unreadable = (None, None) if podres is not None else \
        device_checkpoint.state(opts.kubelet_path)
    if podres is not None:
        source = "podresources"
    elif ckpt is not None:
        source = "checkpoint"
    else:
        ctx.skip("neither the kubelet's pod-resources API nor its device checkpoint could be "
                 "read: what each container was given is unknown"
                 + (f" ({unreadable})" if unreadable else ""))
    nvml = ctx.fact(NVML, timeout=min(1.0, max(0.0, ctx.remaining() - 2.0)), default=None)
    inv = nvidia_devices.inventory(opts.host_root, nvml.to_dict() if nvml else None)
    major = inv.majors.get("nvidia-frontend") or inv.majors.get("nvidia")
    if major is None:
        ctx.skip("no NVIDIA driver major in /proc/devices: no GPU device node to look for")
    by_minor = {g.minor: g for g in inv.gpus if g.minor is not None}
    mig_gpus = {g.uuid for g in inv.gpus if g.mig}
    shared_res = {str(r.get("resource")) for r in podres or ()
                  if str(r.get("resource", "")).endswith(SHARED_SUFFIX)}

    trusted, trusted_from = trusted_namespaces(opts)
    plugins = _plugin_containers(
        ctx.fact(DEVICEPLUGIN_TARGETS, timeout=min(1.0, max(0.0, ctx.remaining() - 2.0)),
                 default=None), opts.proc_root)
    me = os.getpid()
    cpu0 = time.thread_time()
    # the scan stops (and says so) before this check's deadline, never past it
    budget = gpu_holders.Budget(opts.isolation_max_fds or None,
                                min(ctx.started + TIMEOUT_S, ctx.run_deadline) - SCAN_RESERVE_S)
    rows = []        # (container, holders, given uuids)
    given_to: dict[str, list] = {}   # GPU uuid -> containers given it whole
    shared: set[str] = set(mig_gpus)
    exempt = []      # {"subject", "why"}
    unscanned = []   # {"subject", "processes": cuts}: read in part or not at all
    bundles = None
    for c in found:
        if me in c.pids:
            continue      # this probe and its NVML child
        if budget.exhausted:
            unscanned.append({"subject": c.subject, "why": budget.why})
            continue
        given = set()
        for dev in _given(c, source):
            uuid, is_shared = _gpu_of(dev, inv)
            given.add(uuid)
            if is_shared or any(r in shared_res for r in c.gpu_resources):
                shared.add(uuid)
            else:
                given_to.setdefault(uuid, []).append(c)
        # every process of the container (Container.pids stops at containers.MAX_PIDS)
        pids = containers.read_pids(c.cgroup_path, gpu_holders.MAX_PIDS + 1) or c.pids
        scan = gpu_holders.scan(pids, major, opts.proc_root, budget=budget)
        if not scan.complete:
            unscanned.append({"subject": c.subject,
                              "processes": [x.to_dict() for x in scan.cuts[:5]]})
        hs = list(scan.holders)
        if hs and not c.meta.get("namespace"):
            if bundles is None:   # names were read for GPU candidates only: read this one's
                bundles = layout.runtime(opts.host_root, opts.proc_root).bundle_configs()
            c = dataclasses.replace(c, meta={**containers.read_bundle_meta(
                opts.host_root, c.ref.container_id, bundles), **c.meta})
        why = _exempt_why(c, plugins, trusted, trusted_from) if hs else None
        if why:
            exempt.append({"subject": c.subject, "why": why})
            continue
        if hs or given:
            rows.append((c, hs, given))
    ctx.progress(message=f"GPU device holders: {sum(len(h) for _, h, _ in rows)} open GPU node(s) "
                         f"in {len(rows)} container(s); exempt (GPU agents by identity): "
                         f"{[e['subject'] for e in exempt[:10]]}"
                         + (f"; {len(unscanned)} container(s) not scanned (fully)"
                            if unscanned else ""),
                 exempt=exempt[:50], trusted_namespaces=list(trusted),
                 trusted_namespaces_from=trusted_from, not_scanned=unscanned[:50],
                 isolation_scan_cpu_s=round(time.thread_time() - cpu0, 4),
                 isolation_fds_read=budget.read)

    def gpu_label(minor: int) -> tuple[str | None, str]:
        g = by_minor.get(minor)
        uuid = g.uuid if g else None
        return uuid, f"/dev/nvidia{minor}" + (f" ({uuid})" if uuid else "")

    holders_of: dict[str | int, list] = {}
    for c, hs, _ in rows:
        for h in hs:
            uuid, _ = gpu_label(h.minor)
            holders_of.setdefault(uuid or h.minor, []).append((c, h))

    for c, hs, given in rows:
        extra = [h for h in hs if (gpu_label(h.minor)[0] or f"minor{h.minor}") not in given]
        if not extra:
            continue
        gpus = sorted({gpu_label(h.minor)[1] for h in extra})
        procs = sorted({f"{h.pid} ({h.comm})" for h in extra})
        others = sorted({o.subject for h in extra
                         for o, _ in holders_of.get(gpu_label(h.minor)[0] or h.minor, ())
                         if o is not c})
        yield catalog.make(
            "gpu.isolation_breach", "critical", c.subject,
            f"Container {c.container_label} in pod {c.pod_label} uses GPU(s) it was not given: "
            f"{', '.join(gpus)} held open by {', '.join(procs)}",
            {"kind": "not_allocated", "namespace": c.meta.get("namespace"),
             "pod": c.meta.get("pod"), "container": c.meta.get("container"),
             "pod_uid": c.ref.pod_uid, "container_id": c.ref.container_id,
             "processes": [{"pid": h.pid, "comm": h.comm, "device": h.path,
                            "gpu_uuid": gpu_label(h.minor)[0]} for h in extra],
             "gpus_held": gpus, "gpus_given": sorted(given), "allocation_source": source,
             "nvidia_visible_devices": c.env.get("NVIDIA_VISIBLE_DEVICES"),
             "other_pods_on_these_gpus": others},
            "This container reaches GPUs the kubelet still counts as free or as another pod's: "
            "an isolation breach. Usual causes: the image sets NVIDIA_VISIBLE_DEVICES=all and "
            "the node's default runtime is nvidia (set the device plugin's "
            "deviceListStrategy to volume-mounts or cdi-annotations and "
            "accept-nvidia-visible-devices-envvar-when-unprivileged=false in the NVIDIA "
            "container toolkit config), a privileged pod, or a hostPath /dev. Stop the pod "
            "(kubectl delete pod), then fix its spec or the runtime config; deny privileged and "
            "hostPath in tenant namespaces (Pod Security Admission 'baseline').",
            REFS)

    for uuid, cs in given_to.items():
        pods = {c.ref.pod_uid: c for c in cs}
        if uuid in shared or len(pods) < 2:
            continue
        names = sorted(c.subject for c in pods.values())
        yield catalog.make(
            "gpu.isolation_breach", "critical", f"gpu {uuid}",
            f"GPU {uuid} is given whole to {len(pods)} pods although it is not shared "
            f"(no time-slicing replicas, no MIG): {'; '.join(names)}",
            {"kind": "two_pods_unshared", "gpu_uuid": uuid, "containers": names,
             "pod_uids": sorted(pods), "allocation_source": source},
            "The kubelet handed one whole GPU to two pods: its device state disagrees with the "
            "pods' (often after a kubelet restart with a stale device checkpoint). Delete one "
            "of the pods so it is rescheduled; if it repeats, drain the node and restart the "
            "kubelet and the device plugin.",
            REFS)
    if unscanned:
        first = unscanned[0]
        what = "; ".join(f"pid {p['pid']} ({p['comm']}): {p['fds_read']} descriptors read, "
                         f"stopped by {p['why']}" for p in first.get("processes", ())[:2]) \
            or f"stopped by {first['why']}"
        ctx.skip(f"{len(unscanned)} container(s) were not scanned fully, so a breach there may be "
                 f"missed (first: {first['subject']}: {what}): only what was read was judged")

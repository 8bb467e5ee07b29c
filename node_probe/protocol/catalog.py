"""The finding catalog: every finding id the tool can emit, in one list (DESIGN.md section 6).

Why: bots key on these ids, so they are stable (add, never rename) and each has a doc page at
docs/findings/<id>.md (cause, evidence, fix, refs). `Finding`s are built through `make()` so an
id that is not in the catalog fails loudly in tests instead of silently reaching users.
"""
from __future__ import annotations

from typing import Any, Mapping

from node_probe.protocol import Finding, Severity

# id -> one-line meaning (the doc page has the rest)
CATALOG: dict[str, str] = {
    # NVML / driver / GPU health (node)
    "nvml.unavailable": "No NVIDIA driver library on this host, so NVML cannot be queried",
    "nvml.init_hang": "nvmlInit did not return within its deadline",
    "nvml.init_error": "nvmlInit returned an error",
    "nvml.inventory": "Driver, CUDA and GPU inventory as NVML reports it",
    "driver.known_bad": "The driver version has a known node-level failure under this node's conditions",
    "driver.version_mismatch": "Kernel module and user-space driver library versions differ",
    "gpu.xid": "The kernel log has NVIDIA Xid errors",
    "gpu.health": "A GPU reports uncorrected ECC errors",
    "gpu.row_remap_pending": "A GPU has a memory row remapping waiting for a GPU reset while it still looks healthy",
    "gpu.row_remap_failed": "A GPU's memory row remapping failed: the GPU must be replaced",
    "mig.layout": "MIG mode and instances; mixed MIG and full GPUs on one node",
    # slow GPUs: degradations that raise no Xid (checks/slow)
    "gpu.pcie_downtrained": "A busy GPU's PCIe link runs below the generation, or any GPU's below the width, that GPU and slot support",
    "gpu.clocks_throttled": "A busy GPU's clocks are held down by thermal, power or hardware slowdown",
    "gpu.nvlink_degraded": "A GPU has fewer NVLink links active than its peers, or NVLink error counters",
    "gpu.memory_degrading": "A GPU has memory pages pending retirement or corrected ECC errors rising fast",
    "pod.numa_misplaced": "A pod's CPUs sit on another NUMA node than its GPU",
    "gpu.time_shared": "Several pods share one GPU (time-slicing or MPS), each with its share",
    # a multi-node job held up: what names the node the others wait for (checks/collective.py,
    # ib_ports.py, gpu_dstate.py)
    "gpu.collective_spin": "A GPU at ~100 % utilisation drawing little power with its clocks up: looks like a kernel spinning in a collective, waiting for a peer",
    "gpu.collective_idle_peer": "One GPU of a pod is idle while the pod's other GPUs spin in a collective: its rank is likely the one they wait for",
    "net.ib_port_down": "An InfiniBand/RoCE port is not ACTIVE where the node's other ports are (or none is)",
    "process.gpu_d_state": "A process holding a GPU has threads stuck in uninterruptible sleep (D state)",
    "kernel.hung_task": "The kernel reported tasks blocked for a long time",
    "gpu.driver_error": "The NVIDIA driver reports a GPU failure without an Xid number (off the bus, GSP timeout, init failure, reset required)",
    "gpu.driver_message": "NVIDIA driver error lines the tool does not recognise (shown, not judged)",
    "nvswitch.sxid": "The kernel log has NVSwitch SXid errors (the NVLink fabric's switches)",
    "gpu.pcie_aer": "PCIe AER errors on a GPU's link (corrected, non-fatal, fatal: a GPU gone from the bus)",
    "kernel.lockup": "A soft/hard lockup, RCU stall or kernel BUG in the NVIDIA driver or a GPU process",
    # device plugin (node)
    "deviceplugin.missing": "No device plugin serves nvidia.com resources on a node with GPUs",
    "deviceplugin.rpc_timeout": "A device plugin RPC did not answer within its deadline",
    "deviceplugin.unhealthy": "The device plugin reports devices as Unhealthy",
    "deviceplugin.checkpoint_mismatch": "The kubelet's device checkpoint gives containers devices the plugin no longer advertises",
    "deviceplugin.unhealthy_stale": "The device plugin still reports devices Unhealthy that NVML reports fine now (the plugin never re-checks)",
    "deviceplugin.blocked_in_nvml": "The device plugin is blocked inside NVML",
    "deviceplugin.stale_dev_view": "The device plugin's /dev lacks device nodes the host has",
    "deviceplugin.no_device_specs": "The NVIDIA device plugin does not pass device specs",
    "deviceplugin.inventory": "Device plugins found on the node and what they serve",
    "sharing.misconfigured": "The device plugin's GPU sharing config (time-slicing/MPS replicas, renameByDefault) disagrees with what the node advertises",
    "sharing.mps_daemon_missing": "GPUs are shared with MPS but no MPS control daemon runs on the node",
    # cgroups / containers (node)
    "cgroup.device_denied": "A GPU container's device cgroup denies a device it needs",
    "cgroup.device_rules_rewritten": "A GPU container's device rules were rewritten without its NVIDIA devices",
    "cgroup.dev_char_symlinks_missing": "/dev/char symlinks for NVIDIA devices are missing on a systemd-driver node",
    "gpu.isolation_breach": "A container holds GPUs it was not given, or one unshared GPU is given to two pods",
    "container.nvidia_eperm": "Opens of /dev/nvidia* failed with EPERM",
    "ioctl.stall": "An ioctl on /dev/nvidia* has not returned for a long time",
    "cuda.call_failed": "CUDA driver calls (init, context, memory) of a process returned errors",
    # kubelet (API side and node side)
    "kubelet.admission_stalled": "Pods bound to the node get no kubelet action while the node looks Ready",
    "kubelet.blocked_in_device_plugin": "kubelet goroutines are parked in device plugin calls",
    "kubelet.goroutines_unavailable": "The kubelet goroutine dump could not be read",
    "kubelet.cpu_manager_static": "kubelet runs cpuManagerPolicy static, which rewrites device cgroups",
    "kubelet.config": "kubelet configuration relevant to GPUs",
    "kubelet.down": "The kubelet is not running while device plugins on the node are",
    "node.gpu_capacity_mismatch": "GPU capacity and allocatable differ",
    "node.not_found": "The node does not exist",
    "node.not_kubernetes": "This host runs no kubelet: not a Kubernetes node",
    "node.not_ready": "The node is NotReady: its kubelet does not run new pods",
    "node.foreign_condition": "Another health monitor (node-problem-detector, NVSentinel, EKS, GKE, AKS, a device plugin) flags the node",
    "node.gpu_black_hole": "A Ready, schedulable node fails or rejects the GPU pods sent to it",
    # jobs (API side, `job NAME`: the nodes and ranks of one job compared)
    "job.node_differs": "One node of a multi-node job differs from its siblings (its findings)",
    "job.node_fewer_gpus": "One node of a multi-node job has fewer allocatable GPUs than its siblings",
    "job.node_missing": "Pods of a multi-node job are bound to a node that is not in the node list (deleted)",
    "job.rank_crashloop": "A rank (pod) of a multi-node job is in CrashLoopBackOff",
    "job.rank_restarts": "A rank of a multi-node job restarted far more often than the others",
    "job.rank_replaced": "A rank of a multi-node job was re-created long after the others",
    "job.rank_late_start": "A rank of a multi-node job started long after the others",
    # pods (API side)
    "pod.pending_explained": "Why the pod is not running, from its events and conditions",
    "pod.admission_error": "The kubelet rejected the pod at admission",
    "pod.gpu_never_fits": "The pod asks for more GPUs than any node has, or a GPU resource no node offers",
    "pod.gpu_devices_missing": "Nodes big enough for the pod have too few allocatable GPUs (plugin gone or devices unhealthy)",
    "pod.gpu_held_by_others": "Nodes that could take the pod have their GPUs held by other pods",
    "pod.gpu_placement_excluded": "Nodes with enough GPUs are excluded by taints, selectors, affinity, cordon or NotReady",
    "pod.gpu_quota_exhausted": "The namespace ResourceQuota on a GPU resource is used up",
    "pod.gpu_start_failed": "A GPU container cannot start: the container runtime's message names a node fault",
    "probe.pod_not_started": "The debug pod did not start on the node (a consequence, not the cause)",
    # memory
    "memory.pressure": "Memory or IO pressure on the node; binary page-cache thrash",
    "memory.overcommit": "Pod memory limits leave too little for system daemons",
    # HAMi
    "hami.handshake_stale": "HAMi node handshake is stale",
    "hami.lock_stale": "HAMi node lock is held too long or by a pod that is gone",
    "hami.register_invalid": "HAMi node device registration is invalid",
    "hami.isolation_missing": "HAMi vGPU isolation (libvgpu.so preload) is missing in a container",
    "hami.allocation_mismatch": "HAMi pod device annotations disagree",
    "hami.plugin_log_error": "The HAMi device plugin log has known error patterns",
    "hami.filter_failed": "The HAMi scheduler filtered out every node for a GPU pod, and why per node",
    # the probe itself
    "probe.ebpf_unavailable": "eBPF tracing could not run; other checks still ran",
    "probe.driver_not_seen": "The API says the node has GPUs, but the node probe found no "
                             "NVIDIA driver: the GPU checks could not look",
    # beyond the seed incidents (issue 15)
    "fabric.not_ready": "NVSwitch fabric not ready: fabric manager not running, wrong version, or GPUs not registered",
    "persistence.off": "Neither nvidia-persistenced nor persistence mode keeps the driver initialised",
    "gpu.lost": "A GPU fell off the bus or is lost to NVML (Xid 79, GPU_IS_LOST, missing from NVML)",
    "gpu.memory_orphaned": "GPU memory held by processes that are gone or in no live pod, or by no process",
    "mig.mode_pending": "A GPU's pending MIG mode differs from its current mode (reset or reboot needed)",
    "runtime.handler_missing": "The container runtime has no handler for the nvidia runtime class",
    "runtime.not_wired": "A GPU container was never given its NVIDIA devices: the runtime is not wired for GPUs",
    "cdi.spec_version_mismatch": "CDI specs name driver files of another version than the loaded driver",
    "dra.plugins": "kubelet DRA plugins registered on the node and what they answer",
    "dra.plugin_unresponsive": "A kubelet DRA plugin does not answer its registration or service socket",
    "mig.config_failed": "The MIG manager's node label says the MIG reconfiguration failed or is stuck pending",
    "runtime.class_missing": "A pod names a RuntimeClass that does not exist",
    "cdi.unresolvable_devices": "The runtime could not resolve the CDI devices a pod was given",
    "dra.claim_unallocated": "A pod waits on ResourceClaims that are not allocated, and why",
    "dra.device_unhealthy": "Pod status reports allocated devices as unhealthy",
    "dra.driver_not_registered": "The kubelet has no registered kubelet plugin for a DRA driver a pod's claims need",
    "dra.prepare_failed": "A DRA driver's kubelet plugin refuses to prepare a claim's devices, and why",
    # the watching agent (issue 23), read from the node's conditions
    "agent.problem_seen": "The watching agent marks this node with a problem, now or within the last hour",
    "kubelet.blocked_in_dra_plugin": "kubelet goroutines are parked in DRA NodePrepareResources calls",
    # the watching agent's node conditions, read by `nodes` (issue 23)
    "agent.heartbeat_stale": "The node's gpu-doctor agent stopped refreshing its node conditions",
    "agent.condition": "The gpu-doctor agent marks the node with a problem this client does not know",
    # queueing systems and other schedulers holding a Pending GPU pod (issue 32)
    "kueue.not_admitted": "Kueue has not admitted the pod's Workload: quota, queue or admission checks",
    "volcano.podgroup_pending": "Volcano has not enqueued the pod's PodGroup, or cannot place its gang",
    "kai.podgroup_unschedulable": "The KAI scheduler says why the pod's PodGroup cannot be scheduled",
}


class UnknownFindingId(KeyError):
    pass


def make(id: str, severity: Severity | str, subject: str, title: str,
         evidence: Mapping[str, Any] | None = None, remediation: str = "",
         refs: tuple[str, ...] | list[str] = (), quoted: Any = ()) -> Finding:
    """Build a Finding whose id must be in the catalog. `quoted`: protocol.quote() entries,
    the text others wrote that the finding shows as data (never in `title`)."""
    if id not in CATALOG:
        raise UnknownFindingId(f"finding id {id!r} is not in node_probe/catalog.py")
    return Finding(id=id, severity=Severity(severity), subject=subject, title=title,
                   evidence=dict(evidence or {}), remediation=remediation, refs=tuple(refs),
                   quoted=tuple(quoted))


# Remediation is advice someone will follow. A record from a node (debug pod, agent) or a bundle
# is hostile input: its remediation is shown as gpu-doctor's only for a finding id of this
# catalog; any other id's remediation is shown as what the node said, never as ours.
NODE_REPORTED = "Reported by the node, not from gpu-doctor's catalog: "


def label_foreign_remediation(rec: Mapping[str, Any]) -> Mapping[str, Any]:
    """The finding record, with its remediation labelled as the node's when its id is not in
    the catalog (applied where node records and bundles are decoded, never by renderers)."""
    rem = rec.get("remediation")
    if not isinstance(rem, str) or not rem or rec.get("id") in CATALOG or \
            rem.startswith(NODE_REPORTED):
        return rec
    return {**rec, "remediation": NODE_REPORTED + rem}

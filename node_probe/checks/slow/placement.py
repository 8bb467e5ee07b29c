"""Placement that slows a pod: CPUs on another NUMA node than its GPU; a GPU shared by pods.

Why: a pod whose cpuset sits on socket 1 while its GPU hangs off socket 0 pays the socket
interconnect on every copy (the kubelet's topology manager aligns CPUs and devices only with
policy `restricted`/`single-numa-node`; `none` is the default). And a pod on a time-sliced or
MPS-shared GPU gets a share of it: "slow" is then its neighbours, and the verdict should say so.

Inputs are plain records, so the probe and any offline source judge alike:
  placements: [{"pod": "ns/name", "container": str, "cpus": [int], "gpus": [uuid]}]
  gpus: contract (a) GPU records (uuid, pci_bus_id, numa_node: int|None from sysfs)
  cpu_nodes: {cpu: NUMA node} (/sys/devices/system/node/node*/cpulist)
  kubelet: {"topologyManagerPolicy", "topologyManagerScope", "cpuManagerPolicy"} (any may be absent)
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from node_probe.checks.slow import _common
from node_probe.host.numa import parse_cpulist  # noqa: F401 (re-exported for offline sources)
from node_probe.protocol import Finding, catalog

NUMA_FID = "pod.numa_misplaced"
SHARED_FID = "gpu.time_shared"
NUMA_REFS = ("https://kubernetes.io/docs/tasks/administer-cluster/topology-manager/",
             "https://www.kernel.org/doc/Documentation/ABI/testing/sysfs-bus-pci")
SHARED_REFS = ("https://github.com/NVIDIA/k8s-device-plugin#shared-access-to-gpus-with-cuda-time-slicing",
               "https://docs.nvidia.com/deploy/mps/index.html")
MAX_CPUS_SHOWN = 64


def judge_numa(placements: Sequence[Mapping[str, Any]], gpus: Sequence[Mapping[str, Any]],
               cpu_nodes: Mapping[int, int], kubelet: Mapping[str, Any] | None = None
               ) -> list[Finding]:
    """pod.numa_misplaced: every CPU of the container is on another NUMA node than its GPU.
    Says nothing when a GPU's node is unknown (-1: a single-node machine) or CPUs span the
    GPU's node too."""
    by_uuid = {str(g.get("uuid")): g for g in gpus if g.get("uuid")}
    kubelet = kubelet or {}
    policy = kubelet.get("topologyManagerPolicy") or "none"
    out = []
    for p in placements:
        nodes = sorted({cpu_nodes[c] for c in p.get("cpus") or () if c in cpu_nodes})
        if not nodes:
            continue
        for uuid in p.get("gpus") or ():
            g = by_uuid.get(str(uuid).split("::")[0])
            gnode = None if g is None else _common.num(g.get("numa_node"))
            if gnode is None or gnode < 0 or gnode in nodes:
                continue
            cpus = list(p.get("cpus") or ())
            ev = {"pod": p.get("pod"), "container": p.get("container"), "gpu_uuid": g["uuid"],
                  "pci_bus_id": g.get("pci_bus_id"), "gpu_numa_node": int(gnode),
                  "cpu_numa_nodes": nodes, "cpus": cpus[:MAX_CPUS_SHOWN],
                  "cpu_count": len(cpus), "topology_manager_policy": policy,
                  "topology_manager_scope": kubelet.get("topologyManagerScope") or "container",
                  "cpu_manager_policy": kubelet.get("cpuManagerPolicy") or "none"}
            out.append(catalog.make(
                NUMA_FID, "warning", f"pod {p.get('pod')} container {p.get('container')}",
                f"{p.get('pod')}: CPUs on NUMA node {','.join(map(str, nodes))}, its "
                f"{_common.label(g)} on node {int(gnode)} (topology manager policy "
                f"{policy})", ev,
                "Every host<->GPU copy crosses the socket interconnect. Move the pod (delete "
                "it to reschedule) to a node whose kubelet aligns CPUs and GPUs: "
                "topologyManagerPolicy single-numa-node (or restricted) with cpuManagerPolicy "
                "static and a Guaranteed pod with integer CPUs.", NUMA_REFS))
    return out


def judge_sharing(g: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> list[Finding]:
    """gpu.time_shared (info) when two or more pods hold one GPU. pods: [{"pod": "ns/name",
    "containers": [str], "pids": [int]}]; each pod's memory share is what NVML's compute
    processes of its pids hold."""
    if len(pods) < 2:
        return []
    used = {int(p["pid"]): p.get("used_memory_bytes") for p in g.get("processes") or ()
            if _common.num(p.get("pid")) is not None}
    rows = []
    for p in pods:
        mem = [used[pid] for pid in p.get("pids") or () if pid in used]
        rows.append({"pod": p.get("pod"), "containers": list(p.get("containers") or ()),
                     "memory_used_bytes": (sum(m for m in mem if m) if mem else None),
                     "share": round(1 / len(pods), 3)})
    ev = {"uuid": g.get("uuid"), "pci_bus_id": g.get("pci_bus_id"), "pods": rows,
          "utilization_gpu_pct": g.get("utilization_gpu_pct")}
    names = ", ".join(str(r["pod"]) for r in rows[:4])
    return [catalog.make(
        SHARED_FID, "info", _common.subject(g),
        f"{_common.label(g)} is shared by {len(pods)} pods (time-slicing or MPS), each "
        f"getting about 1/{len(pods)}: {names}", ev,
        "Nothing to do if sharing is intended. A pod that needs the whole GPU should request "
        "an unshared GPU resource or run on a node whose device plugin does not share.",
        SHARED_REFS)]

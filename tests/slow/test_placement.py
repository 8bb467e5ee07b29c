"""Placement judges: a pod's cpuset on another NUMA node than its GPU; a GPU shared by pods.
Sources: the kubelet's topology manager aligns CPUs and devices only with the restricted and
single-numa-node policies; `none` is the default
(https://kubernetes.io/docs/tasks/administer-cluster/topology-manager/); the NVIDIA device
plugin's time-slicing hands out replicas `<uuid>::<n>`
(https://github.com/NVIDIA/k8s-device-plugin#shared-access-to-gpus-with-cuda-time-slicing)."""
from node_probe.checks.slow import placement

CPU_NODES = {**{c: 0 for c in range(0, 16)}, **{c: 1 for c in range(16, 32)}}
GPUS = [{"uuid": "GPU-a", "pci_bus_id": "00000000:3B:00.0", "index": 0, "numa_node": 0,
         "processes": [{"pid": 11, "used_memory_bytes": 3 << 30},
                       {"pid": 22, "used_memory_bytes": 1 << 30}]},
        {"uuid": "GPU-u", "pci_bus_id": "00000000:5E:00.0", "index": 1, "numa_node": None}]


def test_pod_on_the_gpus_node_raises_nothing():
    p = [{"pod": "ml/ok", "container": "main", "cpus": [2, 3], "gpus": ["GPU-a"]}]
    assert placement.judge_numa(p, GPUS, CPU_NODES, {"topologyManagerPolicy": "none"}) == []


def test_pod_spanning_both_nodes_and_unknown_gpu_node_raise_nothing():
    p = [{"pod": "ml/wide", "container": "main", "cpus": list(range(32)), "gpus": ["GPU-a"]},
         {"pod": "ml/u", "container": "main", "cpus": [20], "gpus": ["GPU-u"]}]
    assert placement.judge_numa(p, GPUS, CPU_NODES, {}) == []


def test_pod_on_the_other_socket_names_the_policy():
    p = [{"pod": "ml/far", "container": "main", "cpus": [16, 17], "gpus": ["GPU-a::3"]}]
    [f] = placement.judge_numa(p, GPUS, CPU_NODES, {"topologyManagerPolicy": "best-effort",
                                                    "cpuManagerPolicy": "static"})
    assert f.id == "pod.numa_misplaced" and f.evidence["gpu_numa_node"] == 0
    assert f.evidence["cpu_numa_nodes"] == [1]
    assert "topology manager policy best-effort" in f.title
    assert "Move the pod" in f.remediation


def test_one_pod_on_a_gpu_is_not_sharing():
    assert placement.judge_sharing(GPUS[0], [{"pod": "ml/a", "pids": [11]}]) == []


def test_two_pods_sharing_a_gpu_each_with_its_share():
    [f] = placement.judge_sharing(GPUS[0], [{"pod": "ml/a", "containers": ["c"], "pids": [11]},
                                            {"pod": "ml/b", "containers": ["c"], "pids": [22]}])
    assert f.id == "gpu.time_shared" and f.severity.value == "info"
    rows = {r["pod"]: r for r in f.evidence["pods"]}
    assert rows["ml/a"]["memory_used_bytes"] == 3 << 30 and rows["ml/b"]["share"] == 0.5

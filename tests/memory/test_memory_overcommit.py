"""memory.overcommit (API side) on realistic Node/Pod/configz objects, seed 004's numbers."""
from __future__ import annotations

import pytest

from kubectl_gpudoctor.analysis.resources import memory

GiB = 1 << 30


def node(cap="64956716Ki", alloc=None, name="gpu-7"):  # a "62 GiB" host as the kernel reports it
    alloc = alloc or cap
    return {"metadata": {"name": name},
            "status": {"capacity": {"memory": cap, "nvidia.com/gpu": "1"},
                       "allocatable": {"memory": alloc, "nvidia.com/gpu": "1"}}}


def pod(name, mem=None, gpu=False, phase="Running", init_mem=None, sidecar_mem=None, ns="ml"):
    lim = {}
    if mem is not None:
        lim["memory"] = mem
    if gpu:
        lim["nvidia.com/gpu"] = "1"
    spec = {"containers": [{"name": "main", "resources": {"limits": lim}}]}
    if init_mem is not None:
        spec["initContainers"] = [{"name": "init", "resources": {"limits": {"memory": init_mem}}}]
    if sidecar_mem is not None:
        spec.setdefault("initContainers", []).append(
            {"name": "side", "restartPolicy": "Always", "resources": {"limits": {"memory": sidecar_mem}}})
    return {"metadata": {"name": name, "namespace": ns}, "spec": spec, "status": {"phase": phase}}


NO_RESERVED = {"kubeletconfig": {"evictionHard": {"memory.available": "100Mi"}}}
PROTECTED = {"kubeletconfig": {"systemReserved": {"memory": "2Gi"}, "kubeReserved": {"memory": "1Gi"},
                               "evictionHard": {"memory.available": "5%"}}}


@pytest.mark.parametrize("text,value", [("64Gi", 64 * GiB), ("65536Ki", 64 << 20), ("1.5Gi", 1.5 * GiB),
                                        ("1G", 1e9), ("129e6", 129e6), ("100Mi", 100 << 20),
                                        ("500m", 0.5), ("12345", 12345.0), (1024, 1024.0)])
def test_memory_quantity(text, value):
    assert memory.to_float(text) == value


def test_memory_quantity_garbage():
    assert memory.to_float("lots") is None and memory.to_float(None) is None


def test_seed_004_gpu_pod_40g_on_62g_host_is_critical():
    (f,) = memory.analyze_node(node(), [pod("hostboom", "40Gi", gpu=True)], NO_RESERVED)
    assert f.id == "memory.overcommit" and f.severity.value == "critical"
    assert "ml/hostboom" in f.title and "no systemReserved/kubeReserved" in f.title
    assert "memory.available<100Mi" in f.title
    assert f.evidence["largest_limits"][0] == {"pod": "ml/hostboom", "limit_gib": 40.0, "gpu": True}
    assert "kubectl cordon gpu-7" in f.remediation and "risk" in f.remediation


def test_seed_004_20g_limit_is_fine():
    assert memory.analyze_node(node(), [pod("hostboom", "20Gi", gpu=True)], NO_RESERVED) == []


def test_same_pod_on_a_protected_node_is_a_warning():
    (f,) = memory.analyze_node(node(alloc="61810988Ki"), [pod("hostboom", "40Gi", gpu=True)], PROTECTED)
    assert f.severity.value == "warning" and f.evidence["unprotected"] is False


def test_single_cpu_pod_close_to_node_memory():
    (f,) = memory.analyze_node(node(), [pod("etl", "60Gi")], NO_RESERVED)
    assert f.severity.value == "critical" and "leaving 1.95 GiB" in f.title


def test_sum_of_limits_is_a_warning():
    pods = [pod(f"w{i}", "14Gi") for i in range(4)] + [pod("done", "30Gi", phase="Succeeded")]
    (f,) = memory.analyze_node(node(), pods, NO_RESERVED)
    assert f.severity.value == "warning" and "4 pods add up to 56.0 GiB" in f.title


def test_unlimited_pods_on_an_unprotected_node_are_info():
    (f,) = memory.analyze_node(node(), [pod("free-for-all"), pod("small", "1Gi")], NO_RESERVED)
    assert f.severity.value == "info" and f.evidence["pods_without_memory_limit"] == ["ml/free-for-all"]


def test_reservation_inferred_without_configz():
    # allocatable = capacity - 100Mi: nothing reserved besides the eviction threshold
    cap_kib = 64956716
    (f,) = memory.analyze_node(node(alloc=f"{cap_kib - 102400}Ki"),
                               [pod("hostboom", "40Gi", gpu=True)], None)
    assert f.severity.value == "critical" and f.evidence["kubelet_config_read"] is False
    # 4 GiB held back by the kubelet: not "no reserved"
    (g,) = memory.analyze_node(node(alloc=f"{cap_kib - 4 * 1048576}Ki"),
                               [pod("hostboom", "40Gi", gpu=True)], None)
    assert g.severity.value == "warning"


def test_effective_limit_counts_init_and_sidecars():
    assert memory.pod_memory_limit(pod("a", "1Gi", init_mem="3Gi")) == 3 * GiB
    assert memory.pod_memory_limit(pod("b", "1Gi", sidecar_mem="1Gi")) == 2 * GiB
    assert memory.pod_memory_limit(pod("c", "1Gi", init_mem="3Gi", sidecar_mem="1Gi")) == 4 * GiB
    assert memory.pod_memory_limit(pod("d")) is None


def test_percent_eviction_threshold():
    b, text = memory.eviction_threshold_bytes({"evictionHard": {"memory.available": "10%"}}, 100 * GiB)
    assert b == 10 * GiB and text == "10%"


def test_node_without_memory_capacity_is_skipped():
    assert memory.analyze_node({"metadata": {"name": "x"}, "status": {}}, [], None) == []

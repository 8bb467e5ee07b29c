"""gpu.slow's wiring from the containers fact (pod-resources device ids, cgroup paths) to the
judges: which pods hold each GPU (`UUID::n` time-slicing replicas fold onto the GPU), each
container's cpuset (cgroup v2 cpuset.cpus.effective; the cpuset twin of a v1 devices path).
The device ids are as the NVIDIA device plugin hands them to the kubelet: GPU UUIDs, and
`<uuid>::<n>` replicas under time-slicing (the plugin's README,
https://github.com/NVIDIA/k8s-device-plugin#shared-access-to-gpus-with-cuda-time-slicing;
node_probe/watch/detect.gpu_users folds them the same way)."""
from pathlib import Path

from node_probe.checks import slow_gpu
from node_probe.checks.slow import placement
from node_probe.engine.facts import ContainerList
from node_probe.host.containers import CgroupRef, Container, Hierarchy

GPU = "GPU-2f815c32-768d-d782-1073-db01d7b90215"


def container(tmp_path: Path, pod: str, name: str, ids, cpus: str | None, pids, version=2):
    d = tmp_path / "cg" / pod / name
    d.mkdir(parents=True)
    if cpus is not None:
        (d / "cpuset.cpus.effective").write_text(cpus + "\n")
    ns, _, pname = pod.partition("_")
    return Container(CgroupRef(f"uid-{pname}", f"cid{name}", "guaranteed", "systemd",
                               "containerd", f"{pod}/{name}"), d, version, list(pids),
                     meta={"namespace": ns, "pod": pname, "container": name},
                     gpu_source="podresources", gpu_ids=list(ids))


def test_holders_cpusets_and_time_slicing_replicas(tmp_path):
    cs = ContainerList(Hierarchy(2, tmp_path / "cg"), (
        container(tmp_path, "ml_a", "main", [f"{GPU}::0"], "16-17", [11]),
        container(tmp_path, "ml_b", "main", [f"{GPU}::1"], "0-3", [22]),
        container(tmp_path, "ml_c", "main", ["GPU-other"], None, [33])))
    names, pods, places = slow_gpu.holders(cs)
    assert names[GPU] == ["ml/a", "ml/b"] and names["GPU-other"] == ["ml/c"]
    assert [p["pod"] for p in places] == ["ml/a", "ml/b"]      # ml/c: no cpuset file
    g = {"uuid": GPU, "index": 0, "pci_bus_id": "00000000:3B:00.0", "numa_node": 0,
         "processes": [{"pid": 11, "used_memory_bytes": 1 << 30}]}
    [numa] = placement.judge_numa(places, [g], {**{c: 0 for c in range(16)},
                                                **{c: 1 for c in range(16, 32)}}, {})
    assert numa.evidence["pod"] == "ml/a"
    [shared] = placement.judge_sharing(g, pods[GPU])
    assert [r["pod"] for r in shared.evidence["pods"]] == ["ml/a", "ml/b"]


def test_v1_cpuset_is_the_devices_paths_twin(tmp_path):
    c = Container(CgroupRef("u", "c", "guaranteed", "cgroupfs", None, "kubepods/podu/c"),
                  Path("/sys/fs/cgroup/devices/kubepods/podu/c"), 1, [])
    assert slow_gpu._cpuset_dir(c) == Path("/sys/fs/cgroup/cpuset/kubepods/podu/c")


def test_no_container_list_names_no_pods():
    assert slow_gpu.holders(None) == ({}, {}, [])


def test_nodes_ranks_an_agent_marked_degraded_gpu_as_a_warning():
    """`nodes` reads GpuDoctorGpuDegraded=True as a warning naming the cause (the agent's
    condition as tests/kubectl/test_fleet_view builds them from a real 1.35 node)."""
    import datetime as dt

    from kubectl_gpudoctor.analysis.monitors import agent_conditions
    from node_probe.protocol import conditions
    from tests.kubectl.test_fleet_view import captured_node, watching
    node = captured_node()
    node["status"]["conditions"] += watching(problems={"GpuDoctorGpuDegraded": (
        conditions.reason_of("gpu.pcie_downtrained"), "GPU 0: Gen2 x16 of Gen5 x16", 900)})
    fs = [f for f in agent_conditions.analyze(node, dt.datetime.now(dt.timezone.utc))
          if f.evidence.get("condition") == "GpuDoctorGpuDegraded"]
    assert [(f.id, f.severity.value) for f in fs] == [("gpu.pcie_downtrained", "warning")]
    assert fs[0].evidence["reason"] == "GpuPcieDowntrained"

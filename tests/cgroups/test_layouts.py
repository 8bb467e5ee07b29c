"""Container discovery from cgroup paths: pure functions over captured layouts."""
import pytest

from node_probe.host import containers
from node_probe.host.containers import parse_cgroup_path

CID = "90d6d4dbe64f821d43e4ef954808089d3f2f63af3fc9824d2c1e719768cd7d18"
UID = "0dbd65af-6693-11eb-994b-246e9634b5c8"
UID_ = UID.replace("-", "_")
STATIC_UID = "6c8a7b1ef12ab5d4e3b2a1908f7e6d5c"   # static pods: a 32-hex hash


@pytest.mark.parametrize("path,qos,driver,runtime", [
    # seed 002's path (cgroupfs driver, burstable, containerd/docker bare id)
    (f"/kubepods/burstable/pod{UID}/{CID}", "burstable", "cgroupfs", None),
    (f"/kubepods/besteffort/pod{UID}/{CID}", "besteffort", "cgroupfs", None),
    (f"/kubepods/pod{UID}/{CID}", "guaranteed", "cgroupfs", None),
    (f"/kubepods/burstable/pod{UID}/crio-{CID}", "burstable", "cgroupfs", "cri-o"),
    # systemd driver
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
     f"cri-containerd-{CID}.scope", "burstable", "systemd", "containerd"),
    (f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/"
     f"crio-{CID}.scope", "besteffort", "systemd", "cri-o"),
    (f"/kubepods.slice/kubepods-pod{UID_}.slice/docker-{CID}.scope", "guaranteed", "systemd",
     "docker"),
    # kind: kubelet cgroupRoot=/kubelet with the systemd driver
    (f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
     f"kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope",
     "besteffort", "systemd", "containerd"),
    # nested under a container runtime (docker-in-docker / kind nodes on cgroupfs)
    (f"/docker/{CID}/kubepods/burstable/pod{UID}/{CID}", "burstable", "cgroupfs", None),
])
def test_container_paths(path, qos, driver, runtime):
    ref = parse_cgroup_path(path)
    assert ref is not None
    assert ref.pod_uid == UID
    assert ref.container_id == CID
    assert (ref.qos, ref.driver, ref.runtime) == (qos, driver, runtime)
    assert ref.rel == path


def test_static_pod_uid_hash():
    ref = parse_cgroup_path(f"/kubepods/burstable/pod{STATIC_UID}/{CID}")
    assert ref and ref.pod_uid == STATIC_UID


def test_sub_cgroup_maps_to_its_container():
    ref = parse_cgroup_path(f"/kubepods.slice/kubepods-pod{UID_}.slice/"
                            f"cri-containerd-{CID}.scope/init.scope")
    assert ref and ref.container_id == CID
    assert ref.rel.endswith(f"cri-containerd-{CID}.scope")


@pytest.mark.parametrize("path,qos,driver", [
    # /proc/PID/cgroup read from inside a debug pod's own cgroup namespace (cgroup v2): the
    # levels above the probe's container show as '..'
    (f"/../../pod{UID}/{CID}", "unknown", "cgroupfs"),              # same QoS class as ours
    (f"/../../../burstable/pod{UID}/{CID}", "burstable", "cgroupfs"),
    (f"/../../../kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope", "burstable",
     "systemd"),
    (f"/../../kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope", "guaranteed", "systemd"),
])
def test_paths_relative_to_another_cgroup_namespace(path, qos, driver):
    ref = parse_cgroup_path(path)
    assert ref is not None and (ref.pod_uid, ref.container_id) == (UID, CID)
    assert (ref.qos, ref.driver) == (qos, driver)


@pytest.mark.parametrize("path", [
    "/", "/system.slice/containerd.service", "/kubepods", "/kubepods/burstable",
    f"/kubepods/burstable/pod{UID}",                                  # pod level
    f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice",
    f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
    f"crio-conmon-{CID}.scope",                                       # conmon, not the container
    f"/user.slice/user-0.slice/session-1.scope",
    f"/kubepods/burstable/pod{UID}/not-a-container",
    "/../../system.slice/containerd.service", "/..", f"/../pod{UID}",
])
def test_not_containers(path):
    assert parse_cgroup_path(path) is None


@pytest.mark.parametrize("value,ids", [
    (None, None), ("", None), ("void", None), ("none", None), ("NONE", None),
    ("all", ["all"]), ("0,1", ["0", "1"]), (f"{'GPU-abc'}", ["GPU-abc"]),
    ("GPU-a, GPU-b", ["GPU-a", "GPU-b"]), ("0:1", ["0:1"]),
    ("/var/run/nvidia-container-devices", ["?"]),
])
def test_visible_devices_values(value, ids):
    assert containers.gpu_ids_from_env(value) == ids


def _captured_v2(tmp_path, driver="systemd"):
    """A captured cgroup2 layout (directories + cgroup.procs files)."""
    root = tmp_path / "cg"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    if driver == "systemd":
        c = root / f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope"
        pause = c.parent / f"cri-containerd-{'a' * 64}.scope"
    else:
        c = root / f"kubepods/burstable/pod{UID}/{CID}"
        pause = c.parent / ("a" * 64)
    for d in (c, pause):
        d.mkdir(parents=True)
        (d / "cgroup.procs").write_text("")
    (c / "cgroup.procs").write_text("4242\n4243\n")
    sysd = root / "system.slice/containerd.service"
    sysd.mkdir(parents=True)
    (sysd / "cgroup.procs").write_text("1\n")
    return root, c


@pytest.mark.parametrize("driver", ["systemd", "cgroupfs"])
def test_discover_on_captured_v2_layout(tmp_path, driver):
    root, c = _captured_v2(tmp_path, driver)
    h = containers.find_hierarchy(root)
    assert h == containers.Hierarchy(2, root)
    found = {ref.container_id: p for ref, p in containers.walk_container_cgroups(h)}
    assert set(found) == {CID, "a" * 64}
    assert found[CID] == c
    assert containers.read_pids(c) == [4242, 4243]


def test_hybrid_host_prefers_v1_devices(tmp_path):
    root = tmp_path / "cg"
    (root / "devices").mkdir(parents=True)
    (root / "devices/devices.list").write_text("a *:* rwm\n")
    (root / "unified").mkdir()
    (root / "unified/cgroup.controllers").write_text("")
    assert containers.find_hierarchy(root) == containers.Hierarchy(1, root / "devices")
    (root / "devices/devices.list").unlink()
    assert containers.find_hierarchy(root) == containers.Hierarchy(2, root / "unified")
    assert containers.find_hierarchy(tmp_path / "nothing") is None


def test_bundle_config_names_and_spec_devices_never_env(tmp_path):
    import json
    cfg = {"ociVersion": "1.1.0",
           "process": {"env": ["PATH=/bin", "DB_PASSWORD=hunter2",
                               "NVIDIA_VISIBLE_DEVICES=GPU-abc"]},
           "annotations": {"io.kubernetes.cri.sandbox-name": "train-0",
                           "io.kubernetes.cri.sandbox-namespace": "ml",
                           "io.kubernetes.cri.container-name": "trainer",
                           "io.kubernetes.cri.sandbox-uid": UID},
           "linux": {"devices": [{"path": "/dev/nvidiactl", "type": "c", "major": 195,
                                  "minor": 255}],
                     "resources": {"devices": [{"allow": False, "access": "rwm"},
                                               {"allow": True, "type": "c", "major": 195,
                                                "minor": 255, "access": "rw"}]}}}
    d = tmp_path / f"run/containerd/io.containerd.runtime.v2.task/k8s.io/{CID}"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(cfg))
    meta = containers.read_bundle_meta(tmp_path, CID)
    assert (meta["namespace"], meta["pod"], meta["container"]) == ("ml", "train-0", "trainer")
    assert meta["spec_devices"][0]["path"] == "/dev/nvidiactl"
    assert "hunter2" not in json.dumps(meta)


def _ctr(meta, env):
    ref = parse_cgroup_path(f"/kubepods/burstable/pod{UID}/{CID}")
    return containers.Container(ref=ref, cgroup_path=None, cgroup_version=1, pids=[1],
                                meta=meta, env=env)


def test_podresources_wins_and_env_is_the_fallback():
    meta = {"namespace": "ml", "pod": "train-0", "container": "trainer"}
    podres = [{"namespace": "ml", "pod": "train-0", "container": "trainer",
               "resource": "nvidia.com/gpu", "device_ids": ["GPU-x::1"]},
              {"namespace": "ml", "pod": "train-0", "container": "trainer",
               "resource": "example.com/nic", "device_ids": ["nic0"]}]
    idx = containers.podresources_index(podres)
    c = _ctr(meta, {"NVIDIA_VISIBLE_DEVICES": "GPU-y"})
    c = containers.assign_gpus(c, idx)
    assert (c.gpu_source, c.gpu_ids, c.gpu_resources) == ("podresources", ["GPU-x::1"],
                                                          ["nvidia.com/gpu"])
    # pod-resources absent: the environment decides
    c = _ctr(meta, {"NVIDIA_VISIBLE_DEVICES": "GPU-y"})
    c = containers.assign_gpus(c, None)
    assert (c.gpu_source, c.gpu_ids) == ("environ", ["GPU-y"])
    # pod-resources knows the container and gave it no GPU: an image's "all" is not one
    idx2 = containers.podresources_index([{"namespace": "ml", "pod": "train-0",
                                           "container": "trainer", "resource": "cpu",
                                           "device_ids": ["1"]}])
    c = _ctr(meta, {"NVIDIA_VISIBLE_DEVICES": "all"})
    c = containers.assign_gpus(c, idx2)
    assert not c.is_gpu
    # no names known (no bundle): environment
    c = _ctr({}, {"NVIDIA_VISIBLE_DEVICES": "all"})
    c = containers.assign_gpus(c, idx)
    assert c.gpu_ids == ["all"]
    # no GPU at all
    c = _ctr({}, {"NVIDIA_VISIBLE_DEVICES": "void"})
    c = containers.assign_gpus(c, None)
    assert not c.is_gpu and c.to_fact()["gpu"] is False


def test_discover_reads_bundles_only_for_candidates(tmp_path):
    root, c = _captured_v2(tmp_path, "cgroupfs")
    host = tmp_path / "host"
    for cid in (CID, "a" * 64):
        d = host / f"run/containerd/io.containerd.runtime.v2.task/k8s.io/{cid}"
        d.mkdir(parents=True)
        d.joinpath("config.json").write_text(
            '{"annotations": {"io.kubernetes.cri.container-name": "c-%s"}}' % cid[:4])
    asked = []

    def want(ref, env):
        asked.append(ref.container_id)
        return ref.container_id == CID

    h, found = containers.discover(root, host, tmp_path / "noproc", want_meta=want)
    by_id = {x.ref.container_id: x for x in found}
    assert sorted(asked) == sorted(by_id)
    assert by_id[CID].meta["container"] == "c-90d6"
    assert by_id["a" * 64].meta == {}
    _, all_meta = containers.discover(root, host, tmp_path / "noproc")
    assert all(x.meta for x in all_meta)

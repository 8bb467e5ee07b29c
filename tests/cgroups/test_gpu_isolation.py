"""A container using GPUs it was not given (issue 25, class 3), end to end.

Real processes in real kubepods-shaped cgroups hold real mknod'ed GPU device nodes open; the
kubelet's pod-resources API is the real gRPC service on its socket (tests/fakes). Without the
NVIDIA driver a 195:N node cannot be opened (ENXIO), so this host root's /proc/devices gives
the driver's name to major 1 and the GPUs minors 3 and 5 (nodes the kernel opens): the probe
reads the major from /proc/devices as on a real node, and judges by the (major, minor) of the
inode each descriptor points to.
"""
import json
import os
import shutil
import socket
import tempfile
from pathlib import Path

import pytest

from tests.cgroups.conftest import GPU0_UUID, GPU1_UUID, new_cid, new_uid
from tests.fakes.fake_podresources import serve
from tests.probe_run import run_probe

pytestmark = pytest.mark.root


@pytest.fixture
def short_tmp():
    """A short base directory: unix socket paths are limited to 108 bytes."""
    d = Path(tempfile.mkdtemp(prefix="gdi-", dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)

MAJOR = 1
MINORS = {GPU0_UUID: 3, GPU1_UUID: 5}


def host_root(base):
    root = base / "host"
    (root / "dev").mkdir(parents=True)
    (root / "proc").mkdir()
    (root / "proc/devices").write_text(f"Character devices:\n  {MAJOR} nvidia-frontend\n"
                                       "136 pts\n\nBlock devices:\n  7 loop\n")
    for i, (uuid, minor) in enumerate(MINORS.items()):
        d = root / f"proc/driver/nvidia/gpus/0000:{0x3b + i:02x}:00.0"
        d.mkdir(parents=True)
        d.joinpath("information").write_text(
            f"Model: \t\t NVIDIA H100 80GB HBM3\nGPU UUID: \t {uuid}\nDevice Minor: \t {minor}\n")
        os.mknod(root / f"dev/nvidia{minor}", 0o666 | 0o020000, os.makedev(MAJOR, minor))
    kdir = root / "var/lib/kubelet/device-plugins"
    kdir.mkdir(parents=True)
    k = socket.socket(socket.AF_UNIX)   # the kubelet's registration socket: a Kubernetes node
    k.bind(str(kdir / "kubelet.sock"))
    k.close()
    return root


def bundle(root, cid, ns, pod, uid, container):
    d = root / f"run/containerd/io.containerd.runtime.v2.task/k8s.io/{cid}"
    d.mkdir(parents=True)
    d.joinpath("config.json").write_text(json.dumps({"annotations": {
        "io.kubernetes.cri.sandbox-name": pod, "io.kubernetes.cri.sandbox-namespace": ns,
        "io.kubernetes.cri.sandbox-uid": uid, "io.kubernetes.cri.container-name": container,
        "io.kubernetes.cri.container-type": "container"}}))


def holding(tree, cgroup, paths, env=None):
    """A real process in `cgroup` that opens each of `paths` and keeps them open."""
    opens = " && ".join(f'exec {3 + i}<"{p}"' for i, p in enumerate(paths)) or "true"
    return tree.spawn_script(cgroup, ["/bin/sh", "-c", f"{opens} && exec /bin/sleep 120"],
                             {"PATH": "/bin:/usr/bin", **(env or {})}, "holder")


def probe(root, rows, uids):
    """The probe's isolation check (with the deviceplugin check, which reads pod-resources)
    while the kubelet's pod-resources API serves `rows`."""
    server = serve(root / "var/lib/kubelet/pod-resources/kubelet.sock", rows)
    try:
        args = ["--host-root", str(root), "--cgroup-root", "/sys/fs/cgroup",
                "--only", "gpu.isolation", "--only", "deviceplugin", "--trace-seconds", "0"]
        for u in uids:
            args += ["--focus-pod", u]
        return run_probe(*args)
    finally:
        server.stop(0)


def scenario(tree, tmp_path, with_intruder):
    root = host_root(tmp_path)
    dev = {u: root / f"dev/nvidia{m}" for u, m in MINORS.items()}
    pods = [("ml", "train-0", "main", [GPU0_UUID], [dev[GPU0_UUID]], {}),
            ("ml", "train-1", "main", [GPU1_UUID], [dev[GPU1_UUID]], {})]
    if with_intruder:
        # no GPU in pod-resources, but its image's NVIDIA_VISIBLE_DEVICES=all reached both
        pods.append(("tenant-b", "notebook-1", "jupyter", [], [dev[GPU0_UUID], dev[GPU1_UUID]],
                     {"NVIDIA_VISIBLE_DEVICES": "all"}))
    rows, uids, procs = [], [], {}
    for ns, pod, cont, given, opens, env in pods:
        uid, cid = new_uid(), new_cid()
        cg = tree.container(uid, cid)
        bundle(root, cid, ns, pod, uid, cont)
        procs[pod] = holding(tree, cg, opens, env)
        uids.append(uid)
        rows.append({"namespace": ns, "pod": pod, "container": cont,
                     "resource": "nvidia.com/gpu" if given else "example.com/nic",
                     "device_ids": given or ["nic-0"]})
    return probe(root, rows, uids), procs


def test_container_holding_gpus_it_was_not_given_is_critical(v1_tree, short_tmp):
    run, procs = scenario(v1_tree, short_tmp, with_intruder=True)
    found = run.findings("gpu.isolation_breach")
    assert len(found) == 1, json.dumps(run.findings(), indent=1)
    f = found[0]
    ev = f["evidence"]
    assert f["severity"] == "critical"
    assert f["subject"] == "pod tenant-b/notebook-1 container jupyter"
    assert ev["kind"] == "not_allocated" and ev["gpus_given"] == []
    assert ev["allocation_source"] == "podresources"
    assert {p["gpu_uuid"] for p in ev["processes"]} == {GPU0_UUID, GPU1_UUID}
    assert {p["pid"] for p in ev["processes"]} == {procs["notebook-1"].pid}
    assert {p["comm"] for p in ev["processes"]} == {"sleep"}
    assert ev["nvidia_visible_devices"] == "all"
    assert ev["other_pods_on_these_gpus"] == ["pod ml/train-0 container main",
                                              "pod ml/train-1 container main"]
    assert GPU0_UUID in f["title"] and "notebook-1" in f["title"]
    assert run.returncode == 1


def test_containers_using_only_their_gpus_stay_quiet(v1_tree, short_tmp):
    run, _ = scenario(v1_tree, short_tmp, with_intruder=False)
    assert not run.findings("gpu.isolation_breach")
    status = {c["id"]: c["status"] for c in run.summary["checks"]}
    assert status["gpu.isolation"] == "ok", run.stdout


def test_one_whole_gpu_given_to_two_pods_is_a_double_allocation(v1_tree, short_tmp):
    root = host_root(short_tmp)
    rows, uids = [], []
    for pod in ("a-0", "b-0"):
        uid, cid = new_uid(), new_cid()
        cg = v1_tree.container(uid, cid)
        bundle(root, cid, "ml", pod, uid, "main")
        holding(v1_tree, cg, [root / "dev/nvidia3"])
        uids.append(uid)
        rows.append({"namespace": "ml", "pod": pod, "container": "main",
                     "resource": "nvidia.com/gpu", "device_ids": [GPU0_UUID]})
    run = probe(root, rows, uids)
    [f] = run.findings("gpu.isolation_breach")
    assert f["evidence"]["kind"] == "two_pods_unshared"
    assert f["evidence"]["containers"] == ["pod ml/a-0 container main",
                                           "pod ml/b-0 container main"]

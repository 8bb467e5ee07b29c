"""Names for a container found by its cgroup when the runtime's bundle is not readable:
the kubelet's termination-log mount in a real process's mountinfo, and the real pod-resources
gRPC API (tests/fakes/fake_podresources.py) joined with the kubelet's device checkpoint."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from node_probe.deviceplugin import podresources
from node_probe.host import device_checkpoint, podnames
from tests.cgroups.conftest import (GPU0_UUID, deny_all_then_allow, make_host_root, new_cid,
                                    new_uid)
from tests.fakes.fake_podresources import serve
from tests.probe_run import run_probe

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: mount namespaces")


def kubelet_container_file(base, uid: str, container: str):
    d = base / "var" / "lib" / "kubelet" / "pods" / uid / "containers" / container
    d.mkdir(parents=True)
    f = d / "5e1f2a3b"
    f.write_text("")
    return f


class ContainerLike:
    """A process in its own mount namespace with the kubelet's termination-log bind mount."""

    def __init__(self, base, uid: str, container: str) -> None:
        src = kubelet_container_file(base, uid, container)
        target = base / "termination-log"
        target.write_text("")
        self.p = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sh", "-c",
             f'mount --bind "{src}" "{target}" && echo ok && exec sleep 30'],
            stdout=subprocess.PIPE, text=True)
        assert self.p.stdout.readline().strip() == "ok"

    def close(self) -> None:
        self.p.kill()
        self.p.wait()


@pytest.mark.root
@needs_root
def test_mountinfo_of_a_real_process_names_pod_uid_and_container(tmp_path):
    uid = str(uuid.uuid4())
    base = tmp_path / "host root"      # a space: mountinfo escapes it as \040
    base.mkdir()
    c = ContainerLike(base, uid, "trainer")
    try:
        assert podnames.read_names([c.p.pid]) == (uid, "trainer")
    finally:
        c.close()
    assert podnames.read_names([os.getpid()]) is None   # ours has no such mount
    assert podnames.read_names([2 ** 22 + 7]) is None    # gone


def rows():
    return [
        {"namespace": "ml", "pod": "train-0", "container": "main", "resource": "nvidia.com/gpu",
         "device_ids": ["GPU-a"]},
        {"namespace": "ml", "pod": "train-1", "container": "main", "resource": "nvidia.com/gpu",
         "device_ids": ["GPU-b", "GPU-c"]},
        {"namespace": "default", "pod": "gdscn-gpu", "container": "c",
         "resource": "nvidia.com/mig-1g.10gb", "device_ids": ["MIG-1"]},
        # two pods given the same (shared) replica id: not a unique answer
        {"namespace": "a", "pod": "x", "container": "main", "resource": "nvidia.com/gpu",
         "device_ids": ["GPU-s::0"]},
        {"namespace": "b", "pod": "y", "container": "main", "resource": "nvidia.com/gpu",
         "device_ids": ["GPU-s::0"]},
    ]


def checkpoint(entries) -> str:
    return json.dumps({"Data": {"PodDeviceEntries": [
        {"PodUID": u, "ContainerName": c, "ResourceName": r, "DeviceIDs": {"0": ids},
         "AllocResp": ""} for u, c, r, ids in entries], "RegisteredDevices": {}},
        "Checksum": 1})


def test_pod_resources_joined_with_the_checkpoint_names_pod_uids(tmp_path):
    u0, u1, u2, u3, gone = (str(uuid.uuid4()) for _ in range(5))
    sock = tmp_path / "pod-resources" / "kubelet.sock"
    server = serve(sock, rows())
    try:
        lst, _ = podresources.query(sock, 5.0)
    finally:
        server.stop(0)
    assert lst.status == "ok"
    entries = device_checkpoint.parse(checkpoint([
        (u0, "main", "nvidia.com/gpu", ["GPU-a"]),
        (u1, "main", "nvidia.com/gpu", ["GPU-c", "GPU-b"]),   # order does not matter
        (u2.upper(), "c", "nvidia.com/mig-1g.10gb", ["MIG-1"]),
        (u3, "main", "nvidia.com/gpu", ["GPU-s::0"]),
        (gone, "main", "nvidia.com/gpu", ["GPU-z"]),
    ]))
    assert len(entries) == 5
    assert podnames.pods_by_uid(entries, lst.value) == {
        u0: ("ml", "train-0"), u1: ("ml", "train-1"), u2: ("default", "gdscn-gpu")}
    assert podnames.pods_by_uid(None, lst.value) == {}
    assert podnames.pods_by_uid(entries, None) == {}


@pytest.mark.root
@needs_root
def test_fill_names_a_container_the_bundle_did_not(tmp_path):
    uid = str(uuid.uuid4())
    c = ContainerLike(tmp_path, uid, "c")
    try:
        names = {uid: ("default", "gdscn-gpu")}
        meta = podnames.fill({}, uid, [c.p.pid], names)
        assert (meta["namespace"], meta["pod"], meta["container"]) == ("default", "gdscn-gpu",
                                                                         "c")
        assert meta["names_from"] == "mountinfo+podresources+checkpoint"
        # the bundle's names win; a mount of another pod's uid is not taken
        bundle = {"namespace": "ns", "pod": "p", "container": "k"}
        assert podnames.fill(bundle, uid, [c.p.pid], names) == bundle
        other = podnames.fill({}, str(uuid.uuid4()), [c.p.pid], names)
        assert other == {}
    finally:
        c.close()


@pytest.mark.root
def test_denied_container_is_named_without_the_runtime_bundle_end_to_end(v1_tree, tmp_path):
    """Issue 13: no OCI bundle for the container (names unknown to the runtime reader). The
    probe names it from its termination-log mount and the real pod-resources API joined with
    the kubelet's checkpoint, not as `pod uid <uid> container <id>`."""
    short = Path(tempfile.mkdtemp(prefix="gdpn-"))   # unix socket paths: <= 107 bytes
    try:
        named_end_to_end(v1_tree, short, tmp_path)
    finally:
        shutil.rmtree(short, ignore_errors=True)


def named_end_to_end(v1_tree, base, tmp_path):
    host = make_host_root(base)
    uid, cid = new_uid(), new_cid()
    cg = v1_tree.container(uid, cid)
    deny_all_then_allow(cg, ["c 1:3 rwm", "c *:* m", "c 195:255 rw", "c 195:0 rw"])
    src = kubelet_container_file(host, uid, "server")
    target = tmp_path / "termination-log"
    target.write_text("")
    procs_file = str(cg / "cgroup.procs")

    def join():
        fd = os.open(procs_file, os.O_WRONLY)
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)

    p = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c",
                          f'mount --bind "{src}" "{target}" && echo ok && exec sleep 120'],
                         stdout=subprocess.PIPE, text=True, preexec_fn=join)
    v1_tree.procs.append(p)
    assert p.stdout.readline().strip() == "ok"
    kdir = host / "var/lib/kubelet"
    (kdir / "device-plugins").mkdir(parents=True, exist_ok=True)
    k = socket.socket(socket.AF_UNIX)   # the kubelet's registration socket: a Kubernetes node
    k.bind(str(kdir / "device-plugins" / "kubelet.sock"))
    k.close()
    (kdir / "device-plugins/kubelet_internal_checkpoint").write_text(checkpoint([
        (uid, "server", "nvidia.com/gpu", [GPU0_UUID])]))
    server = serve(kdir / "pod-resources" / "kubelet.sock", [
        {"namespace": "ai", "pod": "infer-7", "container": "server",
         "resource": "nvidia.com/gpu", "device_ids": [GPU0_UUID]},
        {"namespace": "ai", "pod": "other-1", "container": "server",
         "resource": "nvidia.com/gpu", "device_ids": ["GPU-other"]}])
    try:
        run = run_probe("--host-root", str(host), "--cgroup-root", "/sys/fs/cgroup",
                        "--only", "cgroup.devices", "--only", "deviceplugin",
                        "--trace-seconds", "0", "--focus-pod", uid)
    finally:
        server.stop(0)
    [f] = run.findings("cgroup.device_denied")
    assert f["subject"] == "pod ai/infer-7 container server", f["subject"]
    assert f["title"].startswith("Container server in pod ai/infer-7 cannot open")
    ev = f["evidence"]
    assert (ev["namespace"], ev["pod"], ev["container"], ev["pod_uid"]) == (
        "ai", "infer-7", "server", uid)
    assert ev["gpu_source"] == "podresources" and ev["gpu_ids"] == [GPU0_UUID]

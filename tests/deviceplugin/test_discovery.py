"""Socket -> process mapping against real listening sockets and processes; cgroup -> pod."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from node_probe.deviceplugin import discovery
from node_probe.host import unix_sockets


def test_plugin_socket_maps_to_the_serving_process(host, start_plugin):
    p = start_plugin("nvidia-gpu.sock")
    # the kubelet's own socket (the host fixture binds it) is never a plugin
    assert (host.plugins_dir / "kubelet.sock").is_socket()
    (t,) = discovery.discover(host.kubelet)
    assert t.pid == p.pid and t.socket == str(p.socket)
    assert t.match == "inode"
    assert t.resource == "nvidia.com/gpu" and t.resource_source == "socket-name"
    assert t.comm.startswith("python")
    assert t.fact()["pid"] == p.pid


def test_two_plugins_in_two_kubelet_dirs_with_the_same_socket_name(host, start_plugin,
                                                                   tmp_path):
    """Basename matching alone would confuse them; the inode check does not."""
    a = start_plugin("nvidia-gpu.sock")
    other = Path(str(host.root) + "-b")
    (other / "device-plugins").mkdir(parents=True)
    try:
        q = subprocess.Popen([sys.executable, str(Path(__file__).parents[1] / "fakes" /
                                                  "fake_device_plugin.py"),
                              "--socket", str(other / "device-plugins" / "nvidia-gpu.sock")],
                             stdout=subprocess.PIPE)
        try:
            assert b"READY" in q.stdout.readline()
            (ta,) = discovery.discover(host.kubelet)
            (tb,) = discovery.discover(other)
            assert (ta.pid, tb.pid) == (a.pid, q.pid)
        finally:
            q.kill()
            q.wait()
    finally:
        import shutil
        shutil.rmtree(other, ignore_errors=True)


def test_socket_nobody_serves_has_no_pid(host):
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(host.plugins_dir / "nvidia-mig-1g.10gb.sock"))
    s.close()  # the file stays, like a plugin that died
    (t,) = discovery.discover(host.kubelet)
    assert t.pid is None and t.resource == "nvidia.com/mig-1g.10gb"


def test_regular_files_and_missing_dir_are_ignored(host, tmp_path):
    (host.plugins_dir / "kubelet_internal_checkpoint").write_text("{}")
    assert discovery.discover(host.kubelet) == []
    assert discovery.discover(tmp_path / "nope") == []


def test_pod_uid_and_container_from_cgroup_paths(tmp_path):
    uid = "0f4a54ad-6b8a-4e7e-9a4c-3d2f1e0b9c8d"
    cid = "a" * 64
    cases = {
        101: f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
             f"{uid.replace('-', '_')}.slice/cri-containerd-{cid}.scope\n",
        102: f"12:devices:/kubepods/burstable/pod{uid}/{cid}\n0::/\n",
        103: "0::/system.slice/kubelet.service\n",
        # read from inside the debug pod's cgroup namespace (cgroup v2, cgroupfs driver)
        104: f"0::/../../../burstable/pod{uid}/{cid}\n",
        # a static pod: its UID is a 32-hex hash
        105: f"0::/kubepods/burstable/pod{'b' * 32}/{cid}\n",
    }
    for pid, text in cases.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(text)
    assert discovery.pod_of(101, tmp_path) == (uid, cid)
    assert discovery.pod_of(102, tmp_path) == (uid, cid)
    assert discovery.pod_of(103, tmp_path) == (None, None)
    assert discovery.pod_of(104, tmp_path) == (uid, cid)
    assert discovery.pod_of(105, tmp_path) == ("b" * 32, cid)


def test_resource_from_socket_name():
    assert discovery.resource_from_socket_name("nvidia-gpu.sock") == "nvidia.com/gpu"
    assert discovery.resource_from_socket_name("nvidia-mig-3g.48gb.sock") == \
        "nvidia.com/mig-3g.48gb"
    assert discovery.resource_from_socket_name("rdma.sock") is None


def test_kubelet_checkpoint_both_formats(host):
    (host.plugins_dir / "kubelet_internal_checkpoint").write_text(json.dumps({"Data": {
        "PodDeviceEntries": [
            {"PodUID": "u1", "ContainerName": "c", "ResourceName": "nvidia.com/gpu",
             "DeviceIDs": {"0": ["GPU-a"]}, "AllocResp": "x"},
            {"PodUID": "u2", "ContainerName": "d", "ResourceName": "nvidia.com/gpu",
             "DeviceIDs": ["GPU-b"]}],
        "RegisteredDevices": {"nvidia.com/gpu": ["GPU-a", "GPU-b"]}}, "Checksum": 1}))
    ck = discovery.read_checkpoint(host.kubelet)
    assert ck["registered"] == {"nvidia.com/gpu": ["GPU-a", "GPU-b"]}
    assert [a["device_ids"] for a in ck["allocations"]] == [["GPU-a"], ["GPU-b"]]
    t = discovery.PluginTarget(socket="x.sock")
    discovery.refine_resource(t, ["GPU-b"], ck["registered"], "kubelet-checkpoint")
    assert t.resource == "nvidia.com/gpu"


def test_net_unix_parser():
    text = ("Num       RefCount Protocol Flags    Type St Inode Path\n"
            "0000000000000000: 00000002 00000000 00010000 0001 01 4242 /var/lib/kubelet/"
            "device-plugins/nvidia-gpu.sock\n"
            "0000000000000000: 00000002 00000000 00000000 0001 03 4243\n"
            "0000000000000000: 00000002 00000000 00010000 0001 01 4244 @abstract\n")
    assert unix_sockets.parse_net_unix(text) == [
        (4242, 0x10000, "/var/lib/kubelet/device-plugins/nvidia-gpu.sock")]

"""host.layout: one answer per "where is it" question, with how it was decided.

Each test builds a host root the way a distribution lays it out and, where the answer comes
from a running daemon, starts a real process serving the daemon's socket with its flags.
"""
from __future__ import annotations

from node_probe.host import driver_libs, kubelet_root_dir, layout, runtime_layout
from tests.beyond.conftest import healthy_gpus, make_host
from tests.layouts.conftest import stale_socket, write
from tests.probe_run import run_probe


def test_kubelet_root_dir_from_the_running_kubelet(tmp_path, daemons):
    root = tmp_path / "host"
    kdir = root / "srv/kubelet"                        # a custom --root-dir
    write(root, "var/lib/kubelet/pods/.keep")          # the default exists but is unused
    k = daemons("kubelet", [kdir / "device-plugins/kubelet.sock"], "--root-dir=/srv/kubelet",
                root=root)                             # the host's kubelet: its root is /
    got = kubelet_root_dir.resolve_kubelet_dir(root)
    assert got.path == kdir and got.pid == k.pid and got.served
    assert f"--root-dir of pid {k.pid}" in got.how


def test_kubelet_name_alone_does_not_move_the_kubelet_dir(tmp_path, daemons):
    """A process named kubelet whose --root-dir holds no socket it serves is not believed."""
    root = tmp_path / "host"
    stale_socket(root / "var/lib/kubelet/device-plugins/kubelet.sock")
    write(root, "tmp/evil/device-plugins/.keep")
    daemons("kubelet", [], "--root-dir=/tmp/evil")
    got = kubelet_root_dir.resolve_kubelet_dir(root)
    assert got.path == root / "var/lib/kubelet" and not got.served
    assert "the kubelet is down" in got.how


def test_k0s_and_microk8s_defaults(tmp_path, daemons):
    root = tmp_path / "k0s"
    k = daemons("kubelet", [root / "var/lib/k0s/kubelet/pod-resources/kubelet.sock"])
    got = kubelet_root_dir.resolve_kubelet_dir(root)
    assert got.path == root / "var/lib/k0s/kubelet" and got.pid == k.pid and "k0s" in got.how
    root2 = tmp_path / "microk8s"
    stale_socket(root2 / "var/snap/microk8s/common/var/lib/kubelet/device-plugins/kubelet.sock")
    got2 = kubelet_root_dir.resolve_kubelet_dir(root2)
    assert got2.path == root2 / "var/snap/microk8s/common/var/lib/kubelet"
    assert "microk8s" in got2.how and not got2.served


def test_containerd_state_dir_from_its_own_flags_and_config(tmp_path, daemons):
    root = tmp_path / "host"
    write(root, "var/lib/rancher/k3s/agent/etc/containerd/config.toml",
          'version = 2\nroot = "/var/lib/rancher/k3s/agent/containerd"\n')
    c = daemons("containerd", [root / "run/k3s/containerd/containerd.sock"],
                "-c", "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
                "--state", "/run/k3s/containerd")
    rt = runtime_layout.resolve_runtime(root)
    assert (rt.name, rt.pid, rt.state_dir) == ("containerd", c.pid, "/run/k3s/containerd")
    assert rt.root_dir == "/var/lib/rancher/k3s/agent/containerd"
    assert rt.config == "/var/lib/rancher/k3s/agent/etc/containerd/config.toml"
    assert rt.bundle_configs()[0][0] == \
        "run/k3s/containerd/io.containerd.runtime.v2.task/k8s.io/{id}/config.json"
    assert f"pid {c.pid} serves /run/k3s/containerd/containerd.sock" in rt.how


def test_crio_runroot_from_its_config(tmp_path, daemons):
    root = tmp_path / "host"
    write(root, "etc/crio/crio.conf", '[crio]\nrunroot = "/run/crio-storage"\n')
    c = daemons("crio", [root / "var/run/crio/crio.sock"])
    rt = runtime_layout.resolve_runtime(root)
    assert (rt.name, rt.pid, rt.state_dir) == ("cri-o", c.pid, "/run/crio-storage")
    assert rt.bundle_configs()[0][0] == \
        "run/crio-storage/overlay-containers/{id}/userdata/config.json"


def test_driver_root_the_device_plugin_was_told(tmp_path, daemons):
    root, _ = make_host(tmp_path, healthy_gpus(1), root=tmp_path / "host/opt/drv")
    kdir = root.parent.parent / "var/lib/kubelet"
    daemons("nvidia-device-p", [kdir / "device-plugins/nvidia-gpu.sock"],
            env={"NVIDIA_DRIVER_ROOT": "/opt/drv"})
    got = driver_libs.resolve_driver_root(tmp_path / "host", plugin_pids=())
    assert got.library is None                          # not a place anyone looks by default
    got = layout.driver_root(tmp_path / "host", kubelet=kdir)
    assert got.root == "opt/drv" and got.library is not None
    assert "NVIDIA_DRIVER_ROOT=/opt/drv in the device plugin" in got.how


def test_gpu_operator_driver_root_nvml_and_runtime_cdi_agree(tmp_path):
    """The driver only under /run/nvidia/driver: nvml loads it, and runtime_cdi judges the
    runtime wiring instead of skipping with "no NVIDIA driver" (what it did before)."""
    host = tmp_path / "host"
    make_host(tmp_path, healthy_gpus(1), root=host / "run/nvidia/driver")
    write(host, "etc/containerd/config.toml",
          'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n'
          '  default_runtime_name = "runc"\n'
          '  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n'
          '    runtime_type = "io.containerd.runc.v2"\n')
    kfile = tmp_path / "kmsg"
    kfile.write_text("")
    run = run_probe("--host-root", str(host), "--kmsg-file", str(kfile), "--trace-seconds", "0",
                    "--only", "nvml", "--only", "runtime_cdi", "--only", "layout")
    status = {c["id"]: c["status"] for c in run.summary["checks"]}
    assert status == {"nvml": "ok", "runtime_cdi": "ok", "layout": "ok"}, run.summary
    (missing,) = run.findings("runtime.handler_missing")
    assert missing["severity"] == "warning"
    (lay,) = [r for r in run.records if r.get("phase") == "layout"]
    assert lay["driver_root"]["root"] == "/run/nvidia/driver"
    assert "GPU Operator" in lay["driver_root"]["how"]


def test_kubelet_dir_of_a_stopped_kubelet_from_its_live_device_plugin(tmp_path, daemons):
    root = tmp_path / "host"
    kdir = root / "var/snap/microk8s/common/var/lib/kubelet"
    p = daemons("nvidia-device-p", [kdir / "device-plugins/nvidia-gpu.sock"])
    write(root, "var/lib/kubelet/.keep")
    got = kubelet_root_dir.resolve_kubelet_dir(root)
    assert got.path == kdir and not got.served
    assert f"a device plugin (pid {p.pid})" in got.how and "kubelet is down" in got.how


def test_a_driver_root_from_a_plugin_is_loaded_only_when_root_owned(tmp_path, daemons):
    """A device plugin is a pod: the library it points at is not dlopen()ed as root unless
    root owns it and nobody else can write it."""
    root, _ = make_host(tmp_path, healthy_gpus(1), root=tmp_path / "host/opt/drv")
    kdir = tmp_path / "host/var/lib/kubelet"
    daemons("nvidia-device-p", [kdir / "device-plugins/nvidia-gpu.sock"],
            env={"NVIDIA_DRIVER_ROOT": "/opt/drv"})
    lib = driver_libs.resolve_driver_root(tmp_path / "host", plugin_pids=()).library
    assert lib is None
    libdir = root / "usr/lib/x86_64-linux-gnu"
    libdir.chmod(0o777)                                # anyone could have put it there
    got = layout.driver_root(tmp_path / "host", kubelet=kdir)
    assert got.library is None and "not the host's own" in " ".join(got.tried)
    assert got.refused == (("/opt/drv/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
                            "/opt/drv/usr/lib/x86_64-linux-gnu is writable by group or others "
                            "(mode 777)"),)


def test_bundle_paths_from_a_config_with_braces_do_not_break_formatting():
    rt = runtime_layout.Runtime("containerd", "test", state_dir="/run/{odd}")
    assert rt.bundle_configs()[0][0].format(id="abc") == \
        "run/{odd}/io.containerd.runtime.v2.task/k8s.io/abc/config.json"


# -- the container runtime, decided from its own process (issue 29 item 3) -------------------

def test_containerd_found_from_its_own_config_where_no_default_socket_is(tmp_path, daemons):
    """canonical/k8s-snap#1046: a containerd whose socket is outside every default
    (`--container-runtime-endpoint="/home/ubuntu/containerd/k8s-containerd/run/containerd/
    containerd.sock"`). The address comes from its config's [grpc] address here, the state dir
    from the same config; the default config (a decoy for a fixed-path resolver) is not read."""
    root = tmp_path / "host"
    base = "home/ubuntu/containerd/k8s-containerd"
    write(root, "etc/containerd/config.toml", 'version = 2\nstate = "/run/containerd"\n')
    write(root, f"{base}/etc/containerd/config.toml",
          f'version = 2\nroot = "/{base}/var/lib/containerd"\nstate = "/{base}/run/containerd"\n'
          f'[grpc]\n  address = "/{base}/run/containerd/containerd.sock"\n')
    c = daemons("containerd", [root / base / "run/containerd/containerd.sock"],
                "--config", f"/{base}/etc/containerd/config.toml", root=root)
    rt = runtime_layout.resolve_runtime(root)
    assert (rt.name, rt.pid, rt.socket, rt.config) == (
        "containerd", c.pid, f"/{base}/run/containerd/containerd.sock",
        f"/{base}/etc/containerd/config.toml")
    assert (rt.state_dir, rt.root_dir) == (f"/{base}/run/containerd",
                                           f"/{base}/var/lib/containerd")
    assert f"(grpc.address in /{base}/etc/containerd/config.toml)" in rt.how
    assert rt.bundle_configs()[0][0] == \
        f"{base}/run/containerd/io.containerd.runtime.v2.task/k8s.io/{{id}}/config.json"


def test_two_containerds_the_kubelets_runtime_endpoint_decides(tmp_path, daemons):
    """NVIDIA/nvidia-container-toolkit#982: a k0s node with k0s's embedded containerd
    (--address /run/k0s/containerd.sock, k0s's runtime.md flags) beside a vanilla containerd:
    the one the kubelet talks to is the one whose containers are judged."""
    root = tmp_path / "host"
    write(root, "etc/k0s/containerd.toml", "version = 2\n")
    vanilla = daemons("containerd", [root / "run/containerd/containerd.sock"], root=root)
    k0s = daemons("containerd", [root / "run/k0s/containerd.sock"],
                  "--root=/var/lib/k0s/containerd", "--state=/run/k0s/containerd",
                  "--address=/run/k0s/containerd.sock", "--config=/etc/k0s/containerd.toml",
                  root=root)
    daemons("kubelet", [root / "var/lib/k0s/kubelet/device-plugins/kubelet.sock"],
            "--root-dir=/var/lib/k0s/kubelet",
            "--container-runtime-endpoint=unix:///run/k0s/containerd.sock", root=root)
    rt = runtime_layout.resolve_runtime(root)
    assert (rt.pid, rt.socket, rt.state_dir) == (k0s.pid, "/run/k0s/containerd.sock",
                                                 "/run/k0s/containerd")
    assert "the kubelet's runtime endpoint is /run/k0s/containerd.sock" in rt.how
    assert f"also running: containerd (pid {vanilla.pid}, /run/containerd/containerd.sock)" \
        in rt.how


def test_a_containerd_that_is_not_the_hosts_own_is_not_the_runtime(tmp_path, daemons):
    """A tenant's process named containerd, serving the socket its own flags name (its root is
    not the host's): the host's containerd on the default socket is the runtime."""
    root = tmp_path / "host"
    write(root, "etc/evil/config.toml", 'version = 2\nstate = "/tmp/evil"\n')
    daemons("containerd", [root / "run/evil/containerd.sock"], "--address=/run/evil/containerd.sock",
            "--config=/etc/evil/config.toml")
    real = daemons("containerd", [root / "run/containerd/containerd.sock"], root=root)
    rt = runtime_layout.resolve_runtime(root)
    assert (rt.pid, rt.socket, rt.state_dir) == (real.pid, "/run/containerd/containerd.sock",
                                                 "/run/containerd")
    assert "containerd's default address" in rt.how


def test_crio_listen_and_runroot_from_its_drop_in_dir(tmp_path, daemons):
    """CRI-O merges /etc/crio/crio.conf.d/*.conf over crio.conf (crio.conf.d(5)); [crio.api]
    listen and [crio] runroot set there decide where it is."""
    root = tmp_path / "host"
    write(root, "etc/crio/crio.conf", '[crio]\nroot = "/var/lib/containers/storage"\n')
    write(root, "etc/crio/crio.conf.d/10-custom.conf",
          '[crio]\nrunroot = "/run/custom/runroot"\n[crio.api]\nlisten = "/run/custom/crio.sock"\n')
    c = daemons("crio", [root / "run/custom/crio.sock"], root=root)
    rt = runtime_layout.resolve_runtime(root)
    assert (rt.name, rt.pid, rt.socket, rt.state_dir, rt.config_dir) == (
        "cri-o", c.pid, "/run/custom/crio.sock", "/run/custom/runroot", "/etc/crio/crio.conf.d")
    assert "[crio.api] listen" in rt.how

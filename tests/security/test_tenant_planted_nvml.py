"""A tenant never chooses what the probe loads as root (security audit round 4, HL-01).

The audit's attack: a tenant pod, root in its own container with an emptyDir and nothing else,
runs a process named `kubelet` with `--root-dir` in its emptyDir, serves the kubelet's sockets
there, and a second process serving a device-plugin socket there with NVIDIA_DRIVER_ROOT
pointing at a libnvidia-ml.so.1 it planted (root-owned, 0755, as a root container's files
are). The probe then took the emptyDir as the kubelet dir, the planted driver root as the
node's, and dlopen()ed the tenant's library in its NVML child, as root; the watching agent did
it by itself in one pass.

Here the attack runs as the audit ran it (../shared/audits/t4-repro/h02_tenant_kubelet.sh): the
host's kubelet is a process of the host root serving the default sockets; the tenant's
processes live in a mount namespace of their own with the emptyDir bind-mounted at /mnt, and
really serve their sockets (the probe matches socket inodes through /proc/PID/root). Each
library writes a marker naming itself when loaded: the host's must run, the tenant's never.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from node_probe.host import host_owned, layout, run_cache
from tests.fakes import fake_daemon
from tests.probe_run import REPO, run_probe

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None
                                or shutil.which("gcc") is None,
                                reason="needs root (chroot, mount namespaces) and gcc")

POD_UID = "6b1f0c1e-0000-4000-8000-000000000001"
EMPTYDIR = f"var/lib/kubelet/pods/{POD_UID}/volumes/kubernetes.io~empty-dir/scratch"
LIBDIR = "usr/lib/x86_64-linux-gnu"


def marker_lib(path: Path, marker: Path, name: str) -> None:
    """A libnvidia-ml.so.1 whose constructor appends `name` to `marker` when it is loaded."""
    path.parent.mkdir(parents=True, exist_ok=True)
    src = path.parent / f".{name}.c"
    src.write_text(textwrap.dedent(f"""\
        #include <stdio.h>
        __attribute__((constructor)) static void c(void) {{
            FILE *f = fopen("{marker}", "a");
            if (f) {{ fprintf(f, "{name}\\n"); fclose(f); }}
        }}
        int nvmlInit_v2(void) {{ return 999; }}
        """))
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(path), str(src)], check=True)
    src.unlink()
    path.chmod(0o755)


@pytest.fixture
def short_tmp():
    """A short temp dir: unix socket paths are limited to 107 bytes, and the emptyDir's is long."""
    d = Path(tempfile.mkdtemp(prefix="hl01-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def node(short_tmp):
    """A host root with the host's own library and kubelet, and the tenant's plant."""
    work = short_tmp
    host = work / "host"
    marker = work / "MARKER"
    marker_lib(host / LIBDIR / "libnvidia-ml.so.1", marker, "HOST_LIB")
    ed = host / EMPTYDIR
    marker_lib(ed / "drv" / LIBDIR / "libnvidia-ml.so.1", marker, "TENANT_LIB")
    for d in (ed, *ed.rglob("*")):
        if d.is_dir():
            d.chmod(0o755)
    procs: list[subprocess.Popen] = []
    # the host's kubelet: a process of the host root, no --root-dir (the kubeadm default)
    kdir = host / "var/lib/kubelet"
    procs.append(fake_daemon.spawn("kubelet", [kdir / "device-plugins/kubelet.sock",
                                               kdir / "pod-resources/kubelet.sock"], root=host))
    # the tenant: its own mount namespace, its emptyDir at /mnt (as a container sees a volume)
    script = fake_daemon._script()
    tenant = subprocess.Popen(
        # (an asynchronous list's stdin is /dev/null: the pipe is kept on fd 3 so that both end
        # when the test closes it)
        ["unshare", "-m", "--propagation", "private", "sh", "-c",
         f'exec 3<&0; mount --bind "{ed}" /mnt || exit 1; '
         f'"{sys.executable}" "{script}" kubelet /mnt/device-plugins/kubelet.sock,'
         f'/mnt/pod-resources/kubelet.sock "" --root-dir=/{EMPTYDIR} <&3 & '
         f'NVIDIA_DRIVER_ROOT=/{EMPTYDIR}/drv "{sys.executable}" "{script}" nvidia-device-p '
         f'/mnt/device-plugins/nvidia-gpu.sock "" <&3 & wait'],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
    said = ""
    while said.count("ready") < 2:            # two processes, one pipe: lines may interleave
        said += tenant.stdout.read(1) or "EOF"
        assert "EOF" not in said, "the tenant's processes did not start"
    yield host, marker, work
    for p in procs:
        p.kill()
        p.wait(10)
    os.killpg(tenant.pid, 9)
    tenant.wait(10)
    run_cache.clear()


def test_the_probe_loads_the_hosts_library_not_the_tenants(node):
    host, marker, work = node
    kfile = work / "kmsg"
    kfile.write_text("")
    run = run_probe("--host-root", str(host), "--kmsg-file", str(kfile), "--trace-seconds", "0",
                    "--cgroup-root", str(work), "--timeout", "40", timeout=90)
    assert run.records and run.records[-1]["kind"] == "summary", run.stderr[-2000:]
    assert marker.read_text().split() == ["HOST_LIB"]            # never TENANT_LIB
    (where,) = [r for r in run.records if r.get("phase") == "layout"]
    assert where["kubelet_dir"]["path"] == str(host / "var/lib/kubelet")
    refused = [t for t in where["kubelet_dir"]["tried"] if "not believed" in t]
    assert refused and f"/{EMPTYDIR}" in refused[0] and "is not the host's" in refused[0]
    assert where["driver_root"]["library"] == str(host / LIBDIR / "libnvidia-ml.so.1")
    # nothing of the verdict comes from the tenant's dir: its plugin socket is not inventoried
    assert "empty-dir" not in json.dumps(run.findings())


def test_the_watching_agent_loads_the_hosts_library_not_the_tenants(node):
    host, marker, work = node
    p = subprocess.run(
        [sys.executable, "-m", "node_probe", "agent-watch", "--host-root", str(host),
         "--node-name", "gpu-1", "--no-api", "--no-evidence", "--passes", "1",
         "--kmsg-file", "/dev/null", "--cgroup-root", str(work)],
        capture_output=True, text=True, timeout=120, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert p.returncode == 0, p.stderr[-2000:]
    assert marker.read_text().split() == ["HOST_LIB"]


def test_a_driver_root_named_by_a_plugin_in_a_pod_volume_is_refused_and_said(short_tmp):
    """A plugin serving the host kubelet's socket (so it has the hostPath) told a driver root in
    a pod's volume: the library there is never loaded, and the probe says so instead of "no
    NVIDIA driver"."""
    tmp_path = short_tmp
    host = tmp_path / "host"
    marker = tmp_path / "MARKER"
    marker_lib(host / EMPTYDIR / "drv" / LIBDIR / "libnvidia-ml.so.1", marker, "TENANT_LIB")
    kdir = host / "var/lib/kubelet"
    procs = [fake_daemon.spawn("kubelet", [kdir / "device-plugins/kubelet.sock"], root=host),
             fake_daemon.spawn("nvidia-device-p", [kdir / "device-plugins/nvidia-gpu.sock"],
                               env={"NVIDIA_DRIVER_ROOT": f"/{EMPTYDIR}/drv"})]
    try:
        run_cache.clear()
        got = layout.driver_root(host)
        assert got.library is None
        assert got.refused == ((f"/{EMPTYDIR}/drv/{LIBDIR}/libnvidia-ml.so.1",
                                f"/{EMPTYDIR}/drv/{LIBDIR}/libnvidia-ml.so.1 lies in "
                                "/var/lib/kubelet/pods, a kubelet dir's pods/ (pod volumes)"),)
        kfile = tmp_path / "kmsg"
        kfile.write_text("")
        run = run_probe("--host-root", str(host), "--kmsg-file", str(kfile), "--trace-seconds",
                        "0", "--cgroup-root", str(tmp_path), "--only", "nvml", timeout=60)
        (f,) = run.findings("nvml.unavailable")
        assert f["severity"] == "warning" and "not loaded" in f["title"]
        assert f["evidence"]["refused"][0]["library"].endswith("libnvidia-ml.so.1")
        assert not marker.exists()
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
        run_cache.clear()


# the watching agent's way: the same child forked by its NVML forkserver (issue 41 item 3)
FORKED = ("import sys; from node_probe.host import nvml_forkserver as f; "
          "assert f.start(); r = f.run(sys.argv[1:], 30); sys.stdout.buffer.write(r.stdout)")


@pytest.fixture(params=["started", "forked"])
def ask_child(request):
    def run(*args: str) -> dict:
        head = ([sys.executable, "-m", "node_probe.host.nvml_child"]
                if request.param == "started" else [sys.executable, "-c", FORKED])
        p = subprocess.run([*head, *args], capture_output=True, text=True, timeout=60,
                           cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
        (result,) = [json.loads(x)["result"] for x in p.stdout.splitlines() if '"result"' in x]
        return result
    return run


@pytest.mark.parametrize("where,why", [
    (f"{EMPTYDIR}/{LIBDIR}", "lies in /var/lib/kubelet/pods"),
    ("var/lib/containerd/io.containerd.snapshotter.v1.overlayfs/snapshots/17/fs/" + LIBDIR,
     "lies in /var/lib/containerd"),
    ("opt/open/" + LIBDIR, "/opt/open is writable by group or others"),
])
def test_the_nvml_child_refuses_what_is_not_the_hosts_own_whoever_calls_it(tmp_path, where,
                                                                            why, ask_child):
    """Defence in depth: the child itself checks before mapping a byte of the library."""
    host = tmp_path / "host"
    marker = tmp_path / "MARKER"
    lib = host / where / "libnvidia-ml.so.1"
    marker_lib(lib, marker, "PLANTED")
    if "open" in where:
        (host / "opt/open").chmod(0o777)
    got = ask_child("--host-root", str(host), str(lib))
    assert got["status"] == "refused" and why in got["error"], got
    assert not marker.exists()


def test_the_nvml_child_loads_the_hosts_own_library_and_refuses_a_symlink(tmp_path, ask_child):
    host = tmp_path / "host"
    marker = tmp_path / "MARKER"
    lib = host / LIBDIR / "libnvidia-ml.so.570.172.08"
    marker_lib(lib, marker, "HOST_LIB")
    (host / LIBDIR / "libnvidia-ml.so.1").symlink_to(lib.name)
    got = ask_child("--host-root", str(host), str(host / LIBDIR / "libnvidia-ml.so.1"))
    assert got["status"] == "refused" and "is a symlink" in got["error"]   # callers resolve
    assert not marker.exists()
    got = ask_child("--host-root", str(host), str(lib))
    assert got["status"] == "error" and marker.read_text().split() == ["HOST_LIB"]


def test_a_process_is_the_hosts_only_with_the_host_root_and_outside_every_pod(tmp_path):
    """/proc/PID/cgroup lines quoted from real nodes: a CRI-O pod's container
    (opencontainers/runc#4620, calico-node) and a host kubelet in system.slice
    (kontena/pharos-cluster#440)."""
    host = tmp_path / "host"
    host.mkdir()
    proc = tmp_path / "proc"
    pod = ("13:freezer:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poda5c1f8d5_"
           "1919_434d_add7_4afaafdaef89.slice/crio-5eed917563583925ffdbd40a64efb2aaffe58638e57ad"
           "d8becaf460fe74f5b1c.scope\n")
    kubelet = "6:memory:/system.slice\n1:name=systemd:/system.slice\n"
    for pid, root, cg in ((10, host, kubelet), (11, host, pod), (12, tmp_path, kubelet)):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "root").symlink_to(root)
        (proc / str(pid) / "cgroup").write_text(cg)
    assert host_owned.process_refusal(10, proc, host) is None
    assert "runs in a pod's cgroup" in host_owned.process_refusal(11, proc, host)
    assert "root is not the host's" in host_owned.process_refusal(12, proc, host)


# Two lines of a real k3s node's mountinfo, quoted from k3d-io/k3d#48 (turn 13): each container's
# root is an overlay under containerd's state dir, its writes land in the upperdir.
K3S_MOUNTINFO = (
    "2536 2061 0:199 / /run/k3s/containerd/io.containerd.runtime.v1.linux/k8s.io/0b14fd09a2d4d54"
    "042919c5cdc9767f4d18afc50b3a90383043fa898e3483daa/rootfs rw,relatime - overlay overlay rw,lo"
    "werdir=/var/lib/rancher/k3s/agent/containerd/io.containerd.snapshotter.v1.overlayfs/snapshot"
    "s/1/fs,upperdir=/var/lib/rancher/k3s/agent/containerd/io.containerd.snapshotter.v1.overlayfs"
    "/snapshots/17/fs,workdir=/var/lib/rancher/k3s/agent/containerd/io.containerd.snapshotter.v1."
    "overlayfs/snapshots/17/work,xino=off\n"
    "2583 2061 0:3 net:[4026534625] /var/run/netns/cni-92573b38-8889-0842-c69d-d7456957beaa rw - "
    "nsfs nsfs rw\n")


def test_overlay_roots_and_upper_dirs_of_the_mount_table_are_tenant_areas():
    got = host_owned.overlay_areas(K3S_MOUNTINFO)
    assert got == {
        "run/k3s/containerd/io.containerd.runtime.v1.linux/k8s.io/0b14fd09a2d4d54042919c5cdc976"
        "7f4d18afc50b3a90383043fa898e3483daa/rootfs": "an overlay mount (a container's root)",
        "var/lib/rancher/k3s/agent/containerd/io.containerd.snapshotter.v1.overlayfs/snapshots/17"
        "/fs": "an overlay upperdir",
        "var/lib/rancher/k3s/agent/containerd/io.containerd.snapshotter.v1.overlayfs/snapshots/17"
        "/work": "an overlay workdir"}
    # the GPU Operator's driver container is an overlay mounted at /run/nvidia/driver by
    # privileged host software: trusted at exactly that path
    operator = "3000 2061 0:250 / /run/nvidia/driver rw - overlay overlay rw,upperdir=/x/fs\n"
    assert host_owned.overlay_areas(operator) == {"x/fs": "an overlay upperdir"}
    # mount points with a space are escaped as \040 (proc_pid_mountinfo(5))
    odd = "1 2 0:1 / /srv/my\\040root rw - overlay overlay rw\n"
    assert list(host_owned.overlay_areas(odd)) == ["srv/my root"]

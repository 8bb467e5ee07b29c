"""Builders for raw API objects (camelCase dicts as the API server returns them) carrying the
annotation values HAMi writes; values are copied from HAMi's docs, tests and source formats."""
from __future__ import annotations

import datetime as dt

import pytest

UUID_A = "GPU-03f69c50-207a-2038-9b45-23cac89cb67d"
UUID_B = "GPU-1afede84-4e70-2174-49af-f07ebb94d1ae"
NOW = dt.datetime(2024, 5, 14, 7, 10, 0, tzinfo=dt.timezone.utc)

# hami <= 2.4: 7 fields per device, ':'-terminated (docs/develop/protocol.md)
REG_LEGACY7 = (f"{UUID_A},10,46068,100,NVIDIA-NVIDIA A40,0,true:"
               f"{UUID_B},10,46068,100,NVIDIA-NVIDIA A40,0,true:")
# later string encoding: ,index,mode appended (EncodeNodeDevices)
REG_LEGACY9 = (f"{UUID_A},10,46068,100,NVIDIA-NVIDIA A40,0,true,0,hami-core:"
               f"{UUID_B},10,46068,100,NVIDIA-NVIDIA A40,0,true,1,hami-core:")
# JSON list (MarshalNodeDevices, omitempty: index 0 and health false are left out)
REG_JSON = ('[{"id":"%s","count":10,"devmem":46068,"devcore":100,"type":"NVIDIA-NVIDIA A40",'
            '"mode":"hami-core","health":true},'
            '{"id":"%s","index":1,"count":10,"devmem":46068,"devcore":100,'
            '"type":"NVIDIA-NVIDIA A40","mode":"hami-core","health":true}]' % (UUID_A, UUID_B))


def node(name="gpu-1", annotations=None, allocatable=None):
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": dict(annotations or {})},
            "status": {"allocatable": dict(allocatable or {}), "capacity": dict(allocatable or {})}}


def pod(name, ns="default", node_name="gpu-1", annotations=None, phase="Pending", gpus=1,
        uid=None, owner=True, image="pytorch:latest", extra_containers=()):
    md = {"name": name, "namespace": ns, "uid": uid or f"uid-{name}",
          "annotations": dict(annotations or {})}
    if owner:
        md["ownerReferences"] = [{"kind": "ReplicaSet", "name": f"{name}-rs"}]
    containers = [{"name": "main", "image": image,
                   "resources": {"limits": {"nvidia.com/gpu": str(gpus)} if gpus else {}}}]
    containers += list(extra_containers)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": md,
            "spec": {"nodeName": node_name, "containers": containers},
            "status": {"phase": phase}}


def plugin_pod(node_name="gpu-1"):
    return pod("hami-device-plugin-x7k2p", ns="kube-system", node_name=node_name, gpus=0,
               phase="Running", image="projecthami/hami:v2.5.0")


def event(pod_obj, reason, message, ts="2024-05-14T07:09:30Z"):
    md = pod_obj["metadata"]
    return {"kind": "Event", "reason": reason, "message": message, "type": "Warning",
            "involvedObject": {"kind": "Pod", "name": md["name"], "namespace": md["namespace"],
                               "uid": md["uid"]},
            "lastTimestamp": ts}


@pytest.fixture
def now():
    return NOW


# -- node side: real container roots ------------------------------------------------------------

import os
import shutil
import signal
import subprocess
from pathlib import Path


def _copy_with_libs(binary: str, root: Path) -> None:
    """Copy a dynamically linked binary and the libraries ldd names into root (same paths)."""
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, timeout=10).stdout
    paths = [binary]
    for line in out.splitlines():
        for tok in line.split():
            if tok.startswith("/"):
                paths.append(tok)
    for p in paths:
        real = os.path.realpath(p)
        for dest in {p, real}:
            d = root / dest.lstrip("/")
            d.parent.mkdir(parents=True, exist_ok=True)
            if not d.exists():
                shutil.copy2(real, d)


class ContainerRoot:
    """A directory laid out like a HAMi container's /: /bin/sleep (with its libc), optionally
    /etc/ld.so.preload, /usr/local/vgpu/libvgpu.so and the shared cache dir."""

    def __init__(self, path: Path) -> None:
        self.path = path
        _copy_with_libs("/bin/sleep", path)

    def add_vgpu(self, preload=True, lib=True, cache_dir=True, preload_text=None,
                 hook="/usr/local", preload_symlink=False) -> "ContainerRoot":
        vgpu = self.path / hook.lstrip("/") / "vgpu"
        if cache_dir:
            vgpu.mkdir(parents=True, exist_ok=True)
        if lib:
            vgpu.mkdir(parents=True, exist_ok=True)
            (vgpu / "libvgpu.so").write_bytes(b"\x7fELF not really")
        if preload:
            etc = self.path / "etc"
            etc.mkdir(exist_ok=True)
            text = preload_text if preload_text is not None else f"{hook}/vgpu/libvgpu.so\n"
            if preload_symlink:  # an absolute symlink must resolve inside the container root
                vgpu.mkdir(parents=True, exist_ok=True)
                (vgpu / "ld.so.preload").write_text(text)
                os.symlink(f"{hook}/vgpu/ld.so.preload", etc / "ld.so.preload")
            else:
                (etc / "ld.so.preload").write_text(text)
        return self


HAMI_ENV = {"CUDA_DEVICE_MEMORY_LIMIT_0": "3000m", "CUDA_DEVICE_SM_LIMIT": "30",
            "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/7e1d3c2a-54b0-4c55-a5f0-0c1d2e3f4a5b.cache",
            "NVIDIA_VISIBLE_DEVICES": UUID_A}


class Chrooted:
    """Real processes whose /proc/PID/root is a ContainerRoot (chroot + exec /bin/sleep)."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, root: ContainerRoot, env: dict) -> subprocess.Popen:
        chroot = shutil.which("chroot") or "/usr/sbin/chroot"
        p = subprocess.Popen([chroot, str(root.path), "/bin/sleep", "120"], env=dict(env),
                             start_new_session=True)
        self.procs.append(p)
        return p

    def wait_rooted(self, p: subprocess.Popen, root: ContainerRoot, timeout=60.0) -> None:
        import time
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                if os.readlink(f"/proc/{p.pid}/root") == str(root.path) and \
                        os.readlink(f"/proc/{p.pid}/exe").endswith("sleep"):
                    return
            except OSError:
                pass
            time.sleep(0.02)
        raise AssertionError(f"pid {p.pid} did not chroot into {root.path}")

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)


@pytest.fixture
def container_root(tmp_path):
    n = [0]

    def make() -> ContainerRoot:
        n[0] += 1
        return ContainerRoot(tmp_path / f"root{n[0]}")
    return make


@pytest.fixture
def chrooted():
    if os.geteuid() != 0:
        pytest.skip("needs root: chroot")
    c = Chrooted()
    try:
        yield c
    finally:
        c.stop()

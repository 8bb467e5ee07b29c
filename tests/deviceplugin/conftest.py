"""Fixtures for the device-plugin tests: a short temp host root (unix socket paths are limited
to 107 bytes), real fake-plugin processes (started and killed by pid), a pod-resources server."""
from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FAKE_PLUGIN = REPO / "tests" / "fakes" / "fake_device_plugin.py"
KUBELET_REL = "var/lib/kubelet"
GPU_A = "GPU-2f815c32-768d-d782-1073-db01d7b90215"
GPU_B = "GPU-bafcf1f7-1006-01e5-85e2-684fee364617"


class Host:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.kubelet = root / KUBELET_REL
        self.plugins_dir = self.kubelet / "device-plugins"
        self.plugins_dir.mkdir(parents=True)
        (self.kubelet / "pod-resources").mkdir()
        # the kubelet's registration socket: this fake host is a Kubernetes node (a host
        # without it and without a kubelet process is not one: node.not_kubernetes)
        k = socket.socket(socket.AF_UNIX)
        k.bind(str(self.plugins_dir / "kubelet.sock"))
        k.close()

    def not_a_node(self) -> None:
        (self.plugins_dir / "kubelet.sock").unlink()

    def args(self, *extra: str) -> list[str]:
        return ["--host-root", str(self.root), "--kubelet-dir", str(self.kubelet), *extra]

    def driver_version(self, version: str) -> None:
        d = self.root / "proc/driver/nvidia"
        d.mkdir(parents=True, exist_ok=True)
        (d / "version").write_text(
            f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  Sun Jul  6 2025\n"
            "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")

    def gpu_dirs(self, *pci: str) -> None:
        for p in pci:
            (self.root / "proc/driver/nvidia/gpus" / p).mkdir(parents=True, exist_ok=True)


@pytest.fixture
def host():
    root = Path(tempfile.mkdtemp(prefix="gd-", dir="/tmp"))
    try:
        yield Host(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


class Plugin:
    def __init__(self, proc: subprocess.Popen, socket: Path, call_log: Path) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.socket = socket
        self.call_log = call_log

    def calls(self) -> list[str]:
        try:
            return self.call_log.read_text().split("\n")[:-1]
        except FileNotFoundError:
            return []

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)


def _wait_ready(proc: subprocess.Popen, timeout: float) -> None:
    end = time.monotonic() + timeout
    buf = b""
    while time.monotonic() < end:
        r, _, _ = select.select([proc.stdout], [], [], max(0.0, end - time.monotonic()))
        if not r:
            break
        chunk = os.read(proc.stdout.fileno(), 4096)
        if not chunk:
            break
        buf += chunk
        if b"READY" in buf:
            return
    proc.kill()
    out = proc.communicate(timeout=5)
    raise RuntimeError(f"fake plugin did not start: {buf!r} {out!r}")


@pytest.fixture
def start_plugin(host):
    started: list[Plugin] = []

    def start(name: str = "nvidia-gpu.sock", *, mode: str = "healthy", nvml_lib=None,
              devices=(GPU_A, GPU_B), extra=(), wrapper=(), env=None) -> Plugin:
        sock = host.plugins_dir / name
        log = host.root / f"calls-{name}.log"
        argv = [*wrapper, sys.executable, str(FAKE_PLUGIN), "--socket", str(sock), "--mode", mode,
                "--devices", ",".join(devices), "--call-log", str(log), *extra]
        if nvml_lib:
            argv += ["--nvml-lib", str(nvml_lib)]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})})
        _wait_ready(proc, 60)  # a grpc server start on a loaded 2-core machine
        p = Plugin(proc, sock, log)
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()


@pytest.fixture
def podres(host):
    """Serve pod-resources for the host's kubelet dir with the given rows (in-process)."""
    from tests.fakes.fake_podresources import serve

    servers = []

    def start(rows, hang=False):
        s = serve(host.kubelet / "pod-resources" / "kubelet.sock", rows, hang)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop(0)

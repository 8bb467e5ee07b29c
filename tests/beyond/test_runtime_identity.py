"""The runtime whose config is judged is the process serving the CRI socket under the host root
(found by socket inode), not whatever process is named `containerd`: real listening unix
sockets, real processes, one of them a tenant's decoy."""
from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from node_probe.host import layout, runtime_config
from tests.fakes import fake_daemon

NVIDIA_CONFIG = """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
  BinaryName = "/usr/bin/nvidia-container-runtime"
"""
DECOY_CONFIG = """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.decoy.options]
  BinaryName = "/tmp/decoy"
"""
DEFAULT_CONFIG = """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
"""


@pytest.fixture
def procs(tmp_path):
    started: list[subprocess.Popen] = []

    def start(*args: str, comm: str | None = None, bind: Path | None = None) -> subprocess.Popen:
        p = fake_daemon.spawn(comm or "", [bind] if bind else [], *args)
        started.append(p)
        return p

    yield start
    for p in started:
        p.kill()
        p.wait(timeout=10)


def host(tmp_path: Path) -> Path:
    root = tmp_path / "host"
    for rel, text in (("etc/containerd/config.toml", DEFAULT_CONFIG),
                      ("custom/config.toml", NVIDIA_CONFIG), ("decoy/config.toml", DECOY_CONFIG),
                      ("etc/crio/crio.conf", '[crio.runtime]\ndefault_runtime = "runc"\n'),
                      ("opt/crio/crio.conf", '[crio.runtime]\ndefault_runtime = "nvidia"\n')):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    for d in ("run/containerd", "var/run/crio"):
        (root / d).mkdir(parents=True)
    return root


def test_config_of_the_process_serving_the_cri_socket_not_of_a_decoy(tmp_path, procs):
    root = host(tmp_path)
    # the tenant's decoy: named containerd, started first, with a socket of the same name bound
    # in a path of its own
    (tmp_path / "elsewhere").mkdir()
    procs("--config", "/decoy/config.toml", comm="containerd",
          bind=tmp_path / "elsewhere/containerd.sock")
    real = procs("--config", "/custom/config.toml", comm="ctrd-real",
                 bind=root / "run/containerd/containerd.sock")
    assert layout.runtime(root).pid == real.pid
    assert runtime_config.containerd_config_paths(root)[0] == "custom/config.toml"
    cfg = runtime_config.containerd(root)
    assert cfg.files == ("/custom/config.toml",) and cfg.nvidia_handlers == ["nvidia"]
    assert "decoy" not in cfg.handlers


def test_a_decoy_alone_leaves_the_default_config(tmp_path, procs):
    root = host(tmp_path)
    procs("--config", "/decoy/config.toml", comm="containerd")
    # a socket file nobody serves any more (its server exited)
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(root / "run/containerd/containerd.sock"))
    s.close()
    assert layout.runtime(root).pid is None
    cfg = runtime_config.containerd(root)
    assert cfg.files == ("/etc/containerd/config.toml",) and set(cfg.handlers) == {"runc"}


def test_crio_config_named_by_the_process_serving_crio_sock(tmp_path, procs):
    root = host(tmp_path)
    procs("--config", "/etc/crio/crio.conf", comm="crio",
          bind=tmp_path / "crio.sock")           # decoy: right name, wrong socket
    procs("--config=/opt/crio/crio.conf", comm="crio-real", bind=root / "var/run/crio/crio.sock")
    cfg = runtime_config.crio(root)
    assert cfg.files == ("/opt/crio/crio.conf",) and cfg.default_handler == "nvidia"


def test_crio_without_a_serving_process_reads_the_default(tmp_path):
    cfg = runtime_config.crio(host(tmp_path))
    assert cfg.files == ("/etc/crio/crio.conf",) and cfg.default_handler == "runc"

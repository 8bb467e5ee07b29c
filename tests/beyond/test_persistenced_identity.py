"""nvidia-persistenced is the host's daemon only when it runs in the host's filesystem (issue
21, item 7): a tenant's container process that calls itself nvidia-persistenced does not keep
the driver initialised and must not silence persistence.off. Identified as the kubelet and the
device plugin are, by what the process is rather than its name: its root is the host root (or
the GPU Operator's driver container root, mounted at run/nvidia/driver).

The 'daemons' are real processes named nvidia-persistenced (comm and argv[0]) confined with
chroot: into the test's host root (the host's daemon), into another directory (a container),
into <host root>/run/nvidia/driver (the GPU Operator's driver container)."""
from __future__ import annotations

import os

import pytest

from tests.beyond.conftest import healthy_gpus, make_host
from tests.probe_run import run_probe

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chroot needs root")


def probe(root, kfile):
    return run_probe("--host-root", str(root), "--kmsg-file", str(kfile), "--trace-seconds", "0",
                     "--kubelet-dir", str(root / "var/lib/kubelet"),
                     "--only", "nvml", "--only", "persistence")


def test_persistenced_of_the_host_silences_persistence_off(tmp_path, chrooted):
    root, kfile = make_host(tmp_path, healthy_gpus(2, persistence=False))
    chrooted(root)
    run = probe(root, kfile)
    assert not run.findings("persistence.off"), run.findings()


def test_persistenced_of_the_gpu_operator_driver_container_counts(tmp_path, chrooted):
    root, kfile = make_host(tmp_path, healthy_gpus(2, persistence=False))
    chrooted(root / "run/nvidia/driver")
    run = probe(root, kfile)
    assert not run.findings("persistence.off"), run.findings()


def test_a_container_process_named_persistenced_is_not_the_host_daemon(tmp_path, chrooted):
    root, kfile = make_host(tmp_path, healthy_gpus(2, persistence=False))
    pid = chrooted(tmp_path / "tenant-container-rootfs")
    run = probe(root, kfile)
    (f,) = run.findings("persistence.off")
    assert f["evidence"]["nvidia_persistenced_pids"] == []
    assert f["evidence"]["not_host_pids"] == [pid]

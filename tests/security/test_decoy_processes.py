"""Decoys never hide the host's kubelet or runtime (security audit round 5, HK-01).

The audit's attack (../shared/audits/t5-repro/hk01_decoy_kubelets.sh): sixteen processes named
`kubelet` -- a tenant needs only prctl(PR_SET_NAME) in its own container, sixteen times --
started before the node's kubelet. The resolver looked at the first MAX_PROCS_SEEN=16
processes of that name in /proc order (ascending pid) and refused each decoy (not the host's)
but spent a slot on it; a kubelet (re)started after them, with a higher pid, was never looked
at and its `--root-dir` was lost: "no kubelet found: the default", and on a node with another
root dir every device-plugin finding vanished. The runtime's resolver had the same cap.

Here with real processes (tests/fakes/fake_daemon.py): the decoys run with the machine's `/` as
their root, which the test's host root is not (a container's process, as far as the probe can
tell), and the host's daemons chroot into the host root and really serve their sockets. The
host's own processes named `kubelet` with nothing to say (no --root-dir) take no slot either.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from node_probe.host import daemon_args, kubelet_root_dir, run_cache, runtime_layout
from tests.fakes import fake_daemon

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chroot)")

DECOYS = daemon_args.MAX_PROCS_SEEN


@pytest.fixture
def host():
    d = Path(tempfile.mkdtemp(prefix="hk01-", dir="/tmp"))   # unix socket paths: 107 bytes
    procs: list = []
    run_cache.clear()
    try:
        yield d / "host", procs
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
        run_cache.clear()
        shutil.rmtree(d, ignore_errors=True)


def test_sixteen_decoy_kubelets_started_first_do_not_hide_the_kubelet(host):
    root, procs = host
    root.mkdir()
    for i in range(DECOYS):   # a tenant's container: not the host root
        procs.append(fake_daemon.spawn("kubelet", [], f"--root-dir=/decoy{i}"))
    for _ in range(DECOYS):   # the host's own, naming no root dir: nothing to look at
        procs.append(fake_daemon.spawn("kubelet", [], root=root))
    kdir = root / "srv/kubelet"   # the node's kubelet, (re)started last, its own root dir
    kubelet = fake_daemon.spawn("kubelet", [kdir / "device-plugins/kubelet.sock",
                                            kdir / "pod-resources/kubelet.sock"],
                                "--root-dir=/srv/kubelet", root=root)
    procs.append(kubelet)
    kd = kubelet_root_dir.resolve_kubelet_dir(root)
    assert kd.path == kdir and kd.served and kd.pid == kubelet.pid, kd
    assert f"--root-dir of pid {kubelet.pid}" in kd.how
    # the decoys' dirs are said, refused, never taken
    assert any("/decoy0" in t and "not the host's" in t for t in kd.tried), kd.tried


def test_sixteen_decoy_runtimes_started_first_do_not_hide_containerd(host):
    root, procs = host
    root.mkdir()
    for _ in range(DECOYS):
        procs.append(fake_daemon.spawn("containerd", [], "--address=/decoy/containerd.sock"))
    sock = root / "srv/ctrd/containerd.sock"   # not a default address: only its flag says it
    real = fake_daemon.spawn("containerd", [sock], "--address=/srv/ctrd/containerd.sock",
                             root=root)
    procs.append(real)
    rt = runtime_layout.resolve_runtime(root)
    assert rt.name == "containerd" and rt.pid == real.pid, rt
    assert rt.socket == "/srv/ctrd/containerd.sock" and "--address" in rt.how, rt


def test_without_decoys_the_same_kubelet_is_found(host):
    """The control: the node as the attack found it, minus the decoys."""
    root, procs = host
    root.mkdir()
    kdir = root / "srv/kubelet"
    procs.append(fake_daemon.spawn("kubelet", [kdir / "device-plugins/kubelet.sock",
                                               kdir / "pod-resources/kubelet.sock"],
                                   "--root-dir=/srv/kubelet", root=root))
    kd = kubelet_root_dir.resolve_kubelet_dir(root)
    assert kd.path == kdir and kd.served, kd

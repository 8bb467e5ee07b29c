"""nvidia-persistenced is the host's daemon only when it runs in the host's filesystem (issue
21, item 7): a tenant's container process that calls itself nvidia-persistenced does not keep
the driver initialised and must not silence persistence.off. Identified as the kubelet and the
device plugin are, by what the process is rather than its name: its root is the host root (or
the GPU Operator's driver container root, mounted at run/nvidia/driver).

The 'daemons' are real processes named nvidia-persistenced (comm and argv[0]) confined with
chroot: into the test's host root (the host's daemon), into another directory (a container),
into <host root>/run/nvidia/driver (the GPU Operator's driver container).

Where the driver lives comes from the layout matrix (tests/layouts/test_matrix.py): the driver's
library at each distribution's path, so host.layout resolves the node's driver root as it does
on that distribution, and the daemon counts in that root (GKE's /home/kubernetes/bin/nvidia) or,
on Talos, in the extension service's own root (/usr/local/lib/containers/nvidia-persistenced,
siderolabs/extensions nvidia-gpu/nvidia-container-toolkit/nvidia-persistenced.yaml and
https://www.talos.dev/latest/advanced/extension-services/) -- and only there."""
from __future__ import annotations

import os

import pytest

from tests.beyond.conftest import healthy_gpus, make_host
from tests.layouts.test_matrix import LAYOUTS
from tests.probe_run import run_probe

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chroot needs root")


LAYOUT = {lay.name: lay for lay in LAYOUTS}
TALOS_SERVICE_ROOT = "usr/local/lib/containers/nvidia-persistenced"
# where each distribution runs nvidia-persistenced, under its host root
DAEMON_ROOT = {"gke-cos": LAYOUT["gke-cos"].driver_root, "talos": TALOS_SERVICE_ROOT,
               "openshift-crio": LAYOUT["openshift-crio"].driver_root,
               "bottlerocket": "/", "kubeadm-ubuntu": "/"}


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


def on(tmp_path, name, persistence=False):
    """A host root laid out as distribution `name` (its driver library where it puts it)."""
    return make_host(tmp_path, healthy_gpus(2, persistence=persistence),
                     libdir=LAYOUT[name].libdir)


@pytest.mark.parametrize("name", sorted(DAEMON_ROOT))
def test_persistenced_in_the_distributions_driver_root_counts(tmp_path, chrooted, name):
    root, kfile = on(tmp_path, name)
    chrooted(root / DAEMON_ROOT[name].lstrip("/"))
    run = probe(root, kfile)
    assert not run.findings("persistence.off"), (run.findings(), run.stderr[-2000:])
    assert run.summary["checks"] and "error" not in {c["status"] for c in run.summary["checks"]}


@pytest.mark.parametrize("name", ["gke-cos", "talos"])
def test_a_tenant_process_named_persistenced_on_gke_and_talos_is_refused(tmp_path, chrooted,
                                                                          name):
    root, kfile = on(tmp_path, name)
    pid = chrooted(tmp_path / "tenant-container-rootfs")
    run = probe(root, kfile)
    (f,) = run.findings("persistence.off")
    assert f["severity"] == "warning"
    ev = f["evidence"]
    assert ev["nvidia_persistenced_pids"] == [] and ev["not_host_pids"] == [pid]
    # the roots it was judged against: the host, this node's driver root, the operator's
    assert {"/", LAYOUT[name].driver_root, "/run/nvidia/driver"} <= set(ev["daemon_roots"])
    assert (("/" + TALOS_SERVICE_ROOT) in ev["daemon_roots"]) == (name == "talos")


@pytest.mark.parametrize("elsewhere", ["home/kubernetes/bin/nvidia", TALOS_SERVICE_ROOT])
def test_another_distributions_driver_root_does_not_count_on_this_node(tmp_path, chrooted,
                                                                        elsewhere):
    """The node's own driver root counts, not every path some distribution uses: on a node whose
    driver is on the host, a process rooted in GKE's or Talos's directory is not its daemon."""
    root, kfile = on(tmp_path, "kubeadm-ubuntu")
    pid = chrooted(root / elsewhere)
    run = probe(root, kfile)
    (f,) = run.findings("persistence.off")
    assert f["evidence"]["not_host_pids"] == [pid]
    assert "/" + elsewhere not in f["evidence"]["daemon_roots"]


@pytest.mark.parametrize("name", ["gke-cos", "talos"])
def test_healthy_gke_and_talos_nodes_are_quiet(tmp_path, name):
    root, kfile = on(tmp_path, name, persistence=True)
    run = probe(root, kfile)
    assert not run.findings("persistence.off") and not run.actionable(), run.findings()
    status = {c["id"]: c["status"] for c in run.summary["checks"]}
    assert status["persistence"] == "ok" and status["nvml"] == "ok", status

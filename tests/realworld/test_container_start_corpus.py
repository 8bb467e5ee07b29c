"""The real container-start failures (corpus_container_start.py) fed to `pod Y` the way a cluster
shows them: in the container's status (`pod_status`) or in the kubelet's Warning event about the
pod (`runtime_message`), through the fake API server and the real CLI. Each must give the
thread's cause as pod.gpu_start_failed, with a cause word the quote itself does not contain.
"""
from __future__ import annotations

import json

import pytest

from tests.kubectl.conftest import run_cli
from tests.kubectl.fakecluster import FakeCluster

from .corpus_container_start import ARTIFACTS
from .feed import load_api

CHANNELS = ("pod_status", "runtime_message")


def _feed(fc: FakeCluster, a) -> tuple[str, str]:
    """As every API-side artifact is fed (feed.load_api): the container's status or the
    kubelet's Warning event about the pod. (node, pod) in namespace default."""
    return load_api(fc, a, 0)


@pytest.mark.parametrize("a", [a for a in ARTIFACTS if a.channel in CHANNELS],
                         ids=lambda a: a.key)
def test_real_container_start_failures_name_their_cause(a, tmp_path):
    fc = FakeCluster()
    _node, pod = _feed(fc, a)
    fc.start()
    try:
        r = run_cli("pod", pod, "-n", "default", "--no-probe", "--kubeconfig",
                    str(fc.kubeconfig(tmp_path / "kc")), "-o", "json")
    finally:
        fc.stop()
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    got = [f for f in doc["findings"] if f["id"] == a.expect_id]
    assert got, f"{a.key}: no {a.expect_id} in {[f['id'] for f in doc['findings']]}"
    f = got[0]
    assert f["severity"] == a.expect_severity
    words = " ".join([f["title"], f["remediation"], json.dumps(f["evidence"])]).lower()
    assert a.cause_word.lower() in words, (a.key, f["title"])
    # the generic "container waits" finding is not said twice for the same cause
    assert not [g for g in doc["findings"] if g["id"] == "pod.pending_explained"
                and "CreateContainerError" in g["title"]]
    # the verdict roots there, or at the finding that proves its cause (runtime.py reads the
    # same CDI and handler events: cdi.unresolvable_devices, runtime.handler_missing)
    assert doc["verdict"]["root_cause"] in [a.expect_id, *f["evidence"]["caused_by"]]


def test_the_probe_proves_the_cause_and_the_verdict_roots_there(tmp_path):
    """`pod Y` runs the node probe (here: a debug pod whose log is the probe's stream, with the
    finding the `driver` check makes for a kernel module older than the libraries,
    node_probe/checks/driver.py): the verdict's root cause is then the node-side finding that
    proves the runtime's message, with pod.gpu_start_failed as its effect."""
    from node_probe import protocol
    from node_probe.protocol import catalog

    from tests.kubectl.fakecluster import cut_odd

    a = next(x for x in ARTIFACTS if x.key == "k8s-device-plugin#1431-driver-library-mismatch")
    fc = FakeCluster()
    _node, pod = _feed(fc, a)
    mismatch = catalog.make(
        "driver.version_mismatch", "critical", "node",
        "Kernel module 570.124.06 but user-space driver library 570.195.03",
        {"kernel_module_version": "570.124.06", "library_version": "570.195.03",
         "library": "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.570.195.03"},
        "A driver upgrade replaced the libraries but the old kernel module is still loaded.",
        ("https://docs.nvidia.com/deploy/nvml-api/group__nvmlDeviceEnumvs.html",))
    stream = [protocol.record("progress", phase="start", checks=["driver"]),
              {**mismatch.to_record(), "check": "driver"},
              protocol.summary([mismatch], [], True, 0.1, 1)]
    fc.log_chunks = cut_odd("".join(protocol.encode(r) + "\n" for r in stream).encode())
    fc.start()
    try:
        r = run_cli("pod", pod, "-n", "default", "--kubeconfig",
                    str(fc.kubeconfig(tmp_path / "kc")), "--start-timeout", "10", "-o", "json")
    finally:
        fc.stop()
    doc = json.loads(r.stdout)
    assert r.returncode == 1, r.stderr
    assert {"pod.gpu_start_failed", "driver.version_mismatch"} <= {f["id"] for f in
                                                                   doc["findings"]}
    v = doc["verdict"]
    assert v["root_cause"] == "driver.version_mismatch"
    assert v["chain"][:2] == ["driver.version_mismatch", "pod.gpu_start_failed"]

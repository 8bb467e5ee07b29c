"""A GPU host with no kubelet at all (issue 12 item 11): not a Kubernetes node (info), the
kubelet-facing checks skipped with the reason; no critical deviceplugin.missing."""
from __future__ import annotations

from tests.probe_run import run_probe

ONLY = ("--only", "deviceplugin", "--only", "kubelet", "--trace-seconds", "0")


def test_gpu_host_without_kubelet_is_not_a_kubernetes_node(host):
    host.not_a_node()
    host.gpu_dirs("0000:3b:00.0", "0000:86:00.0")       # GPUs, a kubelet dir, no kubelet
    run = run_probe(*host.args(*ONLY))
    assert run.findings("deviceplugin.missing") == []
    (f,) = run.findings("node.not_kubernetes")
    assert f["severity"] == "info" and f["evidence"]["kubelet"] is False
    checks = {c["id"]: c for c in run.summary["checks"]}
    assert checks["deviceplugin"]["status"] == "skipped"
    assert "not a Kubernetes node" in checks["deviceplugin"]["reason"]
    assert checks["kubelet"]["status"] == "skipped"
    assert run.summary["complete"] is True and run.returncode == 0


def test_stale_kubelet_socket_still_counts_as_a_node(host):
    host.gpu_dirs("0000:3b:00.0")                       # the fixture's stale kubelet.sock
    run = run_probe(*host.args(*ONLY))
    assert run.findings("node.not_kubernetes") == []
    (f,) = run.findings("deviceplugin.missing")
    assert f["severity"] == "critical"

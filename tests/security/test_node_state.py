"""The node's state before and at the debug pod (issue 12 item 10): NotReady is said plainly
and no pod is created (no waiting the start timeout, no blaming admission); a pod the kubelet
refuses at admission (DiskPressure, PIDPressure, OutOfcpu) is `probe.pod_not_started` with the
reason and the ways in, not a bare exit 3; the debug pod does not use the host network."""
from __future__ import annotations

import json
import time

import kubernetes_validate
import pytest

from kubectl_gpudoctor.reach import debugpod
from tests.kubectl.conftest import DATA, cluster, kubeconfig, run_cli  # noqa: F401
from tests.kubectl.test_cli_cluster import DEBUG_POD, healthy_node


def test_not_ready_node_is_said_plainly_without_a_pod(cluster, kubeconfig):  # noqa: F811
    cluster.add_node("gpu-1", ready=False, lease_age_s=420)
    t0 = time.monotonic()
    r = run_cli("node", "gpu-1", "--kubeconfig", str(kubeconfig), "--start-timeout", "600",
                "-o", "json", timeout=300)
    assert time.monotonic() - t0 < 60            # hang guard: not the 600 s start timeout
    doc = json.loads(r.stdout)
    by_id = {f["id"]: f for f in doc["findings"]}
    nr = by_id["node.not_ready"]
    assert nr["severity"] == "critical" and "NotReady" in nr["title"]
    assert nr["evidence"]["ready_status"] == "Unknown"
    assert nr["evidence"]["lease_renew_age_s"] >= 400
    assert any("local" in w for w in nr["evidence"]["ways_in"])
    assert "probe.pod_not_started" not in by_id and "kubelet.admission_stalled" not in by_id
    assert cluster.created == []
    checks = {c["id"]: c for c in doc["checks"]}
    assert checks["node.probe"]["status"] == "skipped"
    assert doc["summary"]["complete"] is False and r.returncode == doc["exit_code"] == 1


@pytest.mark.parametrize("reason,message,fix", [
    ("Evicted", "The node had condition: [DiskPressure]. ", "free disk"),
    ("Evicted", "The node had condition: [PIDPressure]. ", "leaking threads"),
    ("OutOfcpu", "Pod Node didn't have enough resource: cpu, requested: 50, used: 63990, "
                 "capacity: 64000", "allocatable CPU"),
])
def test_pod_refused_at_admission_is_a_finding_with_ways_in(cluster, kubeconfig,  # noqa: F811
                                                           reason, message, fix):
    healthy_node(cluster)
    cluster.debug_pod_mode = "rejected"
    cluster.reject_with = (reason, message)
    r = run_cli("node", "gpu-1", "--kubeconfig", str(kubeconfig), "-o", "json",
                "--start-timeout", "30")
    assert "Traceback" not in r.stderr and r.returncode != 3, r.stderr
    doc = json.loads(r.stdout)
    (f,) = [f for f in doc["findings"] if f["id"] == "probe.pod_not_started"]
    assert f["evidence"]["rejected_reason"] == reason
    assert message.split(":")[0].strip() in f["title"]
    assert fix.lower() in f["remediation"].lower() and "Ways in" in f["remediation"]
    assert any("local" in w for w in f["evidence"]["ways_in"])
    assert "kubelet.config" in {x["id"] for x in doc["findings"]}   # API side kept
    assert doc["summary"]["complete"] is False and r.returncode == 1
    assert cluster.count("DELETE", DEBUG_POD) == 1


def test_debug_pod_does_not_use_the_host_network():
    m = debugpod.manifest("gpu-1", "gpu-doctor", "abcd1234")
    assert m["spec"]["hostNetwork"] is False and m["spec"]["hostPID"] is True
    assert m["spec"]["dnsPolicy"] == "ClusterFirst"
    kubernetes_validate.validate(m, kubernetes_validate.latest_version(), strict=True)

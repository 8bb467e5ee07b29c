"""Every API-side artifact of the corpus (pod status, pod events, a GPU plugin pod's container
status, node conditions, node capacity), put into the fake API server the way the API server shows it and read
by `pod Y` / `node X` (API side, the real kubernetes client, in-process). Each must name the
cause its source established (finding id, severity, a cause word not in the quote)."""
import pytest

from tests.kubectl.fakecluster import FakeCluster
from tests.realworld import corpus
from tests.realworld.artifact import Artifact
from tests.realworld.feed import API_CHANNELS, answers, diagnose, load_api

API = corpus.artifacts(API_CHANNELS)
# Healthy monitors, quoted exactly: the EKS agent's condition while its GPU checks run
# (aws/eks-node-monitoring-agent cmd/eks-node-monitoring-agent/main.go, ReadyReason and
# ReadyMessage), NVSentinel's syslog conditions with nothing found (NVIDIA/NVSentinel#458).
EKS_MAIN = ("https://github.com/aws/eks-node-monitoring-agent/blob/main/cmd/"
            "eks-node-monitoring-agent/main.go")
HEALTHY = [
    Artifact("eks-nma-healthy-gpu", EKS_MAIN, "Monitoring for the Nvidia GPU system is active",
             "node_condition", "healthy", "none", "node.foreign_condition", "info",
             "quiet-control", {"type": "AcceleratedHardwareReady", "status": "True",
                               "reason": "NvidiaGPUIsReady"}),
    Artifact("nvsentinel#458-healthy-xid", "https://github.com/NVIDIA/NVSentinel/issues/458",
             "No Health Failures", "node_condition", "healthy", "none", "node.foreign_condition",
             "info", "quiet-control", {"type": "SysLogsXIDError", "status": "False",
                                       "reason": "SysLogsXIDErrorIsHealthy"}),
    Artifact("nvsentinel#458-healthy-sxid", "https://github.com/NVIDIA/NVSentinel/issues/458",
             "No Health Failures", "node_condition", "healthy", "none", "node.foreign_condition",
             "info", "quiet-control", {"type": "SysLogsSXIDError", "status": "False",
                                       "reason": "SysLogsSXIDErrorIsHealthy"}),
]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    fc = FakeCluster().start()
    try:
        where = {a.key: load_api(fc, a, i) for i, a in enumerate(API + HEALTHY)}
        yield fc.kubeconfig(tmp_path_factory.mktemp("kc") / "kubeconfig"), where
    finally:
        fc.stop()


@pytest.mark.parametrize("a", API, ids=[a.key for a in API])
def test_api_artifact(a, loaded):
    kubeconfig, where = loaded
    node, pod = where[a.key]
    found = diagnose(kubeconfig, node, pod)
    assert answers(a, found), (a.source, a.diagnosis,
                               [(f.id, f.severity.value, f.title) for f in found])


@pytest.mark.parametrize("a", HEALTHY, ids=[a.key for a in HEALTHY])
def test_healthy_monitor_conditions_stay_quiet(a, loaded):
    kubeconfig, where = loaded
    node, _ = where[a.key]
    found = [f for f in diagnose(kubeconfig, node, None) if f.id == "node.foreign_condition"]
    assert found == [], [(f.severity.value, f.title) for f in found]

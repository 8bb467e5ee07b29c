"""pod.gpu_start_failed stays quiet where the runtime's message names no GPU cause, and names
the specific cause before the general one (the real messages themselves are fed through the
fake API server by tests/realworld/test_container_start_corpus.py)."""
from __future__ import annotations

import datetime as dt

from kubectl_gpudoctor.analysis import container_start, pod_status

from .fakecluster import FakeCluster

NOW = dt.datetime.now(dt.timezone.utc)
# the kubelet's own words for a container whose image runs as root under runAsNonRoot
# (kubernetes/kubernetes pkg/kubelet/kuberuntime/security_context_others.go, verifyRunAsNonRoot:
# https://github.com/kubernetes/kubernetes/blob/master/pkg/kubelet/kuberuntime/security_context_others.go)
RUN_AS_ROOT = ('container has runAsNonRoot and image will run as root (pod: '
               '"train-0_ml(3c1b4e0a-2f5d-4d6e-9a41-0c2f8b7e6d15)", container: main)')


def _pod(reason: str, message: str, running: bool = False) -> dict:
    fc = FakeCluster()
    fc.add_node("gpu-a", now=NOW)
    pod = fc.add_pod("ml", "train-0", "gpu-a", phase="Running" if running else "Pending",
                     gpus=1, now=NOW, events="none")
    if not running:
        pod["status"]["containerStatuses"] = [{
            "name": "main", "ready": False, "restartCount": 0, "image": "x",
            "state": {"waiting": {"reason": reason, "message": message}}}]
    return pod


def test_a_running_gpu_pod_and_a_non_gpu_start_error_say_nothing_here():
    assert container_start.analyze_pod(_pod("", "", running=True)) == []
    pod = _pod("CreateContainerConfigError", RUN_AS_ROOT)
    assert container_start.analyze_pod(pod) == []
    # ...and the generic finding still explains it
    fs = pod_status.analyze_pod(pod, [], NOW)
    assert [f.id for f in fs] == ["pod.pending_explained"]
    assert "runAsNonRoot" in fs[0].quoted[0]["text"]  # quoted: the kubelet's words


def test_the_specific_cause_wins_over_the_general_nvml_error():
    msg = ("stderr: Auto-detected mode as 'legacy'\nnvidia-container-cli: initialization "
           "error: nvml error: driver/library version mismatch: unknown")
    cause, _ = container_start.classify(msg)
    assert cause.key == "driver_library_mismatch"
    cause, text = container_start.classify(
        "nvidia-container-cli.real: initialization error: nvml error: insufficient "
        "permissions: unknown")
    assert cause.key == "nvml_error" and "insufficient permissions" in text
    assert container_start.classify(RUN_AS_ROOT) is None
    assert container_start.classify(None) is None

"""pod.gpu_start_failed stays quiet where the runtime's message names no GPU cause, and names
the specific cause before the general one (the real messages themselves are fed through the
fake API server by tests/realworld/test_container_start_corpus.py)."""
from __future__ import annotations

import datetime as dt

from kubectl_gpudoctor.analysis.failing import container_start, pod_status

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


def test_every_cdi_and_oci_hook_failure_names_its_cause():
    """Issue 40.5: a hook the CDI spec names that is not on the node, and a hook that ran and
    failed, from the threads' own words."""
    missing = [
        # siderolabs/talos#13021: the device plugin's CDI spec names /usr/bin/nvidia-ctk, Talos
        # installs it under /usr/local/bin
        ("error running createContainer hook #0: fork/exec /usr/bin/nvidia-ctk: no such file or "
         "directory", "/usr/bin/nvidia-ctk"),
        # void-linux/void-packages#55062: the package lacked nvidia-cdi-hook
        ("Error: runc: runc create failed: unable to start container process: error during "
         "container init: error running hook #0: fork/exec /usr/bin/nvidia-cdi-hook: no such "
         "file or directory: OCI runtime attempted to invoke a command that was not found",
         "/usr/bin/nvidia-cdi-hook"),
        # NVIDIA/nvidia-docker#958: the legacy prestart hook not installed
        ('docker: Error response from daemon: OCI runtime create failed: exec: '
         '"nvidia-container-runtime-hook": executable file not found in $PATH: unknown.',
         "nvidia-container-runtime-hook"),
    ]
    for msg, path in missing:
        cause, text = container_start.classify(msg)
        assert cause.key == "cdi_hook_missing" and path in text, msg
        assert "--nvidia-cdi-hook-path" in cause.fix
    failed = [
        # NVIDIA/nvidia-container-toolkit#2026 (toolkit 1.20.0's application-profile hook)
        ("createContainer hook #6: exit status 1, stderr:\nfailed to create application "
         "profiles directory:\nmkdirat etc/nvidia/nvidia-application-profiles-rc.d: read-only "
         "file system", "createContainer hook, exit status 1"),
        # NVIDIA/nvidia-container-toolkit#143 (crun running the CDI spec's chmod hook)
        ('Error: OCI runtime error: crun: {"msg":"error executing hook `/usr/bin/nvidia-ctk` '
         '(exit code: 1)","level":"error","time":"2023-11-05T12:05:27.216981Z"}',
         "nvidia-ctk hook, exit status 1"),
    ]
    for msg, words in failed:
        cause, text = container_start.classify(msg)
        assert cause.key == "cdi_hook_failed" and words in text, (msg, text)
    # healthy controls: another vendor's hook, and the nvidia-container-cli errors keep their
    # own specific causes
    assert container_start.classify("error running createContainer hook #0: exit status 1, "
                                    "stderr: other-vendor-hook: bad config") is None
    assert container_start.classify("error running hook #0: fork/exec /opt/acme/hook: no such "
                                    "file or directory") is None
    mismatch = ("error running prestart hook #0: exit status 1, stdout: , stderr: "
                "nvidia-container-cli: initialization error: nvml error: driver/library version "
                "mismatch: unknown")
    assert container_start.classify(mismatch)[0].key == "driver_library_mismatch"


def test_a_healthy_node_and_a_pods_own_start_error_make_no_node_finding():
    """The node-level pass (issue 36.3) stays quiet on a healthy node: Running GPU pods, a
    non-GPU pod's start error, and a GPU image that needs a newer CUDA (the pod's own fault,
    NVIDIA/nvidia-docker#1442) -- and speaks for the first GPU pod that fails for a node reason."""
    running = _pod("", "", running=True)
    own = _pod("RunContainerError", "nvidia-container-cli: requirement error: unsatisfied "
               "condition: cuda>=11.0, please update your driver to a newer version, or use an "
               "earlier cuda container: unknown")
    no_gpu = _pod("CreateContainerConfigError", RUN_AS_ROOT)
    for c in no_gpu["spec"]["containers"]:
        c["resources"] = {}
    assert container_start.analyze_node("gpu-a", [running, own, no_gpu]) == []
    sick = _pod("RunContainerError", "nvidia-container-cli: initialization error: nvml error: "
                "driver/library version mismatch: unknown")
    (f,) = container_start.analyze_node("gpu-a", [running, own, sick])
    assert f.subject == "node/gpu-a" and f.severity.value == "critical"
    assert f.evidence["cause"] == "driver_library_mismatch"
    assert f.evidence["node_action"] == "drain"

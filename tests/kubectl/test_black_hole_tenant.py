"""A tenant cannot make a healthy node a black hole (audit round 5, BH-01).

The runtime quotes a missing executable back with Go's %q: `unable to start container process:
exec: \\"/cluster/kube-apiserver-operator\\": executable file not found in $PATH`
(https://github.com/opencontainers/runc/issues/4713). A tenant whose container command is the
NVIDIA hook's error text gets that text into the runtime's own message. The hook's real error
comes in the runtime's hook frame, its stderr after `error running hook` (the frames quoted
below, each from its thread), and only there does it name a cause. And one namespace's failing
pods are weighed against the other namespaces' GPU pods on the same node.
"""
from __future__ import annotations

import datetime as dt
import json

from kubectl_gpudoctor.analysis.failing import black_hole, container_start, start_frames

from .conftest import run_cli
from .fakecluster import FakeCluster, add_black_hole, ts
from .test_black_hole import NOW, _fleet, _judge

HOOK_ERR = "nvidia-container-cli: initialization error: nvml error: GPU is lost"
# the runtime's frame for a missing executable (containerd 1.7 + runc, as the audit's repro and
# runc#4713 show it), with the tenant's command as argv[0]
TENANT = ("failed to create containerd task: failed to create shim task: OCI runtime create "
          "failed: runc create failed: unable to start container process: exec: \"" + HOOK_ERR
          + "\": executable file not found in $PATH: unknown")
# the same, quoted once more as containerd passes runc's error on (runc#4713's form)
TENANT_ESCAPED = ('runc create failed: unable to start container process: exec: \\"' + HOOK_ERR
                  + '\\": executable file not found in $PATH')
# a command with a newline in it: %q writes it as \n, which the hook frame's stderr also has
TENANT_NEWLINE = ('unable to start container process: exec: "x\\n' + HOOK_ERR
                  + '": executable file not found in $PATH: unknown')
# https://github.com/NVIDIA/k8s-device-plugin/issues/1431 (runc 1.1+: "prestart hook")
REAL_1431 = ("failed to create containerd task: failed to create shim task: OCI runtime create "
             "failed: runc create failed: unable to start container process: error during "
             "container init: error running prestart hook #0: exit status 1, stdout: , stderr: "
             "Auto-detected mode as 'legacy'\nnvidia-container-cli: initialization error: nvml "
             "error: driver/library version mismatch: unknown")
# https://github.com/NVIDIA/nvidia-container-toolkit/issues/202 ("error running hook #0: error
# running hook")
REAL_202 = ("docker: Error response from daemon: failed to create shim task: OCI runtime create "
            "failed: runc create failed: unable to start container process: error during "
            "container init: error running hook #0: error running hook: exit status 1, stdout: "
            ", stderr: Auto-detected mode as 'legacy'\nnvidia-container-cli: initialization "
            "error: driver rpc error: timed out: unknown.")
# https://github.com/NVIDIA/nvidia-container-toolkit/issues/29 (older runc: "Running hook #1::")
REAL_29 = ("docker: Error response from daemon: failed to create shim: OCI runtime create "
           "failed: container_linux.go:380: starting container process caused: process_linux.go:"
           "545: container init caused: Running hook #1:: error running hook: exit status 1, "
           "stdout: , stderr: Auto-detected mode as 'legacy'\nnvidia-container-cli: device "
           "error: false: unknown device: unknown.")


def test_the_hook_error_counts_only_in_the_hook_frame_never_in_the_quoted_command():
    for msg in (TENANT, TENANT_ESCAPED, TENANT_NEWLINE, "Error: " + TENANT):
        assert container_start.classify(msg) is None, msg
    assert container_start.classify(REAL_1431)[0].key == "driver_library_mismatch"
    assert container_start.classify(REAL_202)[0].key == "driver_rpc_timeout"
    # the older frame is found (its stderr is the hook's); that cause is none we name
    assert start_frames.hook_stderr(start_frames.runtime_text(REAL_29)).splitlines() == [
        "Auto-detected mode as 'legacy'", "nvidia-container-cli: device error: false: unknown "
        "device: unknown."]
    # the frame itself spelled inside the quoted command is blanked with it
    forged = ('unable to start container process: exec: "error running hook #0: exit status '
              '1, stdout: , stderr: ' + HOOK_ERR + '": executable file not found in $PATH')
    assert container_start.classify(forged) is None
    # a command named like an NVIDIA hook binary is the pod's command, in the process frame
    # (new and old runc); only the runtime's own exec of the hook (nvidia-docker#958, outside
    # that frame) is a missing hook: test_container_start holds that side
    for frame in ('unable to start container process: exec: "nvidia-container-runtime-hook"'
                  ': executable file not found in $PATH: unknown',
                  'starting container process caused "exec: \\"/usr/bin/nvidia-ctk\\": '
                  'executable file not found in $PATH": unknown'):
        assert container_start.classify(frame) is None, frame
    # a CDI device name spelled as the command is not the runtime's CDI error either
    assert container_start.classify(
        'unable to start container process: exec: "unresolvable CDI devices nvidia.com/gpu=0"'
        ': executable file not found in $PATH') is None


def _tenant_pods(fc: FakeCluster, node: str, n: int, now: dt.datetime) -> None:
    """The audit's repro: a ReplicaSet whose GPU pods run the hook's error text as command."""
    for i in range(n):
        pod = fc.add_pod("tenant", f"evil-7d9f8b6c5-{'xkmt'[i]}2b4q", node, phase="Running",
                         gpus=1, age_s=600 - i * 60, now=now, events="scheduled-only")
        pod["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "name": "evil-7d9f8b6c5",
                                               "controller": True, "uid": "rs-1",
                                               "apiVersion": "apps/v1"}]
        pod["spec"]["containers"][0]["command"] = [HOOK_ERR]
        at = now - dt.timedelta(seconds=300 - i * 60)
        pod["status"]["containerStatuses"] = [{
            "name": "main", "ready": False, "restartCount": 3, "image": "busybox",
            "imageID": "x", "state": {"waiting": {"reason": "RunContainerError",
                                                  "message": TENANT}},
            "lastState": {"terminated": {"reason": "StartError", "exitCode": 128,
                                         "message": TENANT,
                                         "startedAt": "1970-01-01T00:00:00Z",
                                         "finishedAt": ts(at)}}}]
        fc.add_event(pod, "Warning", "Failed", "Error: " + TENANT, "kubelet", at, host=node)


def test_four_tenant_pods_spelling_the_hook_error_make_no_black_hole(cluster, kubeconfig):
    now = dt.datetime.now(dt.timezone.utc)
    cluster.add_node("gpu-1", gpus=8, now=now)
    cluster.add_node("gpu-2", gpus=8, now=now)
    _tenant_pods(cluster, "gpu-1", 4, now)
    for cmd in (["nodes"], ["node", "gpu-1", "--no-probe"],
                ["pod", "evil-7d9f8b6c5-x2b4q", "-n", "tenant", "--no-probe"]):
        r = run_cli(*cmd, "--kubeconfig", str(kubeconfig), "-o", "json")
        doc = json.loads(r.stdout)
        ids = {f["id"] for f in doc["findings"]}
        assert not ids & {"node.gpu_black_hole", "pod.gpu_start_failed"}, (cmd, ids)
        assert "GPU is lost" not in json.dumps(doc.get("verdict")), cmd


def test_one_namespace_failing_while_the_others_start_is_not_the_node():
    # a tenant's pods rejected on gpu-0 (or events saying so), while another team's GPU pods
    # start there between the first rejection and the last: not the node's fault
    fc, names = _fleet()
    add_black_hole(fc, names[0], "tenant", "evil-1", rejected=5, gone=3, now=NOW)
    fs = _judge(fc, names[0])
    assert [f.id for f in fs] == ["node.gpu_black_hole"]  # alone there: it still counts
    assert fs[0].evidence["namespaces"] == {"tenant": 8}
    assert fs[0].evidence["other_namespaces"] == {"gpu_pods": 0,
                                                  "started_since_first_failure": 0}
    for k in range(2):
        p = fc.add_pod("ml", f"train-{k}", names[0], gpus=1, age_s=120, now=NOW,
                       events="none")
        p["metadata"]["ownerReferences"] = [{"kind": "Job", "name": "train", "controller": True}]
    assert _judge(fc, names[0]) == []
    assert _judge(fc, names[0], peers=False) == []
    # two namespaces failing on the node: the node's again
    add_black_hole(fc, names[0], "ml2", "runner-2", rejected=4, gone=0, now=NOW, start=50)
    fs = _judge(fc, names[0])
    assert [f.id for f in fs] == ["node.gpu_black_hole"]
    assert fs[0].evidence["namespaces"] == {"tenant": 8, "ml2": 4}
    assert fs[0].evidence["other_namespaces"] is None
    assert black_hole.MIN_FAILED <= 12

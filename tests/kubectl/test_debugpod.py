"""The debug pod manifest: schema-valid for the Kubernetes versions we support, and safe."""
from __future__ import annotations

import kubernetes_validate
import pytest

from kubectl_gpudoctor.reach import debugpod
from kubectl_gpudoctor.reach import podspec
from node_probe import __version__


@pytest.mark.parametrize("k8s", ["1.27", "1.30", kubernetes_validate.latest_version()])
@pytest.mark.parametrize("node", ["gpu-1", "ip-10-0-1-23.ec2.internal",
                                  "a-very-long-node-name-" + "x" * 50])
def test_manifest_is_schema_valid(k8s, node):
    m = debugpod.manifest(node, "gpu-doctor", debugpod.new_run_id(), focus_pods=("uid-1",))
    kubernetes_validate.validate(m, k8s, strict=True)
    assert len(m["metadata"]["name"]) <= 63
    for v in m["metadata"]["labels"].values():
        assert len(v) <= 63


def test_manifest_safety_properties():
    m = debugpod.manifest("gpu-1", "ns1", "abcd1234", timeout_s=40, trace_s=3)
    spec = m["spec"]
    c = spec["containers"][0]
    assert spec["nodeName"] == "gpu-1"
    assert spec["hostPID"] and spec["hostNetwork"] is False  # no check needs the host network
    assert spec["automountServiceAccountToken"] is False
    assert spec["restartPolicy"] == "Never"
    assert spec["activeDeadlineSeconds"] >= 40
    assert spec["tolerations"] == [{"operator": "Exists"}]
    assert c["securityContext"]["privileged"] is True
    assert c["image"] == f"{podspec.DEFAULT_IMAGE_REPO}:{__version__}"
    mounts = {mt["mountPath"]: mt for mt in c["volumeMounts"]}
    assert mounts["/host"]["readOnly"] is True
    assert {"/lib/modules", "/usr/src", "/sys/fs/cgroup", "/dev", "/sys/kernel/debug"} <= set(mounts)
    assert mounts["/lib/modules"]["readOnly"] and mounts["/usr/src"]["readOnly"]
    lim = c["resources"]["limits"]["memory"]
    assert lim.endswith("Mi") and 300 <= int(lim[:-2]) <= 512
    labels = m["metadata"]["labels"]
    assert labels[podspec.APP_LABEL] == "gpu-doctor" and labels[debugpod.RUN_LABEL] == "abcd1234"
    assert labels[debugpod.NODE_LABEL] == "gpu-1"
    cmd = c["command"]
    assert cmd[:4] == ["python3", "-m", "node_probe", "-o"] and "jsonl" in cmd
    assert cmd[cmd.index("--host-root") + 1] == "/host"
    assert cmd[cmd.index("--timeout") + 1] == "40"
    assert cmd[cmd.index("--trace-seconds") + 1] == "3"


def test_probe_args_are_understood_by_the_probe():
    """The command line we put in the pod must parse with the probe's own parser."""
    from node_probe.cli import build_parser
    cmd = podspec.probe_args(30, 5, "gpu-1", focus_pods=("u1", "u2"))
    args = build_parser().parse_args(cmd[3:])
    assert args.output == "jsonl" and args.focus_pod == ["u1", "u2"]
    assert args.target_name == "gpu-1"


# -- a node whose / is a private mount (issue 13, debugpod-private-root-status.json) -----------

def _mounts(body):
    return [m for c in body["spec"]["containers"] for m in c["volumeMounts"]]


def test_manifest_needs_no_mount_propagation():
    m = debugpod.manifest("gpu-1", "ns1", "abcd1234")
    assert not [mt for mt in _mounts(m) if "mountPropagation" in mt]
    p = debugpod.manifest("gpu-1", "ns1", "abcd1234", propagation="HostToContainer")
    kubernetes_validate.validate(p, kubernetes_validate.latest_version(), strict=True)
    assert [mt["mountPath"] for mt in _mounts(p) if mt.get("mountPropagation")] == ["/host"]


def test_captured_refusal_is_recognised():
    from .fakecluster import _private_root_status
    [cs] = _private_root_status()["containerStatuses"]
    waiting = cs["state"]["waiting"]
    assert waiting["reason"] in debugpod.FATAL_WAIT_REASONS
    assert debugpod.mount_refused(waiting["message"])
    assert not debugpod.mount_refused('failed to create containerd task: exec: "python3": '
                                      'executable file not found in $PATH')


def test_debug_pod_starts_on_a_node_whose_root_is_private(cluster, kubeconfig):
    from kubectl_gpudoctor.api.kube import Kube
    cluster.add_node("gpu-1")
    cluster.root_private = True
    pod = debugpod.DebugPod(Kube(str(kubeconfig)), debugpod.manifest("gpu-1", "default", "r1"))
    try:
        pod.create()
        got = pod.wait_running(10, poll_s=0.1)
        assert got["status"]["phase"] == "Running" and pod.notes == []
        assert len(cluster.created) == 1
    finally:
        assert pod.delete()


def test_refused_propagation_falls_back_to_a_pod_without_it(cluster, kubeconfig):
    """A pod asking for propagation gets the captured CreateContainerError; the client
    deletes it, creates it again without propagation, says so, and it runs."""
    from kubectl_gpudoctor.api.kube import Kube
    cluster.add_node("gpu-1")
    cluster.root_private = True
    said = []
    body = debugpod.manifest("gpu-1", "default", "r2", propagation="HostToContainer")
    pod = debugpod.DebugPod(Kube(str(kubeconfig)), body, say=said.append)
    first = pod.name
    try:
        pod.create()
        got = pod.wait_running(10, poll_s=0.1)
        assert got["status"]["phase"] == "Running"
    finally:
        assert pod.delete()
    assert [b["metadata"]["name"] for b in cluster.created] == [first, pod.name]
    assert pod.name != first and len(pod.name) <= 63
    assert [d[1] for d in cluster.deleted] == [first, pod.name]
    assert not [m for m in _mounts(cluster.created[1]) if "mountPropagation" in m]
    assert len(pod.notes) == 1 and "not a shared or slave mount" in pod.notes[0]
    assert any("recreated the debug pod without it" in s for s in said)


def test_refusal_without_propagation_to_drop_is_a_launch_error(cluster, kubeconfig):
    from kubectl_gpudoctor import errors
    from kubectl_gpudoctor.api.kube import Kube
    cluster.add_node("gpu-1")
    cluster.root_private = True
    body = debugpod.manifest("gpu-1", "default", "r3", propagation="HostToContainer")
    pod = debugpod.DebugPod(Kube(str(kubeconfig)), body)
    pod.body = debugpod.without_propagation(pod.body)
    # the fake refuses it all the same (as for a mount we cannot drop)
    try:
        pod.create()
        import tests.kubectl.fakecluster as fcm
        real = fcm._propagates_host_root
        fcm._propagates_host_root = lambda p: True
        try:
            with pytest.raises(errors.LaunchFailed, match="not a shared or slave mount"):
                pod.wait_running(5, poll_s=0.1)
        finally:
            fcm._propagates_host_root = real
    finally:
        pod.delete()


def test_the_first_polls_are_short_and_double_up_to_poll_s(monkeypatch):
    """A pod that runs within a second is seen a moment after it runs, not a whole poll_s
    later: the pauses between the GETs start at FIRST_POLL_S and double up to poll_s
    (recorded, not slept: no clock in this test)."""
    pending = {"status": {"phase": "Pending", "containerStatuses": [
        {"name": podspec.CONTAINER, "state": {"waiting": {"reason": "ContainerCreating"}}}]}}
    running = {"status": {"phase": "Running", "containerStatuses": [
        {"name": podspec.CONTAINER, "state": {"running": {"startedAt": "2026-11-29T04:00:00Z"}}}]}}

    class Answers:
        def __init__(self, pendings):
            self.left, self.gets = pendings, 0

        def get_json(self, path, timeout=None):
            self.gets += 1
            if self.left:
                self.left -= 1
                return pending
            return running

    pauses: list[float] = []
    monkeypatch.setattr(debugpod.time, "sleep", pauses.append)
    kube = Answers(7)
    pod = debugpod.DebugPod(kube, debugpod.manifest("gpu-1", "default", "r4"))
    assert pod.wait_running(60)["status"]["phase"] == "Running"
    assert kube.gets == 8
    assert pauses == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0])
    # a poll_s under the first pause is the pause from the start
    pauses.clear()
    pod = debugpod.DebugPod(Answers(3), debugpod.manifest("gpu-1", "default", "r5"))
    pod.wait_running(60, poll_s=0.05)
    assert pauses == pytest.approx([0.05, 0.05, 0.05])

"""Admission races after a kubelet restart or node reboot (issue 25, class 1), API side.

Messages as the kubelet writes them: the pod status message is "Pod was rejected: " + the
admission result (pkg/kubelet/kubelet.go rejectPod), the result is "Allocate failed due to %v,
which is unexpected" (pkg/kubelet/cm/admission/errors.go), and %v is the device manager's error
from pkg/kubelet/cm/devicemanager/manager.go. The events are the kubelet's own "Starting"
("Starting kubelet.") and "Rebooted" node events, as in tests/data/captures.
"""
import datetime as dt

from kubectl_gpudoctor.analysis.failing import admission_race, pod_status

NOW = dt.datetime(2026, 11, 23, 8, 0, 0, tzinfo=dt.timezone.utc)
T0 = NOW - dt.timedelta(minutes=30)      # the kubelet started


def ts(t):
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def node_event(reason, message, t, component="kubelet"):
    return {"reason": reason, "message": message, "type": "Normal",
            "source": {"component": component, "host": "gpu-1"},
            "firstTimestamp": ts(t), "lastTimestamp": ts(t), "count": 1,
            "involvedObject": {"kind": "Node", "name": "gpu-1"}}


def rejected_pod(err, owner=None, name="train-7"):
    md = {"name": name, "namespace": "ml", "uid": "u-" + name,
          "creationTimestamp": ts(T0 - dt.timedelta(hours=2))}
    if owner:
        md["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner[0], "name": owner[1],
                                  "uid": "o-1", "controller": True}]
    msg = f"Allocate failed due to {err}, which is unexpected"
    pod = {"metadata": md,
           "spec": {"nodeName": "gpu-1", "containers": [{"name": "main", "resources": {
               "limits": {"nvidia.com/gpu": "4"}}}]},
           "status": {"phase": "Failed", "reason": "UnexpectedAdmissionError",
                      "message": "Pod was rejected: " + msg}}
    ev = {"reason": "UnexpectedAdmissionError", "message": msg, "type": "Warning",
          "source": {"component": "kubelet", "host": "gpu-1"},
          "firstTimestamp": ts(T0 + dt.timedelta(seconds=20)),
          "lastTimestamp": ts(T0 + dt.timedelta(seconds=20)), "count": 1,
          "involvedObject": {"kind": "Pod", "name": name, "namespace": "ml", "uid": "u-" + name}}
    return pod, [ev]


def node(allocatable="8"):
    return {"metadata": {"name": "gpu-1"},
            "status": {"capacity": {"nvidia.com/gpu": "8"},
                       "allocatable": {"nvidia.com/gpu": allocatable}}}


def plugin_pod(started):
    return {"metadata": {"name": "nvidia-device-plugin-daemonset-x7k2p",
                         "namespace": "gpu-operator"},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": "nvidia-device-plugin", "state": {"running": {"startedAt": ts(started)}}}]}}


def test_reboot_race_no_healthy_devices_names_the_race_and_the_replacement():
    pod, evs = rejected_pod("no healthy devices present; cannot allocate unhealthy devices "
                            "nvidia.com/gpu", owner=("ReplicaSet", "train-5d8f"))
    nev = [node_event("Rebooted", "Node gpu-1 has been rebooted, boot id: 5f0c", T0 - dt.timedelta(seconds=3)),
           node_event("Starting", "Starting kubelet.", T0)]
    [f] = pod_status.analyze_pod(pod, evs, NOW, node=node("8"), node_events=nev,
                                 node_pods=[plugin_pod(T0 + dt.timedelta(seconds=75))])
    race = f.evidence["admission_race"]
    # cleared (8 allocatable now) and replaced by its ReplicaSet: nothing left but tidying up
    assert f.id == "pod.admission_error" and f.severity.value == "info"
    assert race["kind"] == "no_healthy_devices" and race["resource"] == "nvidia.com/gpu"
    assert race["race"].startswith("node reboot: the kubelet re-admitted the pod before the "
                                   "device plugin had registered nvidia.com/gpu again")
    assert race["kubelet_started_at"] == T0.isoformat()
    assert race["plugin_started_at"] == (T0 + dt.timedelta(seconds=75)).isoformat()
    assert race["cleared_now"] is True and race["node_allocatable_now"] == 8
    assert race["recreated"] is True and race["controller"] == {"kind": "ReplicaSet",
                                                                "name": "train-5d8f"}
    assert "Nothing to do for the workload" in f.remediation
    assert "https://github.com/kubernetes/kubernetes/issues/117955" in f.refs


def test_kubelet_restart_devices_unavailable_for_a_bare_pod_must_be_recreated_by_hand():
    pod, evs = rejected_pod("requested number of devices unavailable for nvidia.com/gpu. "
                            "Requested: 4, Available: 0")
    [f] = pod_status.analyze_pod(pod, evs, NOW, node=node("0"),
                                 node_events=[node_event("Starting", "Starting kubelet.", T0)])
    race = f.evidence["admission_race"]
    assert (race["kind"], race["requested"], race["available"]) == ("devices_unavailable", 4, 0)
    assert "kubelet restart" in race["race"]
    assert race["cleared_now"] is False
    assert race["recreated"] is False and race["controller"] is None
    assert "nothing recreates it" in f.remediation and "has not cleared" in f.remediation


def test_checkpoint_disagreeing_with_the_plugin_under_a_statefulset():
    pod, evs = rejected_pod("previously allocated devices are no longer healthy; cannot "
                            "allocate unhealthy devices nvidia.com/gpu",
                            owner=("StatefulSet", "llm"))
    race = admission_race.explain(pod, evs, NOW)
    assert race["kind"] == "checkpoint_disagrees"
    assert "checkpoint" in race["race"] and race["recreated"] is True
    assert "same name" in race["how"]


def test_unregistered_long_after_start_is_a_missing_plugin_not_a_race():
    pod, evs = rejected_pod("cannot allocate unregistered device nvidia.com/gpu",
                            owner=("Job", "bench"))
    race = admission_race.explain(pod, evs, NOW, node_events=[
        node_event("Starting", "Starting kubelet.", T0 - dt.timedelta(days=2))])
    assert race["race"] == "no device plugin is registered for nvidia.com/gpu on this node"
    assert "backoffLimit" in race["how"]


def test_other_rejections_and_healthy_pods_are_not_called_races():
    pod, evs = rejected_pod("x")
    pod["status"]["message"] = "Pod was rejected: Node didn't have enough resource: nvidia.com/gpu"
    pod["status"]["reason"] = "OutOfnvidia.com/gpu"
    assert admission_race.explain(pod, [], NOW) is None
    [f] = pod_status.analyze_pod(pod, [], NOW)
    assert "admission_race" not in f.evidence
    running = {"metadata": {"name": "ok", "namespace": "ml", "uid": "u-ok"},
               "spec": {"nodeName": "gpu-1"},
               "status": {"phase": "Running", "containerStatuses": [
                   {"name": "main", "state": {"running": {"startedAt": ts(T0)}}}]}}
    assert pod_status.analyze_pod(running, [], NOW) == []


def rejected_after_a_kubelet_restart(cluster) -> dt.datetime:
    """On the fake API server: node gpu-1 whose kubelet restarted 20 minutes ago, and pod
    ml/train-7 of ReplicaSet train-5d8f that it then rejected at admission (Failed,
    UnexpectedAdmissionError, the kubelet's event 15 s after its start). The kubelet's start."""
    started = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=20)
    cluster.add_node("gpu-1")
    msg = ("Allocate failed due to no healthy devices present; cannot allocate unhealthy "
           "devices nvidia.com/gpu, which is unexpected")
    pod = cluster.add_pod("ml", "train-7", "gpu-1", phase="Failed", gpus=1, events="none",
                          extra_status={"reason": "UnexpectedAdmissionError",
                                        "message": "Pod was rejected: " + msg,
                                        "containerStatuses": []})
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                           "name": "train-5d8f", "uid": "o-1",
                                           "controller": True}]
    cluster.add_event(pod, "Warning", "UnexpectedAdmissionError", msg, "kubelet",
                      started + dt.timedelta(seconds=15), host="gpu-1")
    ev = node_event("Starting", "Starting kubelet.", started)
    ev["metadata"] = {"name": "gpu-1.start", "namespace": "default"}
    cluster.events.append(ev)
    return started


def test_pod_command_names_the_race_from_the_nodes_events(cluster, kubeconfig):
    import json

    from .conftest import run_cli

    started = rejected_after_a_kubelet_restart(cluster)
    plugin = cluster.add_pod("gpu-operator", "nvidia-device-plugin-daemonset-x7k2p", "gpu-1")
    for cs in plugin["status"].get("containerStatuses") or ():
        cs["state"] = {"running": {"startedAt": ts(started + dt.timedelta(seconds=70))}}
    r = run_cli("pod", "train-7", "-n", "ml", "--kubeconfig", str(kubeconfig), "--no-probe",
                "-o", "json")
    doc = json.loads(r.stdout)
    [f] = [f for f in doc["findings"] if f["id"] == "pod.admission_error"]
    race = f["evidence"]["admission_race"]
    assert race["kind"] == "no_healthy_devices", r.stderr
    assert race["race"].startswith("kubelet restart: the kubelet re-admitted the pod")
    assert race["kubelet_started_at"] is not None and race["plugin_started_at"] is not None
    assert race["recreated"] is True and race["cleared_now"] is True

"""What other health monitors already say about a node (issue 25, class 7).

Condition types and reasons as the monitors write them: the EKS node monitoring agent sets
AcceleratedHardwareReady=False with reasons like NvidiaXID79Error / DCGMError (aws/eks-node-
monitoring-agent; EKS node health docs), node-problem-detector sets KernelDeadlock and
Frequent*Restart (True = problem) and records events from its `kernel-monitor`, NVSentinel sets
a condition per check (GpuXidError), GKE XidCriticalError. Our own agent's GpuDoctor* conditions
(protocol/conditions) are not foreign.
"""
import datetime as dt
import json

from kubectl_gpudoctor.analysis.monitors import foreign

from .conftest import run_cli

NOW = dt.datetime(2026, 11, 23, 8, 0, 0, tzinfo=dt.timezone.utc)


def ts(t):
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def cond(type_, status, reason="", message="", age_h=3.0):
    return {"type": type_, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": ts(NOW - dt.timedelta(hours=age_h)),
            "lastHeartbeatTime": ts(NOW - dt.timedelta(minutes=1))}


def node(conditions, taints=()):
    base = [cond("Ready", "True", "KubeletReady"), cond("MemoryPressure", "False")]
    return {"metadata": {"name": "gpu-1"}, "spec": {"taints": list(taints)},
            "status": {"conditions": base + list(conditions)}}


def node_event(reason, message, component, type_="Warning", count=1, age_s=600):
    t = NOW - dt.timedelta(seconds=age_s)
    return {"reason": reason, "message": message, "type": type_, "count": count,
            "source": {"component": component, "host": "gpu-1"},
            "firstTimestamp": ts(t), "lastTimestamp": ts(t),
            "involvedObject": {"kind": "Node", "name": "gpu-1"}}


def test_each_monitor_is_shown_with_its_source_and_age():
    n = node([cond("AcceleratedHardwareReady", "False", "NvidiaXID79Error",
                   "GPU 0000:86:00.0 has fallen off the bus", age_h=5),
              cond("KernelDeadlock", "True", "DockerHung", "task docker:7 blocked for more "
                   "than 300 seconds."),
              cond("GpuXidError", "True", "GpuXidErrorIsNotHealthy",
                   "ErrorCode:119 GPU:0 PCI:0000:19:00 XID error occurred"),
              cond("XidCriticalError", "True", "XidCriticalError", "Xid 48 on GPU 3"),
              cond("GpuDoctorXidErrors", "True", "GpuXid", "ours, not foreign")],
             taints=[{"key": "nvidia.com/gpu-unhealthy", "value": "xid-79",
                      "effect": "NoSchedule", "timeAdded": ts(NOW - dt.timedelta(hours=2))}])
    evs = [node_event("TaskHung", "INFO: task nvidia-smi:4123 blocked for more than 120 seconds.",
                      "kernel-monitor", count=3),
           node_event("Starting", "Starting kubelet.", "kubelet", type_="Normal")]
    fs = foreign.foreign_conditions(n, evs, NOW)
    by = {(f.evidence["kind"], f.evidence.get("type") or f.evidence.get("key")
           or f.evidence.get("reason")): f for f in fs}
    assert set(by) == {("condition", "AcceleratedHardwareReady"), ("condition", "KernelDeadlock"),
                       ("condition", "GpuXidError"), ("condition", "XidCriticalError"),
                       ("taint", "nvidia.com/gpu-unhealthy"), ("event", "TaskHung")}
    eks = by[("condition", "AcceleratedHardwareReady")]
    assert eks.evidence["source"] == "EKS node monitoring agent"
    # the Xid in EKS's reason is decoded: 79 is a reboot, as our own gpu.xid says (corpus2)
    assert eks.evidence["age_s"] == 5 * 3600 and eks.severity.value == "critical"
    assert "NvidiaXID79Error" in eks.title and "5h" in eks.title
    assert by[("condition", "KernelDeadlock")].evidence["source"] == "node-problem-detector"
    assert by[("condition", "KernelDeadlock")].severity.value == "info"
    assert by[("condition", "GpuXidError")].evidence["source"].startswith("NVSentinel")
    assert by[("condition", "XidCriticalError")].evidence["source"].startswith("GKE")
    ev = by[("event", "TaskHung")].evidence
    assert (ev["source"], ev["count"], ev["age_s"]) == ("kernel-monitor", 3, 600)
    assert by[("taint", "nvidia.com/gpu-unhealthy")].evidence["age_s"] == 7200


def test_healthy_monitors_stay_quiet_and_hostile_messages_are_one_bounded_line():
    n = node([cond("AcceleratedHardwareReady", "True", "NvidiaGPUHealthy"),
              cond("KernelDeadlock", "False", "KernelHasNoDeadlock"),
              cond("GpuDoctorWatching", "True", "Watching")])
    assert foreign.foreign_conditions(n, [node_event("Starting", "Starting kubelet.", "kubelet",
                                                     "Normal")], NOW) == []
    evil = node([cond("FrequentKubeletRestart", "True", "x" * 5000,
                      "line1\n\x1b[31mred\x1b[0m" + "y" * 10_000)])
    [f] = foreign.foreign_conditions(evil, [], NOW)
    assert "\n" not in f.title and "\x1b" not in f.title
    assert len(f.evidence["message"].encode()) <= 300 and len(f.evidence["reason"]) <= 128


def test_node_command_shows_foreign_conditions_and_events(cluster, kubeconfig):
    n = cluster.add_node("gpu-1")
    n["status"]["conditions"].append(cond("AcceleratedHardwareReady", "False", "NvidiaXID79Error",
                                          "GPU fell off the bus"))
    ev = node_event("TaskHung", "INFO: task python3:91 blocked for more than 120 seconds.",
                    "kernel-monitor")
    ev["metadata"] = {"name": "gpu-1.1", "namespace": "default"}
    cluster.events.append(ev)
    r = run_cli("node", "gpu-1", "--kubeconfig", str(kubeconfig), "--no-probe", "-o", "json")
    doc = json.loads(r.stdout)
    got = sorted((f["evidence"]["kind"], f["evidence"]["source"]) for f in doc["findings"]
                 if f["id"] == "node.foreign_condition")
    assert got == [("condition", "EKS node monitoring agent"), ("event", "kernel-monitor")], \
        r.stderr


def test_nodes_command_shows_foreign_conditions(cluster, kubeconfig):
    n = cluster.add_node("gpu-1")
    n["status"]["conditions"].append(cond("XidCriticalError", "True", "XidCriticalError",
                                          "Xid 48"))
    cluster.add_node("gpu-2")
    r = run_cli("nodes", "--kubeconfig", str(kubeconfig), "-o", "json")
    doc = json.loads(r.stdout)
    got = [f["subject"] for f in doc["findings"] if f["id"] == "node.foreign_condition"]
    assert got == ["node/gpu-1 condition XidCriticalError"], r.stderr


def test_the_agents_own_events_are_ours_not_another_monitors():
    """The Event the watching agent writes on its node, as a real 1.35 API server stored it
    (tests/data/captures/k8s-1.35/node-status-writes/event-create.201.json: source.component
    `gpu-doctor-agent`, reason BlockedInNvmlInit, Warning): its component matched the monitor
    pattern ("gpu") and came back as node.foreign_condition, "another monitor" reporting the
    tool's own verdict. A real monitor's event beside it still counts."""
    from node_probe.protocol.conditions import AGENT_COMPONENT
    from node_probe.watch.writer import COMPONENT

    from .test_captures import CAPTURES

    capture = CAPTURES / "node-status-writes" / "event-create.201.json"
    ours = json.loads(capture.read_text())
    assert ours["source"]["component"] == AGENT_COMPONENT == COMPONENT
    name = ours["involvedObject"]["name"]
    n = dict(node([]), metadata={"name": name})
    theirs = dict(node_event("TaskHung", "INFO: task nvidia-smi:4123 blocked for more than 120 "
                             "seconds.", "kernel-monitor"),
                  involvedObject={"kind": "Node", "name": name})
    now = dt.datetime(2026, 11, 26, 5, 0, 0, tzinfo=dt.timezone.utc)
    fs = foreign.foreign_conditions(n, [ours, theirs], now)
    assert [f.evidence["source"] for f in fs] == ["kernel-monitor"]

"""node.gpu_black_hole: a Ready node that rejects every GPU pod sent to it (issue 32).

The incident: pytorch/ci-infra PR #1058 (https://github.com/pytorch/ci-infra/pull/1058): one
lost GPU made ip-10-4-164-212 reject 554 pods in 1 h 46 min while it stayed Ready, every pod with
the kubelet message quoted in fakecluster.LOST_GPU_ADMISSION (the NVIDIA device plugin reads the
links of all GPUs, so one GPU off the bus fails GetPreferredAllocation for every pod:
k8s-device-plugin #2038). The fleet below has 1,000 GPU nodes and two such nodes, whose rejected
pods are partly still listed and partly gone (only the kubelet's events remain), while the same
ReplicaSets' pods run on other nodes.
"""
from __future__ import annotations

import datetime as dt
import json

from kubectl_gpudoctor.analysis.failing import black_hole
from kubectl_gpudoctor.analysis import verdict

from .conftest import run_cli
from .fakecluster import FakeCluster, add_black_hole, build_fleet, generated_name, ts

NOW = dt.datetime(2026, 9, 4, 16, 40, tzinfo=dt.timezone.utc)


def test_two_black_holes_in_a_thousand_nodes_lead_the_fleet(cluster, kubeconfig):
    names = build_fleet(cluster, 1000, 3000)
    add_black_hole(cluster, names[700], "ci", "runner-7d9c8b5f4", rejected=12, gone=30,
                   elsewhere=names[10:20])
    add_black_hole(cluster, names[250], "eval", "bench-5f6d7c8b9", rejected=4, gone=0,
                   elsewhere=names[30:36])
    r = run_cli("nodes", "--kubeconfig", str(kubeconfig), "-o", "json", timeout=120)
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    rows = doc["nodes"]
    assert len(rows) == 1000
    # the two black holes are the first two rows, the one that failed more pods first (audit
    # round 5, N9: 4 of 4 was listed before 42 of 42, by name), and no GPU is free on either
    # (N9: `FREE 7` on a node that fails every GPU pod)
    assert [rows[0]["node"], rows[1]["node"]] == [names[700], names[250]]
    assert rows[0]["gpu_free"] == rows[1]["gpu_free"] == 0
    assert all("black_hole_failed" not in r for r in rows)
    assert all("node.gpu_black_hole" in r["findings"] for r in rows[:2])
    assert all(r["critical"] == r["warning"] == 0 for r in rows[2:])  # 998 quiet nodes
    bad = [f for f in doc["findings"] if f["severity"] in ("critical", "warning")]
    assert {(f["id"], f["subject"]) for f in bad} == {
        ("node.gpu_black_hole", f"node/{names[700]}"),
        ("node.gpu_black_hole", f"node/{names[250]}")}
    big = next(f for f in bad if f["subject"] == f"node/{names[700]}")
    ev = big["evidence"]
    # 12 listed + 30 gone (their events), none run there; the same ReplicaSet's 10 pods on
    # other nodes all run
    assert (ev["failed_pods"], ev["gpu_pods"]) == (42, 42)
    assert ev["reasons"] == {"UnexpectedAdmissionError": 42}
    assert ev["compared_elsewhere"] is True and ev["elsewhere"] == {"pods": 10, "failed": 0}
    assert ev["controllers"] == [{"controller": "ReplicaSet ci/runner-7d9c8b5f4",
                                  "failed_here": 42,
                                  "elsewhere": {"pods": 10, "failed": 0}}]
    assert ev["window_s"] == 3600 and ev["failing_for_s"] == 41 * 20
    assert "GPU is lost" in ev["messages"][0]
    assert big["severity"] == "critical"
    row = rows[0] if rows[0]["node"] == names[700] else rows[1]
    assert row["root_cause"] == "node.gpu_black_hole"
    # the verdict is the finding's own sentence, with its numbers (issue 30), not the catalog's,
    # and what the rejections said, in our words (audit round 5, N9: all 42 said "GPU is lost")
    assert row["verdict"].startswith(f"42 of 42 GPU pods sent to {names[700]} in the last 60m "
                                     "failed or were rejected (42 UnexpectedAdmissionError); 42 "
                                     "of them: the device plugin says a GPU is lost")
    assert ev["admission_causes"] == {"gpu_lost": 42}


def test_node_x_says_it_and_cordons_first(cluster, kubeconfig):
    names = build_fleet(cluster, 40, 120)
    add_black_hole(cluster, names[7], "ci", "runner-7d9c8b5f4", rejected=5, gone=6,
                   elsewhere=names[20:26])
    r = run_cli("node", names[7], "--no-probe", "--kubeconfig", str(kubeconfig), "-o", "json")
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    f = next(f for f in doc["findings"] if f["id"] == "node.gpu_black_hole")
    assert f["evidence"]["failed_pods"] == 11
    # compared through the namespace of the failing ReplicaSet (one list), as `nodes` does
    assert f["evidence"]["elsewhere"] == {"pods": 6, "failed": 0}
    v = doc["verdict"]
    assert v["root_cause"] == "node.gpu_black_hole"
    assert v["actions"][0]["command"] == f"kubectl cordon {names[7]}"
    assert v["actions"][0]["stage"] == "stop"
    # the rejections name a lost GPU: drain, then reboot (audit round 5, N9: the fix step was
    # the generic "find why the node fails GPU pods")
    steps = [(a["step"], a["command"] or "") for a in v["actions"]]
    assert steps[1][0] == "mitigate" and steps[1][1].startswith(f"kubectl drain {names[7]}")
    assert any(s == "fix" and "reboot" in a["text"] for (s, _), a in zip(steps, v["actions"]))
    assert not any("find why the node fails GPU pods" in a["text"] for a in v["actions"])
    assert cluster.count("GET", r"/api/v1/namespaces/ci/pods") == 1
    # a healthy node of the same fleet: no finding, and no namespace list
    r = run_cli("node", names[8], "--no-probe", "--kubeconfig", str(kubeconfig), "-o", "json")
    assert r.returncode == 0, r.stderr
    assert not [f for f in json.loads(r.stdout)["findings"] if f["id"] == "node.gpu_black_hole"]
    assert cluster.count("GET", r"/api/v1/namespaces/ci/pods") == 1


# -- the rule, on the objects alone ------------------------------------------------------------

def _judge(fc: FakeCluster, node: str, peers: bool = True):
    pods = [p for p in fc.pods.values() if (p["spec"].get("nodeName")) == node]
    by_uid: dict = {}
    for e in fc.events:
        by_uid.setdefault(e["involvedObject"]["uid"], []).append(e)
    listed = {p["metadata"]["uid"] for p in fc.pods.values()}
    since = NOW - black_hole.window()
    gone = black_hole.gone_attempts(fc.events, listed, since)
    table = None
    if peers:
        attempts = black_hole.node_attempts(fc.pods.values(), by_uid, gone, NOW)
        table = black_hole.peer_table(attempts)
    return black_hole.analyze(fc.nodes[node], pods, by_uid,
                              [a for a in gone if a.node == node], NOW, table)


def _fleet(n: int = 6) -> tuple[FakeCluster, list[str]]:
    fc = FakeCluster()
    names = [f"gpu-{i}" for i in range(n)]
    for name in names:
        fc.add_node(name, now=NOW)
    return fc, names


def test_a_workload_that_fails_everywhere_is_no_black_hole():
    fc, names = _fleet()
    for i, node in enumerate(names[:3]):  # rejected on every node it is sent to
        add_black_hole(fc, node, "ci", "runner-1", rejected=4, gone=0, now=NOW, start=10 * i)
    assert _judge(fc, names[0]) == []
    # with nothing to compare with, admission rejections alone are the node's
    fc, names = _fleet()
    add_black_hole(fc, names[0], "ci", "runner-1", rejected=4, gone=0, now=NOW)
    fs = _judge(fc, names[0])
    assert [f.id for f in fs] == ["node.gpu_black_hole"]
    assert fs[0].evidence["compared_elsewhere"] is False


def test_a_node_that_recovered_or_takes_no_pods_is_no_black_hole():
    fc, names = _fleet()
    add_black_hole(fc, names[0], "ci", "runner-1", rejected=5, gone=2, now=NOW,
                   elsewhere=names[1:4])
    assert [f.id for f in _judge(fc, names[0])] == ["node.gpu_black_hole"]
    # the same node after the plugin came back: GPU pods started there since the last rejection
    for k in range(6):
        p = fc.add_pod("ci", generated_name("runner-1", 500 + k), names[0], gpus=1, age_s=20,
                       now=NOW, events="none")
        p["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "name": "runner-1",
                                             "controller": True}]
    assert _judge(fc, names[0]) == []
    # cordoned, or NotReady: the scheduler sends it nothing any more
    fc, names = _fleet()
    add_black_hole(fc, names[0], "ci", "runner-1", rejected=5, gone=2, now=NOW)
    fc.nodes[names[0]]["spec"]["unschedulable"] = True
    assert _judge(fc, names[0]) == []
    fc.nodes[names[0]]["spec"].pop("unschedulable")
    fc.nodes[names[0]]["status"]["conditions"][-1]["status"] = "Unknown"
    assert _judge(fc, names[0]) == []
    # rejections older than the window do not count
    fc, names = _fleet()
    add_black_hole(fc, names[0], "ci", "runner-1", rejected=5, gone=0,
                   now=NOW - dt.timedelta(hours=2))
    assert _judge(fc, names[0]) == []


def _quick_exit_pod(fc: FakeCluster, node: str, name: str, rs: str):
    """A GPU pod whose container exits 2 s after it starts, over and over."""
    start = NOW - dt.timedelta(seconds=90)
    pod = fc.add_pod("ml", name, node, gpus=1, age_s=600, now=NOW, events="none")
    pod["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "name": rs, "controller": True}]
    cs = pod["status"]["containerStatuses"][0]
    cs.update(ready=False, restartCount=5, state={"waiting": {
        "reason": "CrashLoopBackOff", "message": "back-off 2m40s restarting failed container"}},
        lastState={"terminated": {"exitCode": 1, "reason": "Error", "startedAt": ts(start),
                                  "finishedAt": ts(start + dt.timedelta(seconds=2))}})
    pod["status"]["phase"] = "Running"
    return pod


def test_pods_that_exit_at_once_count_only_against_the_same_pods_elsewhere():
    fc, names = _fleet()
    for k in range(4):
        _quick_exit_pod(fc, names[0], generated_name("infer-1", k), "infer-1")
    assert _judge(fc, names[0]) == []  # nothing to compare with: maybe the workload
    for k, node in enumerate(names[1:5]):  # the same ReplicaSet runs fine on four nodes
        p = fc.add_pod("ml", generated_name("infer-1", 100 + k), node, gpus=1, age_s=900,
                       now=NOW, events="none")
        p["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "name": "infer-1",
                                             "controller": True}]
    fs = _judge(fc, names[0])
    assert [f.id for f in fs] == ["node.gpu_black_hole"]
    assert fs[0].evidence["reasons"] == {"exited within 10s": 4}
    assert fs[0].evidence["elsewhere"] == {"pods": 4, "failed": 0}
    # and where they exit at once on other nodes too, it is the workload
    for k, node in enumerate(names[1:5]):
        _quick_exit_pod(fc, node, generated_name("infer-1", 200 + k), "infer-1")
        _quick_exit_pod(fc, node, generated_name("infer-1", 300 + k), "infer-1")
    assert _judge(fc, names[0]) == []


def test_the_verdict_cordons_a_black_hole_before_anything_else():
    fc, names = _fleet()
    add_black_hole(fc, names[0], "ci", "runner-1", rejected=5, gone=2, now=NOW)
    fs = _judge(fc, names[0])
    v = verdict.decide(fs, {"kind": "node", "name": names[0], "node": names[0]})
    assert v.root_cause == "node.gpu_black_hole"
    assert v.actions[0].command == f"kubectl cordon {names[0]}"
    # rejected pods are not "stuck": their controllers made new ones; the title counts them
    assert v.impact["pods"] == 0 and fs[0].evidence["failed_pods"] == 7
    assert len(fs[0].evidence["latest_failed"]) == 7


def test_a_wedged_kubelet_is_the_wedge_not_also_a_black_hole():
    """The captured 1.35 wedge (tests/data/captures/k8s-1.35/wedged-3m-*) has three GPU pods
    the kubelet rejected while the plugin restarted, and the kubelet now admits nothing: the
    answer is kubelet.admission_stalled alone (pods wait there; none is rejected any more)."""
    from kubectl_gpudoctor import analysis

    fc, names = _fleet()
    add_black_hole(fc, names[0], "ci", "runner-1", rejected=4, gone=0, now=NOW)
    assert "node.gpu_black_hole" in {f.id for f in _judge(fc, names[0])}
    fc.add_pod("ci", "stuck-0", names[0], phase="Pending", gpus=1, age_s=600, now=NOW,
               events="scheduled-only")
    pods = [p for p in fc.pods.values() if p["spec"].get("nodeName") == names[0]]
    fs, errs = analysis.node_objects(fc.nodes[names[0]], pods, fc.events, fc.leases[names[0]],
                                     NOW, peers={})
    ids = {f.id for f in fs}
    assert "kubelet.admission_stalled" in ids and "node.gpu_black_hole" not in ids and not errs


def _start_failure_pod(fc: FakeCluster, node: str, name: str, message: str):
    """A GPU pod in CrashLoopBackOff whose last start the runtime refused (StartError)."""
    pod = fc.add_pod("ml", name, node, gpus=1, age_s=900, now=NOW, events="none")
    pod["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "name": "cuda-rs",
                                           "controller": True}]
    start = NOW - dt.timedelta(seconds=120)
    pod["status"]["containerStatuses"][0].update(
        ready=False, restartCount=4,
        state={"waiting": {"reason": "CrashLoopBackOff",
                           "message": "back-off 2m40s restarting failed container"}},
        lastState={"terminated": {"exitCode": 128, "reason": "StartError", "message": message,
                                  "startedAt": ts(start), "finishedAt": ts(start)}})
    pod["status"]["phase"] = "Running"


def test_the_title_says_the_start_cause_in_words_not_its_key():
    """ux-round-5 R4-14/N9: with 3 of 3 GPU pods failing on a driver/library mismatch the
    headline read `(3 CrashLoopBackOff: driver_library_mismatch)`: an internal key. The
    runtime's message is k8s-device-plugin#1431's, quoted in
    tests/realworld/corpus_container_start.py
    (https://github.com/NVIDIA/k8s-device-plugin/issues/1431: the loaded kernel module and the
    driver libraries differed; a reboot fixed it)."""
    from tests.realworld.corpus_container_start import ARTIFACTS
    quote = next(a.quote for a in ARTIFACTS if a.key.endswith("driver-library-mismatch"))
    fc, names = _fleet()
    for k in range(3):
        _start_failure_pod(fc, names[0], generated_name("cuda-rs", k), quote)
    fs = _judge(fc, names[0], peers=False)
    assert [f.id for f in fs] == ["node.gpu_black_hole"], fs
    assert "driver library mismatch" in fs[0].title and "_" not in fs[0].title.split("(")[1]
    assert any("driver_library_mismatch" in r for r in fs[0].evidence["reasons"])  # JSON keeps it

"""`job NAME` / `job -l SELECTOR` on the fake API server: each kind's objects and pods as its
controller writes them (tests/kubectl/jobkinds.py cites the controllers' label constants),
one bad node among many, a healthy job, a selector, a kind the cluster does not serve, an
ambiguous name; and the comparison itself (analysis/job/) on its own."""
from __future__ import annotations

import datetime as dt
import json

import pytest

from kubectl_gpudoctor.analysis.job import kinds as jk
from kubectl_gpudoctor.analysis.job import nodes as jn
from kubectl_gpudoctor.analysis.job import ranks as jr
from kubectl_gpudoctor.analysis.job import verdict as jv
from node_probe.protocol.catalog import make

from . import jobkinds
from .conftest import one_error_line, run_cli

NODES = [f"gpu-{i}" for i in range(8)]
NOW = dt.datetime(2026, 11, 29, 1, 0, tzinfo=dt.timezone.utc)


def _fleet(cluster, bad: str | None = "gpu-5", how: str = "notready") -> None:
    for n in NODES:
        if n == bad and how == "notready":
            cluster.add_node(n, ready=False)
        elif n == bad and how == "fewer":
            cluster.add_node(n, gpus=7)  # a GPU fell off the bus: capacity and allocatable 7
        else:
            cluster.add_node(n)
    cluster.add_node("cpu-0", gpus=0)


def _json(kubeconfig, *args: str):
    r = run_cli("job", *args, "-n", "ml", "--kubeconfig", str(kubeconfig), "-o", "json")
    assert "Traceback" not in r.stderr, r.stderr
    return r, json.loads(r.stdout)


# -- one bad node among eight, for each kind --------------------------------------------------

@pytest.mark.parametrize("kind", sorted(jobkinds.BUILDERS))
def test_each_kind_names_the_bad_node(cluster, kubeconfig, kind):
    _fleet(cluster)
    obj = jobkinds.BUILDERS[kind](cluster, "ml", "train", NODES)
    # the same label in another namespace is not this job
    jobkinds.batch_job(cluster, "other", "train", ["gpu-1"])
    r, doc = _json(kubeconfig, obj["metadata"]["name"])
    assert r.returncode == 1, r.stderr
    v = doc["verdict"]
    assert v["subject"] == "node gpu-5"
    assert "gpu-5" in v["headline"] and "differs" in v["headline"]
    assert v["root_cause"] == "node.not_ready"
    cmds = [a["command"] for a in v["actions"]]
    assert "kubectl cordon gpu-5" in cmds
    assert any(c and c.startswith("kubectl delete pod -n ml -l ") and
               "--field-selector spec.nodeName=gpu-5" in c for c in cmds), cmds
    rows = doc["nodes"]
    assert [r_["node"] for r_ in rows][0] == "gpu-5" and rows[0]["differs"] is True
    assert rows[0]["signature"] == ["node.not_ready"]
    assert sorted(r_["node"] for r_ in rows) == NODES  # the job's nodes, not cpu-0
    assert all(not r_["differs"] for r_ in rows[1:])
    assert doc["job"]["pods"] == len(NODES)
    ids = {f["id"] for f in doc["findings"]}
    assert "job.node_differs" in ids


def test_fewer_allocatable_gpus_than_siblings(cluster, kubeconfig):
    _fleet(cluster, how="fewer")
    jobkinds.jobset(cluster, "ml", "llama", NODES)
    r, doc = _json(kubeconfig, "llama", "--kind", "JobSet")
    assert r.returncode == 1
    f = next(f for f in doc["findings"] if f["id"] == "job.node_fewer_gpus")
    assert f["evidence"]["gpu_allocatable"] == 7
    assert f["evidence"]["siblings_gpu_allocatable"] == 8
    assert doc["verdict"]["subject"] == "node gpu-5"
    assert doc["nodes"][0]["node"] == "gpu-5"
    assert doc["nodes"][0]["differs_by"] == ["job.node_fewer_gpus"]
    assert doc["nodes"][0]["severity"] == "warning"


def test_healthy_job_exits_0_and_says_no_node_differs(cluster, kubeconfig):
    _fleet(cluster, bad=None)
    jobkinds.pytorchjob(cluster, "ml", "bert", NODES)
    r = run_cli("job", "bert", "-n", "ml", "--kubeconfig", str(kubeconfig))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no node differs" in r.stdout
    assert "No node differs among the 8 nodes of PyTorchJob ml/bert" in r.stdout
    assert "8 nodes alike with no problem" in r.stdout
    assert max(len(ln) for ln in r.stdout.splitlines()) <= 120
    r, doc = _json(kubeconfig, "bert")
    assert r.returncode == 0
    assert doc["verdict"]["severity"] == "ok" and doc["verdict"]["root_cause"] is None
    assert not [f for f in doc["findings"] if f["severity"] in ("critical", "warning")]


def test_selector_selects_pods_in_the_namespace_only(cluster, kubeconfig):
    _fleet(cluster, bad="gpu-2")
    for i, n in enumerate(NODES[:4]):
        p = cluster.add_pod("ml", f"trainer-{i}", n, gpus=8)
        p["metadata"]["labels"] = {"app": "trainer"}
    q = cluster.add_pod("other", "trainer-x", "gpu-7", gpus=8)  # same label, other namespace
    q["metadata"]["labels"] = {"app": "trainer"}
    r, doc = _json(kubeconfig, "-l", "app=trainer")
    assert r.returncode == 1
    assert sorted(x["node"] for x in doc["nodes"]) == NODES[:4]
    assert doc["verdict"]["subject"] == "node gpu-2"
    assert doc["job"]["selector"] == "app=trainer" and doc["job"]["kind"] is None
    pod_lists = [(p, q_) for m, p, q_ in cluster.requests() if p.endswith("/pods")
                 and q_.get("labelSelector") == "app=trainer"]
    assert pod_lists and all(p == "/api/v1/namespaces/ml/pods" for p, _ in pod_lists)


def test_kind_not_served_is_skipped_quietly(cluster, kubeconfig):
    """Only batch/v1 is served (no Kubeflow, Ray, Volcano, Kueue CRDs): each of their GETs
    answers 404 and the run goes on with the Job; no warning is said about them."""
    _fleet(cluster, bad=None)
    jobkinds.batch_job(cluster, "ml", "train", NODES[:3])
    r = run_cli("job", "train", "-n", "ml", "--kubeconfig", str(kubeconfig))
    assert r.returncode == 0, r.stderr
    assert "not served" not in r.stderr and "pytorchjobs" not in r.stdout + r.stderr
    asked = {p for m, p, _ in cluster.requests() if p.startswith("/apis/")}
    assert "/apis/kubeflow.org/v1/namespaces/ml/pytorchjobs/train" in asked
    assert "/apis/ray.io/v1/namespaces/ml/rayjobs/train" in asked


def test_no_job_of_that_name_suggests_close_names(cluster, kubeconfig):
    _fleet(cluster, bad=None)
    jobkinds.batch_job(cluster, "ml", "llama-train", NODES[:2])
    r = run_cli("job", "llama-trian", "-n", "ml", "--kubeconfig", str(kubeconfig))
    assert r.returncode == 3
    line = one_error_line(r.stderr)
    assert 'no job named "llama-trian" in namespace ml' in line
    assert "did you mean Job/llama-train?" in line


def test_ambiguous_name_needs_kind_in_any_case(cluster, kubeconfig):
    _fleet(cluster)
    jobkinds.jobset(cluster, "ml", "train", NODES)   # also makes batch Jobs train-workers-I
    jobkinds.batch_job(cluster, "ml", "train", NODES[:2])
    r = run_cli("job", "train", "-n", "ml", "--kubeconfig", str(kubeconfig))
    assert r.returncode == 2
    line = one_error_line(r.stderr)
    assert "more than one kind of job (Job, JobSet)" in line and "--kind" in line
    for spelling in ("JobSet", "jobset", "jobsets.jobset.x-k8s.io"):
        r, doc = _json(kubeconfig, "train", "--kind", spelling)
        assert doc["job"]["kind"] == "JobSet", spelling
        assert doc["job"]["pods"] == len(NODES)
    r, doc = _json(kubeconfig, "jobset/train")  # kubectl's TYPE/NAME
    assert doc["job"]["kind"] == "JobSet"
    r = run_cli("job", "train", "-n", "ml", "--kind", "cronjob", "--kubeconfig", str(kubeconfig))
    assert r.returncode == 2 and 'unknown --kind "cronjob"' in one_error_line(r.stderr)


def test_usage_errors(kubeconfig):
    r = run_cli("job", "--kubeconfig", str(kubeconfig))
    assert r.returncode == 2 and "NAME or -l SELECTOR" in one_error_line(r.stderr)
    r = run_cli("job", "x", "-l", "a=b", "--kubeconfig", str(kubeconfig))
    assert r.returncode == 2
    r = run_cli("job", "Bad_Name", "--kubeconfig", str(kubeconfig))
    assert r.returncode == 2


def test_one_crashlooping_rank_on_healthy_nodes_is_named(cluster, kubeconfig):
    _fleet(cluster, bad=None)
    jobkinds.volcano_job(cluster, "ml", "vc", NODES)
    pod = cluster.pods[("ml", "vc-worker-3")]
    cs = pod["status"]["containerStatuses"][0]
    cs.update({"ready": False, "restartCount": 6,
               "state": {"waiting": {"reason": "CrashLoopBackOff", "message":
                                     "back-off 5m0s restarting failed container=main pod="
                                     "vc-worker-3_ml(uid)"}},
               "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}})
    r, doc = _json(kubeconfig, "vc", "--kind", "vcjob")
    assert r.returncode == 1
    v = doc["verdict"]
    assert v["root_cause"] == "job.rank_crashloop" and v["subject"] == "pod ml/vc-worker-3"
    assert "kubectl logs -n ml vc-worker-3 --previous" in [a["command"] for a in v["actions"]]
    f = next(f for f in doc["findings"] if f["id"] == "job.rank_crashloop")
    assert f["evidence"]["rank"] == "worker" and f["evidence"]["restarts"] == 6


def test_markdown_and_chat_carry_the_verdict(cluster, kubeconfig):
    _fleet(cluster)
    jobkinds.lws(cluster, "ml", "vllm", NODES)
    for fmt in ("markdown", "chat"):
        r = run_cli("job", "vllm", "-n", "ml", "--kubeconfig", str(kubeconfig), "-o", fmt)
        assert r.returncode == 1
        assert "gpu-5" in r.stdout and "differs" in r.stdout, r.stdout
        assert "kubectl cordon gpu-5" in r.stdout


# -- the comparison on its own ----------------------------------------------------------------

def _finding(fid: str, sev: str, node: str):
    return make(fid, sev, f"node/{node}", f"{fid} on {node}")


def test_compare_names_the_one_node_of_64_that_differs():
    views = [jn.view(f"n{i}", None, [_finding("node.not_ready", "critical", f"n{i}")]
                     if i == 17 else [], [f"ml/p{i}"], i != 17) for i in range(64)]
    c = jn.compare("job", views)
    assert c.odd == ("n17",) and not c.shared and c.baseline == ()
    assert [f.id for f in c.findings] == ["job.node_differs"]


def test_compare_a_problem_every_node_shares_is_not_one_nodes():
    fs = [_finding("memory.overcommit", "warning", f"n{i}") for i in range(10)]
    views = [jn.view(f"n{i}", None, [fs[i]], [f"ml/p{i}"], True) for i in range(10)]
    c = jn.compare("job", views)
    assert c.shared and c.odd == () and c.baseline == ("memory.overcommit",)
    v = jv.decide({"name": "j", "namespace": "ml", "label": "Job ml/j"}, c,
                  {f"n{i}": [fs[i]] for i in range(10)}, [], [], pods=10, probed=False)
    assert "not one node, the cause is shared" in v.headline


def test_compare_healthy_job_has_no_odd_node_and_no_finding():
    views = [jn.view(f"n{i}", None, [], [f"ml/p{i}"], True) for i in range(4)]
    c = jn.compare("job", views)
    assert c.odd == () and c.findings == ()
    v = jv.decide({"name": "j", "namespace": "ml", "label": "Job ml/j"}, c, {}, [], [],
                  pods=4, probed=True)
    assert v.severity == "ok" and v.root_cause is None
    assert v.headline.startswith("No node differs among the 4 nodes of Job ml/j: the cause "
                                 "is likely in the job")


def _rank_pod(i: int, created_s: float, started_s: float | None = None,
              restarts: int = 0) -> dict:
    ts = lambda s: (NOW - dt.timedelta(seconds=s)).strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: E731
    return {"metadata": {"name": f"w-{i}", "namespace": "ml", "uid": f"u{i}",
                         "creationTimestamp": ts(created_s),
                         "labels": {jk.KF_TYPE: "worker", jk.KF_INDEX: str(i)}},
            "spec": {"nodeName": f"n{i}"},
            "status": {"phase": "Running", "startTime": ts(started_s or created_s),
                       "containerStatuses": [{"name": "main", "restartCount": restarts,
                                              "state": {"running": {}}}]}}


def test_ranks_replaced_late_and_restarting_against_their_siblings():
    pods = [_rank_pod(i, 7200) for i in range(6)]
    pods.append(_rank_pod(6, 600))                 # re-created 110 min after the others
    pods.append(_rank_pod(7, 7200, started_s=3000))  # created with them, started 70 min late
    pods[2] = _rank_pod(2, 7200, restarts=9)
    kind = jk.by_name("pytorchjob")[0]
    fs = {f.id: f for f in jr.analyze("job", kind, pods, {}, NOW)}
    assert fs["job.rank_replaced"].evidence["pod"] == "ml/w-6"
    assert fs["job.rank_replaced"].evidence["rank"] == "worker/6"
    assert fs["job.rank_late_start"].evidence["pod"] == "ml/w-7"
    assert fs["job.rank_restarts"].evidence["restarts"] == 9
    healthy = jr.analyze("job", kind, [_rank_pod(i, 7200) for i in range(8)], {}, NOW)
    assert healthy == []


def test_kind_spellings_and_shared_labels():
    assert [k.kind for k in jk.by_name("JobSet")] == ["JobSet"]
    assert [k.group for k in jk.by_name("job")] == ["batch"]
    assert [k.group for k in jk.by_name("vcjob")] == ["batch.volcano.sh"]
    assert [k.group for k in jk.by_name("jobs.batch.volcano.sh")] == ["batch.volcano.sh"]
    assert jk.by_name("LWS")[0].kind == "LeaderWorkerSet"
    # a TFJob of the same name shares training.kubeflow.org/job-name: not this PyTorchJob's
    mine = {"metadata": {"name": "a", "ownerReferences": [
        {"kind": "PyTorchJob", "uid": "u1", "controller": True}]}}
    theirs = {"metadata": {"name": "b", "ownerReferences": [
        {"kind": "TFJob", "uid": "u2", "controller": True}]}}
    other_pt = {"metadata": {"name": "c", "ownerReferences": [
        {"kind": "PyTorchJob", "uid": "u3", "controller": True}]}}
    q = jk.PodQuery(f"{jk.KF_NAME}=x", "PyTorchJob", "u1")
    launcher = {"metadata": {"name": "d", "ownerReferences": [
        {"kind": "Job", "uid": "u4", "controller": True}]}}
    assert [p["metadata"]["name"] for p in jk.owned([mine, theirs, other_pt, launcher], q)] \
        == ["a", "d"]


# -- --probe: the node side, one deadline -------------------------------------------------------

def _streams():
    from .conftest import DATA
    full = (DATA / "probe_stream.ndjson").read_bytes()
    healthy = b"\n".join(ln for ln in full.split(b"\n") if b'"nvml.init_hang"' not in ln)
    return full, healthy


def test_probe_names_the_node_side_odd_one_and_the_node_that_does_not_answer(cluster,
                                                                              kubeconfig):
    """Four nodes, all Ready: the probe finds NVML init hanging on gpu-1 only; gpu-3's probe
    never answers. The verdict names gpu-1 from its node side; gpu-3 is named as not
    answering and the run is partial, within the one --timeout."""
    for n in NODES[:4]:
        cluster.add_node(n)
    jobkinds.batch_job(cluster, "ml", "train", NODES[:4])
    full, healthy = _streams()
    cluster.log_chunks = [healthy]
    cluster.node_log_chunks["gpu-1"] = [full]
    cluster.node_log_hang.add("gpu-3")
    cluster.node_log_chunks["gpu-3"] = [healthy.split(b"\n")[0] + b"\n"]
    r = run_cli("job", "train", "-n", "ml", "--kubeconfig", str(kubeconfig), "-o", "json",
                "--probe", "--no-agent", "--timeout", "8s", "--trace-seconds", "0",
                timeout=90)
    doc = json.loads(r.stdout)
    v = doc["verdict"]
    assert v["subject"] == "node gpu-1", v
    assert v["root_cause"] == "nvml.init_hang"
    rows = {x["node"]: x for x in doc["nodes"]}
    assert rows["gpu-1"]["differs"] and "nvml.init_hang" in rows["gpu-1"]["signature"]
    assert rows["gpu-3"]["probe"] == "no answer"
    assert rows["gpu-0"]["probe"] != "no answer"
    assert doc["summary"]["complete"] is False
    assert "gpu-3" in doc["summary"]["incomplete_reason"]
    assert "partial" in doc["summary"]["incomplete_reason"]
    assert r.returncode == 1, r.stderr  # a critical finding outranks the partial run (4)
    # every debug pod is gone
    assert not [k for k in cluster.pods if k[0] == "gpu-doctor"]


# -- the MCP tool `job` -------------------------------------------------------------------------

def test_mcp_job_tool_answers_the_cli_document(cluster, kubeconfig):
    pytest.importorskip("mcp")
    from .mcpclient import assert_same_document, calls, server_command, text
    _fleet(cluster, how="fewer")  # (a NotReady node's words carry ages: not comparable)
    jobkinds.pytorchjob(cluster, "ml", "bert", NODES)
    kc = f"--kubeconfig={kubeconfig}"
    r = run_cli("job", "bert", "-n", "ml", kc, "-o", "json")
    want = json.loads(r.stdout)
    _, got, _ = calls(server_command(kc), [
        ("job", {"name": "bert", "namespace": "ml"}),
        ("job", {"name": "bert", "namespace": "ml", "probe": True}),
        ("job", {"namespace": "ml"})])
    assert_same_document(got[0].structured_content, want, 30.0)
    assert got[0].structured_content["verdict"]["subject"] == "node gpu-5"
    assert got[1].is_error and "--allow-node-probe" in text(got[1])
    assert got[2].is_error and "give name or selector" in text(got[2])
    assert not cluster.created


def test_a_pending_rank_gets_the_pending_explanation(cluster, kubeconfig):
    """A node with 7 of 8 GPUs left one worker Pending (NVIDIA/aicr#1858): the job's seven
    nodes are alike; the rank that differs is the Pending one, with the scheduler's words."""
    _fleet(cluster, bad=None)
    jobkinds.pytorchjob(cluster, "ml", "bert", NODES[:7] + [None])
    pod = cluster.pods[("ml", "bert-worker-6")]
    pod["status"] = {"phase": "Pending", "conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/9 nodes are available: 1 Insufficient nvidia.com/gpu, 8 node(s) didn't "
                   "match pod anti-affinity rules. preemption: 0/9 nodes are available: 9 No "
                   "preemption victims found for incoming pod.",
        "lastTransitionTime": "2026-11-29T00:00:00Z"}]}
    r, doc = _json(kubeconfig, "bert")
    assert r.returncode == 1
    v = doc["verdict"]
    assert v["subject"] == "pod ml/bert-worker-6", v
    assert v["root_cause"] == "pod.pending_explained"
    assert doc["job"]["unscheduled"] == 1 and doc["job"]["nodes"] == 7


def test_kind_given_but_not_served(cluster, kubeconfig):
    _fleet(cluster, bad=None)
    jobkinds.batch_job(cluster, "ml", "train", NODES[:2])
    r = run_cli("job", "train", "-n", "ml", "--kind", "RayJob", "--kubeconfig", str(kubeconfig))
    assert r.returncode == 3
    assert 'no RayJob named "train" in namespace ml' in one_error_line(r.stderr)


def test_the_agents_mark_and_another_monitors_condition_make_a_node_differ(cluster,
                                                                           kubeconfig):
    """16 watched nodes (the agent's GpuDoctor* conditions, quiet): gpu-3's agent marks Xid
    errors; gpu-9 carries node-problem-detector's XidCriticalError (GKE's condition). Both
    differ from the 14 alike; the healthy marks of the others are no difference."""
    from node_probe.protocol import conditions

    from .test_fleet_view import watching
    from .test_foreign_conditions import cond
    names = [f"gpu-{i}" for i in range(16)]
    for n in names:
        node = cluster.add_node(n)
        problems = {"GpuDoctorXidErrors": (conditions.reason_of("gpu.xid"),
                                           "Xid 79 on GPU 3", 600)} if n == "gpu-3" else None
        node["status"]["conditions"] += watching(problems=problems)
        if n == "gpu-9":
            node["status"]["conditions"].append(cond("XidCriticalError", "True",
                                                     "XidCriticalError", "Xid 48"))
    jobkinds.jobset(cluster, "ml", "llm", names)
    r, doc = _json(kubeconfig, "llm")
    assert r.returncode == 1, r.stderr
    assert sorted(doc["job"]["differ"]) == ["gpu-3", "gpu-9"]
    rows = {x["node"]: x for x in doc["nodes"]}
    assert "node.foreign_condition" in rows["gpu-9"]["differs_by"]
    assert rows["gpu-3"]["differs_by"] and all(not rows[n]["differs"] for n in names
                                               if n not in ("gpu-3", "gpu-9"))
    assert doc["verdict"]["subject"] in ("node gpu-3", "node gpu-9")


def test_pod_queries_of_workloads_and_rayjobs():
    """A Kueue Workload of a plain pod group (no owner) selects its pods by
    kueue.x-k8s.io/pod-group-name (kubernetes-sigs/kueue pkg/controller/jobs/pod: GroupNameLabel);
    one owned by a Job resolves to that Job; a RayJob names its pods only once its status
    has a rayClusterName."""
    wl = jk.by_name("workload")[0]
    group = {"metadata": {"name": "nccl-test", "labels": {jk.KUEUE_GROUP: "nccl-test"}}}
    assert jk.pod_query(wl, group).selector == "kueue.x-k8s.io/pod-group-name=nccl-test"
    owned_wl = {"metadata": {"name": "job-train-3f2a1", "ownerReferences": [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "u",
         "controller": True}]}}
    assert jk.pod_query(wl, owned_wl) is None
    kind, name = jk.owner_of(owned_wl)
    assert (kind.kind, kind.group, name) == ("Job", "batch", "train")
    rj = jk.by_name("RayJob")[0]
    assert jk.pod_query(rj, {"metadata": {"name": "rj"}, "status": {}}) is None
    assert jk.pod_query(rj, {"metadata": {"name": "rj"}, "status": {
        "rayClusterName": "rj-raycluster-x8k2p"}}).selector == "ray.io/cluster=rj-raycluster-x8k2p"


def test_a_rayjob_without_its_cluster_yet_has_no_pods(cluster, kubeconfig):
    _fleet(cluster, bad=None)
    rj = jobkinds._obj(cluster, "ray.io", "v1", "rayjobs", "RayJob", "ml", "rj",
                       {"entrypoint": "python train.py"}, {"jobDeploymentStatus": "Initializing"})
    assert rj
    r, doc = _json(kubeconfig, "rj")
    assert r.returncode == 0, r.stderr
    assert doc["verdict"]["headline"] == "RayJob ml/rj has no pods"
    assert doc["job"]["pods"] == 0


def test_pods_bound_to_a_deleted_node_make_it_differ(cluster, kubeconfig):
    _fleet(cluster, bad=None)
    jobkinds.mpijob(cluster, "ml", "mpi", NODES[:4] + ["gpu-gone"])
    r, doc = _json(kubeconfig, "mpi")
    assert r.returncode == 1
    v = doc["verdict"]
    assert v["subject"] == "node gpu-gone" and v["root_cause"] == "job.node_missing"
    cmds = [a["command"] for a in v["actions"]]
    assert not any(c and c.startswith("kubectl cordon") for c in cmds)
    assert "kubectl delete pod -n ml -l training.kubeflow.org/job-name=mpi --field-selector " \
           "spec.nodeName=gpu-gone" in cmds


def test_probe_refuses_more_debug_pods_than_max_probes_and_fail_on(cluster, kubeconfig):
    _fleet(cluster, how="fewer")
    jobkinds.batch_job(cluster, "ml", "train", NODES)
    r = run_cli("job", "train", "-n", "ml", "--kubeconfig", str(kubeconfig), "--probe",
                "--no-agent", "--max-probes", "4")
    assert r.returncode == 2
    assert "--probe would start debug pods on 8 nodes" in one_error_line(r.stderr)
    assert not cluster.created
    # a warning (fewer GPUs) is below --fail-on critical: exit 0
    r = run_cli("job", "train", "-n", "ml", "--kubeconfig", str(kubeconfig), "--fail-on",
                "critical")
    assert r.returncode == 0, r.stdout
    assert "gpu-5" in r.stdout


# -- the node that holds up a hung job (the hang helper's probe checks) -------------------------

def _probe_stream(tmp_path, name, gpus, ib):
    """A REAL probe run's stream (node_probe with the stand-in libnvidia-ml.so.1 and a sysfs
    tree of RDMA ports as the kernel writes them), as the debug pod would print it."""
    from tests.fakes.nvml import build_fake_nvml
    from tests.probe_run import run_probe
    root = tmp_path / name
    build_fake_nvml(root / "usr/lib/x86_64-linux-gnu", gpus=gpus)
    for dev, (state, phys) in ib.items():
        d = root / "sys/class/infiniband" / dev / "ports/1"
        d.mkdir(parents=True)
        (d / "state").write_text(state)
        (d / "phys_state").write_text(phys)
        (d / "rate").write_text("400 Gb/sec (4X NDR)\n")
        (d / "link_layer").write_text("InfiniBand\n")
    run = run_probe("--host-root", str(root), "--only", "gpu.collective", "--only", "ib_ports",
                    "--trace-seconds", "0")
    assert run.summary, run.stderr
    return run.stdout.encode()


def test_probe_names_the_node_the_hung_job_waits_for(cluster, kubeconfig, tmp_path):
    """A hung 4-node job (nccl#968's picture): on gpu-0, gpu-2 and gpu-3 every GPU is 100 %
    busy at ~70 W of 400 W (gpu.collective_spin: waiting); on gpu-1 one InfiniBand port is
    DOWN/Disabled beside ACTIVE siblings and its GPUs do not spin. The spinning nodes are not
    "the shared cause": the verdict names gpu-1, the node they wait for."""
    from tests.fakes.nvml import FakeGpu
    spin = (("util_gpu", 100), ("power_mw", 70000), ("power_limit_mw", 400000),
            ("sm_mhz", 1410), ("sm_max_mhz", 1410), ("clock_reasons", 0))
    up = ("4: ACTIVE\n", "5: LinkUp\n")
    waiting = _probe_stream(tmp_path, "waiting",
                            [FakeGpu(f"GPU-w{i}", minor=i, attrs=spin) for i in range(2)],
                            {"mlx5_0": up, "mlx5_1": up})
    culprit = _probe_stream(tmp_path, "culprit",
                            [FakeGpu(f"GPU-c{i}", minor=i) for i in range(2)],
                            {"mlx5_0": up, "mlx5_1": ("1: DOWN\n", "3: Disabled\n")})
    for n in NODES[:4]:
        cluster.add_node(n)
    jobkinds.batch_job(cluster, "ml", "train", NODES[:4])
    cluster.log_chunks = [waiting]
    cluster.node_log_chunks["gpu-1"] = [culprit]
    r = run_cli("job", "train", "-n", "ml", "--kubeconfig", str(kubeconfig), "-o", "json",
                "--probe", "--no-agent", "--timeout", "20s", "--trace-seconds", "0",
                timeout=90)
    doc = json.loads(r.stdout)
    v = doc["verdict"]
    assert v["subject"] == "node gpu-1", v
    assert v["root_cause"] == "net.ib_port_down", v
    rows = {x["node"]: x for x in doc["nodes"]}
    assert rows["gpu-1"]["differs"] and "net.ib_port_down" in rows["gpu-1"]["signature"]
    assert rows["gpu-1"]["differs_by"][:2] == ["not waiting", "net.ib_port_down"]
    for n in ("gpu-0", "gpu-2", "gpu-3"):
        assert "gpu.collective_spin" in rows[n]["signature"] and not rows[n]["differs"]
        assert rows[n]["waiting"] is True and rows[n]["differs_by"] == []
    assert rows["gpu-1"]["waiting"] is False
    assert doc["nodes"][0]["node"] == "gpu-1"
    assert "the cause is shared" not in v["headline"]
    # the waiters' signature is shown once per node for a few nodes, not once per GPU
    spins = [f for f in doc["findings"] if f["id"] == "gpu.collective_spin"]
    assert len(spins) == 3, [(f["subject"], f.get("node")) for f in spins]
    assert r.returncode == 1, r.stderr


def test_compare_names_the_node_that_does_not_wait_even_with_no_finding_of_its_own():
    views = [jn.NodeView(f"gpu-{i}", ("gpu.collective_spin",), "warning", 8, (f"p{i}",), True)
             for i in (0, 2, 3)] + [jn.NodeView("gpu-1", (), "ok", 8, ("p1",), True)]
    c = jn.compare("Job ml/train", views)
    assert c.odd == ("gpu-1",) and c.not_waiting == ("gpu-1",) and not c.shared
    [f] = c.findings
    assert f.subject == "node/gpu-1" and "the job likely waits for gpu-1" in f.title
    # a waiting node with a GPU process stuck in D beside it: the stuck one is named by it
    views[-1] = jn.NodeView("gpu-1", ("process.gpu_d_state",), "warning", 8, ("p1",), True)
    c = jn.compare("Job ml/train", views)
    assert c.odd == ("gpu-1",) and not c.shared
    assert jn.signature(views[-1], c)["differs_by"] == ["not waiting", "process.gpu_d_state"]
    # all four wait, but on gpu-2 one GPU of the rank's pod sits idle among them: gpu-2
    idle = [jn.NodeView(f"gpu-{i}", ("gpu.collective_spin",) + (
        ("gpu.collective_idle_peer",) if i == 2 else ()), "warning", 8, (), True)
        for i in range(4)]
    c = jn.compare("Job ml/train", idle)
    assert c.odd == ("gpu-2",) and not c.shared and c.not_waiting == ()
    # every node waiting: no node is named (the peer is elsewhere, or the job itself)
    allw = [jn.NodeView(f"gpu-{i}", ("gpu.collective_spin",), "warning", 8, (), True)
            for i in range(4)]
    c = jn.compare("Job ml/train", allw)
    assert c.odd == () and c.not_waiting == ()


def test_a_pending_rank_gets_the_gpu_fit_once_per_job(cluster, kubeconfig):
    """NVIDIA/aicr#1858: a node with 7 of 8 GPUs left a worker Pending. Seven nodes run the
    job's seven ranks on all 8 GPUs each; the only node with room, gpu-7, has 7 allocatable
    GPUs (one unhealthy). Two ranks are Pending: the fit `pod Y` gives (pod.gpu_devices_missing
    naming gpu-7 7/8) is computed once for the job, naming both ranks, and leads the verdict."""
    for n in NODES[:7]:
        cluster.add_node(n)
    cluster.add_node("gpu-7", gpus=8, allocatable_gpus=7)
    cluster.add_node("cpu-0", gpus=0)
    jobkinds.pytorchjob(cluster, "ml", "bert", NODES[:7] + [None, None])
    r, doc = _json(kubeconfig, "bert")
    assert r.returncode == 1, r.stderr
    fits = [f for f in doc["findings"] if f["id"] == "pod.gpu_devices_missing"]
    assert len(fits) == 1, [(f["id"], f["title"], f["evidence"]) for f in doc["findings"] if f["id"].startswith("pod.")]
    f = fits[0]
    assert "gpu-7 7/8" in f["title"]
    assert f["evidence"]["pending_ranks_total"] == 2
    assert f["evidence"]["requested_per_rank"] == {"nvidia.com/gpu": 8}
    v = doc["verdict"]
    assert v["root_cause"] == "pod.gpu_devices_missing", v
    assert v["subject"] == f"pod {f['evidence']['fit_computed_for']}"
    # the lists the fit needs were read once, not per rank
    lists = [p for m, p, _ in cluster.requests() if m == "GET" and p == "/api/v1/nodes"]
    assert len(lists) <= 2, lists   # one for the job's nodes (nodes' scan), one for the fit

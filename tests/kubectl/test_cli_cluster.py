"""`kubectl gpu-doctor node|pod|cleanup` end to end: real CLI process, real kubernetes client,
fake API server (kmock) over TCP."""
from __future__ import annotations

import json
import re
import signal
import socket
import time

import pytest

from node_probe.protocol import SCHEMA

from .conftest import DATA, interrupt_when, one_error_line, popen_cli, run_cli
from .fakecluster import cut_odd
from .kubelet_dump import HEALTHZ_SYNCLOOP_FAILED, healthy_kubelet_dump, wedged_kubelet_dump

DEBUG_POD = r"/api/v1/namespaces/[^/]+/pods/gpu-doctor-[^/]+"
LOG = DEBUG_POD + "/log"


def healthy_node(cluster, name="gpu-1"):
    cluster.add_node(name)
    cluster.add_pod("ml", "train-0", name, gpus=1)
    cluster.goroutines[name] = healthy_kubelet_dump()
    cluster.configz[name] = {"cpuManagerPolicy": "none", "cgroupDriver": "systemd"}


def test_node_runs_probe_renders_findings_exit_1_and_deletes_pod(cluster, kubeconfig):
    healthy_node(cluster)
    cluster.log_chunks = cut_odd((DATA / "probe_stream.ndjson").read_bytes())
    r = run_cli("node", "gpu-1", "--kubeconfig", str(kubeconfig), "--start-timeout", "10")
    assert r.returncode == 1, r.stderr
    assert "nvml.init_hang" in r.stdout and "CRITICAL" in r.stdout
    assert "kubelet.config" in r.stdout  # API-side finding merged with the node stream
    assert "Traceback" not in r.stderr
    assert len(cluster.created) == 1
    assert cluster.count("DELETE", DEBUG_POD) == 1
    ns, name, q = cluster.deleted[0]
    assert name == cluster.created[0]["metadata"]["name"] and q == {"gracePeriodSeconds": "0"}
    # the body the client really sent is a valid Pod
    import kubernetes_validate
    kubernetes_validate.validate(cluster.created[0], "1.30", strict=True)
    assert cluster.created[0]["spec"]["nodeName"] == "gpu-1"


def test_node_json_document_for_bots(cluster, kubeconfig):
    healthy_node(cluster)
    cluster.log_chunks = cut_odd((DATA / "probe_stream.ndjson").read_bytes(), (5, 11, 2))
    r = run_cli("node", "gpu-1", "--kubeconfig", str(kubeconfig), "-o", "json")
    doc = json.loads(r.stdout)
    assert doc["schema"] == SCHEMA and doc["exit_code"] == r.returncode == 1
    assert doc["target"] == {"kind": "node", "name": "gpu-1", "node": "gpu-1"}
    assert doc["summary"]["complete"] is True and doc["summary"]["critical"] == 1
    ids = {f["id"] for f in doc["findings"]}
    assert {"nvml.init_hang", "kubelet.config", "nvml.unavailable"} <= ids
    checks = {c["id"] for c in doc["checks"]}
    assert {"nvml", "api.kubelet_goroutines", "node.probe"} <= checks
    assert cluster.count("DELETE", DEBUG_POD) == 1


def test_jsonl_is_a_live_record_stream_ending_in_summary(cluster, kubeconfig):
    healthy_node(cluster)
    cluster.log_chunks = cut_odd((DATA / "probe_stream.ndjson").read_bytes())
    r = run_cli("node", "gpu-1", "--kubeconfig", str(kubeconfig), "-o", "jsonl",
                "--fail-on", "critical")
    recs = [json.loads(line) for line in r.stdout.splitlines()]
    assert all(rec["schema"] == SCHEMA for rec in recs)
    assert recs[-1]["kind"] == "summary" and recs[-1]["exit_code"] == r.returncode == 1
    assert sum(1 for rec in recs if rec["kind"] == "summary") == 1


def wedged_node(cluster, name="gpu-1"):
    cluster.add_node(name, gpus=8)
    cluster.add_pod("ml", "infer-0", name, gpus=1)  # running before the wedge
    for i in range(3):
        cluster.add_pod("mck-test", f"neal-0729-{i}-68b4895fb7-6868w", name, phase="Pending",
                        gpus=1 if i < 2 else 0, age_s=600, events="scheduled-only")
    cluster.goroutines[name] = wedged_kubelet_dump(stuck=2, minutes=10)
    cluster.healthz[name] = (500, HEALTHZ_SYNCLOOP_FAILED)
    cluster.debug_pod_mode = "pending"  # the kubelet never admits our pod either


def test_wedged_admission_is_diagnosed_and_no_doomed_pod_is_created(cluster, kubeconfig):
    """The API side already knows the kubelet admits no pod: the debug pod is not created;
    the report says why and which ways in exist (issue 13)."""
    wedged_node(cluster)
    r = run_cli("node", "gpu-1", "--kubeconfig", str(kubeconfig), "-o", "json")
    doc = json.loads(r.stdout)
    by_id = {f["id"]: f for f in doc["findings"]}
    assert by_id["kubelet.admission_stalled"]["severity"] == "critical"
    ns = by_id["probe.pod_not_started"]
    assert ns["severity"] == "warning" and ns["evidence"]["created"] is False
    assert set(ns["evidence"]["caused_by"]) == {"kubelet.admission_stalled",
                                                "kubelet.blocked_in_device_plugin"}
    assert any("local" in w for w in ns["evidence"]["ways_in"])
    assert r.returncode == doc["exit_code"] == 1
    assert doc["summary"]["complete"] is False and r.stderr.strip() == ""
    assert cluster.count("POST", r"/api/v1/namespaces/[^/]+/pods") == 0
    assert cluster.count("DELETE", DEBUG_POD) == 0
    checks = {c["id"]: c for c in doc["checks"]}
    assert checks["node.probe"]["status"] == "skipped"


def test_forced_pod_on_wedged_node_does_not_start_and_is_a_consequence(cluster, kubeconfig):
    wedged_node(cluster)
    r = run_cli("node", "gpu-1", "--kubeconfig", str(kubeconfig), "--start-timeout", "2",
                "--force-pod", "-o", "json")
    doc = json.loads(r.stdout)
    by_id = {f["id"]: f for f in doc["findings"]}
    assert by_id["kubelet.admission_stalled"]["severity"] == "critical"
    assert by_id["kubelet.admission_stalled"]["evidence"]["pending_untouched"] == 3
    blocked = by_id["kubelet.blocked_in_device_plugin"]
    assert blocked["severity"] == "critical" and blocked["evidence"]["goroutines"] == 2
    assert blocked["evidence"]["longest_wait_min"] == 10
    assert blocked["evidence"]["healthz_failed"] == ["syncloop"]
    ns = by_id["probe.pod_not_started"]
    assert ns["severity"] == "warning"  # a consequence, not the headline
    assert set(ns["evidence"]["caused_by"]) == {"kubelet.admission_stalled",
                                                "kubelet.blocked_in_device_plugin"}
    assert any("local" in w for w in ns["evidence"]["ways_in"])
    # not a tool failure: findings decide the exit code, and no error line
    assert r.returncode == doc["exit_code"] == 1
    assert doc["summary"]["complete"] is False and "error" not in doc
    assert r.stderr.strip() == ""
    assert cluster.count("DELETE", DEBUG_POD) == 1
    assert cluster.count("GET", r"/api/v1/namespaces/[^/]+/pods/gpu-doctor-[^/]+/log") == 0


def test_pod_pending_on_wedged_node_explained(cluster, kubeconfig):
    wedged_node(cluster)
    r = run_cli("pod", "neal-0729-0-68b4895fb7-6868w", "-n", "mck-test", "--kubeconfig",
                str(kubeconfig), "--no-probe", "-o", "json")
    doc = json.loads(r.stdout)
    assert doc["target"] == {"kind": "pod", "name": "mck-test/neal-0729-0-68b4895fb7-6868w",
                             "node": "gpu-1"}
    by_id = {f["id"]: f for f in doc["findings"]}
    assert by_id["pod.pending_explained"]["evidence"]["caused_by"] == "kubelet.admission_stalled"
    assert "kubelet.admission_stalled" in by_id and r.returncode == 1
    assert cluster.created == []


def test_pod_with_probe_namespace_runs_debug_pod_elsewhere(cluster, kubeconfig):
    healthy_node(cluster)
    cluster.log_chunks = [(DATA / "probe_stream.ndjson").read_bytes()]
    r = run_cli("pod", "train-0", "-n", "ml", "--probe-namespace", "gpu-doctor",
                "--kubeconfig", str(kubeconfig), "-o", "json")
    assert r.returncode == 1, r.stderr
    body = cluster.created[0]
    assert body["metadata"]["namespace"] == "gpu-doctor"
    uid = cluster.pods[("ml", "train-0")]["metadata"]["uid"]
    cmd = body["spec"]["containers"][0]["command"]
    assert cmd[cmd.index("--focus-pod") + 1] == uid  # node checks focused on the pod
    assert cluster.deleted[0][0] == "gpu-doctor"


def test_table_output_of_wedged_node(cluster, kubeconfig):
    wedged_node(cluster)
    r = run_cli("node", "gpu-1", "--kubeconfig", str(kubeconfig), "--start-timeout", "1")
    assert r.returncode == 1
    assert "kubelet.blocked_in_device_plugin" in r.stdout
    assert "INCOMPLETE" in r.stdout and "probe.pod_not_started" in r.stdout


def test_unknown_node(cluster, kubeconfig):
    r = run_cli("node", "nope", "--kubeconfig", str(kubeconfig))
    line = one_error_line(r.stderr)
    assert r.returncode == 3 and "node nope not found" in line
    assert r.stdout == "" and cluster.created == []


def test_unknown_pod(cluster, kubeconfig):
    r = run_cli("pod", "ghost", "-n", "team", "--kubeconfig", str(kubeconfig))
    line = one_error_line(r.stderr)
    assert r.returncode == 3 and "pod team/ghost not found" in line


def test_forbidden(cluster, kubeconfig):
    cluster.add_node("gpu-1")
    cluster.forbid.append(("GET", re.compile(r"^/api/v1/nodes/gpu-1$")))
    r = run_cli("node", "gpu-1", "--kubeconfig", str(kubeconfig))
    line = one_error_line(r.stderr)
    assert r.returncode == 3 and "forbidden" in line and 'cannot get' in line


def test_pod_security_rejection(cluster, kubeconfig):
    healthy_node(cluster)
    cluster.namespaces["ml"] = {"pod-security.kubernetes.io/enforce": "restricted"}
    cluster.pod_security_enforce["gpu-doctor"] = "baseline"
    r = run_cli("pod", "train-0", "--kubeconfig", str(kubeconfig), "-n", "ml")
    line = one_error_line(r.stderr)
    assert r.returncode == 3
    assert "Pod Security" in line and "namespace gpu-doctor" in line
    # the fix is the probe namespace's (the packaged manifests: a krew user has no deploy/),
    # never relaxing the -n namespace
    assert "kubectl gpu-doctor rbac | kubectl apply -f -" in line and "deploy/" not in line
    assert "kubectl label ns" not in line and "namespace ml" not in line
    assert cluster.deleted == []  # nothing was created, nothing to delete


def test_rbac_forbids_creating_the_debug_pod(cluster, kubeconfig):
    healthy_node(cluster)
    cluster.forbid.append(("POST", re.compile(r"/pods$")))
    r = run_cli("node", "gpu-1", "--kubeconfig", str(kubeconfig))
    line = one_error_line(r.stderr)
    assert r.returncode == 3 and "not allowed to create pods in namespace gpu-doctor" in line
    assert "kubelet.config" in r.stdout  # the API-side findings are still shown


def test_yaml_output(cluster, kubeconfig):
    import yaml
    wedged_node(cluster)
    r = run_cli("node", "gpu-1", "--kubeconfig", str(kubeconfig), "--no-probe", "-o", "yaml")
    doc = yaml.safe_load(r.stdout)
    assert doc["exit_code"] == r.returncode == 1
    assert "kubelet.admission_stalled" in {f["id"] for f in doc["findings"]}


def test_image_not_pullable_is_launch_error_and_pod_deleted(cluster, kubeconfig):
    healthy_node(cluster)
    cluster.debug_pod_mode = "imagepull"
    r = run_cli("node", "gpu-1", "--kubeconfig", str(kubeconfig), "--image",
                "registry.invalid/probe:nope")
    line = one_error_line(r.stderr)
    assert r.returncode == 3 and "registry.invalid/probe:nope" in line and "ErrImagePull" in line
    assert cluster.count("DELETE", DEBUG_POD) == 1


def test_no_api_server(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kc = tmp_path / "kc"
    kc.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "x", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "x", "user": "u"}}]}))
    r = run_cli("node", "gpu-1", "--kubeconfig", str(kc))
    line = one_error_line(r.stderr)
    assert r.returncode == 3
    assert line.endswith(f"error: The connection to the server 127.0.0.1:{port} was refused - "
                         f"did you specify the right host or port?")


def test_bad_kubeconfig_and_usage_errors(tmp_path):
    r = run_cli("node", "gpu-1", "--kubeconfig", str(tmp_path / "missing"))
    assert r.returncode == 3 and "kubeconfig" in one_error_line(r.stderr)
    r = run_cli("node")
    assert r.returncode == 2 and "Missing argument" in one_error_line(r.stderr)
    r = run_cli("node", "x", "--fail-on", "sometimes")
    assert r.returncode == 2 and one_error_line(r.stderr)
    r = run_cli("frobnicate")
    assert r.returncode == 2 and one_error_line(r.stderr)
    r = run_cli("node", "x", "--trace-seconds", "30", "--timeout", "20")
    assert r.returncode == 2 and "--trace-seconds" in one_error_line(r.stderr)


def test_goroutines_forbidden_is_an_info_finding_naming_the_permission(cluster, kubeconfig):
    healthy_node(cluster)
    cluster.forbid.append(("GET", re.compile(r"/proxy/")))
    r = run_cli("node", "gpu-1", "--kubeconfig", str(kubeconfig), "--no-probe", "-o", "json")
    doc = json.loads(r.stdout)
    f = next(f for f in doc["findings"] if f["id"] == "kubelet.goroutines_unavailable")
    assert f["severity"] == "info" and f["evidence"]["status"] == 403
    assert "nodes/proxy" in f["remediation"]
    assert r.returncode == 0


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_during_log_follow_deletes_pod(cluster, kubeconfig, sig):
    healthy_node(cluster)
    data = (DATA / "probe_stream.ndjson").read_bytes()
    cluster.log_chunks = [data[:400]]  # some records, then the probe "keeps running"
    cluster.log_hang = True
    p = popen_cli("node", "gpu-1", "--kubeconfig", str(kubeconfig), "-o", "jsonl")
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and cluster.count(
                "GET", r"/api/v1/namespaces/[^/]+/pods/gpu-doctor-[^/]+/log") == 0:
            time.sleep(0.05)
        time.sleep(0.5)
        assert cluster.deleted == []
        p.send_signal(sig)
        out, err = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130
    assert cluster.count("DELETE", DEBUG_POD) == 1
    assert "Traceback" not in err
    assert "debug pod deleted" in one_error_line(err)
    recs = [json.loads(line) for line in out.splitlines()]
    assert recs[-1]["kind"] == "summary" and recs[-1]["complete"] is False


def test_cleanup_deletes_leftovers_by_label(cluster, kubeconfig):
    from kubectl_gpudoctor.reach import debugpod
    cluster.add_node("gpu-1")
    cluster.namespaces["ops"] = {}
    for ns, rid in (("default", "aaaa0001"), ("ops", "bbbb0002")):
        body = debugpod.manifest("gpu-1", ns, rid)
        cluster.pods[(ns, body["metadata"]["name"])] = body
    cluster.add_pod("default", "unrelated", "gpu-1")
    r = run_cli("cleanup", "-A", "--kubeconfig", str(kubeconfig))
    assert r.returncode == 0, r.stderr
    assert "deleted 2 gpu-doctor debug pod(s) in all namespaces" in r.stdout
    assert ("default", "unrelated") in cluster.pods and len(cluster.pods) == 1


def test_cleanup_is_scoped_like_kubectl_n_then_the_probe_namespace_a_for_all(cluster,
                                                                              kubeconfig):
    """-n NS cleans NS only; no -n cleans the probe namespace (where debug pods are made:
    GPU_DOCTOR_NAMESPACE, else gpu-doctor), never every namespace; -A cleans all."""
    from kubectl_gpudoctor.reach import debugpod
    cluster.add_node("gpu-1")
    for ns in ("gpu-doctor", "ops", "default"):
        cluster.namespaces[ns] = {}
    left = {}
    for ns, rid in (("gpu-doctor", "aaaa0001"), ("ops", "bbbb0002"), ("default", "cccc0003")):
        body = debugpod.manifest("gpu-1", ns, rid)
        cluster.pods[(ns, body["metadata"]["name"])] = body
        left[ns] = (ns, body["metadata"]["name"])
    r = run_cli("cleanup", "--kubeconfig", str(kubeconfig))
    assert r.returncode == 0, r.stderr
    assert "deleted 1 gpu-doctor debug pod(s) in namespace gpu-doctor" in r.stdout
    assert left["gpu-doctor"] not in cluster.pods and left["ops"] in cluster.pods
    assert cluster.count("GET", r"^/api/v1/pods$") == 0  # never listed cluster-wide
    r = run_cli("cleanup", "-n", "ops", "--kubeconfig", str(kubeconfig))
    assert "deleted 1 gpu-doctor debug pod(s) in namespace ops" in r.stdout
    assert left["ops"] not in cluster.pods and left["default"] in cluster.pods
    # kubectl's flags before the command count too
    r = run_cli("--kubeconfig", str(kubeconfig), "-n", "default", "cleanup")
    assert r.returncode == 0 and "in namespace default" in r.stdout and not cluster.pods
    r = run_cli("cleanup", "-A", "-n", "ops", "--kubeconfig", str(kubeconfig))
    assert r.returncode == 2 and "exclude each other" in one_error_line(r.stderr)


def test_kubectl_plugin_completion_protocol_lists_nodes(cluster, kubeconfig):
    import os
    import subprocess
    import sys

    from .conftest import REPO, cli_env
    cluster.add_node("gpu-a1")
    cluster.add_node("gpu-a2")
    cluster.add_node("cpu-b1", gpus=0)
    env = dict(cli_env(), KUBECONFIG=str(kubeconfig))
    r = subprocess.run([sys.executable, "-m", "kubectl_gpudoctor", "__complete", "node",
                        "gpu-a"], capture_output=True, text=True, env=env, cwd=str(REPO),
                       timeout=60)
    assert r.returncode == 0
    assert r.stdout.splitlines() == ["gpu-a1", "gpu-a2", ":4"]
    assert os.environ.get("KUBECONFIG") != str(kubeconfig)  # the test env was not touched


def test_pod_bound_to_deleted_node_is_node_not_found(cluster, kubeconfig):
    cluster.add_pod("ml", "orphan-0", "gpu-gone", gpus=1)
    r = run_cli("pod", "orphan-0", "-n", "ml", "--kubeconfig", str(kubeconfig), "-o", "json")
    doc = json.loads(r.stdout)
    f = next(f for f in doc["findings"] if f["id"] == "node.not_found")
    assert f["severity"] == "critical" and f["subject"] == "node/gpu-gone"
    assert "--grace-period=0 --force" in f["remediation"]
    assert r.returncode == 1 and cluster.created == []


@pytest.mark.serial    # signal timing: its 20 s guard was once missed under a load of 10+
def test_repeated_signals_still_delete_the_pod(cluster, kubeconfig):
    """Ctrl-C hammered (then SIGTERM) while the pod is being followed: still one DELETE."""
    healthy_node(cluster)
    cluster.log_chunks = [(DATA / "probe_stream.ndjson").read_bytes()[:200]]
    cluster.log_hang = True
    p = popen_cli("node", "gpu-1", "--kubeconfig", str(kubeconfig))
    out, err = interrupt_when(
        p, lambda: cluster.count("GET", LOG) > 0,
        (signal.SIGINT, signal.SIGINT, signal.SIGTERM, signal.SIGINT), gap_s=0.01)
    assert p.returncode == 130 and "Traceback" not in err
    assert len(cluster.deleted) >= 1 and not [k for k in cluster.pods if k[1].startswith(
        "gpu-doctor-")]


def test_sigterm_while_waiting_for_the_pod_deletes_it(cluster, kubeconfig):
    healthy_node(cluster)
    cluster.debug_pod_mode = "pending"
    p = popen_cli("node", "gpu-1", "--kubeconfig", str(kubeconfig), "--start-timeout", "60")
    out, err = interrupt_when(p, lambda: cluster.created, (signal.SIGTERM,), settle_s=0.3)
    assert p.returncode == 130 and "debug pod deleted" in one_error_line(err)
    assert cluster.count("DELETE", DEBUG_POD) == 1


def test_ctrl_c_while_the_create_is_unanswered_still_deletes_the_pod(cluster, kubeconfig):
    """The API server created the pod but its answer has not arrived (slow webhook, lost
    reply) when the user presses Ctrl-C: the pod may exist, so it is deleted all the same."""
    healthy_node(cluster)
    cluster.slow_reply["/api/v1/namespaces/gpu-doctor/pods"] = 20.0
    p = popen_cli("node", "gpu-1", "--kubeconfig", str(kubeconfig))
    out, err = interrupt_when(p, lambda: cluster.created, settle_s=0.3)
    assert p.returncode == 130 and "Traceback" not in err
    assert cluster.created and cluster.count("DELETE", DEBUG_POD) == 1
    assert not [k for k in cluster.pods if k[1].startswith("gpu-doctor-")]


def test_hung_kubelet_proxy_is_reported_not_fatal(cluster, kubeconfig):
    healthy_node(cluster)
    cluster.slow["/api/v1/nodes/gpu-1/proxy/debug/pprof/goroutine"] = 5.0
    r = run_cli("node", "gpu-1", "--kubeconfig", str(kubeconfig), "--no-probe",
                "--kubelet-timeout", "0.5", "-o", "json")
    doc = json.loads(r.stdout)
    f = next(f for f in doc["findings"] if f["id"] == "kubelet.goroutines_unavailable")
    assert f["evidence"]["status"] == 504 and "did not answer" in f["title"]
    assert r.returncode == 0 and r.stderr == ""


def test_hami_analysis_is_wired_in_with_warning_events(cluster, kubeconfig):
    import datetime as dt
    cluster.add_node("gpu-1")
    p = cluster.add_pod("ml", "vgpu-0", "gpu-1", phase="Failed", gpus=1, extra_status={
        "reason": "UnexpectedAdmissionError",
        "message": "Pod was rejected: Allocate failed due to device number not matched, "
                   "which is unexpected"})
    p["metadata"]["annotations"] = {"hami.io/vgpu-node": "gpu-1",
                                    "hami.io/bind-phase": "allocating"}
    cluster.add_event(p, "Warning", "UnexpectedAdmissionError",
                      "Allocate failed due to device number not matched, which is unexpected",
                      "kubelet", dt.datetime.now(dt.timezone.utc), host="gpu-1")
    r = run_cli("node", "gpu-1", "--kubeconfig", str(kubeconfig), "--no-probe", "-o", "json")
    ids = {f["id"] for f in json.loads(r.stdout)["findings"]}
    assert "hami.allocation_mismatch" in ids and r.returncode == 1
    # one Warning-events list instead of one call per pod
    assert cluster.count("GET", r"/api/v1/events") == 1

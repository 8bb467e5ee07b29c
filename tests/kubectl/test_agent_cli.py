"""The agent through the real CLI process: `agent install|status|uninstall`, `node X` by exec in
the agent (no debug pod), the wedge with both halves of the verdict, `nodes --probe` through
agents past the debug-pod cap, and `--save` + `replay`."""
from __future__ import annotations

import json
import re
import time

import kubernetes_validate
import pytest
import yaml


from .conftest import DATA, run_cli
from .fakeexec import PROBE_NS  # noqa: E402
from .fakeexec import ExecCluster
from .kubelet_dump import healthy_kubelet_dump

PINNED = "registry.local/gpu-doctor-probe:0.1.0@sha256:" + "0123456789abcdef" * 4
PROBE_STREAM = (DATA / "probe_stream.ndjson").read_bytes()


@pytest.fixture
def xc():
    fc = ExecCluster()
    fc.start()
    try:
        yield fc
    finally:
        fc.stop()


@pytest.fixture
def kc(xc, tmp_path):
    return str(xc.kubeconfig(tmp_path / "kubeconfig"))


def recorded_probe(cmd):
    """The agent container's process: prints the recorded probe stream and exits 1 (it has
    critical findings), as `python3 -m node_probe -o jsonl` would."""
    import sys
    return [sys.executable, "-c",
            "import sys; sys.stdout.buffer.write(open(%r, 'rb').read()); sys.exit(1)"
            % str(DATA / "probe_stream.ndjson")]


def test_install_dry_run_prints_valid_manifests():
    r = run_cli("agent", "install", "--dry-run", "-o", "yaml", "--image", PINNED,
                "--node-selector", "nvidia.com/gpu.present=true")
    assert r.returncode == 0, r.stderr
    docs = [d for d in yaml.safe_load_all(r.stdout) if d]
    # watching by default: the agent's own identity and the policies that keep it to its
    # node, then the probe namespace's admission policy (issue 21)
    assert [d["kind"] for d in docs] == [
        "Namespace", "ResourceQuota", "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding", "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding", "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding", "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding", "ServiceAccount", "ClusterRole",
        "ClusterRoleBinding", "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding", "DaemonSet"]  # the policy in force before pods
    for d in docs:
        kubernetes_validate.validate(d, kubernetes_validate.latest_version(), strict=True)
    [ds] = [d for d in docs if d["kind"] == "DaemonSet"]
    assert "agent-watch" in ds["spec"]["template"]["spec"]["containers"][0]["command"]
    idle = run_cli("agent", "install", "--dry-run", "--no-watch")
    assert [d["kind"] for d in yaml.safe_load_all(idle.stdout) if d] == [
        "Namespace", "ResourceQuota", "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding", "DaemonSet"]
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"] == PINNED
    assert ds["spec"]["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    j = run_cli("agent", "install", "--dry-run", "-o", "json")
    assert "DaemonSet" in [i["kind"] for i in json.loads(j.stdout)["items"]]


def test_install_status_uninstall_through_the_cli(xc, kc):
    for n in ("gpu-a", "gpu-b"):
        xc.add_node(n)
    r = run_cli("agent", "status", "--kubeconfig", kc)
    assert r.returncode == 1 and "not installed" in r.stdout
    assert "kubectl gpu-doctor agent install" in r.stdout
    r = run_cli("agent", "install", "--kubeconfig", kc)
    assert r.returncode == 0, r.stderr
    assert "daemonset/gpu-doctor-agent created" in r.stdout
    # the probe namespace's admission policy goes with it, pinned to the installed image
    assert "validatingadmissionpolicy/gpu-doctor-probe-only created" in r.stdout
    assert ("validatingadmissionpolicies", "gpu-doctor-probe-only") in xc.admission
    r = run_cli("agent", "status", "--kubeconfig", kc, "-o", "json")
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert [(x["node"], x["phase"]) for x in doc["nodes"]] == [("gpu-a", "Running"),
                                                               ("gpu-b", "Running")]
    r = run_cli("agent", "uninstall", "--kubeconfig", kc)
    assert r.returncode == 0 and "daemonset/gpu-doctor-agent deleted" in r.stdout
    r = run_cli("agent", "install", "--kubeconfig", kc, "--node-selector", "bad")
    assert r.returncode == 2 and r.stderr.count("\n") == 1


def test_watch_install_creates_the_identity_and_uninstall_removes_it(xc, kc):
    xc.add_node("gpu-a")
    r = run_cli("agent", "install", "--kubeconfig", kc, "--interval", "45s",
                "--metrics-port", "9400")
    assert r.returncode == 0, r.stderr
    for line in ("serviceaccount/gpu-doctor-agent created",
                 "clusterrole/gpu-doctor-agent-node-status created",
                 "validatingadmissionpolicy/gpu-doctor-agent-own-node created",
                 "validatingadmissionpolicybinding/gpu-doctor-agent-own-events created"):
        assert line in r.stdout
    [ds] = xc.daemonsets.values()
    c = ds["spec"]["template"]["spec"]["containers"][0]
    assert c["command"][3:] == ["agent-watch", "--host-root", "/host", "--interval", "45s",
                                "--evidence-dir", "/var/lib/gpu-doctor/evidence",
                                "--metrics-port", "9400"]
    assert c["ports"] == [{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}]
    # what the agent left on its node: the two custom conditions of the real 1.35 capture
    cap = json.loads((DATA.parent.parent / "data/captures/k8s-1.35/admission-and-conditions/"
                      "c07-get-node-two-custom-conditions.200.json").read_text())
    mine = [c for c in cap["status"]["conditions"] if c["type"].startswith("GpuDoctor")]
    xc.nodes["gpu-a"]["status"]["conditions"] = mine + xc.nodes["gpu-a"]["status"]["conditions"]
    r = run_cli("agent", "uninstall", "--kubeconfig", kc)
    assert r.returncode == 0
    assert "validatingadmissionpolicy/gpu-doctor-agent-own-node deleted" in r.stdout
    assert not xc.objects
    # issue 31: the marks went with the agent (one strategic merge patch with $patch: delete
    # per type, c14), the kubelet's conditions stay, and the output says how many
    assert "GpuDoctor conditions removed from 1 node(s) (2 condition(s))" in r.stdout
    left = [c["type"] for c in xc.nodes["gpu-a"]["status"]["conditions"]]
    assert left == ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]


def test_an_installed_sleeping_agent_keeps_sleeping_unless_asked(xc, kc):
    xc.add_node("gpu-a")
    assert run_cli("agent", "install", "--kubeconfig", kc, "--no-watch").returncode == 0
    r = run_cli("agent", "install", "--kubeconfig", kc)   # an upgrade, no flag
    assert r.returncode == 0 and "keeps the sleeping agent" in r.stderr
    [ds] = xc.daemonsets.values()
    assert "agent-idle" in ds["spec"]["template"]["spec"]["containers"][0]["command"]
    assert not xc.objects
    assert run_cli("agent", "install", "--kubeconfig", kc, "--watch").returncode == 0
    [ds] = xc.daemonsets.values()
    assert "agent-watch" in ds["spec"]["template"]["spec"]["containers"][0]["command"]
    r = run_cli("agent", "install", "--kubeconfig", kc, "--no-watch", "--metrics-port", "9400")
    assert r.returncode == 2 and "need the watching agent" in r.stderr
    r = run_cli("agent", "install", "--kubeconfig", kc, "--interval", "2s")
    assert r.returncode == 2 and r.stderr.count("\n") == 1


def _healthy_with_agent(xc, name="gpu-1"):
    xc.namespaces["gpu-doctor"] = {PROBE_NS: "true"}
    xc.add_node(name)
    xc.add_pod("ml", "train-0", name, gpus=1)
    xc.goroutines[name] = healthy_kubelet_dump()
    xc.configz[name] = {"cpuManagerPolicy": "none", "cgroupDriver": "systemd"}
    xc.add_agent_pod(name)
    xc.exec_argv = recorded_probe


def test_node_runs_the_probe_by_exec_in_the_agent(xc, kc):
    _healthy_with_agent(xc)
    t0 = time.monotonic()
    r = run_cli("node", "gpu-1", "--kubeconfig", kc, "-o", "json", "--trace-seconds", "0")
    wall = time.monotonic() - t0
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert "nvml.init_hang" in {f["id"] for f in doc["findings"]}
    checks = {c["id"]: c for c in doc["checks"]}
    assert checks["node.probe"]["status"] == "ok"
    assert "via agent pod gpu-doctor/gpu-doctor-agent-" in checks["node.probe"]["message"]
    assert xc.created == []  # no debug pod
    (ex,) = xc.execs
    assert ex["command"][:3] == ["python3", "-m", "node_probe"]
    assert ex["command"][ex["command"].index("--trace-seconds") + 1] == "0"
    print(f"node X via the agent, --trace-seconds 0: {wall:.2f}s wall (CLI process)")


def test_no_agent_flag_uses_the_debug_pod(xc, kc):
    _healthy_with_agent(xc)
    xc.log_chunks = [PROBE_STREAM]
    r = run_cli("node", "gpu-1", "--kubeconfig", kc, "-o", "json", "--no-agent",
                "--start-timeout", "10")
    assert r.returncode == 1, r.stderr
    assert len(xc.created) == 1 and xc.execs == []


def test_exec_refused_falls_back_to_the_debug_pod(xc, kc):
    import re
    _healthy_with_agent(xc)
    xc.forbid.append(("*", re.compile(r"/exec$")))
    xc.log_chunks = [PROBE_STREAM]
    r = run_cli("node", "gpu-1", "--kubeconfig", kc, "-o", "json", "--start-timeout", "10")
    assert r.returncode == 1, r.stderr
    assert len(xc.created) == 1
    doc = json.loads(r.stdout)
    assert "via debug pod" in {c["id"]: c for c in doc["checks"]}["node.probe"]["message"]


def test_without_agent_the_report_names_the_install_command(xc, kc):
    """Neither way works (the debug pod never starts, no agent): the report says which ways
    in exist, the agent's install command among them."""
    xc.namespaces["gpu-doctor"] = {PROBE_NS: "true"}
    xc.add_node("gpu-1")
    xc.goroutines["gpu-1"] = healthy_kubelet_dump()
    xc.debug_pod_mode = "pending"
    r = run_cli("node", "gpu-1", "--kubeconfig", kc, "-o", "json", "--start-timeout", "2")
    doc = json.loads(r.stdout)
    text = json.dumps(doc)
    assert "kubectl gpu-doctor agent install" in text, text[-2000:]


def test_save_then_replay_same_document_and_exit_code(xc, kc, tmp_path):
    _healthy_with_agent(xc)
    path = tmp_path / "incident.json"
    r = run_cli("node", "gpu-1", "--kubeconfig", kc, "-o", "json", "--trace-seconds", "0",
                "--save", str(path))
    assert r.returncode == 1, r.stderr
    assert path.exists()
    b = json.loads(path.read_text())
    assert b["command_line"][1:] == ["node", "gpu-1", "--kubeconfig", kc, "-o", "json",
                                     "--trace-seconds", "0", "--save", str(path)]
    assert [x["kind"] for x in b["evidence"]["probe_ndjson"]][-1] == "summary"
    rp = run_cli("replay", str(path), "-o", "json")
    assert rp.returncode == r.returncode
    a, c = json.loads(r.stdout), json.loads(rp.stdout)
    a.pop("duration_s")
    c.pop("duration_s")
    # a replay says it is one (which bundle, captured when): the rest is the same document
    assert c.pop("replay") == {"bundle": str(path), "captured_at": b["created_at"],
                               "untrusted": True}
    assert json.dumps(a, indent=2) == json.dumps(c, indent=2)
    t = run_cli("replay", str(path))
    assert t.returncode == 1 and "nvml.init_hang" in t.stdout
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    rb = run_cli("replay", str(bad))
    assert rb.returncode == 2 and rb.stderr.strip().count("\n") == 0
    assert "not a gpu-doctor bundle" in rb.stderr
    r = run_cli("node", "gpu-1", "--kubeconfig", kc, "--save", str(tmp_path / "no" / "x.json"))
    assert r.returncode == 2 and "does not exist" in r.stderr


def test_nodes_probe_through_agents_has_no_debug_pod_cap(xc, kc):
    xc.namespaces["gpu-doctor"] = {PROBE_NS: "true"}
    for i in range(25):
        name = f"gpu-{i:02d}"
        xc.add_node(name)
        if i < 23:
            xc.add_agent_pod(name)
    xc.exec_argv = recorded_probe
    xc.log_chunks = [PROBE_STREAM]
    r = run_cli("nodes", "--kubeconfig", kc, "--probe", "--max-probes", "2",
                "--start-timeout", "10", timeout=120)
    assert r.returncode == 1, r.stderr
    assert len(xc.execs) == 23 and len(xc.created) == 2
    assert "PROBE VIA" in r.stdout
    assert "node probe: 23 via agent, 2 via debug pod" in r.stdout
    # over the cap counting only nodes without an agent
    r = run_cli("nodes", "--kubeconfig", kc, "--probe", "--max-probes", "1")
    assert r.returncode == 2 and "2 nodes without a running agent" in r.stderr


def test_known_wedge_without_agent_names_the_install_command_and_creates_no_pod(xc, kc):
    from .kubelet_dump import wedged_kubelet_dump
    xc.add_node("gpu-w")
    for k in range(3):
        xc.add_pod("ml", f"train-{k}", "gpu-w", phase="Pending", gpus=1, age_s=600,
                   events="scheduled-only")
    xc.goroutines["gpu-w"] = wedged_kubelet_dump(stuck=2, minutes=10)
    xc.debug_pod_mode = "pending"
    r = run_cli("node", "gpu-w", "--kubeconfig", kc, "-o", "json")
    doc = json.loads(r.stdout)
    assert xc.created == []  # the stall is known: no pod that could not start
    ids = {f["id"] for f in doc["findings"]}
    assert "kubelet.admission_stalled" in ids
    assert "kubectl gpu-doctor agent install" in json.dumps(doc)


def test_nodes_probe_names_why_a_node_had_no_way_in(xc, kc):
    """PROBE VIA says which way each node was reached, and why there was none: a NotReady node
    and a node whose kubelet admits no pod (no agent there) get no debug pod and no "-"."""
    from .kubelet_dump import wedged_kubelet_dump
    xc.namespaces["gpu-doctor"] = {PROBE_NS: "true"}
    xc.add_node("gpu-a")
    xc.add_agent_pod("gpu-a")
    xc.add_node("gpu-down", ready=False, lease_age_s=600)
    xc.add_node("gpu-w")
    for k in range(3):
        xc.add_pod("ml", f"train-{k}", "gpu-w", phase="Pending", gpus=1, age_s=600,
                   events="scheduled-only")
    xc.goroutines["gpu-w"] = wedged_kubelet_dump(stuck=2, minutes=10)
    xc.exec_argv = recorded_probe
    r = run_cli("nodes", "--kubeconfig", kc, "--probe", "--trace-seconds", "0", timeout=120)
    assert r.returncode == 1, r.stderr
    assert xc.created == [] and len(xc.execs) == 1
    via = {line.split()[0]: line for line in r.stdout.splitlines()
           if line.startswith("gpu-")}
    # PROBE VIA is the last column (each sick node's verdict goes on its own line below)
    assert re.search(r"  agent$", via["gpu-a"]), via["gpu-a"]
    assert re.search(r"  none: NotReady$", via["gpu-down"]), via["gpu-down"]
    assert re.search(r"  none: admission blocked$", via["gpu-w"]), via["gpu-w"]
    assert "node probe: 1 via agent, 1 none: NotReady, 1 none: admission blocked" in r.stdout


CID = "efe143260eee9" + "0" * 51


def _probe_naming_by_uid(tmp_path, uid: str):
    """The agent's probe as on the real kubelet: a finding about a container it knows only by
    pod UID and container id (names null), then the recorded run's summary."""
    lines = PROBE_STREAM.decode().splitlines(keepends=True)
    rec = {"schema": "gpu-doctor/v1", "kind": "finding", "id": "cgroup.device_denied",
           "severity": "critical", "subject": f"pod uid {uid} container {CID[:13]}",
           "title": f"Container {CID[:13]} in pod uid {uid} cannot open /dev/nvidia-uvm "
                    f"(c 508:0): its device cgroup denies it",
           "evidence": {"pod_uid": uid, "namespace": None, "pod": None, "container": None,
                        "container_id": CID}, "check": "cgroup"}
    stream = tmp_path / "stream.ndjson"
    stream.write_text("".join(lines[:-1]) + json.dumps(rec) + "\n" + lines[-1])

    def argv(cmd):
        import sys
        return [sys.executable, "-c", "import sys; sys.stdout.write(open(%r).read()); "
                "sys.exit(1)" % str(stream)]
    return argv


@pytest.mark.parametrize("command", [["node", "gpu-1"], ["nodes", "--probe"]])
def test_agent_path_names_pods_and_containers_from_the_api(xc, kc, tmp_path, command):
    _healthy_with_agent(xc)
    pod = xc.pods[("ml", "train-0")]
    pod["status"]["containerStatuses"][0]["containerID"] = f"containerd://{CID}"
    xc.exec_argv = _probe_naming_by_uid(tmp_path, pod["metadata"]["uid"])
    r = run_cli(*command, "--kubeconfig", kc, "-o", "json", "--trace-seconds", "0",
                timeout=120)
    assert r.returncode == 1, r.stderr
    assert xc.created == [] and len(xc.execs) == 1  # by exec, not a debug pod
    (f,) = [f for f in json.loads(r.stdout)["findings"] if f["id"] == "cgroup.device_denied"]
    ev = f["evidence"]
    assert (ev["namespace"], ev["pod"], ev["container"]) == ("ml", "train-0", "main")
    assert "pod ml/train-0 container main" in f["subject"]
    assert f["title"].startswith("Container main in pod ml/train-0 cannot open")


@pytest.mark.parametrize("argv", [
    ["agent", "install", "--dry-run", "-o", "yaml", "-n", "../kube-system"],
    ["agent", "status", "-n", "Gpu_Doctor"],
    ["agent", "uninstall", "--namespace", "a" * 64],
    ["node", "gpu-1", "--agent-namespace", "ns/../x"],
    ["nodes", "--agent-namespace", "x?watch=1"]])
def test_agent_namespace_is_a_dns1123_label(argv):
    r = run_cli(*argv)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "namespace name" in r.stderr and "Traceback" not in r.stderr
    assert r.stdout == ""


def test_agent_namespace_from_the_environment_is_checked_too(monkeypatch):
    monkeypatch.setenv("GPU_DOCTOR_AGENT_NAMESPACE", "Bad_NS")
    r = run_cli("agent", "install", "--dry-run", "-o", "yaml")
    assert r.returncode == 2 and "namespace name 'Bad_NS' is not valid" in r.stderr


def test_history_needs_an_agent_and_escapes_what_it_lists(xc, kc):
    import sys
    xc.namespaces["gpu-doctor"] = {PROBE_NS: "true"}
    xc.add_node("gpu-1")
    r = run_cli("node", "gpu-1", "--history", "--kubeconfig", kc)
    assert r.returncode == 3 and "agent install" in r.stderr and r.stderr.count("\n") == 1
    xc.add_agent_pod("gpu-1")
    # a hostile agent: an escape sequence in a listed class, a time out of range
    line = '{"n": 1, "time": 1.0e30, "class": "Gpu\\u001b[31mDoctor", "bytes": 5}'
    xc.exec_argv = lambda cmd: [sys.executable, "-c", f"print({line!r})"]
    r = run_cli("node", "gpu-1", "--history", "--kubeconfig", kc)
    assert r.returncode == 0 and "\x1b" not in r.stdout and "Gpu??31mDoctor" in r.stdout
    xc.exec_argv = lambda cmd: [sys.executable, "-c", "print('{\"schema\": \"other\"}')"]
    r = run_cli("node", "gpu-1", "--history", "1", "--kubeconfig", kc)
    assert r.returncode == 2 and "not a gpu-doctor bundle" in r.stderr


def test_history_list_keeps_every_agent_field_off_the_terminal(xc, kc, tmp_path):
    """HI-01 (round-4 audit, h01_history_impostor.py list_escapes): a replaced agent image put
    OSC 52 (a clipboard write) and CSI in the `bytes` field, which the table printed raw. Only
    whole numbers pass as N and BYTES; every cell goes through the terminal sanitiser; -o json
    carries null for what was not a number."""
    import sys
    osc, csi = "\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07", "\x1b[2J\x9b"
    lines = [{"n": 1, "bytes": "12" + osc + csi, "time": 1.7e9, "class": "Gpu" + csi},
             {"n": 2, "bytes": {"a": [osc] * 3}, "time": "x" + osc, "class": ["\u202e"]},
             {"n": 3, "bytes": True, "time": 1.7e9, "class": "GpuDoctorXidErrors"},
             {"n": True, "bytes": 5, "time": 1.7e9, "class": "X"},
             {"n": 4, "bytes": 2048, "time": 1.7e9, "class": "GpuDoctorGpuLost"}]
    src = tmp_path / "list.ndjson"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    xc.namespaces["gpu-doctor"] = {PROBE_NS: "true"}
    xc.add_node("gpu-1")
    xc.add_agent_pod("gpu-1")
    xc.exec_argv = lambda cmd: [sys.executable, "-c",
                                f"import sys; sys.stdout.write(open({str(src)!r}).read())"]
    r = run_cli("node", "gpu-1", "--history", "--kubeconfig", kc)
    assert r.returncode == 0, r.stderr
    for raw in ("\x1b", "\x07", "\x9b", "\u202e"):
        assert raw not in r.stdout, repr(r.stdout)
    table = [ln.split() for ln in r.stdout.splitlines()[1:5]]
    assert [(row[0], row[-1]) for row in table] == [("1", "?"), ("2", "?"), ("3", "?"),
                                                    ("4", "2048")]
    r = run_cli("node", "gpu-1", "--history", "-o", "json", "--kubeconfig", kc)
    doc = json.loads(r.stdout)
    assert [(b["n"], b["bytes"]) for b in doc["bundles"]] == [(1, None), (2, None), (3, None),
                                                              (4, 2048)]


def test_without_admission_policies_the_watching_agent_gets_no_grant(xc, kc):
    import re
    xc.add_node("gpu-a")
    xc.serves_admission_v1 = False  # an API server before 1.30
    r = run_cli("agent", "install", "--kubeconfig", kc, "--watch")  # asked for: refused
    assert r.returncode == 3 and r.stderr.count("\n") == 1
    assert "does not serve ValidatingAdmissionPolicy" in r.stderr and "--no-watch" in r.stderr
    assert not [k for k in xc.objects if re.search("clusterrole|serviceaccount", k)]
    assert not xc.daemonsets
    r = run_cli("agent", "install", "--kubeconfig", kc)  # the default: the sleeping agent
    assert r.returncode == 0, r.stderr
    assert "installing the sleeping agent" in r.stdout
    [ds] = xc.daemonsets.values()
    assert "agent-idle" in ds["spec"]["template"]["spec"]["containers"][0]["command"]
    assert not [k for k in xc.objects if re.search("clusterrole|serviceaccount", k)]


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_agent_status_document_on_a_cluster_error(fmt, tmp_path):
    """`agent status -o json|yaml` prints its document with the error in it, as node/nodes do:
    a missing kubeconfig and an API server that refuses the connection are both exit 3."""
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()        # nothing listens there any more: the connection is refused
    refused = tmp_path / "refused.kubeconfig"
    refused.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    for kubeconfig in (str(tmp_path / "missing"), str(refused)):
        r = run_cli("agent", "status", "-o", fmt, "--kubeconfig", kubeconfig,
                    "--request-timeout", "5s")
        assert r.returncode == 3, r.stderr
        doc = json.loads(r.stdout) if fmt == "json" else yaml.safe_load(r.stdout)
        assert doc["exit_code"] == 3 and doc["nodes"] == [] and doc["installed"] is None
        assert doc["error"]["type"] and doc["error"]["message"] in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


def test_agent_status_usage_error_prints_no_document():
    r = run_cli("agent", "status", "-o", "json", "--request-timeout", "bogus")
    assert r.returncode == 2 and r.stdout == ""

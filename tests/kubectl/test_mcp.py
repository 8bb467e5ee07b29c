"""`kubectl gpu-doctor mcp` end to end: the official MCP SDK's own stdio client spawns the real
server process, which runs each tool call as the real CLI against the fake API server (kmock)
over TCP; what each tool answers is compared with what `-o json` prints for the same cluster.

The two documents may differ only in VOLATILE (mcpclient.py): when each run started and how
long it and its checks took."""
from __future__ import annotations

import json
import signal
import sys
import time

import pytest

from kubectl_gpudoctor.commands.mcp_calls import DEFAULT_NODES_LIMIT, shape_nodes

from .conftest import REPO, one_error_line, run_cli
from .mcpclient import (INITIALIZE, INITIALIZED, RawServer, assert_same_document, calls,
                        runs_of, server_command, text, tool_call, wait_for)
from .test_cli_cluster import DEBUG_POD, healthy_node, wedged_node
from .test_fit_cli import pending

pytest.importorskip("mcp")


def cli_doc(*args: str) -> tuple[int, dict]:
    r = run_cli(*args, "-o", "json")
    assert "Traceback" not in r.stderr, r.stderr
    return r.returncode, json.loads(r.stdout)


def incident(cluster) -> None:
    """A healthy node, a node whose kubelet admits nothing, and a GPU pod that fits nowhere."""
    healthy_node(cluster, "gpu-1")
    wedged_node(cluster, "gpu-2")
    cluster.add_node("cpu-1", gpus=0)
    pending(cluster, gpus=16, scheduler_says="0/3 nodes are available: 3 Insufficient "
            "nvidia.com/gpu. preemption: 0/3 nodes are available: 3 No preemption victims "
            "found for incoming pod.")


def test_each_tool_answers_the_document_o_json_prints(cluster, kubeconfig):
    """The answer of node, pod and nodes is the CLI's `-o json` document (VOLATILE aside), its
    exit code included, both as structured content and as the text a client shows; a failed
    run (a node that does not exist: exit 3) is a tool error carrying the CLI's document and
    its error line."""
    incident(cluster)
    kc = f"--kubeconfig={kubeconfig}"
    todo = [("node", {"name": "gpu-1"}), ("node", {"name": "node/gpu-2"}),
            ("pod", {"name": "trainer-0", "namespace": "ml"}),
            ("nodes", {}), ("nodes", {"all": True}), ("node", {"name": "gpu-9"})]
    t0 = time.monotonic()
    want = [cli_doc("node", "gpu-1", kc, "--no-probe"),
            cli_doc("node", "node/gpu-2", kc, "--no-probe"),
            cli_doc("pod", "trainer-0", "-n", "ml", kc, "--no-probe"),
            cli_doc("nodes", kc), cli_doc("nodes", "--all", kc),
            cli_doc("node", "gpu-9", kc, "--no-probe")]
    _, got, _ = calls(server_command(kc), todo)
    slack = time.monotonic() - t0
    codes = []
    for (tool, args), (code, doc), res in zip(todo, want, got):
        if tool == "nodes":  # sized for a model: the sick rows, the healthy ones counted
            doc = shape_nodes(doc, DEFAULT_NODES_LIMIT)
        assert_same_document(res.structured_content, doc, slack), (tool, args)
        # the document once (structured); the text is its summary, not a second copy
        if code != 3:
            assert len(res.content[0].text) < 2000 and "Untrusted data" in res.content[0].text
            v = res.structured_content.get("verdict")
            assert v is None or v["headline"] in res.content[0].text
        assert res.structured_content["exit_code"] == code
        assert res.is_error is (code not in (0, 1, 4)), (tool, args, text(res))
        codes.append(code)
    # the cases really differ: healthy, wedged, a pod that never fits, a fleet, an error
    assert codes == [0, 1, 1, 1, 1, 3]
    assert got[1].structured_content["verdict"]["root_cause"] == "kubelet.blocked_in_device_plugin"
    assert "pod.gpu_never_fits" in {f["id"] for f in got[2].structured_content["findings"]}
    assert [r["node"] for r in got[4].structured_content["nodes"]][0] == "gpu-2"
    assert got[5].structured_content["error"]["message"] == "node gpu-9 not found"
    assert text(got[5]).endswith("kubectl gpu-doctor: error: node gpu-9 not found")


def test_without_allow_node_probe_nothing_is_created_and_the_tools_say_what_they_cost(
        cluster, kubeconfig):
    """Without --allow-node-probe a call asking for the node probe, or for the agent's
    evidence (an exec), is refused and the cluster sees GET requests only; every tool's
    description names its cost."""
    incident(cluster)
    todo = [("node", {"name": "gpu-1", "probe": True}),
            ("pod", {"name": "trainer-0", "namespace": "ml", "probe": True}),
            ("nodes", {"probe": True}), ("history", {"node": "gpu-1"}),
            ("node", {"name": "gpu-1"})]
    listed, got, err = calls(server_command(f"--kubeconfig={kubeconfig}"), todo)
    for res in got[:4]:
        assert res.is_error and "--allow-node-probe" in text(res), text(res)
        assert res.structured_content is None
    assert not got[4].is_error and got[4].structured_content["summary"]["complete"] is True
    assert {m for m, _, _ in cluster.requests()} == {"GET"}, cluster.requests()
    assert not [p for _, p, _ in cluster.requests() if p.endswith("/exec")]
    tools = {t.name: t for t in listed.tools}
    assert sorted(tools) == ["explain", "history", "job", "node", "nodes", "pod", "replay"]
    for name in ("node", "pod", "nodes", "job"):
        d = tools[name].description
        assert "Cost: API reads only" in d and "ON the node" in d or "on EVERY" in d, d
        assert "started without --allow-node-probe" in d
        assert tools[name].annotations.read_only_hint is True
    assert "one exec" in tools["history"].description
    for name in ("explain", "replay"):
        assert "Cost: nothing on the cluster" in tools[name].description
        assert tools[name].annotations.open_world_hint is False
    assert "node probe off" in err  # the one line on stderr when it starts


def test_allow_node_probe_runs_the_probe_as_the_cli_does(cluster, kubeconfig):
    """With --allow-node-probe, probe=true is `node NAME -o json` with its probe (here in a debug
    pod, created and deleted as the CLI does), with the server's probe flags."""
    from .conftest import DATA
    from .fakecluster import cut_odd
    healthy_node(cluster)
    cluster.log_chunks = cut_odd((DATA / "probe_stream.ndjson").read_bytes())
    kc = f"--kubeconfig={kubeconfig}"
    t0 = time.monotonic()
    code, want = cli_doc("node", "gpu-1", kc, "--start-timeout", "10")
    listed, [got], _ = calls(server_command(kc, "--allow-node-probe", "--start-timeout=10s"),
                             [("node", {"name": "gpu-1", "probe": True})])
    assert code == 1 and not got.is_error
    assert_same_document(got.structured_content, want, time.monotonic() - t0)
    assert "nvml.init_hang" in {f["id"] for f in got.structured_content["findings"]}
    assert len(cluster.created) == 2 and cluster.count("DELETE", DEBUG_POD) == 2  # CLI + tool
    assert {t.name: t.annotations.read_only_hint for t in listed.tools}["node"] is False


def test_replay_and_explain_answer_offline(cluster, kubeconfig, tmp_path):
    """replay is `replay FILE -o json` of a bundle saved by `--save`; explain is the finding's
    page (the Markdown `explain ID` renders) and, for an unknown id, the CLI's error line."""
    wedged_node(cluster)
    bundle = tmp_path / "run.bundle"
    r = run_cli("node", "gpu-1", f"--kubeconfig={kubeconfig}", "--no-probe", "--save",
                str(bundle))
    assert r.returncode == 1, r.stderr
    code, want = cli_doc("replay", str(bundle))
    bad = run_cli("explain", "not_ready")
    asked = len(cluster.requests())
    from kubectl_gpudoctor.commands import explain
    _, got, _ = calls(server_command(), [("replay", {"path": str(bundle)}),
                                         ("explain", {"id": "kubelet.admission_stalled"}),
                                         ("explain", {"id": "not_ready"}),
                                         ("explain", {})])
    assert_same_document(got[0].structured_content, want, 0) and code == 1
    assert got[1].structured_content["page"] == explain.page_text("kubelet.admission_stalled")
    assert got[2].is_error and text(got[2]) == one_error_line(bad.stderr)
    from node_probe.protocol.catalog import CATALOG
    assert [f["id"] for f in got[3].structured_content["findings"]] == sorted(CATALOG)
    assert len(cluster.requests()) == asked  # none of them asked the API server anything


def test_history_is_the_cli_s_document_when_allowed(tmp_path):
    """history execs the read-only agent-history in the agent pod (the exec fake speaks the
    real protocol), and answers what `node NAME --history -o json` prints."""
    from .fakeexec import ExecCluster
    xc = ExecCluster()
    xc.start()
    try:
        kc = f"--kubeconfig={xc.kubeconfig(tmp_path / 'kubeconfig')}"
        xc.namespaces["gpu-doctor"] = {"gpu-doctor.io/probe-namespace": "true"}
        xc.add_node("gpu-1")
        xc.add_agent_pod("gpu-1")
        line = '{"n": 1, "time": 1790000000.0, "class": "GpuDoctorAdmissionStalled", "bytes": 5}'
        xc.exec_argv = lambda cmd: [sys.executable, "-c", f"print({line!r})"]
        r = run_cli("node", "gpu-1", "--history", kc, "-o", "json")
        assert r.returncode == 0, r.stderr
        _, [got], _ = calls(server_command(kc, "--allow-node-probe"),
                            [("history", {"node": "gpu-1"})])
        assert not got.is_error and got.structured_content == json.loads(r.stdout)
        assert got.structured_content["bundles"][0]["condition"] == "GpuDoctorAdmissionStalled"
    finally:
        xc.stop()


HOSTILE = [
    ("node", {"name": "Bad_Name"}, ["node", "Bad_Name"]),
    ("node", {"name": "../nodes/gpu-1"}, ["node", "../nodes/gpu-1"]),
    ("node", {"name": "--kubeconfig=/etc/passwd"}, ["node", "--", "--kubeconfig=/etc/passwd"]),
    ("node", {"name": "gpu-1?watch=true"}, ["node", "gpu-1?watch=true"]),
    ("node", {"name": "pod/train-0"}, ["node", "pod/train-0"]),
    ("node", {"name": "a" * 300}, ["node", "a" * 300]),
    ("pod", {"name": "train-0", "namespace": "ml/../kube-system"},
     ["pod", "train-0", "-n", "ml/../kube-system"]),
    ("history", {"node": "GPU 1"}, ["node", "GPU 1", "--history"]),
    ("replay", {"path": "/dev/zero"}, ["replay", "/dev/zero"]),
]


def test_a_bad_argument_is_the_cli_s_usage_error_as_a_tool_error(cluster, kubeconfig):
    """What the CLI refuses with one usage line (exit 2) the tool refuses with the same line,
    as a tool error; nothing reaches the API server and the server goes on answering."""
    healthy_node(cluster)
    kc = f"--kubeconfig={kubeconfig}"
    want = []
    for _, _, argv in HOSTILE:
        r = run_cli(argv[0], *([kc] if argv[0] != "replay" else []), *argv[1:])
        assert r.returncode == 2, (argv, r.stderr)
        want.append(one_error_line(r.stderr))
    _, got, _ = calls(server_command(kc, "--allow-node-probe"),
                      [(tool, args) for tool, args, _ in HOSTILE]
                      + [("explain", {"id": "node.not_ready"})])
    for (tool, args, _), line, res in zip(HOSTILE, want, got):
        assert res.is_error and text(res) == line, (tool, args)
    assert not got[-1].is_error
    assert not cluster.requests()


REFUSED = [
    ("node", {"name": "gpu-1\x00x"}, "NUL"),
    ("node", {"name": "a" * 5000}, "longer than 4096"),
    ("node", {"name": 5}, "expected string"),
    ("node", {"name": "gpu-1", "probe": "yes"}, "expected boolean"),
    ("node", {"name": "gpu-1", "kubeconfig": "/etc/passwd"}, "no such argument 'kubeconfig'"),
    ("node", {}, "Missing argument 'name'"),
    ("history", {"node": "gpu-1", "n": -1}, "not in 0..1000"),
    ("history", {"node": "gpu-1", "n": 10 ** 6}, "not in 0..1000"),
    ("history", {"node": "gpu-1", "n": True}, "expected integer"),
    ("explain", {"id": "x" * 5000}, "longer than 4096"),
    ("rm", {"name": "gpu-1"}, "no such tool 'rm'"),
]


def test_what_no_command_line_can_carry_is_refused_before_any_run(cluster, kubeconfig):
    """Arguments of the wrong name or type, a NUL, a huge string, an unknown tool: a tool error
    in the CLI's form, no run, no request; the server goes on answering."""
    healthy_node(cluster)
    _, got, _ = calls(server_command(f"--kubeconfig={kubeconfig}", "--allow-node-probe"),
                      [(tool, args) for tool, args, _ in REFUSED] + [("node", {"name": "gpu-1"})])
    for (tool, args, says), res in zip(REFUSED, got):
        assert res.is_error and says in text(res), (tool, text(res))
        assert text(res).startswith("kubectl gpu-doctor: error: ")
    assert not got[-1].is_error
    assert len([p for _, p, _ in cluster.requests() if p == "/api/v1/nodes/gpu-1"]) == 1


def test_a_call_past_its_deadline_is_stopped_and_answers_an_error(cluster, kubeconfig):
    """--call-timeout: the run is stopped (SIGTERM: it ends as on Ctrl-C, its document marked
    interrupted), the call is a tool error that says so, no run is left, and the next call
    works. The API server would answer only after 120 s, the client waits 60 s per request."""
    healthy_node(cluster)
    cluster.slow["/api/v1/nodes/gpu-1"] = 120
    kc = f"--kubeconfig={kubeconfig}"
    _, got, _ = calls(server_command(kc, "--call-timeout=2s", "--request-timeout=60s"),
                      [("node", {"name": "gpu-1"}), ("explain", {"id": "node.not_ready"})])
    assert got[0].is_error
    assert "did not finish within 2s (mcp --call-timeout); it was stopped" in text(got[0])
    assert got[0].structured_content["error"]["type"] == "Interrupted"
    assert not got[1].is_error
    assert runs_of(str(kubeconfig)) == []


def test_a_probe_stopped_past_the_deadline_deletes_its_debug_pod(cluster, kubeconfig):
    """A debug pod that never starts outlives the call: the run, stopped, deletes it as Ctrl-C
    would, and the answer says the pod is gone."""
    healthy_node(cluster)
    cluster.debug_pod_mode = "pending"
    _, [got], _ = calls(server_command(f"--kubeconfig={kubeconfig}", "--allow-node-probe",
                                       "--start-timeout=60s", "--call-timeout=5s"),
                        [("node", {"name": "gpu-1", "probe": True})])
    assert got.is_error and "--call-timeout" in text(got)
    assert "interrupted; debug pod deleted" in text(got)
    assert len(cluster.created) == 1 and cluster.count("DELETE", DEBUG_POD) == 1
    assert runs_of(str(kubeconfig)) == []


def _start_a_hanging_call(cluster, kubeconfig) -> RawServer:
    healthy_node(cluster)
    cluster.slow["/api/v1/nodes/gpu-1"] = 120
    srv = RawServer(f"--kubeconfig={kubeconfig}", "--request-timeout=60s")
    srv.send(INITIALIZE)
    assert srv.read_until(1)["result"]["serverInfo"]["name"] == "gpu-doctor"
    srv.send(INITIALIZED)
    srv.send(tool_call(2, "node", {"name": "gpu-1"}))
    assert wait_for(lambda: runs_of(str(kubeconfig)) != [])
    return srv


def _only_protocol(srv: RawServer, rest: bytes) -> None:
    for line in srv.lines + rest.splitlines():
        assert json.loads(line)["jsonrpc"] == "2.0", line


def test_stdin_closed_mid_call_ends_the_server_and_its_runs(cluster, kubeconfig):
    """The client goes away (EOF): the call in flight is cancelled, its run stopped, the server
    exits 0, and stdout carried nothing but JSON-RPC."""
    srv = _start_a_hanging_call(cluster, kubeconfig)
    srv.close_stdin()
    code, rest, err = srv.finish()
    assert code == 0, err
    assert runs_of(str(kubeconfig)) == []
    assert "Traceback" not in err
    _only_protocol(srv, rest)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_ends_the_server_and_its_runs(cluster, kubeconfig, sig):
    """Ctrl-C (or SIGTERM) while a call runs and the client is silent: the run is stopped, the
    server says `interrupted` on stderr and exits 130."""
    srv = _start_a_hanging_call(cluster, kubeconfig)
    srv.p.send_signal(sig)
    code, rest, err = srv.finish()
    assert code == 130, err
    assert err.strip().splitlines()[-1] == "kubectl gpu-doctor: interrupted"
    assert runs_of(str(kubeconfig)) == []
    _only_protocol(srv, rest)


def test_a_call_the_client_cancels_stops_its_run_and_the_server_goes_on(cluster, kubeconfig):
    """notifications/cancelled for a call in flight: its run is stopped now, not when the
    server ends, and the server answers the next request."""
    srv = _start_a_hanging_call(cluster, kubeconfig)
    srv.send({"jsonrpc": "2.0", "method": "notifications/cancelled",
              "params": {"requestId": 2, "reason": "the user gave up"}})
    assert wait_for(lambda: runs_of(str(kubeconfig)) == [])
    assert srv.p.poll() is None
    srv.send({"jsonrpc": "2.0", "id": 3, "method": "ping"})
    assert srv.read_until(3)["result"] == {}
    srv.close_stdin()
    code, rest, err = srv.finish()
    assert code == 0, err
    _only_protocol(srv, rest)


def test_a_killed_server_takes_its_runs_with_it(cluster, kubeconfig):
    """SIGKILL leaves the server no chance to stop anything: the kernel sends each run SIGTERM
    when the server dies (PR_SET_PDEATHSIG), and the run ends as on Ctrl-C."""
    srv = _start_a_hanging_call(cluster, kubeconfig)
    srv.p.kill()
    srv.finish()
    assert wait_for(lambda: runs_of(str(kubeconfig)) == [])


def test_a_message_over_the_line_limit_is_dropped_and_the_server_goes_on():
    srv = RawServer()
    srv.send(INITIALIZE)
    srv.read_until(1)
    srv.send(INITIALIZED)
    srv.send(b"[" + b" " * (5 * 1024 * 1024) + b"]\n")
    srv.send({"jsonrpc": "2.0", "id": 7, "method": "ping"})
    assert srv.read_until(7)["result"] == {}
    srv.close_stdin()
    code, rest, err = srv.finish()
    assert code == 0 and "dropped a message longer than 4 MiB" in err
    _only_protocol(srv, rest)


def test_without_the_sdk_one_line_and_exit_2():
    """A pip install without the [mcp] extra: `mcp` says what to install, nothing else."""
    import subprocess
    from .conftest import cli_env
    r = subprocess.run([sys.executable, "-c", "import sys; sys.modules['mcp'] = None; "
                        "from kubectl_gpudoctor.cli import entrypoint; entrypoint()", "mcp"],
                       capture_output=True, text=True, env=cli_env(), cwd=str(REPO),
                       timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    # what it names can be installed (the SDK; audit round 5, N16: this project is on no index)
    assert "pip install 'mcp>=2.3,<3'" in one_error_line(r.stderr)
    assert "kubectl-gpu-doctor[mcp]" not in r.stderr

"""The exec path (execstream + agent_exec.run_probe) against the faithful fake of the websocket exec
protocol (tests/kubectl/fakeexec.py), through the real kubernetes client's `stream()`."""
from __future__ import annotations

import io
import json
import re
import sys
import textwrap
import time

import pytest

from kubectl_gpudoctor import errors
from kubectl_gpudoctor.reach import execstream
from kubectl_gpudoctor.reach import agent_exec
from kubectl_gpudoctor.api.kube import Kube
from kubectl_gpudoctor.report.output import Output

from .fakeexec import PROBE_NS  # noqa: E402
from .fakeexec import ExecCluster

NODE = "gpu-0001"


@pytest.fixture
def xc():
    fc = ExecCluster()
    fc.namespaces["gpu-doctor"] = {PROBE_NS: "true"}
    fc.add_node(NODE)
    fc.start()
    try:
        yield fc
    finally:
        fc.stop()


@pytest.fixture
def kube(xc, tmp_path):
    return Kube(str(xc.kubeconfig(tmp_path / "kc")))


def script(body: str):
    """exec_argv: whatever the plugin asks for, run this Python script instead."""
    code = textwrap.dedent(body)
    return lambda cmd: [sys.executable, "-c", code]


def _exec(kube, pod, command=("true",), **kw) -> execstream.ExecStream:
    return execstream.ExecStream(kube, "gpu-doctor", pod["metadata"]["name"], "probe",
                                 list(command), **kw).open()


@pytest.mark.parametrize("server,expected", [
    (("v5.channel.k8s.io", "v4.channel.k8s.io"), "v5.channel.k8s.io"),
    (("v4.channel.k8s.io",), "v4.channel.k8s.io"),  # a 1.29 API server
])
def test_stdout_stderr_and_exit_status_per_protocol(xc, kube, server, expected):
    xc.exec_protocols = server
    pod = xc.add_agent_pod(NODE)
    # bytes cut mid-line and mid-UTF-8 across writes; stderr interleaved
    xc.exec_argv = script("""
        import os, sys, time
        for part in (b'{"a": "\\xc3', b'\\xa9"}\\nsecond ', b'line\\n'):
            os.write(1, part); time.sleep(0.05)
            os.write(2, b'warn\\n')
        sys.exit(3)
    """)
    ex = _exec(kube, pod, ["python3", "-m", "node_probe", "-o", "jsonl"])
    data = b"".join(ex.chunks())
    assert data == '{"a": "é"}\nsecond line\n'.encode()
    assert ex.end.exit_code == 3 and ex.end.reason == "NonZeroExitCode"
    assert ex.end.stderr_tail == b"warn\n" * 3
    assert ex.end.protocol == expected
    (rec,) = xc.execs
    assert rec["offered"] == "v5.channel.k8s.io,v4.channel.k8s.io"  # what the client offers
    assert rec["protocol"] == expected
    assert rec["command"] == ["python3", "-m", "node_probe", "-o", "jsonl"]
    assert rec["container"] == "probe"
    assert rec["params"]["stdout"] == "true" and rec["params"]["stdin"] == "false"
    assert rec["params"]["tty"] == "false"


def test_success_is_exit_code_zero(xc, kube):
    pod = xc.add_agent_pod(NODE)
    xc.exec_argv = script("print('ok')")
    ex = _exec(kube, pod)
    assert b"".join(ex.chunks()) == b"ok\n"
    assert ex.end.exit_code == 0 and ex.end.status == {"metadata": {}, "status": "Success"}


def test_exec_refused_by_rbac_is_forbidden_with_the_api_message(xc, kube):
    pod = xc.add_agent_pod(NODE)
    xc.forbid.append(("*", re.compile(r"/exec$")))
    with pytest.raises(errors.Forbidden) as ei:
        _exec(kube, pod)
    assert ei.value.status == 403
    assert 'cannot create resource "pods/exec"' in ei.value.one_line()
    assert xc.execs[0]["outcome"] == 403 and xc.execs[0]["protocol"] is None


def test_exec_into_a_pod_that_is_gone_is_not_found(xc, kube):
    pod = xc.add_agent_pod(NODE)
    del xc.pods[("gpu-doctor", pod["metadata"]["name"])]
    with pytest.raises(errors.NotFound):
        _exec(kube, pod)


def test_exec_into_a_pod_not_running_is_bad_request(xc, kube):
    pod = xc.add_agent_pod(NODE, phase="Pending")
    with pytest.raises(errors.BadRequest) as ei:
        _exec(kube, pod)
    assert "container not found" in ei.value.one_line()


def test_stream_cut_without_status_is_stream_broken(xc, kube):
    pod = xc.add_agent_pod(NODE)
    xc.exec_mode, xc.exec_cut_after = "cut", 10
    xc.exec_argv = script("""
        import os, time
        for i in range(50):
            os.write(1, b'0123456789\\n'); time.sleep(0.02)
    """)
    ex = _exec(kube, pod)
    got = b""
    with pytest.raises(errors.StreamBroken) as ei:
        for c in ex.chunks():
            got += c
    assert got == b"0123456789"
    assert "broke" in ei.value.one_line() or "without an exit status" in ei.value.one_line()


def test_deadline_ends_a_silent_exec(xc, kube):
    pod = xc.add_agent_pod(NODE)
    xc.exec_argv = script("import time; time.sleep(30)")
    ex = _exec(kube, pod, deadline_s=1.5)
    t0 = time.monotonic()
    with pytest.raises(errors.StreamBroken) as ei:
        list(ex.chunks())
    assert time.monotonic() - t0 < 15  # 10x hang guard: the exec'd program sleeps 30s
    assert "did not finish within 1.5s" in ei.value.one_line()


def test_connect_deadline_when_the_api_server_does_not_answer(tmp_path):
    """A listening socket that never answers the upgrade: the connect gives up in time."""
    import socket
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    fc = ExecCluster()
    fc.url = f"http://127.0.0.1:{srv.getsockname()[1]}"
    kube = Kube(str(fc.kubeconfig(tmp_path / "kc")))
    ex = execstream.ExecStream(kube, "gpu-doctor", "agent-x", "probe", ["true"],
                               connect_timeout_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(errors.ApiUnreachable) as ei:
        ex.open()
    assert time.monotonic() - t0 < 10  # 10x hang guard: the socket never answers
    assert "within 1s" in ei.value.one_line()
    srv.close()


# -- agent_exec.run_probe: the probe's records through the exec ----------------------------------------

PROBE_STREAM = [
    {"schema": "gpu-doctor/v1", "kind": "progress", "check": "nvml", "status": "running"},
    {"schema": "gpu-doctor/v1", "kind": "finding", "id": "nvml.init_hang", "severity": "critical",
     "subject": "node", "title": "NVML did not answer within 8.0s", "evidence": {"wait_s": 8.0},
     "remediation": "upgrade the driver", "refs": [], "check": "nvml"},
    {"schema": "gpu-doctor/v1", "kind": "summary", "critical": 1, "warning": 0, "info": 0,
     "complete": True, "checks": [{"id": "nvml", "status": "ok", "duration_s": 8.1}]},
]


def _fake_probe(records, exit_code=1, sleep=0.0):
    lines = "".join(json.dumps(r) + "\n" for r in records)
    return script(f"""
        import sys, time
        data = {lines.encode()!r}
        for i in range(0, len(data), 37):
            sys.stdout.buffer.write(data[i:i + 37]); sys.stdout.flush(); time.sleep({sleep})
        sys.exit({exit_code})
    """)


def _out():
    return Output("json", "warning", {"kind": "node", "name": NODE, "node": NODE},
                  out=io.StringIO(), err=io.StringIO(), progress=False)


def test_run_probe_via_agent_merges_the_records(xc, kube):
    pod = xc.add_agent_pod(NODE)
    xc.exec_argv = _fake_probe(PROBE_STREAM)
    out = _out()
    assert agent_exec.run_probe(kube, NODE, pod, out, timeout_s=20, trace_s=0) is True
    assert [f.id for f in out.report.findings] == ["nvml.init_hang"]
    assert out.report.complete
    cmd = xc.execs[0]["command"]
    assert cmd[:3] == ["python3", "-m", "node_probe"]
    assert cmd[cmd.index("--host-root") + 1] == "/host"
    assert cmd[cmd.index("--target-name") + 1] == NODE
    assert cmd[cmd.index("--trace-seconds") + 1] == "0"
    checks = {c.id: c for c in out.report.checks}
    assert checks["node.probe"].status == "ok"
    assert pod["metadata"]["name"] in checks["node.probe"].message


def test_agent_pod_gone_mid_run_is_incomplete_and_says_so(xc, kube):
    pod = xc.add_agent_pod(NODE)
    xc.exec_mode, xc.exec_cut_after = "gone", 60
    xc.exec_argv = _fake_probe(PROBE_STREAM, sleep=0.05)
    out = _out()
    assert agent_exec.run_probe(kube, NODE, pod, out, timeout_s=20, trace_s=0) is True
    assert not out.report.complete
    reasons = out.report.extra_incomplete_reason
    assert "exit code 137" in reasons and "deleted while the probe ran" in reasons
    assert {c.id: c.status for c in out.report.checks}["node.probe"] == "error"


def test_exec_refused_falls_back(xc, kube):
    """403 before the probe started: run_probe says False (the caller uses a debug pod)."""
    pod = xc.add_agent_pod(NODE)
    xc.forbid.append(("*", re.compile(r"/exec$")))
    out = _out()
    assert agent_exec.run_probe(kube, NODE, pod, out, timeout_s=20, trace_s=0) is False
    assert out.report.findings == [] or all(f.check is None for f in out.report.findings)

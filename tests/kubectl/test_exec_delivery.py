"""Every byte the agent sent before the close reaches the report (issue 21, item 4), and the
exec deadline holds while an agent keeps sending (item 5).

The exec fake (tests/kubectl/fakeexec.py) speaks v4 and v5 over a real websocket; the client is
the real kubernetes client's `stream()`. A slow consumer (a slow terminal, many records) lets
the whole output, the final Status and the close frame pile up before the plugin reads them.
"""
from __future__ import annotations

import io
import json
import sys
import time

import pytest

from kubectl_gpudoctor.reach import agent_exec
from kubectl_gpudoctor.report.output import Output

from .test_exec import NODE, kube, xc  # noqa: F401 (fixtures)

PROTOCOLS = [("v5.channel.k8s.io", "v4.channel.k8s.io"), ("v4.channel.k8s.io",)]


def probe_output(n: int) -> bytes:
    recs = [{"schema": "gpu-doctor/v1", "kind": "finding", "id": "nvml.init_hang",
             "severity": "warning", "subject": f"gpu-{i}", "title": f"finding {i} " + "x" * 200,
             "evidence": {"i": i}, "remediation": "r", "refs": [], "check": "nvml"}
            for i in range(n)]
    recs.append({"schema": "gpu-doctor/v1", "kind": "summary", "critical": 0, "warning": n,
                 "info": 0, "complete": True, "checks": [{"id": "nvml", "status": "ok"}]})
    return "".join(json.dumps(r) + "\n" for r in recs).encode()


def write_and_exit(path, code: int = 1):
    """exec_argv: the 'probe' writes the file's bytes to stdout at full speed and exits."""
    return lambda cmd: [sys.executable, "-c",
                        f"import sys; sys.stdout.buffer.write(open({str(path)!r}, 'rb').read());"
                        f" sys.stdout.flush(); sys.exit({code})"]


def slow_output(pause_s: float = 1.5):
    """An Output whose first record takes `pause_s` to render (a slow pipe): meanwhile the
    agent finishes and the server sends the rest, the Status and the close."""
    out = Output("json", "warning", {"kind": "node", "name": NODE, "node": NODE},
                 out=io.StringIO(), err=io.StringIO(), progress=False)
    orig, seen = out.node_record, []

    def node_record(rec, node=None):
        if not seen:
            time.sleep(pause_s)
        seen.append(rec.get("kind"))
        return orig(rec, node=node)
    out.node_record = node_record
    return out, seen


@pytest.mark.parametrize("server", PROTOCOLS, ids=["v5", "v4"])
@pytest.mark.parametrize("n", [400, 5000])
def test_slow_consumer_gets_every_record_and_the_summary(xc, kube, tmp_path, server, n):
    xc.exec_protocols = server
    pod = xc.add_agent_pod(NODE)
    data = tmp_path / "out.ndjson"
    data.write_bytes(probe_output(n))
    xc.exec_argv = write_and_exit(data, code=1)  # 1: the probe found something
    out, seen = slow_output()
    assert agent_exec.run_probe(kube, NODE, pod, out, timeout_s=60, trace_s=0) is True
    assert seen.count("finding") == n and seen[-1] == "summary"
    assert len(out.report.findings) == n
    assert out.report.complete, out.report.extra_incomplete_reason
    assert {c.id: c.status for c in out.report.checks}["node.probe"] == "ok"
    assert xc.execs[0]["outcome"] == 1

"""A hostile agent or debug pod cannot hold the CLI past its deadline or grow it without bound
(issue 21, item 5): one 200 MB line, then valid records as fast as they can be written.

Through the real CLI process: the agent path (exec, tests/kubectl/fakeexec.py) and the debug
pod path (its log, tests/kubectl/hostile.py); peak RSS and CPU from the kernel's accounting of
the CLI process (wait4). The exec and log deadlines are the probe's --timeout + PROBE_GRACE_S.
"""
from __future__ import annotations

import json
import re

import pytest

from kubectl_gpudoctor.reach import records
from kubectl_gpudoctor.reach.stream import PROBE_GRACE_S

from .hostile import (GIANT_LINE_MIB, NODE, endless, finding_line, flood_unit,
                      flooding_agent, run_measured)
from .hostile import hc, kc  # noqa: F401 (fixtures)

RSS_LIMIT_MIB = 512
# the probe's --timeout; the exec into the agent must connect within min(10 s, it)
# (reach/agent_exec.py): 1 s was missed under load (the ux-round-5 loaded run: the CLI fell
# back to a debug pod and the test judged that path), 5 s is not, and the flood still
# outlasts the deadline by far (120 s)
TIMEOUT_S = 5
DEADLINE_S = TIMEOUT_S + PROBE_GRACE_S  # what the CLI gives the exec / the log stream


# -- the decoder's caps (no process needed) --------------------------------------------------

def test_decoder_passes_at_most_max_records_then_only_the_summary():
    dec = records.Decoder()
    flood = b"".join(finding_line(i) for i in range(records.MAX_RECORDS + 5000))
    summary = json.dumps({"schema": "gpu-doctor/v1", "kind": "summary", "complete": True,
                          "critical": 0, "warning": 1, "info": 0}).encode() + b"\n"
    out = []
    for i in range(0, len(flood), 65536):
        out += dec.feed(flood[i:i + 65536])
    out += dec.feed(summary) + dec.finish()
    kinds = [r["kind"] for r in out]
    assert kinds.count("finding") == records.MAX_RECORDS
    assert dec.dropped_lines == 5000
    warn = [r for r in out if r.get("flood")]
    assert len(warn) == 1 and warn[0]["level"] == "warning"
    assert out[-1]["kind"] == "summary" and out[-1]["complete"] is False
    assert "5000 further line(s) were skipped" in out[-1]["incomplete_reason"]


def test_decoder_caps_the_bytes_of_raw_lines_too():
    dec = records.Decoder()
    line = b"x" * 100_000 + b"\n"   # a log line: kept as at most MAX_RAW_CHARS
    n = records.MAX_RECORD_BYTES // records.MAX_RAW_CHARS + 10
    out = []
    for _ in range(n):
        out += dec.feed(line)
    assert dec.records_out <= records.MAX_RECORD_BYTES // records.MAX_RAW_CHARS + 1
    assert dec.dropped_lines >= 9 and "further line(s)" in dec.incomplete_reason


# -- the CLI against a flooding agent / debug pod ------------------------------------------------


def _held(m, what: str) -> None:
    print(f"{what}: {m}")
    assert "Traceback" not in m.stderr, m.stderr[-3000:]
    assert m.max_rss_mib < RSS_LIMIT_MIB, f"{what}: {m}"
    # the deadline held: the flood goes on for 120 s; a 2x guard over the deadline
    assert m.wall_s < 2 * DEADLINE_S + 10, f"{what}: {m}"
    # incomplete (4), unless the flood's own warning findings decide it (1: they come first)
    assert m.returncode in (1, 4), (m.returncode, m.stderr[-2000:])
    doc = json.loads(m.stdout)
    assert doc["summary"]["complete"] is False
    assert len(doc["findings"]) <= records.MAX_RECORDS


def test_a_flooding_agent_is_bounded_and_the_exec_deadline_holds(hc, kc):
    hc.add_agent_pod(NODE)
    hc.exec_argv = lambda cmd: flooding_agent(120)
    m = run_measured("node", NODE, "--kubeconfig", kc, "-o", "json", "--timeout",
                     str(TIMEOUT_S), "--trace-seconds", "0", timeout=240)
    _held(m, f"agent: one {GIANT_LINE_MIB} MB line, then a flood of records")
    assert "did not finish within" in m.stderr or "did not finish within" in m.stdout


def test_a_flooding_debug_pod_log_is_bounded_and_its_deadline_holds(hc, kc):
    hc.hostile[re.compile(r"/api/v1/namespaces/[^/]+/pods/[^/]+/log")] = endless(
        b"", flood_unit, content_type="text/plain", first=(b"x" * (1 << 20), GIANT_LINE_MIB))
    m = run_measured("node", NODE, "--kubeconfig", kc, "-o", "json", "--no-agent",
                     "--timeout", str(TIMEOUT_S), "--trace-seconds", "0",
                     "--start-timeout", "20", timeout=240)
    _held(m, f"debug pod log: one {GIANT_LINE_MIB} MB line, then a flood of records")

"""The trace window fits the run's deadline (issue 12 item 13): a window that cannot fit is
skipped with the reason (the run stays complete), one that partly fits is shortened and said,
the same rule (node_probe.protocol.tracefit) on every path."""
from __future__ import annotations

import pytest

from node_probe.protocol import tracefit
from tests.probe_run import run_probe


def test_fit_rule():
    assert tracefit.fit(30, 5) == (5.0, "")
    assert tracefit.fit(30, 0) == (0.0, "")
    w, note = tracefit.fit(6, 5)
    assert w == 2.0 and "shortened from 5s to 2s" in note and "--timeout 6s" in note
    w, note = tracefit.fit(5, 5)
    assert w == 1.0 and "shortened" in note
    w, note = tracefit.fit(2, 5)
    assert w == 0.0 and "use --timeout 9s or more" in note and "--trace-seconds 0" in note


def test_trace_that_cannot_fit_is_skipped_and_the_run_completes():
    """The other check that uses the trace window (memory) still runs to its end. Nothing here
    may depend on the host's load: the memory check judges the real host, and any memory stall
    elsewhere on the machine (another memory test's thrash, within its PSI avg10) made it a
    warning and the exit 1, hence --fail-on never (exit 0 still requires a complete run:
    incomplete is 4). And it waits min(window, deadline - 1 s) before its last sample: a 1 s
    window in a 4 s deadline leaves it ~2.5 s for that, a 5 s window in 2 s left 0.7 s."""
    run = run_probe("--only", "trace", "--only", "memory", "--timeout", "4",
                    "--trace-seconds", "1", "--fail-on", "never", timeout=120)
    summary = run.summary
    checks = {c["id"]: c for c in summary["checks"]}
    assert checks["trace"]["status"] == "skipped", checks
    assert "a 1s window does not fit in --timeout 4s" in checks["trace"]["reason"]
    assert checks["memory"]["status"] == "ok", checks
    assert summary["complete"] is True and run.returncode == 0, summary


@pytest.mark.root
@pytest.mark.bcc
def test_trace_window_is_shortened_to_fit(bcc_ready):
    run = run_probe("--only", "trace", "--timeout", "5", "--trace-seconds", "5", timeout=30)
    summary = run.summary
    (trace,) = [c for c in summary["checks"] if c["id"] == "trace"]
    assert trace["status"] == "ok" and summary["complete"] is True, summary
    logs = [r["message"] for r in run.records if r["kind"] == "log"]
    assert any("trace window shortened from 5s to 1s" in m for m in logs), logs
    assert trace["duration_s"] < 5.0

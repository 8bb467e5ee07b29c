"""The live status line (render.LiveProgress): one line rewritten in place on a terminal,
with the wait's clock and the node's name, erased by clear(); nothing when disabled."""
from __future__ import annotations

import io

from node_probe.protocol import Report, log, progress, render

ERASE = "\r\x1b[2K"


def test_one_line_rewritten_in_place_and_cleared():
    out = io.StringIO()
    live = render.LiveProgress(out, enabled=True, width=80)
    live.TICK_S = 3600.0  # no clock refresh in between: each part below is one record
    live(progress(message="reading gpu-1's pods"))
    live(progress(message="debug pod gpu-doctor-x Pending on gpu-1", deadline_s=60.0))
    live(progress(phase="start", trace_s=5.0, checks=["trace"]), node="gpu-2")
    live(progress(phase="trace", check="trace"), node="gpu-2")
    live.clear()
    text = out.getvalue()
    assert "\n" not in text                       # never a new line: always the same one
    parts = text.split(ERASE)
    assert parts[0] == "" and parts[-1] == ""     # starts by erasing, ends erased
    assert parts[1] == "reading gpu-1's pods"
    assert parts[2] == "debug pod gpu-doctor-x Pending on gpu-1 (0s/60s)"
    assert parts[3] == "gpu-2: node checks started"
    assert parts[4] == "gpu-2: tracing 5s (0s/5s)"


def test_long_lines_are_cut_to_the_width_so_they_never_wrap():
    out = io.StringIO()
    live = render.LiveProgress(out, enabled=True, width=40)
    live(progress(message="x" * 200))
    assert len(out.getvalue().split(ERASE)[1]) == 39


def test_disabled_writes_nothing():
    out = io.StringIO()
    live = render.LiveProgress(out, enabled=False)
    live(progress(message="hello", deadline_s=5))
    live.clear()
    assert out.getvalue() == ""


def test_incomplete_report_shows_the_probes_last_line():
    r = Report({"kind": "node", "name": "n1"}, "0")
    r.add_record(log("info", "Traceback (most recent call last):", raw=True))
    r.add_record(log("info", "MemoryError: cannot allocate", raw=True))
    r.extra_incomplete_reason = "the probe ended without a summary"
    out = io.StringIO()
    render.render_table(r, out, "warning", 4, width=100)
    assert "last warning: the probe's last output line: MemoryError: cannot allocate" in \
        out.getvalue()
    r.add_record(log("warning", "could not delete debug pod x"))
    out = io.StringIO()
    render.render_table(r, out, "warning", 4, width=100)
    assert "last warning: could not delete debug pod x" in out.getvalue()

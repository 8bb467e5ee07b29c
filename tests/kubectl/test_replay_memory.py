"""Replaying a big bundle holds the report once, not several times (issue 28: replaying 150,000
findings peaked at 712 MiB with `-o json`, 415 MiB as a table, against the CLI's 512 MiB).

What the renderers allocate beyond the parsed bundle is measured with tracemalloc (this
process's own allocation accounting: the same on every run, not a timing): before, `-o json`
built every finding's document and json.dumps' list of its millions of tokens (4x the parsed
bundle), YAML PyYAML's node graph of the whole document (6.6x), the table a terminal-safe copy
of every finding (2.4x). bench/replay_scale.py measures the CLI's peak RSS on the largest
bundles replay accepts.
"""
from __future__ import annotations

import io
import json
import tracemalloc

import pytest

from kubectl_gpudoctor import errors
from kubectl_gpudoctor.report import bundle, bundle_io
from kubectl_gpudoctor.report.output import FORMATS
from node_probe.protocol import Finding, Report

# a real finding (tests/kubectl/data/probe_stream.ndjson, the recorded probe stream)
RECORD = next(r for r in map(json.loads, (line for line in open(
    __file__.rsplit("/", 1)[0] + "/data/probe_stream.ndjson") if line.startswith("{")))
    if r.get("id") == "nvml.init_hang")


def _bundle(n: int) -> bytes:
    rep = {"target": {"kind": "node", "name": "gpu-1", "node": "gpu-1"}, "version": "0.1.0",
           "started_at": 1795319200.0, "fail_on": "warning", "exit_code": 1, "checks": [],
           "findings": [dict(RECORD, subject=f"pod ml/train-{i}") for i in range(n)]}
    return json.dumps({"schema": bundle.SCHEMA, "report": rep}).encode()


class _Sink(io.TextIOBase):
    def write(self, s: str) -> int:
        return len(s)


@pytest.mark.parametrize("fmt", FORMATS)
def test_rendering_a_replayed_bundle_holds_its_findings_once(fmt):
    raw = _bundle(4_000)
    tracemalloc.start()
    try:
        doc = bundle.parse(raw, "b.json")
        parsed = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        bundle.replay(doc, fmt, stdout=_Sink(), stderr=io.StringIO())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1.5 * parsed, f"{fmt}: {peak / parsed:.2f}x the parsed bundle"


def test_json_and_yaml_written_in_pieces_are_the_same_text():
    from kubectl_gpudoctor.report.output import write_yaml, yaml_dump
    from node_probe import protocol
    r = Report({"kind": "node", "name": "gpu-1"}, "0.1.0")
    long = "a title long enough to be folded by a YAML emitter at eighty columns " * 3
    for i in range(2500):
        r.add_finding(Finding("nvml.init_hang", ("critical", "warning", "info")[i % 3],
                              f"pod ml/train-{i}", f"{long}{i}",
                              {"wait_s": 8.0, "nested": [1, {"k": "v: w"}], "none": None,
                               "lines": "one\ntwo", "esc": "\x1b]52;c;\x07"},
                              "fix\nit", ("https://example.com/a",)))
    eager = r.document("warning", 1)
    lazy = r.document("warning", 1, lazy=True)
    lazy["duration_s"] = eager["duration_s"]
    out = io.StringIO()
    protocol.write_json(out, lazy, pieces=100)
    assert out.getvalue() == json.dumps(eager, indent=2, default=str) + "\n"
    out = io.StringIO()
    write_yaml(out, dict(lazy, verdict={"severity": "critical"}), chunk=7)
    assert out.getvalue() == yaml_dump(dict(eager, verdict={"severity": "critical"}))
    empty = Report({"kind": "node"}, "0.1.0").document("warning", 0, lazy=True)
    out = io.StringIO()
    write_yaml(out, empty)
    assert "findings: []\n" in out.getvalue()


def test_a_bundle_past_the_object_bound_is_refused_before_parsing():
    raw = b'{"schema": "x", "pad": [' + b"[]," * bundle_io.MAX_CONTAINERS + b"[]]}"
    with pytest.raises(errors.UsageError, match="more than 600,000 JSON objects"):
        bundle.parse(raw, "b.json")

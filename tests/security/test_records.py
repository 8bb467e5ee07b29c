"""The probe-stream decoder (issue 12 item 6): whatever bytes arrive, no exception; records
that do not validate become log lines and make the run incomplete; an over-long line is
skipped to its newline with one warning and never echoed; API-side findings survive."""
from __future__ import annotations

import io
import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from kubectl_gpudoctor.reach import records
from kubectl_gpudoctor.reach.records import Decoder
from node_probe import protocol
from node_probe.protocol import Finding, Report

S = protocol.SCHEMA


def _line(obj) -> bytes:
    return json.dumps(obj).encode() + b"\n"


GOOD_FINDING = Finding("gpu.xid", "critical", "gpu-0", "Xid 79").to_record()
GOOD_SUMMARY = protocol.summary([], [], True, 1.0, 0)


def _run(*chunks: bytes, max_line: int = records.MAX_LINE_BYTES):
    dec = Decoder(max_line)
    out = list(records.records(chunks, dec))
    return dec, out


@pytest.mark.parametrize("bad", [
    dict(GOOD_FINDING, id=5),                                   # id as a number
    dict(GOOD_FINDING, id=None),
    dict(GOOD_FINDING, id="has space"),
    dict(GOOD_FINDING, severity="fatal"),
    dict(GOOD_FINDING, title="lone \ud800 surrogate"),
    dict(GOOD_FINDING, evidence=[1, 2]),
    dict(GOOD_FINDING, refs="http://x"),
    dict(GOOD_FINDING, subject={"a": 1}),
    dict(GOOD_SUMMARY, complete="false"),                       # complete as a string
    dict(GOOD_SUMMARY, checks=[{"id": 1, "status": "ok"}]),
    dict(GOOD_SUMMARY, checks=["x"]),
    dict(GOOD_SUMMARY, checks=[{"id": "a", "status": "ok", "duration_s": "1"}]),
    dict(GOOD_SUMMARY, critical="1"),
    {"schema": S, "kind": "log", "message": 5},
    {"schema": S, "kind": 7},
])
def test_invalid_records_become_warning_logs_and_incomplete(bad):
    raw = json.dumps(bad, ensure_ascii=True).encode()  # lone surrogates travel as \ud800
    dec, out = _run(raw + b"\n", _line(GOOD_FINDING), _line(GOOD_SUMMARY))
    logs = [r for r in out if r["kind"] == "log" and r.get("invalid")]
    assert len(logs) == 1 and logs[0]["level"] == "warning", out
    assert [r["kind"] for r in out][1:] == ["finding", "summary"]
    summary = out[-1]
    assert summary["complete"] is False and "did not validate" in summary["incomplete_reason"]
    assert dec.incomplete_reason


def test_json_nested_50000_deep():
    deep = b'{"schema":"gpu-doctor/v1","kind":"finding","evidence":' + b"[" * 50000 + b"]" * 50000 + b"}\n"
    dec, out = _run(deep, _line(GOOD_SUMMARY))
    assert out[0]["invalid"] and out[1]["complete"] is False
    # also deep but under the interpreter's recursion limit
    mid = b'{"schema":"gpu-doctor/v1","kind":"log","message":"m","x":' + b"[" * 100 + b"]" * 100 + b"}\n"
    assert _run(mid)[1][0]["invalid"]


def test_non_finite_numbers_are_invalid():
    dec, out = _run(b'{"schema":"gpu-doctor/v1","kind":"summary","complete":true,"duration_s":NaN}\n')
    assert out[0]["invalid"]


def test_oversize_line_skipped_to_newline_with_one_warning_never_echoed():
    secret = b"SECRET" * 20
    big = b'{"schema":"gpu-doctor/v1","kind":"log","message":"' + secret + b"x" * 5000 + b'"}\n'
    chunks = [big[i:i + 333] for i in range(0, len(big), 333)]
    dec, out = _run(*chunks, *chunks, _line(GOOD_FINDING), _line(GOOD_SUMMARY), max_line=1000)
    warnings = [r for r in out if r.get("oversize")]
    assert len(warnings) == 1
    assert [r["kind"] for r in out] == ["log", "finding", "summary"]
    assert dec.oversize_lines == 2
    assert out[-1]["complete"] is False and "skipped" in out[-1]["incomplete_reason"]
    assert b"SECRET" not in json.dumps(out).encode()


def test_100mb_line_in_network_cuts_stays_bounded():
    dec = Decoder()
    chunk = b"A" * (1 << 20)
    total = []
    for _ in range(100):
        total += dec.feed(chunk)
        assert len(dec._buf) <= records.MAX_LINE_BYTES + len(chunk)
    total += dec.feed(b"\n" + _line(GOOD_SUMMARY))
    total += dec.finish()
    assert [r.get("oversize") for r in total] == [True, None]
    assert total[-1]["complete"] is False


def test_valid_stream_is_unchanged():
    dec, out = _run(_line(GOOD_FINDING), b"bcc noise\n", _line(GOOD_SUMMARY))
    assert out[0] == GOOD_FINDING and out[2] == GOOD_SUMMARY and out[1]["raw"]
    assert dec.incomplete_reason == ""


def test_unknown_kind_from_a_newer_probe_is_not_invalid():
    dec, out = _run(_line({"schema": S, "kind": "metric", "v": 1}), _line(GOOD_SUMMARY))
    assert out[1]["complete"] is True and out[0]["level"] == "debug"


# -- property: arbitrary bytes never raise, and what comes out is safe to use --------------

_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                       st.text())
_json = st.recursive(_json_leaf, lambda c: st.one_of(st.lists(c, max_size=4),
                                                     st.dictionaries(st.text(max_size=8), c,
                                                                     max_size=4)),
                     max_leaves=20)
_recordish = st.fixed_dictionaries(
    {"schema": st.just(S), "kind": st.sampled_from(list(protocol.KINDS) + ["x", 1])},
    optional={"id": _json, "severity": st.sampled_from(["critical", "ok", 3, None]),
              "title": _json, "subject": _json, "evidence": _json, "refs": _json,
              "complete": _json, "checks": _json, "message": _json, "level": _json})


def _use(out: list[dict]) -> None:
    """Everything the client does with decoded records must work on them."""
    rep = Report({"kind": "node", "name": "n"}, "0")
    for r in out:
        rep.add_record(r)
        json.dumps(r)
    render = __import__("node_probe.protocol.render", fromlist=["x"])
    buf = io.StringIO()
    render.render_table(rep, buf, "warning", 0)
    render.render_json(rep, io.StringIO(), "warning", 0)
    buf.getvalue().encode("utf-8")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=4096), st.lists(st.integers(1, 64), min_size=1, max_size=8))
def test_arbitrary_bytes_never_raise(data, cuts):
    dec = Decoder(max_line=512)
    chunks, i, k = [], 0, 0
    while i < len(data):
        n = cuts[k % len(cuts)]
        chunks.append(data[i:i + n])
        i, k = i + n, k + 1
    out = list(records.records(chunks, dec))
    assert all(isinstance(r, dict) and r.get("kind") in protocol.KINDS for r in out)
    _use(out)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_recordish, max_size=5), st.binary(max_size=64))
def test_record_shaped_garbage_never_raises(recs, noise):
    data = b"".join(json.dumps(r).encode() + b"\n" for r in recs) + noise
    out = list(records.records([data]))
    _use(out)

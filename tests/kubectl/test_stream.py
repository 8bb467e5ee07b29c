"""NDJSON splitting across arbitrary chunk boundaries (the pod log arrives in network cuts)."""
from __future__ import annotations

from kubectl_gpudoctor.reach import stream
from kubectl_gpudoctor.reach.stream import LineSplitter

from .conftest import DATA
from .fakecluster import cut_odd


def _all(data: bytes, cuts) -> list[dict]:
    # raw (non-JSON) lines become log records stamped at decode time: drop that stamp
    return [{k: v for k, v in r.items() if not (r.get("raw") and k == "ts")}
            for r in stream.records(cuts(data))]


def test_records_identical_whatever_the_cuts():
    data = (DATA / "probe_stream.ndjson").read_bytes()
    whole = _all(data, lambda d: [d])
    assert [r["kind"] for r in whole][-1] == "summary"
    for sizes in ((1,), (2, 3), (7, 13, 1, 29, 3, 61, 2, 17), (4096,)):
        assert _all(data, lambda d: cut_odd(d, sizes)) == whole


def test_multibyte_split_and_non_json_line_become_log():
    data = (DATA / "probe_stream.ndjson").read_bytes()
    assert "—".encode() in data  # the crafted finding's title has a 3-byte character
    recs = _all(data, lambda d: cut_odd(d, (1,)))
    crit = [r for r in recs if r.get("severity") == "critical"]
    assert crit and "—" in crit[0]["title"]
    logs = [r for r in recs if r["kind"] == "log" and r.get("raw")]
    assert logs and "bpf compile noise" in logs[0]["message"]


def test_last_line_without_newline_is_kept_and_crlf_stripped():
    sp = LineSplitter()
    assert sp.feed(b'{"a":') == []
    assert sp.feed(b'1}\r\n{"b"') == [b'{"a":1}']
    assert sp.finish() == [b'{"b"']
    assert sp.finish() == []


def test_blank_lines_are_skipped():
    recs = list(stream.records([b"\n\n", b"hello\n", b"\n"]))
    assert len(recs) == 1 and recs[0]["message"] == "hello"

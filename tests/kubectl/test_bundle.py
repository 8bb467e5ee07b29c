"""Evidence bundles: a real `node X` run (fake API server, debug pod streaming a recorded probe
NDJSON) saved with a Recorder, then replayed offline: same document byte for byte (duration
aside), same exit code, no secrets in the file."""
from __future__ import annotations

import io
import json
import os

import pytest

from kubectl_gpudoctor import errors
from kubectl_gpudoctor.report import bundle
from kubectl_gpudoctor.commands import node
from kubectl_gpudoctor.reach import probe_run
from kubectl_gpudoctor.api.kube import Kube
from kubectl_gpudoctor.report.output import Output

from .conftest import DATA
from .fakecluster import FakeCluster, cut_odd
from .kubelet_dump import healthy_kubelet_dump, wedged_kubelet_dump

SECRET = "s3cr3t-Value-42"


@pytest.fixture
def fc():
    c = FakeCluster()
    c.start()
    try:
        yield c
    finally:
        c.stop()


def _run(fc, tmp_path, fmt: str, wedged: bool = False, probe: bool = True):
    fc.add_node("gpu-1")
    p = fc.add_pod("ml", "train-0", "gpu-1", gpus=1)
    p["spec"]["containers"][0]["env"] = [{"name": "DB_PASSWORD", "value": SECRET},
                                         {"name": "MODEL", "value": "llama"}]
    p["metadata"]["annotations"] = {
        "kubectl.kubernetes.io/last-applied-configuration": json.dumps({"password": SECRET}),
        "note": f"api_token={SECRET}"}
    if wedged:
        for k in range(2):
            fc.add_pod("ml", f"stuck-{k}", "gpu-1", phase="Pending", gpus=1, age_s=600,
                       events="scheduled-only")
        fc.goroutines["gpu-1"] = wedged_kubelet_dump(stuck=2, minutes=10)
        fc.debug_pod_mode = "pending"
    else:
        fc.goroutines["gpu-1"] = healthy_kubelet_dump()
    fc.configz["gpu-1"] = {"cpuManagerPolicy": "static", "cgroupDriver": "systemd",
                           "staticPodURLHeader": {"Authorization": [f"Bearer {SECRET}"]}}
    fc.log_chunks = cut_odd((DATA / "probe_stream.ndjson").read_bytes())
    kube = Kube(str(fc.kubeconfig(tmp_path / "kc")))
    stdout = io.StringIO()
    out = Output(fmt, "warning", {"kind": "node", "name": "gpu-1", "node": "gpu-1"},
                 out=stdout, err=io.StringIO(), progress=False)
    rec = bundle.Recorder()
    rec.attach_kube(kube)
    rec.attach_output(out)
    settings = probe_run.Settings(namespace="default", timeout_s=20, trace_s=0,
                                 start_timeout_s=2, probe=probe)
    error = None
    try:
        node.diagnose_node(kube, "gpu-1", settings, out)
    except errors.GpuDoctorError as exc:
        error = exc
    code = int(out.exit_status(errors.exit_status_of(error) if error else None))
    out.finish(code)
    doc = bundle.build(out, code, error, rec,
                       ["kubectl-gpu_doctor", "node", "gpu-1", "--token", SECRET, "-o", fmt],
                       image="ghcr.io/gpu-doctor/gpu-doctor-probe:0.1.0")
    path = tmp_path / "incident.json"
    bundle.write(str(path), doc)
    return stdout.getvalue(), code, path


def _strip_time(text: str) -> dict:
    doc = json.loads(text)
    doc.pop("duration_s")
    return doc


@pytest.mark.parametrize("wedged", [False, True])
def test_replay_gives_the_same_document_and_exit_code(fc, tmp_path, wedged):
    original, code, path = _run(fc, tmp_path, "json", wedged=wedged)
    doc = bundle.load(str(path))
    replayed = io.StringIO()
    assert bundle.replay(doc, "json", stdout=replayed, stderr=io.StringIO()) == code
    a, b = _strip_time(original), _strip_time(replayed.getvalue())
    # the one addition: a replay says it is one, of which bundle, captured when
    assert b.pop("replay") == {"bundle": "a bundle", "captured_at": doc["created_at"],
                                "untrusted": True}
    assert a == b
    # byte for byte once the one timestamp that must differ is aligned
    a_text = json.dumps(a, indent=2)
    assert a_text == json.dumps(b, indent=2)
    assert a["exit_code"] == code and code in (1, 4)
    if wedged:
        ids = {f["id"] for f in a["findings"]}
        assert "kubelet.admission_stalled" in ids


def test_replay_in_other_formats_and_fail_on(fc, tmp_path):
    _, code, path = _run(fc, tmp_path, "json")
    doc = bundle.load(str(path))
    table = io.StringIO()
    assert bundle.replay(doc, "table", stdout=table, stderr=io.StringIO()) == code
    assert "nvml.init_hang" in table.getvalue()
    # a different --fail-on recomputes the verdict from the saved findings (replay uses its
    # document up: the report's records are dropped as it is built)
    doc = bundle.load(str(path))
    assert bundle.replay(doc, "json", fail_on="never", stdout=io.StringIO(),
                         stderr=io.StringIO()) in (0, 4)


def test_bundle_holds_the_evidence_and_no_secrets(fc, tmp_path):
    _, _, path = _run(fc, tmp_path, "json", wedged=True)
    raw = path.read_text()
    assert SECRET not in raw
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    doc = json.loads(raw)
    assert doc["schema"] == bundle.SCHEMA and "No secrets" in doc["redaction"]
    assert doc["command_line"] == ["kubectl-gpu_doctor", "node", "gpu-1", "--token",
                                   bundle.REDACTED, "-o", "json"]
    assert doc["tool"]["version"] and doc["image"]["probe"].endswith(":0.1.0")
    kinds = {e["kind"] for e in doc["evidence"]["api"]}
    assert {"node", "pods", "kubelet_configz", "goroutine_dump", "kubelet_healthz",
            "lease"} <= kinds
    (dump,) = [e for e in doc["evidence"]["api"] if e["kind"] == "goroutine_dump"]
    assert "GetPreferredAllocation" in dump["text"] and dump["bytes"] >= len(dump["text"])
    # the node's pods (one list by spec.nodeName); the agent lookup is recorded too
    (pods,) = [e for e in doc["evidence"]["api"] if e["kind"] == "pods"
               and ["fieldSelector", "spec.nodeName=gpu-1"] in e["query"]
               and e["path"] == "/api/v1/pods"]
    env = {e["name"]: e["value"] for p in pods["items"] if p["metadata"]["name"] == "train-0"
           for e in p["spec"]["containers"][0]["env"]}
    assert env == {"DB_PASSWORD": bundle.REDACTED, "MODEL": bundle.REDACTED}
    assert any(e["kind"] == "events" for e in doc["evidence"]["api"])


def test_probe_ndjson_is_kept(fc, tmp_path):
    _, _, path = _run(fc, tmp_path, "json")
    doc = json.loads(path.read_text())
    kinds = [r["kind"] for r in doc["evidence"]["probe_ndjson"]]
    assert kinds and kinds[-1] == "summary" and "finding" in kinds


@pytest.mark.parametrize("content,msg", [
    (b"not json", "not JSON"),
    (b'{"schema": "other"}', "not a gpu-doctor bundle"),
    (json.dumps({"schema": bundle.SCHEMA, "report": {"findings": "x"}}).encode(),
     "malformed"),
])
def test_bad_bundle_is_one_usage_error(tmp_path, content, msg):
    p = tmp_path / "b.json"
    p.write_bytes(content)
    with pytest.raises(errors.UsageError) as ei:
        bundle.load(str(p))
    assert msg in ei.value.one_line()
    with pytest.raises(errors.UsageError):
        bundle.load(str(tmp_path / "missing.json"))


def test_redaction_rules():
    assert bundle.redact_text("--password=hunter2 x") == f"--password={bundle.REDACTED} x"
    assert bundle.redact_text("Authorization: Bearer abcdefghijkl") == \
        f"Authorization: {bundle.REDACTED}"
    assert bundle.redact_text("GetPreferredAllocation stuck") == "GetPreferredAllocation stuck"
    assert bundle.redact_argv(["--api-key", "k", "--client-secret=z", "node"]) == \
        ["--api-key", bundle.REDACTED, f"--client-secret={bundle.REDACTED}", "node"]

"""What a bundle keeps (issue 21 items 2 and 3): an allow-list of fields, tested with a corpus of
real secret shapes placed where tenants put them (annotations, event messages, container args
and env, finding titles, the command line), and a scrubber that is linear on hostile text,
bounded by this process's own CPU accounting."""
from __future__ import annotations

import datetime as dt
import io
import json
import os
import resource
import subprocess
import sys

import pytest

from kubectl_gpudoctor import errors
from kubectl_gpudoctor.api.kube import Kube
from kubectl_gpudoctor.commands import node
from kubectl_gpudoctor.reach import probe_run
from kubectl_gpudoctor.report import bundle, bundle_keep
from kubectl_gpudoctor.report.output import Output
from node_probe.protocol import catalog

from tests.kubectl.conftest import DATA
from tests.kubectl.fakecluster import cut_odd
from tests.kubectl.kubelet_dump import healthy_kubelet_dump
from tests.kubectl.test_bundle import fc  # noqa: F401 - fixture: the fake API server

JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ."
       "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c")
AWS = "AKIAIOSFODNN7EXAMPLE"
PEM = ("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA1pemBODYpemBODYpemBODY0000\n"
       "qwertyPEMsecretLINE2\n-----END RSA PRIVATE KEY-----")
CLIENT_KEY = "LS0tLS1CRUdJTiBFQyBQUklWQVRFIEtFWS0tLS0tCk1IY0NBUUVFSUNsaWVudEtleURhdGE="
# every value below must not appear anywhere in the bundle
SECRETS = {
    "annotation under a secret-looking key": "hunter2-annotation",
    "JSON password in an annotation": "S3cr3t-json-annotation",
    "JSON password in a kept annotation": "S3cr3t-kept-annotation",
    "password in a URL": "urlpass-77",
    "JSON password in an event": "S3cr3t-json-event",
    "kubeconfig client-key-data": CLIENT_KEY,
    "PEM private key": "qwertyPEMsecretLINE2",
    "bare JWT": JWT.split(".")[2],
    "--db-password X": "dbpass-argv-1",
    "--jwt=...": "jwt-flag-value-2",
    "-pX": "mysqlpass3",
    "AWS access key id": AWS,
    "env value": "env-value-4",
    "event text in a title": "title-secret-5",
    "the tool's command line": "cli-token-6",
    # round-3 audit S-13 (t3-repro/r01_save_secrets.py): a password inside a `sh -c` string,
    # mysql's documented short password form (https://dev.mysql.com/doc/refman/8.4/en/
    # command-line-options.html: with -p the password value, when given, follows the option
    # letter with no space; `mysql -ptest` is password "test"), and the value of a label whose
    # key names a secret
    "-pX inside sh -c": "hunter2-Sup3rSecret",
    "AWS secret in sh -c": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "label api-token": "tok-a1b2c3d4e5",
}


def _tenant_pod(fc):
    now = dt.datetime.now(dt.timezone.utc)
    p = fc.add_pod("ml", "train-0", "gpu-1", gpus=1)
    c = p["spec"]["containers"][0]
    c["command"] = ["mysql", "-u", "root", f"-p{SECRETS['-pX']}"]
    c["args"] = ["--db-password", SECRETS["--db-password X"], f"--jwt={SECRETS['--jwt=...']}",
                 "--model", "llama"]
    c["env"] = [{"name": "MODEL_TOKEN", "value": SECRETS["env value"]},
                {"name": "AWS_ACCESS_KEY_ID", "value": AWS}]
    p["metadata"]["annotations"] = {
        "db-password": SECRETS["annotation under a secret-looking key"],
        "app.example.com/config": json.dumps({"user": "svc", "password":
                                              SECRETS["JSON password in an annotation"]}),
        "nvidia.com/extra": json.dumps({"password": SECRETS["JSON password in a kept annotation"]}),
        "conn": f"postgres://app:{SECRETS['password in a URL']}@db:5432/x",
        "hami.io/vgpu-node": "gpu-1",
    }
    p["metadata"]["labels"]["team"] = "ml"
    p["metadata"]["labels"]["api-token"] = SECRETS["label api-token"]
    p["spec"]["containers"].append({"name": "migrate", "image": "mysql:8.4", "command": [
        "sh", "-c", f"AWS_SECRET_ACCESS_KEY={SECRETS['AWS secret in sh -c']} "
                    f"mysql -p{SECRETS['-pX inside sh -c']} -h db < /init.sql"]})
    fc.add_event(p, "Warning", "FailedCreate",
                 'webhook said: {"username": "a", "password": "'
                 + SECRETS["JSON password in an event"] + '"} client-key-data: ' + CLIENT_KEY
                 + f" token {JWT} aws {AWS}\n{PEM}", "kubelet", now)
    return p


def _bundle(fc, tmp_path) -> tuple[str, dict]:
    fc.add_node("gpu-1")
    _tenant_pod(fc)
    fc.goroutines["gpu-1"] = healthy_kubelet_dump()
    fc.configz["gpu-1"] = {"cpuManagerPolicy": "static", "cgroupDriver": "systemd",
                           "staticPodURLHeader": {"X-Token": [SECRETS["env value"]]},
                           "authentication": {"x509": {"clientCAFile": "/etc/ca"}}}
    fc.log_chunks = cut_odd((DATA / "probe_stream.ndjson").read_bytes())
    kube = Kube(str(fc.kubeconfig(tmp_path / "kc")))
    out = Output("json", "warning", {"kind": "node", "name": "gpu-1", "node": "gpu-1"},
                 out=io.StringIO(), err=io.StringIO(), progress=False)
    rec = bundle.Recorder()
    rec.attach_kube(kube)
    rec.attach_output(out)
    settings = probe_run.Settings(namespace="default", timeout_s=20, trace_s=0,
                                  start_timeout_s=2)
    error = None
    try:
        node.diagnose_node(kube, "gpu-1", settings, out)
    except errors.GpuDoctorError as exc:
        error = exc
    # an analysis copies event text into a title (pod.pending_explained does)
    out.finding(catalog.make("pod.pending_explained", "warning", "pod/ml/train-0",
                             f"FailedMount: password={SECRETS['event text in a title']}"))
    code = int(out.exit_status(None))
    doc = bundle.build(out, code, error, rec,
                       ["kubectl-gpu_doctor", "node", "gpu-1", "--token",
                        SECRETS["the tool's command line"]])
    path = tmp_path / "b.json"
    bundle.write(str(path), doc)
    return path.read_text(), doc


def test_no_secret_of_the_corpus_is_kept(fc, tmp_path):
    raw, doc = _bundle(fc, tmp_path)
    leaked = {what: s for what, s in SECRETS.items() if s in raw}
    assert leaked == {}
    assert "BEGIN RSA PRIVATE KEY" not in raw


def test_what_the_bundle_keeps_is_still_evidence(fc, tmp_path):
    raw, doc = _bundle(fc, tmp_path)
    (pods,) = [e for e in doc["evidence"]["api"] if e["kind"] == "pods"
               and e["path"] == "/api/v1/pods"
               and ["fieldSelector", "spec.nodeName=gpu-1"] in e["query"]]
    (pod,) = [p for p in pods["items"] if p["metadata"]["name"] == "train-0"]
    md, c = pod["metadata"], pod["spec"]["containers"][0]
    assert md["namespace"] == "ml" and md["labels"]["team"] == "ml"
    assert md["annotations"]["hami.io/vgpu-node"] == "gpu-1"          # read by the analysis
    assert md["annotations"]["db-password"].startswith(bundle.REDACTED)  # name kept, value not
    assert c["args"] == ["--db-password", bundle.REDACTED, f"--jwt={bundle.REDACTED}",
                         "--model", "llama"]
    assert c["command"] == ["mysql", "-u", "root", "-p" + bundle.REDACTED]
    assert pod["spec"]["containers"][1]["command"] == [
        "sh", "-c", f"AWS_SECRET_ACCESS_KEY={bundle.REDACTED} mysql -p{bundle.REDACTED} -h db "
                    f"< /init.sql"]
    assert md["labels"]["api-token"] == bundle.REDACTED
    assert [e["name"] for e in c["env"]] == ["MODEL_TOKEN", "AWS_ACCESS_KEY_ID"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] in ("1", 1)
    assert "volumes" not in pod["spec"] and "managedFields" not in md
    (cfg,) = [e for e in doc["evidence"]["api"] if e["kind"] == "kubelet_configz"]
    assert cfg["object"] == {"kubeletconfig": {"cpuManagerPolicy": "static",
                                               "cgroupDriver": "systemd"}}
    events = [e for e in doc["evidence"]["api"] if e["kind"] == "events"]
    msgs = [i["message"] for e in events for i in e.get("items") or ()]
    assert any(m.startswith("webhook said:") and "<redacted private key>" in m for m in msgs)
    assert any(f["id"] == "pod.pending_explained" and f["title"].startswith("FailedMount:")
               for f in doc["report"]["findings"])
    assert "verdict" in doc["report"]   # kept for readers, scrubbed like the rest


@pytest.mark.parametrize("text,want", [
    ('{"password": "hunter2"}', '{"password": "<redacted>"}'),
    ("client-key-data: LS0tabc", "client-key-data: <redacted>"),
    ("--db-password hunter2 --x", "--db-password <redacted> --x"),
    ("--jwt=abc.def", "--jwt=<redacted>"),
    (f"id {AWS} end", "id <redacted> end"),
    (f"x {JWT} y", "x <redacted> y"),
    ("Authorization: Bearer abcdefghijkl", "Authorization: <redacted>"),
    ("mysql://u:pw123@h/db", "mysql://u:<redacted>@h/db"),
    (f"a\n{PEM}\nb", "a\n<redacted private key>\nb"),
    ("-----BEGIN PRIVATE KEY-----\nno end", "<redacted private key>"),
    ("GetPreferredAllocation stuck for 10m", "GetPreferredAllocation stuck for 10m"),
    ("Back-off pulling image nvcr.io/x:1", "Back-off pulling image nvcr.io/x:1"),
])
def test_scrub_shapes(text, want):
    assert bundle_keep.scrub(text) == want


@pytest.mark.parametrize("word,want", [
    ("mysql -phunter2 -h db", "mysql -p<redacted> -h db"),
    ('mysql -u root -p"pw with space" db', 'mysql -u root -p"<redacted>" db'),
    ("cd /x && mysql -p'pw' db", "cd /x && mysql -p'<redacted>' db"),
    ("mkdir -p /data && run", "mkdir -p /data && run"),       # -p with no glued value
    ("ssh -p 2222 host", "ssh -p 2222 host"),
    ("train.py --lr=1e-4 -p", "train.py --lr=1e-4 -p"),
    ("x-pnot-a-flag", "x-pnot-a-flag"),
])
def test_a_password_glued_to_p_inside_a_shell_string_is_redacted(word, want):
    assert bundle_keep.scrub_argv(["sh", "-c", word]) == ["sh", "-c", want]


def test_label_values_are_kept_unless_the_key_names_a_secret():
    kept = bundle_keep.keep({"metadata": {"labels": {
        "app.kubernetes.io/name": "trainer", "api-token": "tok-1", "db_password": "x",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}}, bundle_keep.POD)
    assert kept["metadata"]["labels"] == {
        "app.kubernetes.io/name": "trainer", "api-token": bundle.REDACTED,
        "db_password": bundle.REDACTED, "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


# -- linear and bounded ------------------------------------------------------------------------

HOSTILE = {  # 200 KiB each: legal annotation values a tenant can set
    "word run": "a" * 200 * 1024,
    "keyword run": "token" * 40 * 1024,
    "keyword words": "tokentokentokentokentokentokentoken-tokentokentokentoken " * 3500,
    "separators": "password=" * 22 * 1024,
    "quotes": '"password": "' * 15 * 1024,
    "dashes": "--password " * 18 * 1024,
    "jwt starts": "eyJ" * 68 * 1024,
    "pem begins": "-----BEGIN RSA PRIVATE KEY-----" * 6600,
    "bearer": "bearer " * 29 * 1024,
    "url": "http://" * 29 * 1024,
    "short p": "-p" * 100 * 1024,
    "short p quotes": '-p"' * 68 * 1024,
    "short p words": " -pa" * 50 * 1024,
}


def test_scrubbing_hostile_text_is_linear_in_cpu():
    """Every hostile shape at 200 KiB, scrubbed as a kept annotation, a free-text message and
    an argv word: bounded CPU (process_time is this process's own accounting). The old
    redactor needed ~80 s of CPU for one 64 KiB word run."""
    t0 = resource.getrusage(resource.RUSAGE_SELF)
    for text in HOSTILE.values():
        bundle_keep.scrub(text)
        bundle_keep.scrub(text, bundle_keep.MAX_BIG_TEXT)
        bundle_keep.scrub_argv([text, "--token", text])
        bundle_keep.keep({"metadata": {"annotations": {"nvidia.com/x": text, "x": text},
                                       "labels": {"a": text[:63], text[:63]: text[:63]}}},
                         bundle_keep.POD)
    t1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (t1.ru_utime - t0.ru_utime) + (t1.ru_stime - t0.ru_stime)
    assert cpu < 5.0, f"{cpu:.1f} s of CPU"


def test_save_of_a_node_with_a_200kib_annotation_is_bounded(tmp_path):
    """`node X --save` end to end, in a child whose CPU is limited (RLIMIT_CPU: a spinning
    redactor dies of SIGXCPU instead of hanging the suite); its CPU by getrusage(CHILDREN)."""
    script = tmp_path / "save.py"
    script.write_text(f"""
import pathlib, sys
from tests.kubectl.fakecluster import FakeCluster
from tests.kubectl.kubelet_dump import healthy_kubelet_dump
from tests.security.test_bundle_secrets import HOSTILE
from kubectl_gpudoctor import cli
fc = FakeCluster(); fc.add_node("gpu-1")
for i, v in enumerate(HOSTILE.values()):
    p = fc.add_pod("ml", f"p{{i}}", "gpu-1")
    p["metadata"]["annotations"] = {{"nvidia.com/n": v, "note": v}}
    p["spec"]["containers"][0]["args"] = [v[:100000]]
fc.goroutines["gpu-1"] = healthy_kubelet_dump()
fc.start()
try:
    kc = fc.kubeconfig(pathlib.Path({str(tmp_path)!r}) / "kc")
    rc = cli.main(["node", "gpu-1", "--kubeconfig", str(kc), "--no-probe", "-o", "json",
                   "--save", {str(tmp_path / "b.json")!r}])
finally:
    fc.stop()
sys.exit(rc)
""")
    def limit():
        resource.setrlimit(resource.RLIMIT_CPU, (120, 120))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=600, preexec_fn=limit, env={**os.environ, "PYTHONPATH": os.getcwd()})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert r.returncode in (0, 1, 4), (r.returncode, r.stderr[-2000:])
    doc = json.loads((tmp_path / "b.json").read_text())
    assert doc["schema"] == bundle.SCHEMA
    assert cpu < 60, f"{cpu:.1f} s of CPU"


def test_the_goroutine_excerpt_is_linear_in_the_number_of_goroutines():
    """A dump of 120,000 goroutines, a quarter of them in device-plugin calls (the old excerpt
    tested each block for membership in the list of hot ones: quadratic, minutes of CPU)."""
    hot, cold = "k8s.io/kubelet/cm/devicemanager.Allocate", "main.loop"
    blocks = [f"goroutine {i} [select]:\n{hot if i % 4 else cold}(0x{i:x})"
              for i in range(120000)]
    t0 = resource.getrusage(resource.RUSAGE_SELF)
    out = bundle.goroutine_excerpt("\n\n".join(blocks))
    t1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (t1.ru_utime - t0.ru_utime) + (t1.ru_stime - t0.ru_stime)
    assert "devicemanager" in out and "more goroutine block(s) not kept" in out
    assert cpu < 5.0, f"{cpu:.1f} s of CPU"


def test_every_part_of_the_report_is_scrubbed():
    """The report's parts beyond findings and checks (the verdict the report leads with, and
    any part added later) keep their strings only scrubbed."""
    rep = {"target": {"kind": "node", "name": "gpu-1"}, "findings": [], "checks": [],
           "error": None, "summary_record": None,
           "verdict": {"headline": f"FailedMount: password={SECRETS['event text in a title']}",
                       "steps": [{"command": f"curl -H 'Authorization: Bearer {JWT}'"}]},
           "later_part": [f"token={SECRETS['env value']}"]}
    kept = json.dumps(bundle.keep_report(rep))
    assert SECRETS["event text in a title"] not in kept and JWT not in kept
    assert SECRETS["env value"] not in kept and "FailedMount" in kept

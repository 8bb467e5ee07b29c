"""The JSON Schema of `-o json` (kubectl_gpudoctor/schema/gpu-doctor-v1.schema.json, shipped as
package data; docs/gpu-doctor-v1.schema.json is the same file) holds for every command's
document: node (healthy, wedged, unknown: an error document), pod, nodes, replay of a saved
bundle, local, version, agent status, node --history, and the MCP `nodes` answer (issue 36.5).
A schema that accepted anything would pass these, so it is also shown to refuse documents a bot
must not be handed."""
from __future__ import annotations

import json
from importlib import resources

import jsonschema
import pytest

from kubectl_gpudoctor.commands.mcp_calls import shape_nodes

from .conftest import REPO, run_cli
from .fakeexec import ExecCluster
from .test_cli_cluster import healthy_node, wedged_node
from .test_fit_cli import pending


def schema() -> dict:
    return json.loads(resources.files("kubectl_gpudoctor").joinpath(
        "schema/gpu-doctor-v1.schema.json").read_text())


def validator() -> jsonschema.Draft202012Validator:
    s = schema()
    jsonschema.Draft202012Validator.check_schema(s)
    return jsonschema.Draft202012Validator(s)


def doc_of(*args: str, codes=(0, 1)) -> dict:
    r = run_cli(*args, "-o", "json", timeout=120)
    assert r.returncode in codes, (args, r.returncode, r.stderr)
    return json.loads(r.stdout)


def test_the_docs_carry_the_packaged_schema():
    assert json.loads((REPO / "docs" / "gpu-doctor-v1.schema.json").read_text()) == schema()


def test_every_cluster_commands_document_is_valid(cluster, kubeconfig, tmp_path):
    healthy_node(cluster, "gpu-1")
    wedged_node(cluster, "gpu-2")
    pending(cluster, gpus=16, scheduler_says="0/3 nodes are available: 3 Insufficient "
            "nvidia.com/gpu.")
    kc = f"--kubeconfig={kubeconfig}"
    bundle = tmp_path / "b.json.gz"
    docs = {
        "node healthy": doc_of("node", "gpu-1", "--no-probe", kc),
        "node wedged": doc_of("node", "gpu-2", "--no-probe", kc, "--save", str(bundle)),
        "node unknown": doc_of("node", "gpu-9", "--no-probe", kc, codes=(3,)),
        "pod": doc_of("pod", "trainer-0", "-n", "ml", "--no-probe", kc),
        "nodes": doc_of("nodes", kc),
        "nodes --all": doc_of("nodes", "--all", kc),
        "version": doc_of("version"),
    }
    docs["replay"] = doc_of("replay", str(bundle))
    docs["mcp nodes"] = shape_nodes(docs["nodes"], 1)
    v = validator()
    for what, d in docs.items():
        errs = sorted(v.iter_errors(d), key=lambda e: e.path)
        assert not errs, (what, [f"{list(e.path)}: {e.message}" for e in errs[:5]])
    assert docs["node unknown"]["error"]["message"] == "node gpu-9 not found"
    assert docs["replay"]["replay"]["untrusted"] is True


def test_local_agent_status_and_history_documents_are_valid(tmp_path):
    v = validator()
    local = doc_of("local", "--only", "driver", "--trace-seconds", "0", "--timeout", "15",
                   "--fail-on", "never", codes=(0,))
    assert local["reach"]["how"] == "local"
    xc = ExecCluster()
    xc.start()
    try:
        kc = str(xc.kubeconfig(tmp_path / "kc"))
        xc.add_node("gpu-a")
        status = doc_of("agent", "status", "--kubeconfig", kc)
        hist = run_cli("node", "gpu-a", "--history", "-o", "json", "--kubeconfig", kc)
    finally:
        xc.stop()
    docs = {"local": local, "agent status": status}
    if hist.stdout.strip():  # no agent on the node: exit 3 with one line and no document
        docs["history"] = json.loads(hist.stdout)
    for what, d in docs.items():
        errs = list(v.iter_errors(d))
        assert not errs, (what, [f"{list(e.path)}: {e.message}" for e in errs[:5]])
    assert v.is_valid({"node": "gpu-a", "bundles": [{"n": 1, "captured_at": None,
                                                     "condition": "GpuDoctorGpuLost",
                                                     "bytes": 2048}]})


@pytest.mark.parametrize("bad", [
    {},                                                   # nothing
    {"schema": "gpu-doctor/v2"},                          # another schema
])
def test_the_schema_refuses_what_a_bot_must_not_get(cluster, kubeconfig, bad):
    healthy_node(cluster, "gpu-1")
    good = doc_of("node", "gpu-1", "--no-probe", f"--kubeconfig={kubeconfig}")
    v = validator()
    assert v.is_valid(good)
    assert not v.is_valid({**good, **bad} if bad else bad)
    broken = json.loads(json.dumps(good))
    broken["findings"] = [{"id": "x.y", "severity": "fatal", "subject": "", "title": "",
                           "evidence": {}, "remediation": "", "refs": []}]
    assert not v.is_valid(broken)  # a severity outside the four
    broken = json.loads(json.dumps(good))
    broken["exit_code"] = 5
    assert not v.is_valid(broken)
    broken = json.loads(json.dumps(good))
    broken["findings"] = [{"id": "x.y", "severity": "info", "subject": "", "title": "",
                           "evidence": {}, "remediation": "", "refs": [],
                           "quoted": [{"text": "no source"}]}]
    assert not v.is_valid(broken)  # a quote always names its source and field

"""How a run that fails ends, through the one `cli.main`: the report collected so far is still
rendered once (JSON/YAML carry an `error` object), ONE line on stderr, the code from
errors.exit_status_of combined with the findings by the documented precedence."""
from __future__ import annotations

import json
import re

import yaml

from .conftest import one_error_line, run_cli
from .test_cli_cluster import healthy_node


def test_launch_error_keeps_the_api_findings_and_names_the_error_in_json(cluster, kubeconfig):
    healthy_node(cluster)
    cluster.forbid.append(("POST", re.compile(r"/pods$")))
    r = run_cli("node", "gpu-1", "--kubeconfig", str(kubeconfig), "-o", "json")
    line = one_error_line(r.stderr)
    doc = json.loads(r.stdout)
    assert r.returncode == doc["exit_code"] == 3
    assert doc["error"]["type"] == "Forbidden" and doc["error"]["message"] in line
    assert "kubelet.config" in {f["id"] for f in doc["findings"]}
    assert doc["summary"]["complete"] is False
    assert "not allowed to create pods" in doc["summary"]["incomplete_reason"]


def test_yaml_document_carries_the_error_too(cluster, kubeconfig):
    healthy_node(cluster)
    cluster.forbid.append(("POST", re.compile(r"/pods$")))
    r = run_cli("node", "gpu-1", "--kubeconfig", str(kubeconfig), "-o", "yaml")
    doc = yaml.safe_load(r.stdout)
    assert doc["exit_code"] == r.returncode == 3 and doc["error"]["type"] == "Forbidden"


def test_an_unknown_node_is_a_document_for_bots_and_nothing_for_humans(cluster, kubeconfig):
    r = run_cli("node", "nope", "--kubeconfig", str(kubeconfig), "-o", "json")
    doc = json.loads(r.stdout)
    assert r.returncode == doc["exit_code"] == 3 and doc["findings"] == []
    assert doc["error"] == {"type": "NotFound", "message": "node nope not found"}
    assert "node nope not found" in one_error_line(r.stderr)
    r = run_cli("node", "nope", "--kubeconfig", str(kubeconfig))
    assert r.returncode == 3 and r.stdout == ""


def test_cleanup_that_cannot_delete_is_a_cluster_error_line(cluster, kubeconfig):
    from kubectl_gpudoctor.reach import debugpod
    cluster.add_node("gpu-1")
    body = debugpod.manifest("gpu-1", "default", "cccc0003")
    cluster.pods[("default", body["metadata"]["name"])] = body
    cluster.forbid.append(("DELETE", re.compile(r"/pods/gpu-doctor-")))
    r = run_cli("cleanup", "-A", "--kubeconfig", str(kubeconfig))
    assert r.returncode == 3
    assert "deleted 0 gpu-doctor debug pod(s)" in r.stdout
    assert "could not delete 1 gpu-doctor debug pod(s): default/gpu-doctor-" in \
        one_error_line(r.stderr)

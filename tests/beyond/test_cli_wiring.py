"""The analyses beyond the seeds reach users: `kubectl gpu-doctor pod|node --no-probe` as a real
subprocess, through the real kubernetes client, against the fake API server."""
from __future__ import annotations

import json

import pytest

from tests.beyond.api_objects import claim, device_class, event, pod, resource_slice
from tests.kubectl.conftest import run_cli
from tests.kubectl.fakecluster import FakeCluster

NODE = "gpu-node-1"


@pytest.fixture
def fake():
    fc = FakeCluster().start()
    try:
        yield fc
    finally:
        fc.stop()


def serve_dra(fc, slices, claims, classes):
    fc.lists["/apis/resource.k8s.io/v1/resourceslices"] = ("ResourceSliceList", slices)
    fc.lists["/apis/resource.k8s.io/v1/resourceclaims"] = ("ResourceClaimList", claims)
    fc.lists["/apis/resource.k8s.io/v1/deviceclasses"] = ("DeviceClassList", classes)


def test_pod_pending_on_a_dra_claim_explained(fake, tmp_path):
    fake.add_node(NODE)
    p = pod("train-0", claim_name="c1")
    fake.pods[("ml", "train-0")] = p
    serve_dra(fake, [resource_slice(NODE, driver="net.example.com")], [claim("c1")],
              [device_class()])
    kc = fake.kubeconfig(tmp_path / "kc")
    r = run_cli("pod", "train-0", "-n", "ml", "--kubeconfig", str(kc), "--no-probe", "-o", "json")
    doc = json.loads(r.stdout)
    f = [x for x in doc["findings"] if x["id"] == "dra.claim_unallocated"]
    assert f, (r.stderr, [x["id"] for x in doc["findings"]])
    assert f[0]["evidence"]["reason"] == "no_resource_slices"
    assert r.returncode == 1


def test_node_with_failed_mig_config_and_missing_runtime_handler(fake, tmp_path):
    n = fake.add_node(NODE, labels={"nvidia.com/mig.config": "all-1g.10gb",
                                    "nvidia.com/mig.config.state": "failed"})
    assert n["metadata"]["labels"]["nvidia.com/mig.config.state"] == "failed"
    p = fake.add_pod("ml", "infer-0", NODE, phase="Pending", gpus=1, events="none")
    p["spec"]["runtimeClassName"] = "nvidia"
    fake.events.append(event(p, "FailedCreatePodSandBox", 'Failed to create pod sandbox: rpc '
                             'error: code = Unknown desc = failed to get sandbox runtime: no '
                             'runtime for "nvidia" is configured', count=12))
    fake.lists["/apis/node.k8s.io/v1/runtimeclasses"] = ("RuntimeClassList", [
        {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"},
         "handler": "nvidia"}])
    kc = fake.kubeconfig(tmp_path / "kc")
    r = run_cli("node", NODE, "--kubeconfig", str(kc), "--no-probe", "-o", "json")
    doc = json.loads(r.stdout)
    got = {x["id"]: x for x in doc["findings"]}
    assert got["mig.config_failed"]["severity"] == "critical", (r.stderr, list(got))
    assert got["runtime.handler_missing"]["evidence"]["pods"] == ["ml/infer-0"]
    checks = {c["id"]: c["status"] for c in doc["checks"]}
    assert checks.get("api.extra_lists") == "skipped"  # no DRA API served: said so


def test_healthy_node_stays_quiet(fake, tmp_path):
    fake.add_node(NODE, labels={"nvidia.com/mig.config": "all-disabled",
                                "nvidia.com/mig.config.state": "success"})
    fake.add_pod("ml", "train-1", NODE, phase="Running", gpus=1)
    serve_dra(fake, [resource_slice(NODE)], [claim("c9", allocated=(NODE, ["gpu-0"]))],
              [device_class()])
    kc = fake.kubeconfig(tmp_path / "kc")
    r = run_cli("node", NODE, "--kubeconfig", str(kc), "--no-probe", "-o", "json")
    doc = json.loads(r.stdout)
    new_ids = ("dra.", "runtime.", "cdi.", "mig.config_failed")
    assert not [x for x in doc["findings"] if x["id"].startswith(new_ids)], doc["findings"]

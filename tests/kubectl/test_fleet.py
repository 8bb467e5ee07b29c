"""`nodes`: a whole fleet from a constant number of list calls (DESIGN.md section 8)."""
from __future__ import annotations

import json

import pytest

from .conftest import run_cli
from .fakecluster import build_fleet

LISTS = (r"/api/v1/nodes", r"/api/v1/pods", r"/api/v1/events",
         r"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases")


def list_calls(cluster) -> int:
    return sum(cluster.count("GET", rx) for rx in LISTS)


def per_node_calls(cluster) -> int:
    return sum(1 for m, p, _ in cluster.requests()
               if p.startswith("/api/v1/nodes/") or "/pods/" in p)


@pytest.mark.parametrize("nodes,pods", [(10, 300), (1000, 30000)])
def test_nodes_uses_constant_list_calls(cluster, kubeconfig, nodes, pods):
    names = build_fleet(cluster, nodes, pods, wedged=(3, 7), cpu_nodes=2)
    r = run_cli("nodes", "--kubeconfig", str(kubeconfig), "-o", "json", timeout=120)
    doc = json.loads(r.stdout)
    assert r.returncode == 1, r.stderr
    assert list_calls(cluster) == 4  # nodes, pods, events, leases: once each, whatever the size
    # only the two flagged nodes get kubelet proxy calls (goroutine dump + healthz)
    assert per_node_calls(cluster) == 4
    stalled = {f["subject"] for f in doc["findings"] if f["id"] == "kubelet.admission_stalled"}
    blocked = {f["subject"] for f in doc["findings"]
               if f["id"] == "kubelet.blocked_in_device_plugin"}
    assert stalled == blocked == {f"node/{names[3]}", f"node/{names[7]}"}
    assert doc["target"]["kind"] == "nodes"
    # the lists were served from the watch cache (resourceVersion=0)
    assert all(q.get("resourceVersion") == "0" for m, p, q in cluster.requests()
               if p in LISTS)


def test_nodes_table_and_selector(cluster, kubeconfig):
    names = build_fleet(cluster, 20, 100, wedged=(5,), cpu_nodes=3)
    r = run_cli("nodes", "--kubeconfig", str(kubeconfig), timeout=60)
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    assert lines[0].startswith("NODE") and names[5] in lines[1]
    assert "kubelet.admission_stalled" in lines[1]
    assert "20 node(s), 1 with findings, 19 without" in r.stdout  # CPU nodes left out
    r = run_cli("nodes", "-l", f"kubernetes.io/hostname={names[0]}", "--kubeconfig",
                str(kubeconfig), "-o", "json")
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["findings"] == []
    nodes_q = [q for m, p, q in cluster.requests() if p == "/api/v1/nodes"]
    assert nodes_q[-1]["labelSelector"] == f"kubernetes.io/hostname={names[0]}"

"""A hostile API server cannot grow the CLI without bound, hold it past its deadline, loop it
forever or make an incomplete run look complete (issue 21, items 5 and 8).

The server is tests/kubectl/hostile.py (the fake API server, real HTTP on 127.0.0.1); the CLI a
real process, whose peak RSS and CPU time come from the kernel's accounting of that process
(wait4). Each hostile answer would go on for minutes and gigabytes: the CLI must end it.
"""
from __future__ import annotations

import datetime as dt
import json

import pytest

from .conftest import one_error_line
from .hostile import (NODE, endless, endless_pages, repeated_token, run_measured, status,
                      trickle)
from .hostile import hc, kc  # noqa: F401 (fixtures)

RSS_LIMIT_MIB = 512


def _bounded(m, what: str) -> None:
    print(f"{what}: {m}")
    assert m.max_rss_mib < RSS_LIMIT_MIB, f"{what}: {m}"
    assert "Traceback" not in m.stderr, m.stderr[-3000:]


def test_endless_node_object_is_one_error_line(hc, kc):
    hc.hostile[f"/api/v1/nodes/{NODE}"] = endless(b'{"kind": "Node", "metadata": {"name": "')
    m = run_measured("node", NODE, "--kubeconfig", kc, "--no-probe", "--request-timeout", "20s")
    _bounded(m, "endless node object")
    line = one_error_line(m.stderr)
    assert m.returncode == 3 and f"node {NODE}" in line and "MiB" in line, line


@pytest.mark.parametrize("sub,check,head,unit", [
    ("debug/pprof/goroutine", "api.kubelet_goroutines", b"goroutine 1 [running]:\n",
     b"main.main()\n\t/x.go:1 +0x1\n" * 2048),
    ("healthz", "api.kubelet_healthz", b"[+]ping ok\n", b"[+]log ok\n" * 4096),
], ids=["goroutine dump", "healthz"])
def test_an_endless_kubelet_answer_is_skipped_not_kept(hc, kc, sub, check, head, unit):
    hc.hostile[f"/api/v1/nodes/{NODE}/proxy/{sub}"] = endless(head, unit,
                                                             content_type="text/plain")
    m = run_measured("node", NODE, "--kubeconfig", kc, "--no-probe", "-o", "json",
                     "--kubelet-timeout", "20s")
    _bounded(m, f"endless {sub}")
    assert m.returncode in (0, 1), m.stderr
    checks = {c["id"]: c for c in json.loads(m.stdout)["checks"]}
    assert checks[check]["status"] in ("skipped", "error") and "MiB" in checks[check]["message"]
    if sub != "healthz":  # an optional read: skipped, saying why
        assert checks[check]["status"] == "skipped"


def test_endless_node_list_body_is_one_error_line(hc, kc):
    hc.hostile["/api/v1/nodes"] = endless(b'{"kind": "NodeList", "metadata": {}, "items": [',
                                          b'{"metadata": {"name": "n"}}, ' * 2048)
    m = run_measured("nodes", "--kubeconfig", kc, "--request-timeout", "60s", timeout=180)
    _bounded(m, "endless node list page")
    line = one_error_line(m.stderr)
    assert m.returncode == 3 and "nodes" in line and "MiB" in line, line


def pod_items(n: int, start: int) -> list[dict]:
    return [{"metadata": {"name": f"p-{start + i:07d}", "namespace": "ml",
                          "uid": f"u-{start + i}"},
             "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "x"}]},
             "status": {"phase": "Running"}} for i in range(n)]


@pytest.mark.parametrize("what", ["nodes", "pods"])
def test_a_list_that_never_ends_is_one_error_line(hc, kc, what):
    if what == "nodes":
        hc.hostile["/api/v1/nodes"] = endless_pages(per_page=1000)
    else:
        hc.hostile["/api/v1/pods"] = endless_pages("PodList", 1000, pod_items)
    m = run_measured("nodes", "--kubeconfig", kc, timeout=300)
    _bounded(m, f"endless {what} list pages")
    line = one_error_line(m.stderr)
    assert m.returncode == 3 and what in line and "pages" in line, line


def fat_pod_items(n: int, start: int) -> list[dict]:
    """Pods the fleet keeps whole (Pending, so not a steady skeleton), each with a 24 KB
    annotation: far under the item bound, far over the memory one."""
    return [{"metadata": {"name": f"fat-{start + i:07d}", "namespace": "ml",
                          "uid": f"u-{start + i}",
                          "annotations": {"note": f"{start + i:07d}" + "x" * 24_000}},
             "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "x"}]},
             "status": {"phase": "Pending"}} for i in range(n)]


def test_memory_is_bounded_by_bytes_not_only_by_items(hc, kc):
    """Audit L-01: 199,990 fat pods took the CLI past 512 MiB under the 200,000-item bound. A
    list of pods that are each kept whole must stop at the memory bound, long before the item
    one, with one error line that says how to narrow it."""
    hc.hostile["/api/v1/pods"] = endless_pages("PodList", 500, fat_pod_items)
    m = run_measured("nodes", "--kubeconfig", kc, timeout=300)
    _bounded(m, "pods each kept whole")
    line = one_error_line(m.stderr)
    assert m.returncode == 3 and "too large to analyse in the memory" in line, line
    assert "-l SELECTOR" in line and "MiB" in line, line
    served = hc.hostile["/api/v1/pods"].served[0]
    assert served * 500 < 100_000, served  # stopped by bytes, not by the item count


def test_a_repeated_continue_token_is_an_error_not_a_loop(hc, kc):
    hc.hostile["/api/v1/nodes"] = repeated_token()
    m = run_measured("nodes", "--kubeconfig", kc, timeout=120)
    _bounded(m, "repeated continue token")
    line = one_error_line(m.stderr)
    assert m.returncode == 3 and "continue" in line, line
    assert hc.hostile["/api/v1/nodes"].served[0] <= 3


# -- item 8: a read that failed makes the run incomplete ------------------------------------

@pytest.mark.parametrize("path", ["/api/v1/pods",
                                  f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/"
                                  f"leases/{NODE}"], ids=["pods", "lease"])
def test_node_with_pods_or_lease_answering_500_is_incomplete(hc, kc, path):
    hc.leases[NODE] = {"metadata": {"name": NODE}, "spec": {
        "holderIdentity": NODE, "renewTime": dt.datetime.now(dt.timezone.utc).strftime(
            "%Y-%m-%dT%H:%M:%S.000000Z"), "leaseDurationSeconds": 40}}
    hc.hostile[path] = status(500)
    m = run_measured("node", NODE, "--kubeconfig", kc, "--no-probe", "-o", "json")
    doc = json.loads(m.stdout)
    assert m.returncode == 4, (m.returncode, m.stderr)
    assert doc["summary"]["complete"] is False


def test_a_trickling_pod_list_holds_node_only_for_its_deadline(hc, kc):
    hc.hostile["/api/v1/pods"] = trickle(b'{"kind": "PodList", "items": [', b" ", 0.2)
    m = run_measured("node", NODE, "--kubeconfig", kc, "--no-probe", "-o", "json",
                     "--request-timeout", "3s")
    _bounded(m, "trickling pod list")
    assert m.wall_s < 30, m  # a 10x hang guard: the list trickles for minutes
    assert m.returncode == 4, (m.returncode, m.stderr)
    doc = json.loads(m.stdout)
    assert doc["summary"]["complete"] is False
    assert {c["id"]: c["status"] for c in doc["checks"]}["api.pods"] == "error"


def test_nodes_with_leases_answering_500_is_incomplete(hc, kc):
    hc.hostile["/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"] = status(500)
    m = run_measured("nodes", "--kubeconfig", kc, "-o", "json")
    assert m.returncode == 4, (m.returncode, m.stderr)
    assert json.loads(m.stdout)["summary"]["complete"] is False


# -- linear work on tenant input ------------------------------------------------------------

def test_30000_warning_events_of_one_pod_are_deduplicated_in_linear_time(hc, kc):
    pod = hc.add_pod("ml", "train-0", NODE, gpus=1)
    when = dt.datetime.now(dt.timezone.utc)
    for i in range(30000):
        hc.add_event(pod, "Warning", "FailedMount", f"mount failed {i}", "kubelet", when)
    hc.cache_lists = True
    m = run_measured("node", NODE, "--kubeconfig", kc, "--no-probe", "-o", "json",
                     timeout=300)
    _bounded(m, "30,000 Warning events of one pod")
    assert m.returncode in (0, 1), m.stderr
    assert m.cpu_s < 30, m  # quadratic: ~130 s of CPU; linear: a few seconds

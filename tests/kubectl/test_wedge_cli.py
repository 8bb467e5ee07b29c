"""`node X` / `pod Y` on the captured wedge: decided from the API side, no debug pod created.

The fake API server serves the real 1.35 captures (node, pods, events, Lease, goroutine dump,
/healthz?verbose, /configz) with their timestamps moved to now, so the CLI judges them as the
real kubelet's state at capture time. GPU Feature Discovery labels are added to the captured
node (the capture's node had none) for the driver verdict.
"""
from __future__ import annotations

import datetime as dt
import json
import re
import time

import pytest

from kubectl_gpudoctor.analysis.common import parse_time

from .conftest import DATA, run_cli
from .fakecluster import cut_odd
from .test_captures import CAPTURES, GFD_570_158, NODE

_TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
POD_CREATE = r"/api/v1/namespaces/[^/]+/pods"


def _shift(obj, delta: dt.timedelta):
    if isinstance(obj, dict):
        return {k: _shift(v, delta) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_shift(v, delta) for v in obj]
    if isinstance(obj, str) and _TS.match(obj):
        t = parse_time(obj) + delta
        frac = "." in obj
        return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if frac else "%Y-%m-%dT%H:%M:%SZ")
    return obj


def load_stage(cluster, stage: str, gfd: bool = True) -> None:
    """The captured stage as the fake's state, `now` = the stage's capture time."""
    lease = json.loads((CAPTURES / f"{stage}-lease.json").read_text())
    delta = dt.datetime.now(dt.timezone.utc) - parse_time(lease["spec"]["renewTime"])

    def doc(name):
        return _shift(json.loads((CAPTURES / name).read_text()), delta)

    node = doc(f"{stage}-node.json")
    if gfd:
        node["metadata"]["labels"].update(GFD_570_158)
    cluster.nodes[NODE] = node
    cluster.leases[NODE] = _shift(lease, delta)
    for p in doc(f"{stage}-pods.json")["items"]:
        cluster.pods[(p["metadata"]["namespace"], p["metadata"]["name"])] = p
    cluster.events.extend(doc(f"{stage}-events.json")["items"])
    cluster.goroutines[NODE] = (CAPTURES / f"{stage}-goroutines.txt").read_text()
    cluster.healthz[NODE] = (200, (CAPTURES / f"{stage}-healthz-verbose.txt").read_text())
    cluster.configz[NODE] = json.loads((CAPTURES / "configz.json").read_text())["kubeletconfig"]
    cluster.debug_pod_mode = "pending"   # the wedged kubelet would never admit it


@pytest.mark.parametrize("stage", ["wedged-20s", "wedged-3m"])
def test_known_wedge_is_reported_without_creating_a_pod(cluster, kubeconfig, stage):
    load_stage(cluster, stage)
    t0 = time.monotonic()
    r = run_cli("node", NODE, "--kubeconfig", str(kubeconfig), "-o", "json")
    wall = time.monotonic() - t0
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    by = {}
    for f in doc["findings"]:
        by.setdefault(f["id"], f)
    blocked = by["kubelet.blocked_in_device_plugin"]
    assert blocked["severity"] == "critical"
    assert blocked["evidence"]["resource"] == ["nvidia.com/gpu"]
    assert blocked["evidence"]["admitting_pod"] == "default/gdscn-gpu"
    drv = by["driver.known_bad"]
    assert drv["severity"] == "critical" and drv["evidence"]["driver_version"] == "570.158.01"
    assert drv["evidence"]["resource"] == ["nvidia.com/gpu"]
    assert drv["title"].startswith("likely root cause: NVIDIA driver 570.158.01")
    skipped = by["probe.pod_not_started"]
    assert skipped["evidence"]["created"] is False
    assert any(w.startswith(f"ssh {NODE}") for w in skipped["evidence"]["ways_in"])
    assert cluster.count("POST", POD_CREATE) == 0
    assert cluster.created == []
    # no pod and no pod wait are proven above (nothing created); the 5 s budget of DESIGN
    # section 8 is a quiet-machine number (bench/), so here only a 10x hang guard
    assert wall < 50, wall


def test_pod_command_on_the_wedge_names_the_plugin_without_a_pod(cluster, kubeconfig):
    load_stage(cluster, "wedged-20s")
    r = run_cli("pod", "gdscn-gpu", "-n", "default", "--kubeconfig", str(kubeconfig),
                "-o", "json")
    assert r.returncode == 1, r.stderr
    ids = {f["id"] for f in json.loads(r.stdout)["findings"]}
    assert {"kubelet.blocked_in_device_plugin", "driver.known_bad",
            "pod.pending_explained", "probe.pod_not_started"} <= ids
    assert cluster.count("POST", POD_CREATE) == 0


def test_force_pod_creates_it_anyway(cluster, kubeconfig):
    load_stage(cluster, "wedged-20s")
    r = run_cli("node", NODE, "--kubeconfig", str(kubeconfig), "-o", "json", "--force-pod",
                "--start-timeout", "2")
    doc = json.loads(r.stdout)
    assert cluster.count("POST", POD_CREATE) == 1
    assert cluster.deleted, "the debug pod is deleted on every path"
    nc = [f for f in doc["findings"] if f["id"] == "probe.pod_not_started"]
    assert nc and nc[0]["evidence"].get("created") is not False


@pytest.mark.parametrize("root_private", [False, True])
def test_healthy_capture_runs_the_probe_even_where_root_is_private(cluster, kubeconfig,
                                                                   root_private):
    """The real kubelet refused the old debug pod on a node whose / is private (exit 3, no
    node-side result); the pod without mount propagation runs there."""
    load_stage(cluster, "healthy", gfd=False)
    cluster.debug_pod_mode = "run"
    cluster.root_private = root_private
    cluster.log_chunks = cut_odd((DATA / "probe_stream.ndjson").read_bytes())
    r = run_cli("node", NODE, "--kubeconfig", str(kubeconfig), "-o", "json",
                "--start-timeout", "10s")
    assert r.returncode != 3, r.stderr
    doc = json.loads(r.stdout)
    assert cluster.count("POST", POD_CREATE) == 1
    assert {c["id"]: c["status"] for c in doc["checks"]}["node.probe"] == "ok"
    assert doc["summary"]["complete"] is True
    assert cluster.count("DELETE", POD_CREATE + "/gpu-doctor-[^/]+") == 1


def test_nodes_names_a_known_bad_driver_where_the_layout_triggers_it(cluster, kubeconfig):
    """`nodes` over a fleet: the node whose GFD labels say 570.158.01 and which advertises
    full GPUs beside MIG slices gets driver.known_bad (warning: nothing wedged yet); the same
    driver without MIG slices, and a fixed driver, stay quiet."""
    mig = {"nvidia.com/mig-1g.10gb": 2}
    cluster.add_node("gpu-a", gpus=2, labels=GFD_570_158, extra_capacity=mig)
    cluster.add_node("gpu-b", gpus=2, labels=GFD_570_158)
    cluster.add_node("gpu-c", gpus=2, extra_capacity=mig, labels=dict(
        GFD_570_158, **{"nvidia.com/cuda.driver.minor": "172", "nvidia.com/cuda.driver.rev": "08"}))
    r = run_cli("nodes", "--kubeconfig", str(kubeconfig), "-o", "json")
    doc = json.loads(r.stdout)
    drv = [f for f in doc["findings"] if f["id"] == "driver.known_bad"]
    assert [(f["subject"], f["severity"]) for f in drv] == [("node/gpu-a", "warning")]
    assert drv[0]["evidence"]["trigger_present"] is True
    assert cluster.count("POST", POD_CREATE) == 0

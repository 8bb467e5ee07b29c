"""An API server that answers with the wrong JSON types is a cluster problem, never an internal
error (round-3 audit U-40: a node whose `metadata` was a string, or a pod list whose items were
numbers, ended `node X` with exit 70 and "AttributeError: 'str' object has no attribute 'get'").

Fuzz-like: every field of the node, its pods, their events and the node's Lease as the fake API
server (tests/kubectl/fakecluster.py, faithful to ../shared/captures/k8s-1.35) serves them is
replaced, one at a time, by a value of another JSON type, and `node X` (API side) and `pod Y`
run in-process and render their table. Each run must end in the report or in one of the
tool's own errors (exit 3, or an incomplete run, exit 4), never in another exception.
"""
from __future__ import annotations

import copy
import datetime as dt
import io
from pathlib import Path
from typing import Any, Iterator

import pytest

from kubectl_gpudoctor import errors
from kubectl_gpudoctor.api import shape
from kubectl_gpudoctor.api.kube import Kube
from kubectl_gpudoctor.commands import node as node_cmd
from kubectl_gpudoctor.reach import probe_run
from kubectl_gpudoctor.report.output import Output
from tests.kubectl.fakecluster import FakeCluster
from tests.kubectl.conftest import run_cli

NODE, NS = "gpu-1", "ml"
POD_PATH = "/api/v1/pods"
EVENTS_PATH = f"/api/v1/namespaces/{NS}/events"
LEASE_PATH = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{NODE}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[tuple[FakeCluster, Kube, dict]]:
    fc = FakeCluster()
    fc.add_node(NODE, gpus=8)
    now = dt.datetime.now(dt.timezone.utc)
    run = fc.add_pod(NS, "train-0", NODE, gpus=1)
    fc.add_pod(NS, "train-1", NODE, phase="Pending", gpus=1, age_s=900,
               events="scheduled-only")
    fc.add_event(run, "Warning", "BackOff", "Back-off restarting failed container main",
                 "kubelet", now, host=NODE)
    fc.start()
    kube = Kube(str(fc.kubeconfig(tmp_path_factory.mktemp("kc") / "kc")))
    docs = {
        f"/api/v1/nodes/{NODE}": fc.nodes[NODE],
        POD_PATH: {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "9"},
                   "items": [p for p in fc.pods.values()]},
        EVENTS_PATH: {"kind": "EventList", "apiVersion": "v1",
                      "metadata": {"resourceVersion": "9"}, "items": list(fc.events)},
        LEASE_PATH: fc.leases[NODE],
    }
    try:
        yield fc, kube, copy.deepcopy(docs)
    finally:
        fc.stop()


def _other(v: Any) -> Any:
    """A value of another JSON type than `v` (the one most likely to be read wrongly)."""
    if isinstance(v, dict):
        return "x"
    if isinstance(v, list):
        return {"a": 1}
    if isinstance(v, bool):
        return "true"
    if isinstance(v, (int, float)):
        return "7"
    return ["x"] if v else 5


def _paths(v: Any, path: tuple = (), max_items: int | None = None) -> Iterator[tuple]:
    """Every field and every list item (the first `max_items` of each list), outermost
    first (test_replay_type_confusion walks bundles with it too)."""
    if path:
        yield path
    if isinstance(v, dict):
        for k, sub in v.items():
            yield from _paths(sub, path + (k,), max_items)
    elif isinstance(v, list):
        for i, sub in enumerate(v[:max_items]):
            yield from _paths(sub, path + (i,), max_items)


def _mutated(doc: Any, path: tuple) -> Any:
    doc = copy.deepcopy(doc)
    cur = doc
    for k in path[:-1]:
        cur = cur[k]
    cur[path[-1]] = _other(cur[path[-1]])
    return doc


def _cases(docs: dict) -> list[tuple[str, tuple]]:
    return [(p, f) for p, doc in docs.items() for f in _paths(doc)]


def _run(kube: Kube, what: str) -> None:
    out = Output("table", "warning", {"kind": "node", "name": NODE, "node": NODE},
                 out=io.StringIO(), err=io.StringIO(), progress=False)
    settings = probe_run.Settings(namespace=NS, timeout_s=5, trace_s=0, probe=False,
                                  agent=False, kubelet_timeout_s=2)
    error = None
    try:
        if what == "node":
            node_cmd.diagnose_node(kube, NODE, settings, out)
        else:
            node_cmd.diagnose_pod(kube, NS, "train-1", settings, out)
    except errors.GpuDoctorError as exc:   # the tool's own: one line and its exit code
        error = exc
    code = int(out.exit_status(error.exit_status if error else None))
    out.finish(code, error=None if error is None else {"type": type(error).__name__,
                                                         "message": str(error)})


def test_every_field_of_another_type_is_a_cluster_answer_never_a_crash(cluster):
    fc, kube, docs = cluster
    crashed = []
    cases = _cases(docs)
    assert len(cases) > 200       # the fixture's objects really are walked
    for path, field in cases:
        fc.answer.clear()
        fc.answer.update(docs)
        fc.answer[path] = _mutated(docs[path], field)
        for what in ("node", "pod"):
            try:
                _run(kube, what)
            except Exception as exc:  # noqa: BLE001 - what the test is looking for
                crashed.append(f"{what}: {path} {'.'.join(map(str, field))}: "
                               f"{type(exc).__name__}: {exc}")
    fc.answer.clear()
    assert crashed == []


BAD_PODS = {"kind": "PodList", "items": [1, "x", None, [], {"metadata": 5, "spec": "y"}]}


@pytest.mark.parametrize("argv,path,doc,want", [
    (["node", NODE, "--no-probe"], f"/api/v1/nodes/{NODE}",
     {"kind": "Node", "metadata": "x", "status": [1, 2], "spec": 7},
     "node.metadata is a string, not an object"),
    (["node", NODE, "--no-probe"], POD_PATH, BAD_PODS, "items[0] is a number, not an object"),
    (["nodes"], POD_PATH, BAD_PODS, "an item.metadata is a number, not an object"),
    (["nodes"], "/api/v1/nodes", {"kind": "NodeList", "items": [{"metadata": {"labels": []}}]},
     "metadata.labels is an array, not an object"),
    # a Running pod whose status lists a null container status: `nodes` ended in exit 70
    # (AttributeError in slim's steady-pod test) before the shape refused null list objects
    (["nodes"], POD_PATH, {"kind": "PodList", "items": [{
        "metadata": {"name": "p", "namespace": NS, "uid": "u1"},
        "spec": {"nodeName": NODE, "containers": [{"name": "main"}]},
        "status": {"phase": "Running", "containerStatuses": [None]}}]},
     "status.containerStatuses[0] is null, not an object"),
])
def test_the_audits_answers_are_one_line_and_the_documented_code(tmp_path, argv, path, doc,
                                                                 want):
    """The audit's two cases end to end (t3-repro/r10_api_hostile.py node_json_wrong_types,
    node_pods_items_not_dicts), and `nodes` over the same lists: exit 3 for the node itself
    or a list `nodes` needs; the node's pod list unreadable makes `node X` incomplete (exit 4)
    and says why. Never 70, never a traceback."""
    fc = FakeCluster()
    fc.add_node(NODE)
    fc.add_pod(NS, "train-0", NODE, gpus=1)
    fc.start()
    try:
        fc.answer[path] = doc
        r = run_cli("--kubeconfig", str(fc.kubeconfig(tmp_path / "kc")), *argv)
    finally:
        fc.stop()
    assert r.returncode in (3, 4), (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr
    assert want in r.stderr + r.stdout


def test_the_schemas_accept_what_a_real_api_server_sends():
    """The 1.35 captures (../shared/captures/k8s-1.35, copied to tests/data) pass the check:
    a healthy node stays quiet."""
    import json
    root = Path(__file__).resolve().parents[1] / "data" / "captures" / "k8s-1.35"
    seen = 0
    for f in sorted(root.glob("*-node.json")):
        shape.check_answer(f"/api/v1/nodes/{NODE}", json.loads(f.read_text()))
        seen += 1
    for f in sorted(root.glob("*-pods.json")):
        shape.check_answer(POD_PATH, json.loads(f.read_text()))
        seen += 1
    for f in sorted(root.glob("*-events.json")):
        shape.check_answer(EVENTS_PATH, json.loads(f.read_text()))
        seen += 1
    for f in sorted(root.glob("*-lease.json")):
        shape.check_answer(LEASE_PATH, json.loads(f.read_text()))
        seen += 1
    assert seen >= 10


def test_a_malformed_item_on_a_page_a_child_parses_is_the_same_error():
    """`nodes` parses big lists in child processes (api/pageparse.py): a child told the page's
    schema meets the wrong type, gives up on the page, and the CLI's own parse of it raises the
    same Malformed the pager turns into exit 3."""
    import json

    from kubectl_gpudoctor.api import pageparse, slim
    fc = FakeCluster()
    good = fc.add_pod(NS, "train-0", NODE, gpus=1)
    raw = json.dumps({"kind": "PodList", "metadata": {}, "items": [
        good, {"metadata": {"name": "p"}, "status": {"containerStatuses": [
            {"name": "main", "restartCount": "x"}]}}]}).encode()
    sid = shape.schema_id(POD_PATH)
    with pageparse.ParsePool(1) as pp:
        fut = pp.submit(raw, pageparse.KIND_PODS | sid << pageparse.KIND_BITS)
        with pytest.raises(shape.Malformed, match=r"restartCount is a string, not an integer"):
            pp.result(fut, lambda: raw, shape.checking(slim.PodCompactor(), sid))
        assert pp.pages == 0     # the child did not pass it off as parsed

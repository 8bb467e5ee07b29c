"""List pages parsed in child processes (pageparse.py): the same items as parsing in the CLI,
in page order; a child that dies or is killed costs nothing but speed (the page is parsed in
the CLI); a page that is not JSON is one clear API error; children run in their own session
(Ctrl-C reaches only the CLI) and exit when the pool closes."""
from __future__ import annotations

import json
import os
import time

import pytest

from kubectl_gpudoctor import errors
from kubectl_gpudoctor.api import pageparse
from kubectl_gpudoctor.api import pager
from kubectl_gpudoctor.api import slim
from kubectl_gpudoctor.api.kube import Kube

from .fakecluster import FakeCluster, build_fleet


@pytest.fixture
def fleet(tmp_path):
    fc = FakeCluster()
    build_fleet(fc, 25, 2500, wedged=(3,), fat=True)
    fc.start()
    try:
        yield fc, Kube(str(fc.kubeconfig(tmp_path / "kc")))
    finally:
        fc.stop()


def _gone(proc, within_s: float = 10.0) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            return True
        time.sleep(0.02)
    return False


@pytest.mark.parametrize("each", [slim.slim, "pods", "pods with container ids"])
def test_children_parse_the_same_items_in_order(fleet, each):
    fc, kube = fleet
    for p in fc.pods.values():
        for c in p["status"].get("containerStatuses") or ():
            c["containerID"] = "containerd://" + p["metadata"]["uid"].replace("-", "")
    mk = {"pods": lambda: slim.PodCompactor(),
          "pods with container ids": lambda: slim.PodCompactor(container_ids=True)
          }.get(each, lambda: each)
    here, pages_here = pager.list_items(kube, "/api/v1/pods", page_size=300, each=mk())
    with pageparse.ParsePool(2) as pp:
        assert pp.workers == 2
        there, pages_there = pager.list_items(kube, "/api/v1/pods", page_size=300,
                                              each=mk(), parsers=pp)
        assert pp.pages == pages_there == pages_here == 9  # every page went to a child
    assert there == here  # same reduced objects, same (key) order
    assert len(there) == len(fc.pods)
    steady = next(p for p in there if p["status"]["phase"] == "Running")
    assert "managedFields" not in steady["metadata"]
    ids = [c.get("containerID") for c in steady["status"].get("containerStatuses") or ()]
    assert ids == ([] if each == "pods" else [
        "containerd://" + steady["metadata"]["uid"].replace("-", "")])
    stuck = next(p for p in there if p["metadata"]["name"] == "neal-3-0")
    assert stuck["status"]["phase"] == "Pending"  # kept whole: a verdict is about it


def test_a_dead_child_costs_only_speed(fleet):
    fc, kube = fleet
    here, _ = pager.list_items(kube, "/api/v1/pods", page_size=300)
    with pageparse.ParsePool(2) as pp:
        got, _ = pager.list_items(kube, "/api/v1/pods", page_size=300, parsers=pp)
        assert got == here and len(pp.children) == 2
        pp.children[0].kill()  # e.g. the OOM killer
        got, _ = pager.list_items(kube, "/api/v1/pods", page_size=300, parsers=pp)
        assert got == here
        pp.children[1].kill()
        pp.children[1].proc.wait(10)
        pp.children[0].proc.wait(10)
        before = len(fc.requests())
        got, pages = pager.list_items(kube, "/api/v1/pods", page_size=300, parsers=pp)
        assert got == here
        # the CLI keeps no copy of a page it sent to a child: each page is fetched again
        # (same continue token) and parsed here
        again = [q for m, p, q in fc.requests()[before:] if p == "/api/v1/pods"]
        assert len(again) == 2 * pages
        tokens = [q.get("continue") for q in again]
        assert all(tokens.count(t) == 2 for t in tokens)


def test_non_json_page_is_an_api_error(fleet, monkeypatch):
    fc, kube = fleet
    real = kube.request
    calls = []

    def request(method, path, query=None, **kw):
        calls.append(1)
        if len(calls) == 2:
            return b'{"metadata": {}, "items": [ <html>'
        return real(method, path, query, **kw)

    monkeypatch.setattr(kube, "request", request)
    with pageparse.ParsePool(2) as pp:
        with pytest.raises(errors.ApiError, match="non-JSON"):
            pager.list_items(kube, "/api/v1/pods", page_size=300, parsers=pp)
        assert all(c.proc.poll() is None for c in pp.children)  # a bad page kills nothing


def test_children_own_session_and_exit_on_close():
    pp = pageparse.ParsePool(2)
    assert pp.children == []  # started with the first page sent
    try:
        fut = pp.submit(json.dumps({"items": [{"metadata": {"name": "a",
                                                           "managedFields": [{}]}}]}).encode(),
                        pageparse.KIND_SLIM)
        items, token, size = fut.result(timeout=30)
        assert (items, token) == ([{"metadata": {"name": "a"}}], None) and size > 0
        procs = [c.proc for c in pp.children]
        assert len(procs) == 2
        for p in procs:  # Ctrl-C goes to the terminal's foreground group: not to them
            assert os.getsid(p.pid) == p.pid != os.getsid(0)
    finally:
        pp.close()
    assert all(_gone(p) for p in procs)
    assert [p.returncode for p in procs] == [0, 0]


def test_no_children_on_one_cpu(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert pageparse.default_workers() == 0
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert pageparse.default_workers() == 2


# -- the item-by-item parser agrees with json.loads --------------------------------------

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3) |
                     st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=12)


# generation speed is not what is tested: a loaded machine must not fail the health check
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=st.lists(st.dictionaries(st.text(max_size=5), _json, max_size=4), max_size=5),
       token=st.none() | st.text(min_size=1, max_size=10), indent=st.sampled_from([None, 0, 2]),
       items_first=st.booleans(), extra=st.dictionaries(st.sampled_from(["kind", "x"]), _json))
def test_parse_page_agrees_with_json_loads(items, token, indent, items_first, extra):
    meta = {"resourceVersion": "1", **({"continue": token} if token else {})}
    doc = {"items": items, "metadata": meta} if items_first else {"metadata": meta,
                                                                   "items": items}
    doc = {**extra, **doc}
    raw = (" \n" + json.dumps(doc, indent=indent) + "\n").encode()
    assert pageparse.parse_page(raw, None) == (json.loads(raw)["items"], token)


@pytest.mark.parametrize("raw", [
    b'{"metadata": {}, "items": [ <html>', b'{"items": [{}]', b'{"items": [{}] } x',
    b'<html>502</html>', b'{"items": [{},]}', b'{"items" [{}]}', b'', b'\xff\xfe{}',
    b'{"items": [{}], }'])
def test_parse_page_refuses_what_json_loads_refuses(raw):
    with pytest.raises(ValueError):
        json.loads(raw)
    with pytest.raises(pageparse.NotJson):
        pageparse.parse_page(raw, slim.slim)


def test_parse_page_odd_but_valid_documents():
    assert pageparse.parse_page(b'[1, 2]', slim.slim) == ([], None)  # not a list object
    assert pageparse.parse_page(b'{}', slim.slim) == ([], None)
    assert pageparse.parse_page(b'{"items": []}', slim.slim) == ([], None)
    # a repeated key: the last one counts, as in json.loads
    assert pageparse.parse_page(b'{"items": [1], "items": [2]}', None) == ([2], None)
    # items that are not objects are kept as they are, not reduced
    assert pageparse.parse_page(b'{"items": [1, {"metadata": {"managedFields": []}}]}',
                                slim.slim) == ([1, {"metadata": {}}], None)


def test_short_lists_start_no_children(fleet):
    """A list of one page, or of a page and less than two more, is parsed in the CLI: a child
    would cost more to start than it saves."""
    fc, kube = fleet
    with pageparse.ParsePool(2) as pp:
        n = len(fc.pods)  # 2,503
        items, pages = pager.list_items(kube, "/api/v1/pods", page_size=2600, parsers=pp)
        assert (len(items), pages) == (n, 1)
        items, pages = pager.list_items(kube, "/api/v1/pods", page_size=1000, parsers=pp)
        assert (len(items), pages) == (n, 3)  # 1,503 left after the first: < 2 pages
        assert pp.children == [] and pp.pages == 0
        items, pages = pager.list_items(kube, "/api/v1/pods", page_size=800, parsers=pp)
        assert (len(items), pages) == (n, 4)
        assert len(pp.children) == 2 and pp.pages == 4  # the first page starts them


def test_slim_drops_a_nodes_image_list_and_keeps_what_analyses_read():
    node = {"kind": "Node", "metadata": {"name": "n", "labels": {"a": "b"},
                                         "managedFields": [{"manager": "kubelet"}]},
            "status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"},
                       "conditions": [{"type": "Ready", "status": "True"}],
                       "nodeInfo": {"kubeletVersion": "v1.35.0"},
                       "images": [{"names": [f"registry/img:{i}"], "sizeBytes": 1} for i in
                                  range(50)]}}
    raw = json.dumps({"items": [node]}).encode()
    (got,), _ = pageparse.parse_page(raw, slim.slim)
    assert "images" not in got["status"] and "managedFields" not in got["metadata"]
    assert got["status"]["capacity"] == node["status"]["capacity"]
    assert got["status"]["nodeInfo"] == node["status"]["nodeInfo"]
    assert got["metadata"]["labels"] == {"a": "b"}


def test_a_closed_pool_stops_the_list_at_once(fleet, monkeypatch):
    """Ctrl-C (or a failed sibling list) closes the pool while a list is walking: the walk
    stops with PoolClosed instead of fetching and parsing the rest of the pages itself."""
    fc, kube = fleet
    real = kube.request
    pp = pageparse.ParsePool(2)
    calls = []

    def request(method, path, query=None, **kw):
        calls.append(1)
        if len(calls) == 3:
            pp.close()
        return real(method, path, query, **kw)

    monkeypatch.setattr(kube, "request", request)
    t0 = time.monotonic()
    with pytest.raises(pageparse.PoolClosed):
        pager.list_items(kube, "/api/v1/pods", page_size=300, parsers=pp)
    assert time.monotonic() - t0 < 10  # not PAGE_TIMEOUT_S per page
    assert len(calls) <= 5  # of 9 pages: the walk stopped
    procs = [c.proc for c in pp.children]
    assert procs and all(_gone(p) for p in procs)


def test_each_member_name_reaches_the_cli_as_one_string():
    """json decodes each item with a fresh memo of member names and marshal shares only what
    is one object in the child, so every node and event used to arrive in the CLI with its own
    copy of each name (~50 bytes each: ~20 MiB over 5,000 nodes and 12,000 events). Names are
    interned as they are decoded (slim.DECODER): one string per name, here and from a child;
    the items are the same."""
    from pathlib import Path
    from kubectl_gpudoctor.api import shape
    cap = Path(__file__).resolve().parents[1] / "data/captures/k8s-1.35/healthy-node.json"
    real = json.loads(cap.read_text())  # what a 1.35 API server sent for a GPU node
    nodes = []
    for i in range(40):
        n = json.loads(json.dumps(real))
        n["metadata"]["name"] = f"gpu-{i:03d}"
        nodes.append(n)
    raw = json.dumps({"metadata": {"continue": "t"}, "items": nodes}).encode()
    sid = shape.schema_id("/api/v1/nodes")
    each = shape.checking(slim.slim, sid)

    def copies(items: list) -> int:  # string objects per member name, most of any name
        ids: dict = {}
        todo = list(items)
        while todo:
            o = todo.pop()
            if isinstance(o, dict):
                for k, v in o.items():
                    ids.setdefault(k, set()).add(id(k))
                    todo.append(v)
            elif isinstance(o, list):
                todo += o
        return max(len(v) for v in ids.values())

    here, token = pageparse.parse_page(raw, each)
    with pageparse.ParsePool(1) as pp:
        there, token2, _ = pp.result(pp.submit(raw, pageparse.KIND_SLIM
                                               | sid << pageparse.KIND_BITS), lambda: raw, each)
        assert pp.pages == 1
    want = [slim.slim(json.loads(json.dumps(n))) for n in nodes]
    assert here == there == want and token == token2 == "t"
    assert copies(here) == 1 and copies(there) == 1

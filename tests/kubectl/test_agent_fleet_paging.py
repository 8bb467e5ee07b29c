"""Paged lists for the fleet scan: the fake API server honours limit/continue like the real one
(key order, opaque token, remainingItemCount, 410 for an expired token), and pager.list_items
walks the pages, slims each object and restarts once on 410."""
from __future__ import annotations

import pytest

from kubectl_gpudoctor import errors
from kubectl_gpudoctor.api import pager
from kubectl_gpudoctor.api import slim
from kubectl_gpudoctor.api.kube import Kube

from .fakecluster import FakeCluster, build_fleet


@pytest.fixture
def fleet(tmp_path):
    fc = FakeCluster()
    build_fleet(fc, 25, 2500, fat=True)
    fc.start()
    try:
        yield fc, Kube(str(fc.kubeconfig(tmp_path / "kc")))
    finally:
        fc.stop()


def test_fake_pages_like_the_api_server(fleet):
    fc, kube = fleet
    first = kube.get_json("/api/v1/pods", [("limit", "1000")])
    assert len(first["items"]) == 1000
    assert first["metadata"]["remainingItemCount"] == 1500
    keys = [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in first["items"]]
    assert keys == sorted(keys)  # etcd key order
    nxt = kube.get_json("/api/v1/pods", [("limit", "1000"),
                                         ("continue", first["metadata"]["continue"])])
    assert (nxt["items"][0]["metadata"]["namespace"], nxt["items"][0]["metadata"]["name"]) > \
        keys[-1]
    # a watch-cache read (resourceVersion=0) ignores limit, as it did before 1.34
    assert len(kube.get_json("/api/v1/pods", [("limit", "10"), ("resourceVersion", "0")])[
        "items"]) == 2500
    with pytest.raises(errors.BadRequest):
        kube.get_json("/api/v1/pods", [("limit", "10"), ("continue", "garbage")])


def test_list_items_walks_every_page_and_slims(fleet):
    fc, kube = fleet
    items, pages = pager.list_items(kube, "/api/v1/pods", page_size=1000)
    assert pages == 3
    assert len(items) == 2500
    assert {p["metadata"]["name"] for p in items} == {k[1] for k in fc.pods}
    reqs = [q for m, p, q in fc.requests() if p == "/api/v1/pods"]
    assert [q.get("limit") for q in reqs] == ["1000"] * 3
    assert [bool(q.get("continue")) for q in reqs] == [False, True, True]
    assert all("resourceVersion" not in q for q in reqs)
    p = items[0]
    assert "managedFields" not in p["metadata"] and "volumes" not in p["spec"]
    assert "env" not in p["spec"]["containers"][0]
    # what the analyses read is still there
    assert p["spec"]["containers"][0]["resources"] and p["status"]["phase"]
    assert p["metadata"]["ownerReferences"] and p["spec"]["tolerations"]


def test_small_list_is_one_call(fleet):
    fc, kube = fleet
    items, pages = pager.list_items(kube, "/api/v1/nodes", page_size=1000)
    assert pages == 1 and len(items) == 25


def test_expired_token_restarts_once_then_fails(fleet):
    fc, kube = fleet
    fc.continue_expired = True
    with pytest.raises(errors.Gone):
        pager.list_items(kube, "/api/v1/pods", page_size=1000)
    reqs = [q for m, p, q in fc.requests() if p == "/api/v1/pods"]
    # page 1, 410, restart: page 1, 410 -> give up
    assert [bool(q.get("continue")) for q in reqs] == [False, True, False, True]


def test_pod_compactor_keeps_what_verdicts_read(fleet):
    fc, kube = fleet
    pods = list(fc.pods.values())
    steady = next(p for p in pods if p["status"]["phase"] == "Running")
    stuck = fc.add_pod("ml", "stuck-0", "gpu-0001", phase="Pending", gpus=1, age_s=600,
                       events="scheduled-only")
    hami = fc.add_pod("ml", "vgpu-0", "gpu-0001", gpus=1)
    hami["metadata"]["annotations"] = {"hami.io/vgpu-devices-allocated": "GPU-x,NVIDIA,1000,30"}
    crashing = fc.add_pod("ml", "crash-0", "gpu-0001", gpus=1)
    crashing["status"]["containerStatuses"][0]["restartCount"] = 4
    c = slim.PodCompactor()
    import json as _json
    s = c(_json.loads(_json.dumps(steady)))
    assert set(s) == {"metadata", "spec", "status"}
    assert s["spec"]["nodeName"] == steady["spec"]["nodeName"]
    assert s["spec"]["containers"] == [{"name": "main", "resources":
                                        steady["spec"]["containers"][0]["resources"]}]
    assert s["status"]["phase"] == "Running"
    assert s["metadata"]["uid"] == steady["metadata"]["uid"]
    # identical parts of two replicas are one object
    other = next(p for p in pods if p is not steady and p["status"]["phase"] == "Running"
                 and p["spec"]["containers"][0]["resources"] ==
                 steady["spec"]["containers"][0]["resources"])
    o = c(_json.loads(_json.dumps(other)))
    assert o["spec"]["containers"] is s["spec"]["containers"]
    assert o["metadata"]["annotations"] is s["metadata"]["annotations"]
    # pods a verdict may be about stay whole
    for p in (stuck, hami, crashing):
        kept = c(_json.loads(_json.dumps(p)))
        assert kept["status"] == p["status"] and kept["metadata"]["name"] == p["metadata"]["name"]
        assert "managedFields" not in kept["metadata"]

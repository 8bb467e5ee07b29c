"""`nodes` folds the pod list into per-node tallies page by page (analysis/resources/podfold.py,
issue 41): the findings are the ones the whole list gives, only the pods a verdict reads are kept,
and the paged path stays right when the cluster moves under it (a pod that changes nodes between
pages), when etcd compacts the continue token (410 Gone: the list starts over, each pod counted
once) and when a page is cut short (one error, no half-folded answer)."""
from __future__ import annotations

import datetime as dt
import json

import pytest

from kubectl_gpudoctor import analysis, errors
from kubectl_gpudoctor.analysis.scheduling import gpu_held
from kubectl_gpudoctor.analysis.resources import memory, podfold
from kubectl_gpudoctor.analysis.common import events_by_uid
from kubectl_gpudoctor.api import pager, slim
from kubectl_gpudoctor.api.kube import Kube
from kubectl_gpudoctor.commands.nodes import _black_hole_context

from .conftest import run_cli
from .fakecluster import EXPIRED_CONTINUE, FakeCluster, add_black_hole, build_fleet
from .test_agent_fleet_paging import fleet  # noqa: F401 - fixture (25 nodes, 2,500 fat pods)


def _mixed_fleet(fc: FakeCluster) -> list[str]:
    """Steady pods, plus every kind the fold must keep: a wedged node's pending pods, a black
    hole's rejected pods with its controller's recent pods elsewhere, crash-looping and
    terminating pods, HAMi and DRA pods, pods without a memory limit and one whose limit
    nearly fills its node (memory.overcommit), a HAMi device-plugin pod."""
    names = build_fleet(fc, 12, 600, wedged=(2,))
    now = dt.datetime.now(dt.timezone.utc)
    add_black_hole(fc, names[5], "ml", "trainer-7d9c8b5f4", rejected=4, gone=3,
                   elsewhere=names[6:10], now=now)
    crash = fc.add_pod("ml", "crash-0", names[1], gpus=1, now=now)
    crash["status"]["containerStatuses"][0]["restartCount"] = 4
    fc.add_pod("ml", "leaving-0", names[1], gpus=1, deletion_overdue_s=900, now=now)
    hami = fc.add_pod("ml", "vgpu-0", names[3], gpus=1, now=now)
    hami["metadata"]["annotations"] = {"hami.io/vgpu-devices-allocated": "GPU-x,NVIDIA,1000,30"}
    plugin = fc.add_pod("kube-system", "hami-device-plugin-x2v4k", names[3], now=now)
    plugin["status"].pop("containerStatuses")  # as the compactor leaves a steady pod
    dra = fc.add_pod("ml", "claimed-0", names[4], phase="Pending", now=now)
    dra["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "claimed-0-gpu"}]
    for i in range(3):
        fc.add_pod("batch", f"nolimit-{i}", names[8], memory_limit=None, now=now)
    fc.add_pod("batch", "hog-0", names[9], memory_limit="1000Gi", gpus=1, now=now)
    fc.add_pod("batch", "unbound-0", None, phase="Pending", now=now)
    return names


def _reduced(fc: FakeCluster) -> list[dict]:
    """The pods as the pager hands them over (slim.PodCompactor, in list order)."""
    comp = slim.PodCompactor()
    pods = [fc.pods[k] for k in sorted(fc.pods)]
    return [comp(json.loads(json.dumps(p))) for p in pods]


def _findings(fs) -> list:
    return sorted((f.id, f.subject, f.severity.value, f.title,
                   json.dumps(f.evidence, sort_keys=True, default=str)) for f in fs)


def test_folded_nodes_give_the_findings_of_the_whole_list():
    fc = FakeCluster()
    _mixed_fleet(fc)
    pods = _reduced(fc)
    ev_index = events_by_uid(fc.events)
    now = dt.datetime.now(dt.timezone.utc)
    fold = podfold.PodFold(lambda: ev_index, now)
    for i in range(0, len(pods), 97):  # pages of an odd size
        fold.page(pods[i:i + 97])
    assert fold.total == len(pods)
    # the whole list, grouped by node as `nodes` did before the fold
    by_node: dict[str, list] = {}
    listed = set()
    for p in pods:
        uid = p["metadata"]["uid"]
        if uid in ev_index:
            listed.add(uid)
        nn = p["spec"].get("nodeName")
        if nn:
            by_node.setdefault(nn, []).append(p)
    assert fold.listed == listed
    gone_all, peers_all = _black_hole_context(pods, ev_index, listed, now)
    gone, peers = _black_hole_context(list(fold.kept_pods()), ev_index, fold.listed, now)
    assert peers == peers_all and peers  # the black hole's controller is compared elsewhere
    assert {k: len(v) for k, v in gone.items()} == {k: len(v) for k, v in gone_all.items()}
    seen_ids = set()
    for node in fc.nodes.values():
        name = node["metadata"]["name"]
        whole = by_node.get(name, [])
        nf = fold.nodes.get(name) or podfold.NodeFold()
        ev_node = {p["metadata"]["uid"]: ev_index[p["metadata"]["uid"]] for p in whole
                   if p["metadata"]["uid"] in ev_index}
        assert (nf.events or {}) == ev_node
        old, _ = analysis.node_objects(node, whole, ev_node, None, now, gone=gone_all.get(
            name, ()), peers=peers_all)
        new, _ = analysis.node_objects(node, nf.kept, nf.events or {}, None, now,
                                       gone=gone.get(name, ()), peers=peers,
                                       memory_tally=nf.memory)
        assert _findings(new) == _findings(old), name
        seen_ids |= {f.id for f in new}
        assert nf.pods == len(whole)
        assert gpu_held.node_free(node, (), nf.held) == gpu_held.node_free(node, whole)
    # the fleet's findings are there to compare: the fold did not make them vanish
    assert {"node.gpu_black_hole", "kubelet.admission_stalled", "memory.overcommit"} <= seen_ids
    # only what a verdict reads is kept: the non-steady pods, the HAMi plugin, the DRA pod
    # and the black-hole controller's recent GPU pods elsewhere; not the 600 steady ones
    kept = {p["metadata"]["name"] for p in fold.kept_pods()}
    assert "hami-device-plugin-x2v4k" in kept and "crash-0" in kept and "unbound-0" in kept
    assert {"nolimit-0", "hog-0"}.isdisjoint(kept)  # tallied, not kept
    assert fold.kept < 40 and fold.total > 600


def test_memory_tally_is_the_list_computation():
    fc = FakeCluster()
    names = build_fleet(fc, 1, 30)
    for i in range(25):
        fc.add_pod("batch", f"nolimit-{i:02d}", names[0], memory_limit=None)
    for i in range(7):
        fc.add_pod("batch", f"big-{i}", names[0], memory_limit="200Gi", gpus=i % 2)
    fc.add_pod("batch", "done-0", names[0], phase="Succeeded", memory_limit="900Gi")
    pods = _reduced(fc)
    t = memory.Tally()
    for p in pods:
        t.add(p)
    node = fc.nodes[names[0]]
    got = memory.analyze_node(node, [], None, t)
    want = memory.analyze_node(node, pods, None)
    assert _findings(got) == _findings(want)
    assert want and want[0].evidence["pods_without_memory_limit_count"] == 25
    assert len(want[0].evidence["largest_limits"]) == 5


# -- the paged path -------------------------------------------------------------------------



def _fold(kube: Kube) -> tuple[podfold.PodFold, int]:
    fold = podfold.PodFold()
    items, pages = pager.list_items(kube, "/api/v1/pods", page_size=300,
                                    each=slim.PodCompactor(), into=fold)
    assert items == []  # handed to the fold, not kept
    return fold, pages


def test_a_pod_that_moves_nodes_between_pages_is_counted_once(fleet):
    fc, kube = fleet
    keys = sorted(fc.pods)
    early, late = fc.pods[keys[10]], fc.pods[keys[-10]]  # in the first page, in the last
    early_from, late_from = early["spec"]["nodeName"], late["spec"]["nodeName"]
    to = "gpu-0024" if early_from != "gpu-0024" and late_from != "gpu-0024" else "gpu-0023"

    def move(kind, page):
        if kind == "PodList" and page == 1:  # after the first page went out
            early["spec"]["nodeName"] = late["spec"]["nodeName"] = to

    fc.after_page = move
    fold, pages = _fold(kube)
    assert pages == 9 and fold.total == 2500
    assert sum(nf.pods for nf in fold.nodes.values()) == 2500
    counts = {n: nf.pods for n, nf in fold.nodes.items()}
    # the early pod where the first page said it was; the late one where its page said
    assert counts[early_from] == 100 - (early_from == late_from)
    assert counts[to] == 101
    assert counts[late_from] == 100 - (early_from == late_from) - (late_from != early_from)


def test_an_expired_continue_token_starts_the_list_over(fleet):
    fc, kube = fleet
    fold = podfold.PodFold()

    def expire(kind, page):
        if kind == "PodList" and page == 3:  # etcd compacts while page 3 is read
            fc.expire_tokens = 1

    fc.after_page = expire
    items, pages = pager.list_items(kube, "/api/v1/pods", page_size=300,
                                    each=slim.PodCompactor(), into=fold)
    reqs = [q for m, p, q in fc.requests() if p == "/api/v1/pods"]
    # pages 1-3, the 410, then the whole list again from the start (client-go's pager does
    # the same: a full list, never the Status's token for an inconsistent remainder)
    assert [bool(q.get("continue")) for q in reqs[:5]] == [False, True, True, True, False]
    assert len(reqs) == 4 + 9
    assert all("inconsistent" not in str(q.get("continue")) for q in reqs)
    assert fold.total == 2500  # each pod once: what was folded before the 410 was dropped
    assert sum(nf.pods for nf in fold.nodes.values()) == 2500
    assert all(nf.pods == 100 for nf in fold.nodes.values())


def test_the_410_is_the_real_servers_status(fleet):
    fc, kube = fleet
    first = kube.get_json("/api/v1/pods", [("limit", "300")])
    fc.expire_tokens = 1
    with pytest.raises(errors.Gone) as e:
        kube.get_json("/api/v1/pods", [("limit", "300"),
                                       ("continue", first["metadata"]["continue"])])
    assert e.value.message == EXPIRED_CONTINUE


def test_a_page_cut_short_is_one_error_not_a_half_answer(fleet, tmp_path):
    fc, kube = fleet
    fc.cut_page = 2
    fold = podfold.PodFold()
    with pytest.raises(errors.ApiError) as e:
        pager.list_items(kube, "/api/v1/pods", page_size=300, each=slim.PodCompactor(),
                         into=fold)
    assert "non-JSON" in str(e.value)
    # the CLI: one line in its words and a documented exit code, never a partial fleet
    fc.cut_page = 0
    fc.cut_next_page("PodList", 2)
    fc.watch_list = False  # the paged path: a server without streaming lists (api/watchlist.py)
    r = run_cli("nodes", "--kubeconfig", str(fc.kubeconfig(tmp_path / "kc2")), "-o", "json",
                timeout=120)
    assert r.returncode not in (0, 1, 70), r.stderr
    assert r.stdout == "" or "nodes" not in json.loads(r.stdout)
    assert r.stderr.strip() and len(r.stderr.strip().splitlines()) == 1, r.stderr


# -- S-18: `nodes --save` keeps the lists it read, the subset its verdicts came from ------------

def test_nodes_save_keeps_the_node_pod_and_event_lists(cluster, kubeconfig, tmp_path):
    from kubectl_gpudoctor.report import bundle
    names = build_fleet(cluster, 20, 300, wedged=(5,))
    path = tmp_path / "fleet.json"
    r = run_cli("nodes", "--kubeconfig", str(kubeconfig), "--save", str(path), timeout=120)
    assert r.returncode == 1, r.stderr
    doc = bundle.load(str(path))
    lists = {e["kind"]: e for e in doc["evidence"]["api"] if "items" in e}
    assert {"nodes", "pods", "events"} <= set(lists)
    nodes, pods, events = lists["nodes"], lists["pods"], lists["events"]
    # every node (a small fleet), the wedged one first; the list's own length said
    assert nodes["items_total"] == len(cluster.nodes) == len(nodes["items"])
    assert nodes["items"][0]["metadata"]["name"] == names[5]
    assert "managedFields" not in nodes["items"][0]["metadata"]  # the allow-list holds
    # the pods its verdict names (the three it never admitted), not the 300 steady ones
    assert pods["items_total"] == len(cluster.pods)
    assert sorted(p["metadata"]["name"] for p in pods["items"]) == \
        [f"neal-5-{k}" for k in range(3)]
    assert {e["involvedObject"]["name"] for e in events["items"]} == \
        {f"neal-5-{k}" for k in range(3)}
    assert all(e["subset"] for e in (nodes, pods, events))

"""Streaming lists (api/watchlist.py, KEP-3157) against the fake API server over real HTTP: the
same fold and the same findings as the paged list; the paged list, from scratch, where the
server rejects the watch-list (the WatchList gate off: the real 422), where the stream is cut
or ends with an ERROR event before its bookmark; one error line and a documented exit code
where the stream trickles past its deadline or both paths fail; an oversize line stops the
read at its cap; hostile types in an event are the tool's own errors, never a crash; and the
stream is closed as soon as the bookmark arrives (the server sees its client leave).

Sources (what the fake answers, tests/kubectl/fakewatch.py):
- the request and the bookmark: https://kubernetes.io/docs/reference/using-api/api-concepts/
  #streaming-lists and client-go's reflector (staging/src/k8s.io/client-go/tools/cache/
  reflector.go, watchList: ResourceVersion "" at first, AllowWatchBookmarks, SendInitialEvents,
  ResourceVersionMatch NotOlderThan);
- the rejection: https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/
  apimachinery/pkg/apis/meta/internalversion/validation/validation.go (validateWatchOptions)
  and staging/src/k8s.io/apiserver/pkg/endpoints/handlers/get.go (errors.NewInvalid of
  ListOptions.meta.k8s.io);
- the ERROR event: staging/src/k8s.io/apiserver/pkg/storage/cacher/watch_cache.go
  (NewResourceExpired "too old resource version: %d (%d)": 410 Expired).
"""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from kubectl_gpudoctor import errors
from kubectl_gpudoctor.analysis.resources import podfold
from kubectl_gpudoctor.api import pager, slim, watchlist
from kubectl_gpudoctor.api.kube import Kube

from .conftest import REPO, cli_env
from .fakecluster import FakeCluster, build_fleet
from .fakewatch import GATE_OFF, line
from .test_agent_fleet_paging import fleet  # noqa: F401 - fixture (25 nodes, 2,500 fat pods)
from .test_api_type_confusion import _mutated, _paths
from .test_podfold import _mixed_fleet

PODS = "/api/v1/pods"
EVENTS = ("fieldSelector", "involvedObject.kind=Pod")


def _fold_of(kube: Kube, lists=watchlist, **kw) -> tuple[podfold.PodFold, int]:
    fold = podfold.PodFold()
    items, n = lists.list_items(kube, PODS, each=slim.PodCompactor(), into=fold, **kw)
    assert items == []
    return fold, n


def _summary(fold: podfold.PodFold) -> dict:
    """What the analyses read of a fold: per node its count, held GPUs, memory tally and the
    pods kept one by one; and the unbound pods."""
    return {"total": fold.total, "unbound": sorted(p["metadata"]["name"] for p in fold.unbound),
            "nodes": {n: (f.pods, f.held, f.memory.total, f.memory.limited,
                          f.memory.unbounded_count, sorted(p["metadata"]["name"] for p in f.kept))
                      for n, f in fold.nodes.items()}}


def _paged_requests(fc: FakeCluster) -> list[dict]:
    return [q for m, p, q in fc.requests() if p == PODS and "limit" in q]


def _watch_requests(fc: FakeCluster) -> list[dict]:
    return [q for m, p, q in fc.requests() if p == PODS and q.get("watch")]


def _wait_for(cond, limit_s: float = 20.0) -> bool:
    """Wait on a state (bounded), never on a fixed sleep."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def _cli(fc: FakeCluster, tmp_path, watch: str, *args: str, timeout: float = 120):
    env = dict(cli_env(), GPU_DOCTOR_WATCH_LIST=watch)
    return subprocess.run([sys.executable, "-m", "kubectl_gpudoctor", "nodes", "--kubeconfig",
                           str(fc.kubeconfig(tmp_path / f"kc-{watch}")), *args],
                          capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=str(REPO))


@pytest.fixture
def mixed(tmp_path):
    fc = FakeCluster()
    _mixed_fleet(fc)
    fc.start()
    try:
        yield fc, Kube(str(fc.kubeconfig(tmp_path / "kc")))
    finally:
        fc.stop()


# -- the same answer --------------------------------------------------------------------------

def test_a_streaming_list_folds_what_the_paged_list_folds(mixed):
    fc, kube = mixed
    streamed, batches = _fold_of(kube, page_size=97)   # batches of an odd size
    assert fc.watches_served == 1 and not _paged_requests(fc)
    [q] = _watch_requests(fc)
    # the request client-go's reflector sends: a consistent read (no resourceVersion)
    assert (q["watch"], q["sendInitialEvents"], q["allowWatchBookmarks"],
            q["resourceVersionMatch"]) == ("1", "true", "true", "NotOlderThan")
    assert "resourceVersion" not in q and int(q["timeoutSeconds"]) > 0
    paged, _ = _fold_of(kube, pager, page_size=97)
    assert batches > 5 and streamed.total == len(fc.pods) > 600
    assert _summary(streamed) == _summary(paged)
    # the stream is closed as soon as the bookmark came: the server sees its client leave
    assert _wait_for(lambda: fc.watch_left == 1 and fc.watches_open == 0)


def test_the_cli_gives_the_same_findings_either_way_and_says_nothing_of_the_fallback(
        mixed, tmp_path):
    fc, _ = mixed

    def findings(r):
        assert r.returncode == 1, r.stderr
        doc = json.loads(r.stdout)
        rows = {row["node"]: {k: row.get(k) for k in ("ready", "pods", "gpus", "free")}
                for row in doc["nodes"]}
        return sorted((f["id"], f["subject"], f["severity"]) for f in doc["findings"]), rows

    streamed = _cli(fc, tmp_path, "1", "-o", "json")
    assert fc.watches_served == 2  # pods and events, each one streaming list
    assert not _paged_requests(fc)
    paged = _cli(fc, tmp_path, "0", "-o", "json")
    assert findings(streamed) == findings(paged)
    ids = {f[0] for f in findings(streamed)[0]}
    assert {"node.gpu_black_hole", "kubelet.admission_stalled"} <= ids
    fc.watch_list = False  # the gate off: rejected, listed page by page, nothing said
    before = fc.watches_served
    fallback = _cli(fc, tmp_path, "1", "-o", "json")
    assert fc.watches_served == before and _paged_requests(fc)
    assert findings(fallback) == findings(paged)
    assert fallback.stderr == ""


# -- a server that does not serve it, or a stream that fails: the paged list, once -----------

def test_the_watchlist_gate_off_is_the_real_422_and_the_paged_list_answers(fleet):
    fc, kube = fleet
    fc.watch_list = False
    with pytest.raises(errors.Invalid) as e:
        kube.request("GET", PODS, list(watchlist.QUERY))
    assert e.value.message == ('ListOptions.meta.k8s.io "" is invalid: sendInitialEvents: '
                               'Forbidden: ' + GATE_OFF)
    assert json.loads(e.value.body)["details"]["causes"][0]["field"] == "sendInitialEvents"
    fold, _ = _fold_of(kube)
    fc.watch_list = True
    streamed, _ = _fold_of(kube)
    assert fold.total == 2500 and _summary(fold) == _summary(streamed)


@pytest.mark.parametrize("how", ["cut", "error"])
def test_a_stream_that_ends_before_its_bookmark_is_listed_again_page_by_page(fleet, how):
    fc, kube = fleet
    if how == "cut":
        fc.watch_cut_after = 1700     # a proxy ended it: 1,700 pods folded, then nothing
    else:
        fc.watch_error_after = 1200   # the cacher's 410 Expired, as an ERROR event
    fold, _ = _fold_of(kube, page_size=500)
    assert fc.watches_served == 1 and _paged_requests(fc)
    fc.watch_cut_after = fc.watch_error_after = None
    whole, _ = _fold_of(kube)
    # started over (into.reset()): each pod once, not the streamed ones twice
    assert fold.total == 2500 and _summary(fold) == _summary(whole)


def test_both_failing_is_one_error_line_and_a_documented_exit_code(fleet, tmp_path):
    fc, _ = fleet
    fc.watch_cut_after = 10
    fc.cut_next_page("PodList", 2)
    r = _cli(fc, tmp_path, "1", "-o", "json")
    assert r.returncode == 3, r.stderr   # errors.ApiError: a cluster error (docs/cli.md)
    assert r.stdout == "" or "nodes" not in json.loads(r.stdout)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "non-JSON" in lines[0] and "pods" in lines[0], r.stderr


# -- bounded: the deadline, the line cap -------------------------------------------------------

def test_a_stream_that_trickles_past_its_deadline_is_one_error_line(fleet, tmp_path):
    fc, _ = fleet
    fc.watch_trickle_s = 0.05   # 7 bytes at a time: a pod's event would take ~25 s
    r = _cli(fc, tmp_path, "1", "--request-timeout", "3s", timeout=90)
    assert r.returncode == 3, r.stderr   # errors.ClientTimeout: a cluster error
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "client-side timeout" in lines[0], r.stderr
    assert "list pods" in lines[0] and "3s" in lines[0], lines
    assert not _paged_requests(fc)  # a deadline is not a reason to list again


def test_a_stream_earns_time_with_the_objects_it_delivers(fleet, tmp_path):
    """One request timeout for every page of objects: a list that takes longer than one
    timeout in all but delivers steadily completes (deadline.Ticket.extend)."""
    fc, _ = fleet
    kube = Kube(str(fc.kubeconfig(tmp_path / "kc-2s")), request_timeout_s=2.0)
    fc.watch_event_delay_s = 0.003   # 2,500 events, ~7.5 s in all: past the timeout
    fold, _ = _fold_of(kube, page_size=25)
    assert fold.total == 2500 and fc.watches_served == 1 and not _paged_requests(fc)


def _endless_line(first: bytes, total: int):
    """`first`, then one line of `total` bytes sent 1 MiB at a time (counted as sent)."""
    yield first
    yield b'{"type":"ADDED","object":{"metadata":{"name":"'
    for _ in range(total >> 20):
        yield b"x" * (1 << 20)
    yield b'"}}}\n'


def test_an_oversize_line_stops_at_its_cap_not_at_its_end(fleet):
    fc, kube = fleet
    pod = json.loads(json.dumps(next(iter(fc.pods.values()))))
    fc.watch_lines = _endless_line(line("ADDED", pod), 1 << 30)
    with pytest.raises(errors.TooLarge) as e:
        _fold_of(kube)
    assert f"over {watchlist.LINE_MAX_BYTES >> 20} MiB" in e.value.message
    assert fc.watch_bytes_sent < 64 << 20  # read up to the cap (and what was in flight)
    assert not _paged_requests(fc)


def test_an_answer_that_is_not_a_stream_is_listed_page_by_page(fleet):
    """A proxy that answers the watch with the list itself (one line, no event): the paged
    list, not an error."""
    fc, kube = fleet
    page = json.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": {},
                       "items": list(fc.pods.values())[:3]}).encode()
    fc.watch_lines = [page]
    fold, _ = _fold_of(kube)
    assert fold.total == 2500 and _paged_requests(fc)


# -- hostile types --------------------------------------------------------------------------

def test_every_field_of_an_event_of_another_type_is_an_answer_never_a_crash(tmp_path):
    fc = FakeCluster()
    build_fleet(fc, 2, 6)
    fc.start()
    try:
        kube = Kube(str(fc.kubeconfig(tmp_path / "kc")), request_timeout_s=5)
        pods = [json.loads(json.dumps(p)) for p in fc.pods.values()]
        events = [{"type": "ADDED", "object": p} for p in pods[:2]] + [
            {"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1", "metadata": {
                "resourceVersion": "1000", "annotations": {watchlist.INITIAL_EVENTS_END: "true"}},
                "spec": {"containers": None}, "status": {}}}]
        cases = [(i, f) for i, ev in enumerate(events) for f in _paths(ev)]
        assert len(cases) > 80
        crashed, outcomes = [], set()
        for i, field in cases:
            lines = [line(e["type"], e["object"]) for e in events]
            ev = _mutated(events[i], field)
            lines[i] = json.dumps(ev, separators=(",", ":")).encode() + b"\n"
            fc.watch_lines = lines
            try:
                fold, _ = _fold_of(kube)
                outcomes.add("folded" if fold.total == 2 else "paged")
            except errors.GpuDoctorError as exc:   # the tool's own: one line, exit 3
                assert exc.exit_status == 3, (field, exc)
                outcomes.add(type(exc).__name__)
            except Exception as exc:  # noqa: BLE001 - what the test is looking for
                crashed.append(f"event {i} {'.'.join(map(str, field))}: "
                               f"{type(exc).__name__}: {exc}")
        assert crashed == []
        # each way out was taken: read, paged (not a watch event at first), an error
        assert {"folded", "paged"} <= outcomes and outcomes - {"folded", "paged"}, outcomes
    finally:
        fc.stop()


def test_a_page_of_items_that_are_not_objects_is_one_error_on_the_paged_path_too(fleet):
    """The walker above found it on the stream; the paged list had it as well: the page
    parsers pass a number or a string through, and the fold read it (exit 70)."""
    fc, kube = fleet
    fc.answer[PODS] = {"kind": "PodList", "apiVersion": "v1", "metadata": {},
                       "items": ["x", 1]}
    with pytest.raises(errors.BadAnswer) as e:
        _fold_of(kube, pager)
    assert "an item is a string, not an object" in e.value.message


def test_the_pagers_memory_bound_stops_a_stream_too(fleet):
    """The same bounds as the paged list: past the resident memory allowed (pager.Memory,
    here set just under what this process holds already) the stream stops with the pager's
    own error, and its connection is shut (the server sees the client leave)."""
    fc, kube = fleet
    mem = pager.Memory(base=pager.resident_bytes() - 1)
    with pytest.raises(errors.BadAnswer) as e:
        _fold_of(kube, memory=mem)
    assert "too large to analyse in the memory" in e.value.message
    assert "-l SELECTOR" in e.value.message
    assert fc.watches_served == 1 and not _paged_requests(fc)
    assert _wait_for(lambda: fc.watches_open == 0)

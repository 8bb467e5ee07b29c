"""The page parsers' fast path (api/typedpods.py, msgspec) gives exactly what the stdlib path
gives, or declines the page: on the pods a real 1.35 API server sent (tests/data/captures),
on the bench's fat fleet pods with black holes, restarts, deletions, HAMi annotations and DRA
claims, and on hostile pages (wrong types anywhere shape.POD looks, nulls where the compactor
reads, NaN, numbers past a double, duplicate keys, bad UTF-8, deep nesting). "Exactly" is the
whole outcome: the reduced items and the continue token, or the same exception with the same
message. A page of ordinary pods must really take the fast path (else `nodes` loses its speed
without a word), and without msgspec every page still parses, by the stdlib.
"""
from __future__ import annotations

import copy
import json
import marshal
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from kubectl_gpudoctor.api import pageparse, shape, slim, typedpods
from tests.kubectl.fakecluster import FakeCluster, add_black_hole, build_fleet

from .conftest import REPO

pytestmark = pytest.mark.skipif(not typedpods.available, reason="msgspec is not installed")

CAPTURES = Path(__file__).resolve().parents[1] / "data" / "captures" / "k8s-1.35"
SID = shape.schema_id("/api/v1/pods")


def _kind(ids: bool) -> int:
    return (pageparse.KIND_PODS_IDS if ids else pageparse.KIND_PODS) | SID << pageparse.KIND_BITS


def outcome(fn, *args):
    try:
        return ("ok", fn(*args))
    except Exception as exc:  # noqa: BLE001 - the exception is the outcome compared
        return ("raised", type(exc).__name__, str(exc))


def stdlib(raw: bytes, ids: bool):
    each, _ = pageparse._each(_kind(ids))
    return outcome(pageparse.parse_page, raw, each)


def fast(raw: bytes, ids: bool):
    """What the CLI and a child get: typedpods, or the stdlib where it declines."""
    each, comp = pageparse._each(_kind(ids))
    assert comp is not None
    return outcome(pageparse.parse_reduced, raw, each, comp)


def decoded_fast(raw: bytes, ids: bool):
    each, comp = pageparse._each(_kind(ids))
    return typedpods.parse(raw, each, comp)


def page(items: list, token: str | None = "tok") -> bytes:
    meta = {"resourceVersion": "7", **({"continue": token} if token else {})}
    return json.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": meta,
                       "items": items}).encode()


def captured_pods() -> list[dict]:
    pods = []
    for f in sorted(CAPTURES.glob("*-pods.json")):
        pods += json.loads(f.read_text())["items"]
    assert len(pods) >= 5
    return pods


def fleet_pods() -> list[dict]:
    """The bench's fat pods (managedFields, projected volume, env...), a wedged node's Pending
    pods, a black hole's Failed pods and its Running peers, and variants of real pods."""
    fc = FakeCluster()
    names = build_fleet(fc, 6, 60, wedged=(2,), fat=True)
    add_black_hole(fc, names[4], "ml", "trainer-7d9c8b5f4", rejected=3, gone=2,
                   elsewhere=names[:2])
    pods = list(fc.pods.values())
    real = [p for p in captured_pods() if p["status"].get("phase") == "Running"]
    assert real, "the captures hold a Running pod"
    variants = {
        "restarted": lambda p: p["status"]["containerStatuses"][0].update(restartCount=3),
        "terminating": lambda p: p["metadata"].update(deletionTimestamp="2026-11-23T08:00:00Z"),
        "hami": lambda p: p["metadata"].setdefault("annotations", {}).update(
            {"hami.io/vgpu-devices-allocated": "GPU-1,NVIDIA,20000,30:;"}),
        "dra claims": lambda p: p["spec"].update(resourceClaims=[
            {"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]),
        "claims in resources": lambda p: p["spec"]["containers"][0]["resources"].update(
            claims=[{"name": "gpu"}]),
        "overhead and null priority": lambda p: p["spec"].update(
            overhead={"cpu": "250m", "memory": 120}, priority=None),
        "init container": lambda p: (p["spec"].update(initContainers=[
            {"name": "init", "image": "busybox", "resources": {}}]), p["status"].update(
            initContainerStatuses=[{"name": "init", "containerID": "containerd://ab",
                                    "state": {"terminated": {"exitCode": 0}}}])),
        "running is null": lambda p: p["status"]["containerStatuses"][0].update(
            state={"running": None}),
        "state is empty": lambda p: p["status"]["containerStatuses"][0].update(state={}),
        "no labels, no owners": lambda p: [p["metadata"].pop(k, None)
                                           for k in ("labels", "ownerReferences")],
        "empty owners": lambda p: p["metadata"].update(ownerReferences=[]),
        "metadata null": lambda p: p.update(metadata=None),
        "float quantities": lambda p: p["spec"]["containers"][0]["resources"].update(
            limits={"cpu": 1.5, "memory": 10 ** 30}),
        "unicode": lambda p: p["metadata"].update(name="pod-\u00e9\u4e2d-\U0001f600"),
    }
    for name, change in variants.items():
        for base in (real[0], pods[0]):
            p = copy.deepcopy(base)
            change(p)
            pods.append(p)
    return pods + captured_pods()


@pytest.mark.parametrize("ids", [False, True], ids=["pods", "pods with container ids"])
def test_realistic_pages_take_the_fast_path_and_reduce_to_the_same_items(ids):
    pods = fleet_pods()
    for i in range(0, len(pods), 25):
        raw = page(pods[i:i + 25], token=f"t{i}")
        got = decoded_fast(raw, ids)
        assert got is not None, "an ordinary page was declined: the fast path is not used"
        assert ("ok", got) == stdlib(raw, ids)
        assert marshal.loads(marshal.dumps(got)) == got
    # the steady ones really were skeletons, the rest slimmed whole pods (what a verdict reads)
    items, _ = decoded_fast(page(fleet_pods()), ids)
    assert any("managedFields" not in (i["metadata"] or {}) and "conditions" in i["status"]
               for i in items if i["metadata"])
    assert sum(set(i["spec"]) <= {"nodeName", "containers", "priority", "schedulerName",
                                  "priorityClassName"} for i in items) > 40


def steady_pod() -> dict:
    fc = FakeCluster()
    build_fleet(fc, 1, 1, fat=True)
    [p] = fc.pods.values()
    return p


def _set(path: tuple, value):
    def change(p: dict) -> None:
        obj = p
        for k in path[:-1]:
            obj = obj[k]
        obj[path[-1]] = value
    return change


HOSTILE = {
    "restartCount a string": _set(("status", "containerStatuses", 0, "restartCount"), "x"),
    "ready a string": _set(("status", "containerStatuses", 0, "ready"), "yes"),
    "a null container status": _set(("status", "containerStatuses"), [None]),
    "a null container": _set(("spec", "containers"), [None]),
    "a null init container": _set(("spec", "initContainers"), [None]),
    "resources a string": _set(("spec", "containers", 0, "resources"), "lots"),
    "a limit true": _set(("spec", "containers", 0, "resources", "limits"), {"cpu": True}),
    "a limit null": _set(("spec", "containers", 0, "resources", "requests"), {"cpu": None}),
    "a limit NaN": _set(("spec", "containers", 0, "resources", "limits"), {"cpu": float("nan")}),
    "a limit past a double": _set(("spec", "containers", 0, "resources", "limits"),
                                  {"cpu": float("inf")}),
    "a label a number": _set(("metadata", "labels"), {"app": 5}),
    "an annotation null": _set(("metadata", "annotations"), {"a": None}),
    "metadata a string": _set(("metadata",), "x"),
    "spec an array": _set(("spec",), []),
    "status null": _set(("status",), None),
    "phase a number": _set(("status", "phase"), 1),
    "priority a float": _set(("spec", "priority"), 1.0),
    "priority true": _set(("spec", "priority"), True),
    "resourceClaims a number": _set(("spec", "resourceClaims"), 5),
    "resourceClaims of strings": _set(("spec", "resourceClaims"), ["a"]),
    "resourceClaims of nulls": _set(("spec", "resourceClaims"), [None]),
    "overhead of booleans": _set(("spec", "overhead"), {"cpu": False}),
    "an owner a string": _set(("metadata", "ownerReferences"), ["x"]),
    "a null owner": _set(("metadata", "ownerReferences"), [None, {"kind": "Job", "name": "j"}]),
    "env of numbers": _set(("spec", "containers", 0, "env"), [1]),
    "tolerations an object": _set(("spec", "tolerations"), {"a": 1}),
    "state a list": _set(("status", "containerStatuses", 0, "state"), []),
    "startedAt a number": _set(("status", "containerStatuses", 0, "state", "running",
                                "startedAt"), 5),
    "a huge integer": _set(("spec", "priority"), 10 ** 40),
    "a lone surrogate": _set(("metadata", "name"), "\ud800x"),
}


@pytest.mark.parametrize("ids", [False, True], ids=["pods", "pods with container ids"])
@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_pod_gets_the_stdlib_outcome(case, ids):
    pods = [steady_pod(), steady_pod(), steady_pod()]
    HOSTILE[case](pods[1])
    raw = page(pods)
    assert fast(raw, ids) == stdlib(raw, ids)


RAW_PAGES = {
    "items null": b'{"metadata": {"continue": "t"}, "items": null}',
    "items an object": b'{"items": {"a": 1}}',
    "items twice": b'{"items": [{"metadata": {"name": "a"}}], "items": [5]}',
    "items then null": b'{"items": [{"metadata": {"name": "a"}}], "items": null}',
    "metadata twice": b'{"metadata": {"continue": "a"}, "items": [], "metadata": {}}',
    "continue a number": b'{"metadata": {"continue": 5}, "items": []}',
    "metadata a string": b'{"metadata": "x", "items": []}',
    "an array": b'[{"metadata": {}}]',
    "an item a number": b'{"items": [5, {"metadata": {"name": "a"}}]}',
    "a key twice, the last a wrong type": b'{"items": [{"status": {"phase": "Running", '
                                          b'"phase": 5}}]}',
    "a key twice, the first a wrong type": b'{"items": [{"status": {"phase": 5, '
                                           b'"phase": "Running"}}]}',
    "an escaped member name": b'{"items": [{"metadata": {"na\\u006de": 7}}]}',
    "NaN where nobody looks": b'{"items": [{"spec": {"x": NaN}}]}',
    "1e400 where nobody looks": b'{"items": [{"spec": {"x": 1e400}}]}',
    "bad UTF-8 where nobody looks": b'{"items": [{"spec": {"x": "\xff"}}]}',
    "a BOM": b'\xef\xbb\xbf{"items": []}',
    "trailing garbage": b'{"items": []} x',
    "truncated": b'{"items": [{"metadata": {"name": "a"}}',
    "control character": b'{"items": [{"metadata": {"name": "a\x01"}}]}',
    "empty": b"",
    "deep nesting where nobody looks": b'{"items": [{"spec": {"affinity": ' + b"[" * 5000
                                       + b"]" * 5000 + b"}}]}",
    "deep nesting where the types look": b'{"items": [{"metadata": {"labels": ' + b'{"a": ' * 3000
                                         + b"1" + b"}" * 3000 + b"}}]}",
}


@pytest.mark.parametrize("ids", [False, True], ids=["pods", "pods with container ids"])
@pytest.mark.parametrize("case", list(RAW_PAGES))
def test_a_hostile_page_text_gets_the_stdlib_outcome(case, ids):
    raw = RAW_PAGES[case]
    # the same text with a steady pod in front: whatever the fast path did with that one,
    # the outcome is the stdlib's
    pod = json.dumps(steady_pod()).encode()
    with_pod = raw.replace(b'"items": [', b'"items": [' + pod + b", ", 1)
    for r in (raw, with_pod):
        assert fast(r, ids) == stdlib(r, ids), r[:200]


# -- any value anywhere in a pod -----------------------------------------------------------

_scalars = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
            | st.text(max_size=6) | st.sampled_from(["Running", "main", "1", "", "nvidia.com"]))
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3) |
                     st.dictionaries(st.sampled_from(["running", "name", "limits", "cpu", "x",
                                                      "ready", "kind"]), inner, max_size=3),
                     max_leaves=8)


def _paths(obj, at=()):
    """Every member and element of `obj`, as a path of keys."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield at + (k,)
            yield from _paths(v, at + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield at + (i,)
            yield from _paths(v, at + (i,))


_STEADY = steady_pod()
_STEADY["spec"]["resourceClaims"] = [{"name": "gpu"}]
_STEADY["metadata"]["ownerReferences"][0]["controller"] = True
PATHS = sorted(set(_paths(_STEADY)), key=repr)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(where=st.sampled_from(PATHS), value=_json, ids=st.booleans())
def test_any_value_anywhere_in_a_pod_gets_the_stdlib_outcome(where, value, ids):
    pod = copy.deepcopy(_STEADY)
    _set(where, value)(pod)
    raw = page([steady_pod(), pod])
    assert fast(raw, ids) == stdlib(raw, ids)


# -- the child, and no msgspec -------------------------------------------------------------

def _child_answer(raw: bytes, kind: int, block_msgspec: bool) -> tuple:
    code = ("import sys\n" + ("sys.modules['msgspec'] = None\n" if block_msgspec else "")
            + "from kubectl_gpudoctor.api import pageparse\nsys.exit(pageparse.main())\n")
    r = subprocess.run([sys.executable, "-c", code],
                       input=struct.pack("!BQ", kind, len(raw)) + raw, capture_output=True,
                       timeout=120, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    status, n = struct.unpack("!BQ", r.stdout[:9])
    return status, marshal.loads(r.stdout[9:9 + n]) if status == 0 else None


@pytest.mark.parametrize("ids", [False, True], ids=["pods", "pods with container ids"])
def test_a_child_answers_the_same_with_and_without_msgspec(ids, monkeypatch):
    raw = page(fleet_pods())
    with_it = _child_answer(raw, _kind(ids), block_msgspec=False)
    without = _child_answer(raw, _kind(ids), block_msgspec=True)
    assert with_it == without and with_it[0] == 0
    assert with_it[1] == stdlib(raw, ids)[1]
    monkeypatch.setattr(typedpods, "msgspec", None)  # and in the CLI's own parse
    assert decoded_fast(raw, ids) is None
    assert fast(raw, ids) == stdlib(raw, ids)

"""JSON nested past Python's recursion limit in an API answer never ends a run in exit 70
(audit round 5, JS-01): the one object is cut (api/depth.py) and a note says which.

The tenant case: a ResourceClaim whose `spec.devices.config[].opaque.parameters` -- a
RawExtension its creator writes in its own namespace -- is an object holding arrays nested
1,500 deep: 3,006 bytes, inside DRA's 10 KiB limit for opaque parameters
(https://github.com/kubernetes/kubernetes/blob/v1.34.0/pkg/apis/resource/types.go,
OpaqueParametersMaxLength = 10 * 1024), and a JSON object as that field's validation asks.
Before the fix every `node`, `nodes` and `pod` run that read the cluster-wide claim list ended
with "internal error: RecursionError" (exit 70).
"""
from __future__ import annotations

import json
import sys

import aiohttp.web
import pytest

from kubectl_gpudoctor.api import depth, pageparse
from kubectl_gpudoctor.api.kube import _loads

from .conftest import one_error_line
from .hostile import NODE, run_measured
from .hostile import hc, kc  # noqa: F401 (fixtures)

DEPTH = 1500
DEEP = '{"a":' + "[" * DEPTH + "]" * DEPTH + "}"
CLAIM = ('{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{"name":"c1",'
         '"namespace":"tenant","uid":"c-1"},"spec":{"devices":{"requests":[{"name":"gpu",'
         '"exactly":{"deviceClassName":"gpu.nvidia.com"}}],"config":[{"requests":["gpu"],'
         '"opaque":{"driver":"gpu.nvidia.com","parameters":' + DEEP + '}}]}}}')
CLAIMS = ('{"kind":"ResourceClaimList","apiVersion":"resource.k8s.io/v1","metadata":{},'
          '"items":[' + CLAIM + "]}").encode()


@pytest.fixture(autouse=True)
def default_recursion_limit():
    """The CLI decodes at CPython's default recursion limit (1000); the in-process tests here
    pin it, since another test of the same pytest worker may leave it raised (Hypothesis
    adjusts it around its examples: hypothesis/internal/conjecture/junkdrawer.py), and then
    nothing is deep enough to cut (the full suite failed three of these tests that way)."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    yield
    sys.setrecursionlimit(old)


def raw(body: bytes):
    async def answer(req: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        return aiohttp.web.Response(body=body, content_type="application/json")
    return answer


def test_the_claim_is_past_what_the_decoders_recurse():
    assert len(DEEP) < 10 * 1024
    with pytest.raises(RecursionError):
        json.loads(CLAIMS)


@pytest.mark.parametrize("args", [
    ("nodes", "-o", "json"),
    ("node", NODE, "--no-probe", "-o", "json"),
    ("pod", "train-0", "-n", "ml", "--no-probe", "-o", "json"),
])
def test_a_tenant_claim_nested_1500_deep_is_cut_with_a_note_not_exit_70(hc, kc, args):
    hc.add_pod("ml", "train-0", NODE, gpus=1)
    hc.hostile["/apis/resource.k8s.io/v1/resourceclaims"] = raw(CLAIMS)
    m = run_measured(*args, "--kubeconfig", kc)
    assert "Traceback" not in m.stderr and "internal error" not in m.stderr, m.stderr
    assert m.returncode in (0, 1), (m.returncode, m.stderr)
    doc = json.loads(m.stdout)
    notes = [c["message"] for c in doc["checks"] if c["id"] == "api.nested_json"]
    assert notes and "resourceclaims" in notes[0] and "nested deeper than 100" in notes[0], \
        doc["checks"]
    if args[0] == "nodes":   # the paged list names the one item it cut
        assert "'tenant/c1'" in notes[0], notes


def test_a_node_object_nested_too_deep_is_read_with_the_deep_value_cut(hc, kc):
    node = json.dumps(hc.nodes[NODE])
    deep = node[:-1] + ',"x":' + DEEP + "}"
    hc.hostile[f"/api/v1/nodes/{NODE}"] = raw(deep.encode())
    m = run_measured("node", NODE, "--no-probe", "-o", "json", "--kubeconfig", kc)
    assert m.returncode in (0, 1), m.stderr
    assert "nested deeper" in m.stdout


def test_a_pod_list_of_the_wrong_type_deep_inside_is_still_one_line_exit_3(hc, kc):
    """Cut or not, a field of the wrong type is the API server's error (exit 3, one line)."""
    hc.hostile["/api/v1/pods"] = raw(json.dumps({
        "kind": "PodList", "apiVersion": "v1", "metadata": {},
        "items": [{"metadata": {"name": "p", "namespace": "ml",
                                "annotations": {"a": "@"}}}]}).replace(
        '"@"', "[" * 5000 + "]" * 5000).encode())
    m = run_measured("nodes", "--kubeconfig", kc)
    line = one_error_line(m.stderr)
    assert m.returncode == 3 and "annotations.a" in line, line


def test_cut_keeps_strings_with_brackets_and_escapes_intact():
    s = '{"s":"[[\\"]]{","a":' + "[" * 5 + '"x]"' + "]" * 5 + "}"
    out, n = depth.cut(s, limit=3)
    assert n == 1 and json.loads(out) == {"s": '[[\"]]{', "a": [[None]]}
    assert depth.cut(s, limit=10) == (s, 0)


def test_the_stdlib_decoder_of_the_cli_and_of_page_children_cut_the_same_item():
    items, _ = pageparse.parse_page(CLAIMS, None)
    assert items[0]["metadata"]["name"] == "c1"
    params = items[0]["spec"]["devices"]["config"][0]["opaque"]["parameters"]
    level, v = 0, params["a"]
    while isinstance(v, list) and v:
        level, v = level + 1, v[0]
    assert v is None and level < depth.MAX_DEPTH
    assert any("'tenant/c1'" in t for t in depth.take_notes())
    doc = _loads(CLAIMS, "/x")
    assert doc["items"][0]["metadata"]["uid"] == "c-1"
    assert depth.take_notes()


def test_the_mcp_tools_answer_over_the_same_claim(hc, kc):
    """MCP runs each call as the CLI does: the cluster's claim no longer fails every call."""
    pytest.importorskip("mcp")
    from .mcpclient import calls, server_command
    hc.add_pod("ml", "train-0", NODE, gpus=1)
    hc.hostile["/apis/resource.k8s.io/v1/resourceclaims"] = raw(CLAIMS)
    _, got, err = calls(server_command(f"--kubeconfig={kc}"),
                        [("nodes", {}), ("node", {"name": NODE}),
                         ("pod", {"name": "train-0", "namespace": "ml"})])
    for res in got:
        doc = res.structured_content
        assert not res.is_error and doc["exit_code"] in (0, 1), doc.get("error")
        assert any(c["id"] == "api.nested_json" for c in doc["checks"])
    assert "Traceback" not in err


def test_a_page_child_that_cut_an_item_hands_the_page_back_to_the_cli():
    """A child's notes would be lost in the child: it answers _DEEP, the CLI parses the page
    itself (the pool's fallback) and the note is made where the run can say it."""
    from kubectl_gpudoctor.api import slim
    depth.take_notes()
    with pageparse.ParsePool(1) as pp:
        fut = pp.submit(CLAIMS, pageparse.KIND_SLIM)
        items, token, size = pp.result(fut, lambda: CLAIMS, slim.slim)
        assert pp.workers == 1      # the child is still there: _DEEP is not a broken child
    assert size is None             # parsed here, not in the child
    assert [i["metadata"]["name"] for i in items] == ["c1"] and token is None
    assert any("'tenant/c1'" in t for t in depth.take_notes())

"""The agent's Event policies type-check on a real API server: no `expressionWarnings`.

On Kubernetes 1.35 the policy `gpu-doctor-agent-own-events` carried, in
`status.typeChecking.expressionWarnings`, "events.k8s.io/v1, Kind=Event: ERROR:
<input>:1:156: undefined field 'involvedObject'" (and 3 more): an events.k8s.io/v1 Event names
its object in `regarding` and its writer in `reportingController`/`reportingInstance` and
`deprecatedSource`, the core/v1 Event in `involvedObject` and `source` (captures
k8s-1.35/admission-and-conditions, b-status-gpu-doctor-agent-own-events.200.json and
b-expression-warnings.json; the API types:
https://kubernetes.io/docs/reference/kubernetes-api/cluster-resources/event-v1/ and
https://kubernetes.io/docs/reference/kubernetes-api/core-resources/... /Event of core/v1).

The API server's type checker is reproduced here for what these policies use (field selection
on `object`/`oldObject`, `has()`), against the official OpenAPI schemas of the kinds each
policy's rules match (kubernetes-validate's v1.35 schemas, matchPolicy Equivalent adding the
equivalent kind of the other group), with the server's wording and columns: on the captured
expression it gives the captured warning exactly, character for character.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import kubernetes_validate
import pytest
from celpy import celparser
from lark import Token, Tree

from kubectl_gpudoctor.reach import agent_policy as ap
from tests.watch.fakeapi import CAPTURES

NS = "gpu-doctor"
DOCS = ap.manifests(NS, {"app.kubernetes.io/name": "gpu-doctor"})
ADMISSION = CAPTURES.parent / "admission-and-conditions"
SCHEMAS = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / "v1.35.0-local"
# (group, version, resource) -> (the kind's schema file, the kind); Events are served by both
KINDS = {("", "v1", "events"): ("event-v1.json", "Event"),
         ("events.k8s.io", "v1", "events"): ("event-events-v1.json", "Event"),
         ("", "v1", "nodes"): ("node-v1.json", "Node"),
         ("", "v1", "nodes/status"): ("node-v1.json", "Node")}
EVENTS = {k for k in KINDS if k[2] == "events"}
EQUIVALENT = {("", "v1", "events"): [("events.k8s.io", "v1", "events")],
              ("events.k8s.io", "v1", "events"): [("", "v1", "events")]}


@lru_cache(maxsize=None)
def _definitions() -> dict:
    return json.loads((SCHEMAS / "_definitions.json").read_text())["$defs"]


def _resolve(schema: dict | None) -> dict | None:
    while schema is not None and "$ref" in schema:
        schema = _definitions()[schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def _kinds(policy: dict) -> list[tuple[str, str, str]]:
    """The (group, version, resource) the type checker checks the policy's expressions
    against: every one its rules match, and with matchPolicy Equivalent (the default) the
    equivalent ones."""
    mc = policy["spec"]["matchConstraints"]
    out = []
    for rule in mc["resourceRules"]:
        for g in rule["apiGroups"]:
            for v in rule["apiVersions"]:
                for r in rule["resources"]:
                    out.append((g, v, r))
                    if mc.get("matchPolicy", "Equivalent") == "Equivalent":
                        out += EQUIVALENT.get((g, v, r), [])
    return list(dict.fromkeys(out))


def type_warning(expression: str, gvr: tuple[str, str, str]) -> str | None:
    """The warning the API server's type checker writes for `expression` on the kind of
    `gvr`, in its form ("<group>/<version>, Kind=<Kind>: ERROR: <input>:1:<col>: undefined
    field '<name>'\\n | <expression>\\n | <dots>^", one per error, joined by newlines), or
    None when it type-checks."""
    file, kind = KINDS[gvr]
    root = json.loads((SCHEMAS / file).read_text())
    tree = celparser.CELParser().parse(expression)
    at_has: dict[int, int] = {}   # a field selection that is has()'s argument: at its "("
    for node in tree.iter_subtrees():
        if node.data == "ident_arg" and isinstance(node.children[0], Token) and \
                node.children[0] == "has":
            arg = node.children[1]
            while isinstance(arg, Tree) and arg.data != "member_dot":
                arg = arg.children[0]
            if isinstance(arg, Tree):
                at_has[id(arg)] = node.children[0].start_pos + len("has")
    errors: dict[int, str] = {}
    seen: dict[int, dict | None] = {}

    def typ(node) -> dict | None:
        if id(node) in seen:
            return seen[id(node)]
        out = None
        if isinstance(node, Tree) and node.data == "member" and len(node.children) == 1:
            out = typ(node.children[0])
        elif isinstance(node, Tree) and node.data == "primary":
            ident = node.children[0]
            if isinstance(ident, Tree) and ident.data == "ident" and \
                    str(ident.children[0]) in ("object", "oldObject"):
                out = root
        elif isinstance(node, Tree) and node.data == "member_dot":
            base, name = _resolve(typ(node.children[0])), node.children[1]
            if base is not None and "properties" in base:
                if str(name) in base["properties"]:
                    out = _resolve(base["properties"][str(name)])
                else:   # the select's "." (or has()'s "(")
                    errors[at_has.get(id(node), name.start_pos - 1)] = str(name)
        seen[id(node)] = out
        return out

    for node in tree.iter_subtrees():
        if node.data == "member_dot":
            typ(node)
    if not errors:
        return None
    group, version, _ = gvr
    return f"{group}/{version}, Kind={kind}: " + "\n".join(
        f"ERROR: <input>:1:{col + 1}: undefined field '{name}'\n | {expression}\n"
        f" | {'.' * col}^" for col, name in sorted(errors.items())) + "\n"


def _policy(name: str) -> dict:
    [p] = [d for d in DOCS if d["kind"] == "ValidatingAdmissionPolicy"
           and d["metadata"]["name"] == name]
    return p


def test_the_checker_gives_the_captured_warning_of_the_old_policy_exactly():
    """The policy as 1.35 stored it (matchPolicy Equivalent, core/v1 rule): our checker finds
    what the server's found, in its words and columns; the core/v1 check passes, as there."""
    cap = json.loads((ADMISSION / "b-status-gpu-doctor-agent-own-events.200.json").read_text())
    [want] = cap["status"]["typeChecking"]["expressionWarnings"]
    expr = cap["spec"]["validations"][0]["expression"]
    kinds = _kinds(cap)
    assert kinds == [("", "v1", "events"), ("events.k8s.io", "v1", "events")]
    assert type_warning(expr, kinds[0]) is None
    assert type_warning(expr, kinds[1]) == want["warning"]
    assert want["fieldRef"] == "spec.validations[0].expression"


@pytest.mark.parametrize("name", [ap.EVENT_POLICY, ap.EVENT_POLICY_V1])
def test_each_event_policy_type_checks_on_every_kind_it_matches(name):
    p = _policy(name)
    kinds = _kinds(p)
    assert len(kinds) == 1   # Exact: its own version only
    for i, v in enumerate(p["spec"]["validations"]):
        for gvr in kinds:
            assert type_warning(v["expression"], gvr) is None, (name, i, gvr)


def test_events_of_both_apis_are_confined_to_the_agents_own_node():
    """Whichever API the agent's account posts an Event through, a policy matches it."""
    covered = {gvr for p in DOCS if p["kind"] == "ValidatingAdmissionPolicy"
               and p["metadata"]["name"] in (ap.EVENT_POLICY, ap.EVENT_POLICY_V1)
               for gvr in _kinds(p)}
    assert covered == EVENTS
    bindings = {d["spec"]["policyName"] for d in DOCS
                if d["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert {ap.EVENT_POLICY, ap.EVENT_POLICY_V1} <= bindings


@pytest.mark.parametrize("name", [ap.NODE_POLICY, ap.WRITER_POLICY])
def test_the_node_policies_type_check_on_the_node(name):
    """The node policies too (the ResourceLists the 1.35 checker calls undefined are read
    through dyn(), which this checker, like the server's, leaves to run time)."""
    p = _policy(name)
    for i, v in enumerate(p["spec"]["validations"]):
        for gvr in _kinds(p):
            assert type_warning(v["expression"], gvr) is None, (name, i, gvr)

"""How a real 1.35 API server answers writes of one object: the fake API server's write semantics.

Why: `agent install` was tested against a fake that replaced objects without a resourceVersion,
which a real API server refuses (issue 31: a second install failed with 422). These rules are
what the real server answered in tests/data/captures/k8s-1.35/admission-and-conditions/ (a01-a21,
e01-e03, b-*; the README there), reproduced as functions over a dict-like store so the fake's
handlers (fakecluster.FakeCluster, fakeexec.ExecCluster) share them:

- POST of an existing object: 409 AlreadyExists, also with ?dryRun=All (a02, a03, a05).
- PUT without metadata.resourceVersion: 422 Invalid, "must be specified for an update" (a06,
  a07); with a stale one: 409 Conflict (a12b); a PUT that changes nothing keeps the
  resourceVersion (a11, a12). PUT and apply never change `status` (a subresource).
- Server-side apply (PATCH, application/apply-patch+yaml, YAML or JSON body): no fieldManager
  -> 422 (a20); absent -> 201 (a18, a19); present -> 200 (a16, a17); without force=true over
  fields another manager set: 409 Conflict with one FieldManagerConflict cause per field, and
  `.spec.matchConstraints` conflicts even with the same content, because the server defaults
  fields inside it (a14, a15). Fields a manager applied before and no longer applies are
  removed (what makes apply converge).
- The manager of a POST/PUT is the User-Agent up to its first "/" (the README: the capture's
  POSTs were owned by "kubectl-gpu_doctor").
- DELETE: 200 with a `Status` Success naming the object and its uid (e01, e03); absent: 404
  NotFound (e02).
- A ValidatingAdmissionPolicy has a second writer, the type checker, which writes
  `status.typeChecking` after every create or spec change and so moves the resourceVersion
  (a08-a10); its warnings are `type_check` below, reproducing b-expression-warnings.json.
"""
from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import re
import uuid
from typing import Any, MutableMapping

APPLY = "application/apply-patch+yaml"
_RV = itertools.count(3400)


@dataclasses.dataclass(frozen=True)
class Resource:
    plural: str                 # "validatingadmissionpolicies"
    group: str = ""             # "admissionregistration.k8s.io"; "" for the core group
    version: str = "v1"

    @property
    def qualified(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def details(self, name: str) -> dict:
        d = {"name": name}
        if self.group:
            d["group"] = self.group
        d["kind"] = self.plural
        return d


VAP = Resource("validatingadmissionpolicies", "admissionregistration.k8s.io")
VAPB = Resource("validatingadmissionpolicybindings", "admissionregistration.k8s.io")

# fields the server defaults inside: another manager owns them even when the content is equal
DEFAULTED = ("matchConstraints", "matchResources", "updateStrategy", "template", "selector")


def status(code: int, reason: str, message: str, details: dict | None = None) -> dict:
    out = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason}
    if details is not None:
        out["details"] = details
    out["code"] = code
    return out


def manager_of(user_agent: str) -> str:
    return (user_agent or "unknown").split("/", 1)[0]


def _fields(obj: dict) -> dict[str, Any]:
    """The fields ownership is tracked at: spec.<key> (or a top-level key of a spec-less
    object such as a ClusterRole's rules), metadata.labels.<k>, metadata.annotations.<k>."""
    out: dict[str, Any] = {}
    for k, v in obj.items():
        if k in ("apiVersion", "kind", "metadata", "status"):
            continue
        if k == "spec" and isinstance(v, dict):
            for sk, sv in v.items():
                out[f"spec.{sk}"] = sv
        else:
            out[k] = v
    md = obj.get("metadata") or {}
    for part in ("labels", "annotations"):
        for k, v in (md.get(part) or {}).items():
            out[f"metadata.{part}.{k}"] = v
    return out


def _set(obj: dict, field: str, value: Any) -> None:
    if field.startswith("metadata."):
        _, part, key = field.split(".", 2)
        obj.setdefault("metadata", {}).setdefault(part, {})[key] = value
    elif field.startswith("spec."):
        obj.setdefault("spec", {})[field[5:]] = value
    else:
        obj[field] = value


def _drop(obj: dict, field: str) -> None:
    if field.startswith("metadata."):
        _, part, key = field.split(".", 2)
        (obj.get("metadata", {}).get(part) or {}).pop(key, None)
    elif field.startswith("spec."):
        (obj.get("spec") or {}).pop(field[5:], None)
    else:
        obj.pop(field, None)


def _content(obj: dict) -> str:
    o = {k: v for k, v in obj.items() if k != "metadata"}
    md = {k: v for k, v in (obj.get("metadata") or {}).items()
          if k in ("labels", "annotations")}
    return json.dumps([o, md], sort_keys=True)


def _spec(obj: dict) -> str:
    return json.dumps({k: v for k, v in obj.items() if k not in ("metadata", "status")},
                      sort_keys=True)


def _public(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if not k.startswith("_")}


def write(store: MutableMapping, key: Any, res: Resource, name: str, method: str, q: dict,
          body: Any, content_type: str, user_agent: str, namespace: str | None = None
          ) -> tuple[int, dict]:
    """One write of one object: (HTTP status, answer body). `store[key]` holds the object
    (with its `_managers`); nothing is stored on ?dryRun=All."""
    dry = q.get("dryRun") == "All"
    have = store[key] if key in store else None
    if method == "DELETE":
        if have is None:
            return 404, status(404, "NotFound", f'{res.qualified} "{name}" not found',
                               res.details(name))
        if not dry:
            del store[key]
        return 200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                     "details": {**res.details(name), "uid": have["metadata"].get("uid")}}
    if method == "POST":
        if have is not None:
            return 409, status(409, "AlreadyExists", f'{res.qualified} "{name}" already exists',
                               res.details(name))
        return 201, _create(store, key, body, manager_of(user_agent), "Update", dry, namespace)
    if method == "PUT":
        rv = (body.get("metadata") or {}).get("resourceVersion")
        if have is None:
            return 404, status(404, "NotFound", f'{res.qualified} "{name}" not found',
                               res.details(name))
        if not rv:
            msg = "Invalid value: 0: must be specified for an update"
            return 422, status(422, "Invalid", f'{res.qualified} "{name}" is invalid: '
                                               f"metadata.resourceVersion: {msg}",
                               {**res.details(name), "causes": [{
                                   "reason": "FieldValueInvalid", "message": msg,
                                   "field": "metadata.resourceVersion"}]})
        if str(rv) != have["metadata"]["resourceVersion"]:
            return 409, status(409, "Conflict", f'Operation cannot be fulfilled on '
                                                f'{res.qualified} "{name}": the object has been '
                                                f"modified; please apply your changes to the "
                                                f"latest version and try again",
                               res.details(name))
        new = copy.deepcopy(body)
        new["metadata"] = {**have["metadata"], **{k: v for k, v in new["metadata"].items()
                                                   if k in ("labels", "annotations")}}
        for part in ("labels", "annotations"):
            if part not in body["metadata"]:
                new["metadata"].pop(part, None)
        if "status" in have:
            new["status"] = have["status"]
        mgrs = copy.deepcopy(have.get("_managers") or {})
        mine = set(_fields(new))
        for m in mgrs.values():
            m["fields"] = [f for f in m["fields"] if f not in mine]
        mgrs[manager_of(user_agent)] = {"op": "Update", "fields": sorted(mine)}
        return 200, _commit(store, key, have, new, mgrs, dry)
    if method == "PATCH" and content_type.split(";")[0].strip() == APPLY:
        fm = q.get("fieldManager")
        if not fm:
            msg = "Required value: is required for apply patch"
            return 422, status(422, "Invalid", f'PatchOptions.meta.k8s.io "" is invalid: '
                                               f"fieldManager: {msg}",
                               {"group": "meta.k8s.io", "kind": "PatchOptions", "causes": [{
                                   "reason": "FieldValueRequired", "message": msg,
                                   "field": "fieldManager"}]})
        if have is None:
            return 201, _create(store, key, body, fm, "Apply", dry, namespace)
        applied = _fields(body)
        cur = _fields(have)
        mgrs = copy.deepcopy(have.get("_managers") or {})
        conflicts: list[tuple[str, str]] = []
        for other, m in mgrs.items():
            if other == fm:
                continue
            for f in m["fields"]:
                if f in applied and (f.split(".")[-1] in DEFAULTED or applied[f] != cur.get(f)):
                    conflicts.append((other, f))
        if conflicts and q.get("force") != "true":
            causes = [{"reason": "FieldManagerConflict",
                       "message": f'conflict with "{o}" using {res.group + "/" if res.group else ""}'
                                  f"{res.version}", "field": f".{f}"} for o, f in conflicts]
            who = {o for o, _ in conflicts}
            head = f"Apply failed with {len(conflicts)} conflict" + \
                ("s" if len(conflicts) > 1 else "")
            if len(conflicts) == 1:
                msg = f"{head}: {causes[0]['message']}: .{conflicts[0][1]}"
            else:
                msg = (f"{head}: conflicts with \"{sorted(who)[0]}\" using "
                       f"{res.group + '/' if res.group else ''}{res.version}:\n"
                       + "\n".join(f"- .{f}" for _, f in conflicts))
            return 409, status(409, "Conflict", msg, {"causes": causes})
        new = copy.deepcopy(_public(have))
        before = set((mgrs.get(fm) or {}).get("fields") or ())
        others = {f for o, m in mgrs.items() if o != fm for f in m["fields"]}
        for f in before - set(applied) - others:   # no longer applied by anyone: removed
            _drop(new, f)
        for f, v in applied.items():
            _set(new, f, copy.deepcopy(v))
        for o, m in mgrs.items():                   # forced: the fields change hands
            if o != fm:
                m["fields"] = [f for f in m["fields"] if f not in applied or
                               (applied[f] == cur.get(f) and f.split(".")[-1] not in DEFAULTED)]
        mgrs[fm] = {"op": "Apply", "fields": sorted(applied)}
        return 200, _commit(store, key, have, new, mgrs, dry)
    return 405, status(405, "MethodNotAllowed", f"{method} is not supported here")


def _create(store, key, body: dict, manager: str, op: str, dry: bool,
            namespace: str | None) -> dict:
    obj = copy.deepcopy(body)
    md = obj.setdefault("metadata", {})
    md.pop("resourceVersion", None)
    if namespace is not None:
        md["namespace"] = namespace
    md.update({"uid": str(uuid.uuid4()), "resourceVersion": str(next(_RV)),
               "generation": 1, "creationTimestamp": "2026-11-27T20:54:22Z"})
    obj["_managers"] = {manager: {"op": op, "fields": sorted(_fields(obj))}}
    if not dry:
        store[key] = obj
        _type_checker(store, key)
    return _public(obj)


def _commit(store, key, have: dict, new: dict, mgrs: dict, dry: bool) -> dict:
    new["metadata"]["resourceVersion"] = have["metadata"]["resourceVersion"]
    new["metadata"]["generation"] = have["metadata"].get("generation", 1)
    if _content(new) != _content(_public(have)):
        new["metadata"]["resourceVersion"] = str(next(_RV))
        if _spec(new) != _spec(have):
            new["metadata"]["generation"] = have["metadata"].get("generation", 1) + 1
    new["_managers"] = mgrs
    answer = _public(new)
    if not dry:
        store[key] = new
        if new["metadata"]["generation"] != have["metadata"].get("generation", 1):
            _type_checker(store, key)
    return copy.deepcopy(answer)


def _type_checker(store, key) -> None:
    """The API server's `validatingadmissionpolicy-status` writer: right after the answer,
    status.typeChecking, which moves the resourceVersion (a08-a10)."""
    obj = store[key]
    if obj.get("kind") != "ValidatingAdmissionPolicy":
        return
    obj = copy.deepcopy(obj)
    obj["status"] = {"observedGeneration": obj["metadata"]["generation"],
                     "typeChecking": {"expressionWarnings": type_check(obj)}}
    obj["metadata"]["resourceVersion"] = str(next(_RV))
    store[key] = obj


# -- the type checker's warnings, as b-expression-warnings.json shows them --------------------
# Fields the 1.35 type checker calls undefined on the kinds our policies match: the
# ResourceList (map[string]Quantity) fields of Pod, Node and ResourceQuota, and the core/v1
# Event fields that events.k8s.io/v1 (checked too under matchPolicy Equivalent) renamed.
UNDEFINED = {
    ("", "pods"): ("/v1, Kind=Pod", ("spec.overhead",)),
    ("", "nodes"): ("/v1, Kind=Node", ("status.capacity", "status.allocatable")),
    ("", "resourcequotas"): ("/v1, Kind=ResourceQuota", ("spec.hard", "status.hard",
                                                          "status.used")),
    ("events.k8s.io", "events"): ("events.k8s.io/v1, Kind=Event",
                                  ("involvedObject", "source", "message", "count",
                                   "firstTimestamp", "lastTimestamp", "reportingComponent")),
    ("", "events"): ("/v1, Kind=Event",
                     ("regarding", "related", "note", "reportingController",
                      "deprecatedSource", "deprecatedCount", "deprecatedFirstTimestamp",
                      "deprecatedLastTimestamp")),
}
# matchPolicy Equivalent type-checks the expressions against the other group's Event too
_EQUIVALENT = {("", "events"): ("events.k8s.io", "events"),
               ("events.k8s.io", "events"): ("", "events")}
_SELECT = re.compile(r"(has\()?\b(?:object|oldObject)((?:\.[A-Za-z_][A-Za-z0-9_]*)+)")


def _errors(expr: str, paths: tuple[str, ...]) -> list[str]:
    out = []
    for m in _SELECT.finditer(expr):
        parts = m.group(2).lstrip(".").split(".")
        for i in range(1, len(parts) + 1):
            path = ".".join(parts[:i])
            if path in paths:
                field = parts[i - 1]
                if m.group(1) and i == len(parts):   # has(x.f): at has's "("
                    col = m.start() + 4
                else:                                 # x.f: at the "." before f
                    col = m.start(2) + sum(len(p) + 1 for p in parts[:i - 1]) + 1
                out.append(f"ERROR: <input>:1:{col}: undefined field '{field}'\n | {expr}\n"
                           f" | {'.' * (col - 1)}^\n")
                break
    return out


def type_check(policy: dict) -> list[dict]:
    spec = policy.get("spec") or {}
    kinds = []
    exact = (spec.get("matchConstraints") or {}).get("matchPolicy") == "Exact"
    for rule in (spec.get("matchConstraints") or {}).get("resourceRules") or ():
        for g in rule.get("apiGroups") or ():
            for r in rule.get("resources") or ():
                base = r.split("/")[0]
                if (g, base) in UNDEFINED:
                    kinds.append(UNDEFINED[(g, base)])
                if (g, base) in _EQUIVALENT and not exact:
                    kinds.append(UNDEFINED[_EQUIVALENT[(g, base)]])
    warnings = []
    for i, v in enumerate(spec.get("validations") or ()):
        for gvk, paths in dict.fromkeys(kinds):
            errs = _errors(v.get("expression", ""), paths)
            if errs:
                warnings.append({"fieldRef": f"spec.validations[{i}].expression",
                                 "warning": f"{gvk}: " + "".join(errs)})
    return warnings


# -- node status patches (captures c01-c18) ---------------------------------------------------
SMP = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
MERGE = "application/merge-patch+json"
_REJECTED = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
             "message": "the server rejected our request due to an error in our request",
             "reason": "Invalid", "details": {}, "code": 422}


def patch_node(node: dict, content_type: str, body: Any, manager: str,
               subresource: bool) -> tuple[int, dict]:
    """A patch of a Node's conditions, as the captures show it (in place on `node`):
    - strategic merge (c01-c10, c14): conditions merge by `type`; a new type goes first, in
      the patch's order (c01, c06); a field the patch leaves out is kept, so a flip without
      `lastTransitionTime` keeps the old one (c02, c04); a time never sent is stored null
      (c06); `{"type": T, "$patch": "delete"}` removes T, absent or not (c09, c10, c14);
    - JSON patch (c11-c13): `test` + `remove` by index; a failed test or an index past the
      end is 422 Invalid with empty details;
    - merge patch: replaces the whole list (node-status-writes: the kubelet's Ready vanished);
    - to the main resource instead of /status, status changes are dropped: 200, nothing
      changed (c16).
    The writer of each condition is recorded in managedFields (operation Update, subresource
    status, one `k:{"type":...}` per condition), as a real API server does."""
    ctype = content_type.split(";")[0].strip()
    conds = [dict(c) for c in (node.get("status") or {}).get("conditions") or ()]
    before = json.dumps(conds, sort_keys=True)
    written: list[str] = []
    if ctype == JSON_PATCH:
        if not isinstance(body, list):
            return 422, _REJECTED
        doc = {"status": {"conditions": conds}}
        for op in body:
            m = re.fullmatch(r"/status/conditions/(\d+)(?:/(\w+))?", str(op.get("path", "")))
            if not m:
                return 422, _REJECTED
            i = int(m.group(1))
            if i >= len(conds):
                return 422, _REJECTED
            if op.get("op") == "test":
                have = conds[i] if m.group(2) is None else conds[i].get(m.group(2))
                if have != op.get("value"):
                    return 422, _REJECTED
            elif op.get("op") == "remove" and m.group(2) is None:
                del conds[i]
            else:
                return 422, _REJECTED
        conds = doc["status"]["conditions"]
    elif ctype == SMP:
        patch = ((body or {}).get("status") or {}).get("conditions")
        if isinstance(patch, list):
            by_type = {c.get("type"): c for c in conds}
            new_first: list[dict] = []
            for p in patch:
                t = p.get("type")
                if p.get("$patch") == "delete":
                    conds = [c for c in conds if c.get("type") != t]
                    new_first = [c for c in new_first if c.get("type") != t]
                    by_type.pop(t, None)
                    continue
                written.append(t)
                if t in by_type:
                    by_type[t].update(p)
                else:
                    c = {"type": t, "lastHeartbeatTime": None, "lastTransitionTime": None}
                    c.update(p)
                    new_first.append(c)
                    by_type[t] = c
            conds = new_first + [c for c in conds if c.get("type") in by_type]
    elif ctype == MERGE:
        patch = ((body or {}).get("status") or {}).get("conditions")
        if isinstance(patch, list):
            conds = [dict(c) for c in patch]
            written = [c.get("type") for c in conds]
    else:
        return 415, status(415, "UnsupportedMediaType",
                           "the body of the request was in an unknown format - accepted media "
                           "types include: application/json-patch+json, application/merge-patch"
                           "+json, application/apply-patch+yaml, application/strategic-merge-"
                           "patch+json")
    if not subresource:   # c16: status changes on the main resource are dropped
        return 200, node
    if json.dumps(conds, sort_keys=True) != before:
        node.setdefault("status", {})["conditions"] = conds
        node["metadata"]["resourceVersion"] = str(next(_RV))
        _own_conditions(node, manager, written)
    return 200, node


def _own_conditions(node: dict, manager: str, types: list[str]) -> None:
    mf = node["metadata"].setdefault("managedFields", [])
    keys = {f'k:{{"type":"{t}"}}' for t in types}
    for e in mf:
        if e.get("subresource") == "status" and e.get("manager") != manager:
            c = ((e.get("fieldsV1") or {}).get("f:status") or {}).get("f:conditions") or {}
            for k in keys:
                c.pop(k, None)
    mine = next((e for e in mf if e.get("manager") == manager
                 and e.get("subresource") == "status"), None)
    if mine is None:
        mine = {"manager": manager, "operation": "Update", "apiVersion": "v1",
                "time": "2026-11-27T20:54:44Z", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:status": {"f:conditions": {".": {}}}}, "subresource": "status"}
        mf.append(mine)
    c = mine["fieldsV1"]["f:status"]["f:conditions"]
    for k in keys:
        c[k] = {".": {}, "f:lastHeartbeatTime": {}, "f:lastTransitionTime": {},
                "f:message": {}, "f:reason": {}, "f:status": {}, "f:type": {}}


# -- validating admission, as the API server evaluates a ValidatingAdmissionPolicy ------------
def admission_denials(policy: dict, obj: dict, user: str, namespace: dict | None,
                      operation: str = "CREATE", old: dict | None = None) -> list[str]:
    """The messages of `policy`'s validations that deny `obj` ([] = admitted): `object`,
    `oldObject`, `request`, `namespaceObject` and the policy's `variables` in order, an
    evaluation error denying (failurePolicy Fail). cel-python, as tests/packaging does."""
    import celpy

    env = celpy.Environment()
    act = {"object": celpy.json_to_cel(obj), "oldObject": celpy.json_to_cel(old),
           "namespaceObject": celpy.json_to_cel(namespace),
           "request": celpy.json_to_cel({"operation": operation,
                                         "namespace": (namespace or {}).get("metadata", {})
                                         .get("name"), "userInfo": {"username": user}})}

    def run(expr: str):
        try:
            return env.program(env.compile(expr)).evaluate(act)
        except Exception as exc:  # noqa: BLE001 - an evaluation error is a denial
            return exc

    variables: dict = {}
    for v in (policy.get("spec") or {}).get("variables") or ():
        act["variables"] = celpy.celtypes.MapType({celpy.celtypes.StringType(k): x for k, x in
                                                   variables.items()
                                                   if not isinstance(x, Exception)})
        variables[v["name"]] = run(v["expression"])
    act["variables"] = celpy.celtypes.MapType({celpy.celtypes.StringType(k): x for k, x in
                                               variables.items()
                                               if not isinstance(x, Exception)})
    failed = []
    for rule in policy["spec"]["validations"]:
        broken = [k for k, x in variables.items()
                  if isinstance(x, Exception) and f"variables.{k}" in rule["expression"]]
        result = None if broken else run(rule["expression"])
        if not (isinstance(result, celpy.celtypes.BoolType) and bool(result)):
            failed.append(rule["message"])
    return failed

"""The JSON types of the API objects the analyses read, checked where an answer arrives.

Why: the analyses read raw API dicts (`(pod.get("spec") or {}).get("containers")`); an answer
whose `metadata` is a string, whose list items are numbers or whose `restartCount` is a list
made them raise AttributeError deep inside, and the run ended as an internal error (exit 70:
round-3 audit U-40), which tells a bot the tool is broken. An API server that answers with the
wrong types is a cluster problem: one line naming the path and the field, exit 3, as kubectl
says `json: cannot unmarshal string into Go struct field Node.metadata of type
v1.ObjectMeta` for the same answer.

The schemas follow the Kubernetes core/v1 and coordination/v1 types
(https://kubernetes.io/docs/reference/kubernetes-api/) for the fields gpu-doctor reads and a
few around them; a field that is absent or null is always fine (the analyses treat it as
unset), a field not named is not looked at. The walk follows the schema, never the data's
depth, and is linear in the size of what it checks.
"""
from __future__ import annotations

import re
from typing import Any

STR, INT, BOOL = "string", "integer", "boolean"
QTY = "quantity"          # resource.Quantity: a string in JSON (numbers accepted)
OBJ = "object"            # any JSON object
STRMAP = "map of strings"


class Malformed(Exception):
    """The answer's `field` does not have the Kubernetes type (the message says which)."""


META = {"name": STR, "namespace": STR, "uid": STR, "generateName": STR,
        "resourceVersion": STR, "creationTimestamp": STR, "deletionTimestamp": STR,
        "labels": STRMAP, "annotations": STRMAP,
        "ownerReferences": [{"apiVersion": STR, "kind": STR, "name": STR, "uid": STR,
                             "controller": BOOL}]}
RESOURCES = {"limits": {QTY}, "requests": {QTY}}          # {QTY}: a map of quantities
CONTAINER = {"name": STR, "image": STR, "command": [STR], "args": [STR],
             "resources": RESOURCES, "securityContext": OBJ, "env": [OBJ], "ports": [OBJ]}
STATE = {"waiting": {"reason": STR, "message": STR},
         "running": {"startedAt": STR},
         "terminated": {"exitCode": INT, "signal": INT, "reason": STR, "message": STR,
                        "startedAt": STR, "finishedAt": STR, "containerID": STR}}
CONTAINER_STATUS = {"name": STR, "containerID": STR, "image": STR, "imageID": STR,
                    "ready": BOOL, "started": BOOL, "restartCount": INT, "state": STATE,
                    "lastState": STATE, "allocatedResources": {QTY}}
CONDITION = {"type": STR, "status": STR, "reason": STR, "message": STR,
             "lastTransitionTime": STR, "lastHeartbeatTime": STR, "lastProbeTime": STR}
POD = {"metadata": META,
       "spec": {"nodeName": STR, "schedulerName": STR, "priority": INT,
                "priorityClassName": STR, "runtimeClassName": STR, "restartPolicy": STR,
                "nodeSelector": STRMAP, "tolerations": [OBJ], "affinity": OBJ,
                "containers": [CONTAINER], "initContainers": [CONTAINER],
                "resourceClaims": [OBJ], "overhead": {QTY}, "hostPID": BOOL,
                "hostNetwork": BOOL, "activeDeadlineSeconds": INT},
       "status": {"phase": STR, "reason": STR, "message": STR, "qosClass": STR,
                  "startTime": STR, "nominatedNodeName": STR, "conditions": [CONDITION],
                  "containerStatuses": [CONTAINER_STATUS],
                  "initContainerStatuses": [CONTAINER_STATUS], "resourceClaimStatuses": [OBJ]}}
NODE = {"metadata": META,
        "spec": {"unschedulable": BOOL, "providerID": STR,
                 "taints": [{"key": STR, "value": STR, "effect": STR, "timeAdded": STR}]},
        "status": {"capacity": {QTY}, "allocatable": {QTY}, "conditions": [CONDITION],
                   "nodeInfo": STRMAP}}
EVENT = {"metadata": META,
         "involvedObject": {"kind": STR, "name": STR, "namespace": STR, "uid": STR,
                            "fieldPath": STR},
         "reason": STR, "message": STR, "type": STR, "count": INT, "firstTimestamp": STR,
         "lastTimestamp": STR, "eventTime": STR, "reportingComponent": STR,
         "reportingInstance": STR, "source": {"component": STR, "host": STR},
         "series": {"count": INT, "lastObservedTime": STR}}
LEASE = {"metadata": META,
         "spec": {"holderIdentity": STR, "leaseDurationSeconds": INT, "renewTime": STR,
                  "acquireTime": STR}}
LIST_META = {"resourceVersion": STR, "continue": STR, "remainingItemCount": INT}

# The queueing systems' and schedulers' objects analysis/scheduling/schedulers.py reads (audit round
# 5, SC-01: a field of another type ended `pod Y` in exit 70), after each project's API types:
# kueue.x-k8s.io v1beta2 workload_types.go, localqueue_types.go, clusterqueue_types.go;
# scheduling.volcano.sh v1beta1 types.go (PodGroup, Queue); scheduling.run.ai v2alpha2
# podgroup_types.go (KAI). A misfit makes the object unreadable (a note), not the run.
KUEUE_RESOURCES = [{"name": STR, "resources": [{"name": STR, "total": QTY, "borrowed": QTY}]}]
WORKLOAD = {"metadata": META,
            "spec": {"queueName": STR, "podSets": [OBJ], "priorityClassName": STR},
            "status": {"conditions": [CONDITION],
                       "admission": {"clusterQueue": STR, "podSetAssignments": [
                           {"name": STR, "count": INT, "flavors": STRMAP,
                            "resourceUsage": {QTY}}]},
                       "admissionChecks": [{"name": STR, "state": STR, "message": STR}]}}
LOCAL_QUEUE = {"metadata": META, "spec": {"clusterQueue": STR},
               "status": {"conditions": [CONDITION]}}
CLUSTER_QUEUE = {"metadata": META,
                 "spec": {"namespaceSelector": OBJ, "resourceGroups": [{
                     "coveredResources": [STR],
                     "flavors": [{"name": STR, "resources": [
                         {"name": STR, "nominalQuota": QTY, "borrowingLimit": QTY,
                          "lendingLimit": QTY}]}]}]},
                 "status": {"conditions": [CONDITION], "admittedWorkloads": INT,
                            "reservingWorkloads": INT, "pendingWorkloads": INT,
                            "flavorsReservation": KUEUE_RESOURCES,
                            "flavorsUsage": KUEUE_RESOURCES}}
VOLCANO_PODGROUP = {"metadata": META,
                    "spec": {"minMember": INT, "queue": STR, "minResources": {QTY},
                             "priorityClassName": STR},
                    "status": {"phase": STR, "conditions": [CONDITION], "running": INT,
                               "succeeded": INT, "failed": INT}}
VOLCANO_QUEUE = {"metadata": META,
                 "spec": {"weight": INT, "capability": {QTY}, "deserved": {QTY},
                          "guarantee": OBJ},
                 "status": {"state": STR, "allocated": {QTY}}}
KAI_PODGROUP = {"metadata": META,
                "spec": {"minMember": INT, "queue": STR, "priorityClassName": STR},
                "status": {"schedulingConditions": [{
                    "type": STR, "nodePool": STR, "status": STR, "reason": STR,
                    "message": STR, "lastTransitionTime": STR,
                    "reasons": [{"reason": STR, "message": STR}]}]}}

# path -> (what it is, the schema of the object or of each list item, a list?)
_PATHS = (
    (re.compile(r"^/api/v1/nodes$"), "node list", NODE, True),
    (re.compile(r"^/api/v1/nodes/[^/]+$"), "node", NODE, False),
    (re.compile(r"^/api/v1/(namespaces/[^/]+/)?pods$"), "pod list", POD, True),
    (re.compile(r"^/api/v1/namespaces/[^/]+/pods/[^/]+$"), "pod", POD, False),
    (re.compile(r"^/api/v1/(namespaces/[^/]+/)?events$"), "event list", EVENT, True),
    (re.compile(r"^/apis/coordination\.k8s\.io/v1/namespaces/[^/]+/leases/[^/]+$"), "lease",
     LEASE, False),
    (re.compile(r"^/apis/coordination\.k8s\.io/v1/namespaces/[^/]+/leases$"), "lease list",
     LEASE, True),
    (re.compile(r"^/apis/kueue\.x-k8s\.io/[^/]+/(namespaces/[^/]+/)?workloads$"),
     "Workload list", WORKLOAD, True),
    (re.compile(r"^/apis/kueue\.x-k8s\.io/[^/]+/namespaces/[^/]+/localqueues/[^/]+$"),
     "LocalQueue", LOCAL_QUEUE, False),
    (re.compile(r"^/apis/kueue\.x-k8s\.io/[^/]+/clusterqueues/[^/]+$"), "ClusterQueue",
     CLUSTER_QUEUE, False),
    (re.compile(r"^/apis/scheduling\.volcano\.sh/[^/]+/namespaces/[^/]+/podgroups/[^/]+$"),
     "PodGroup", VOLCANO_PODGROUP, False),
    (re.compile(r"^/apis/scheduling\.volcano\.sh/[^/]+/queues/[^/]+$"), "Queue",
     VOLCANO_QUEUE, False),
    (re.compile(r"^/apis/scheduling\.run\.ai/[^/]+/namespaces/[^/]+/podgroups/[^/]+$"),
     "PodGroup", KAI_PODGROUP, False),
)


# list item schemas by a small number: a page parser child is told which one with its page
SCHEMA_IDS: dict[int, dict] = {1: NODE, 2: POD, 3: EVENT, 4: LEASE, 5: WORKLOAD}


def schema_id(path: str) -> int:
    """The SCHEMA_IDS number of the items of the list at `path` (0: not checked)."""
    known = schema_for(path)
    if known is None or not known[2]:
        return 0
    return next(i for i, s in SCHEMA_IDS.items() if s is known[1])


def checking(each: Any, sid: int) -> Any:
    """`each` (a list item's reduction) preceded by the check of its item against schema
    `sid`: Malformed("item is ...") before anything reads a wrong type."""
    schema = SCHEMA_IDS.get(sid)
    if schema is None:
        return each

    def check_then(obj: Any) -> Any:
        if type(obj) is not dict:
            raise Malformed(f"an item is {_name(obj)}, not an object")
        bad = _bad(obj, schema)
        if bad is not None:
            raise Malformed(_say("an item", bad))
        return obj if each is None else each(obj)
    return check_then


def schema_for(path: str) -> tuple[str, dict, bool] | None:
    """(what the path answers, its schema, whether it is a list) for the paths analysed."""
    for rx, what, schema, is_list in _PATHS:
        if rx.match(path):
            return what, schema, is_list
    return None


def check_answer(path: str, doc: Any) -> None:
    """Raise Malformed naming the first field of `doc` (the answer for `path`) whose JSON type
    is not the Kubernetes one. Paths gpu-doctor does not analyse are not looked at."""
    known = schema_for(path)
    if known is None:
        return
    what, schema, is_list = known
    if not isinstance(doc, dict):
        raise Malformed(f"the {what} is {_name(doc)}, not an object")
    if is_list:
        _check(doc.get("metadata"), LIST_META, "metadata")
        check_items(doc.get("items"), schema, "items")
    else:
        _check(doc, schema, what)


def check_items(items: Any, schema: dict, where: str = "items", start: int = 0) -> None:
    """Each of `items` (numbered from `start` in the message) against `schema`."""
    if items is None:
        return
    if not isinstance(items, list):
        raise Malformed(f"{where} is {_name(items)}, not an array")
    for i, item in enumerate(items, start):
        if not isinstance(item, dict):
            raise Malformed(f"{where}[{i}] is {_name(item)}, not an object")
        bad = _bad(item, schema)
        if bad is not None:
            raise Malformed(_say(f"{where}[{i}]", bad))


def _check(value: Any, schema: Any, where: str) -> None:
    bad = _bad(value, schema)
    if bad is not None:
        raise Malformed(_say(where, bad))


def _say(where: str, bad: tuple[list, Any, str]) -> str:
    path, value, want = bad
    keys = "".join(f"[{k}]" if isinstance(k, int) else f".{_key(k)}" for k in reversed(path))
    return f"{where}{keys} is {_name(value)}, not {want}"


def _bad(value: Any, schema: Any) -> tuple[list, Any, str] | None:
    """None when `value` fits `schema`, else (the path to the first misfit, reversed; the
    misfit; what was expected). The path is built only on a misfit (checking is the hot path:
    every pod of a 150,000-pod list)."""
    if value is None:
        return None
    if type(schema) is dict:
        if type(value) is not dict:
            return [], value, "an object"
        for key, sub in schema.items():
            v = value.get(key)
            if v is None:
                continue
            if sub is STR:
                if type(v) is not str:
                    return [key], v, "a string"
                continue
            bad = _bad(v, sub)
            if bad is not None:
                bad[0].append(key)
                return bad
        return None
    if type(schema) is list:
        if type(value) is not list:
            return [], value, "an array"
        sub = schema[0]
        for i, v in enumerate(value):
            if v is None and type(sub) is dict:   # a null object in a list: Go never sends one
                return [i], v, "an object"
            bad = _bad(v, sub)
            if bad is not None:
                bad[0].append(i)
                return bad
        return None
    if type(schema) is set:            # {QTY}: a map whose values are quantities
        if type(value) is not dict:
            return [], value, "an object"
        for k, v in value.items():
            if not _is(v, QTY):
                return [k], v, "a quantity"
        return None
    if schema is STRMAP:
        if type(value) is not dict:
            return [], value, "an object"
        for k, v in value.items():
            if type(v) is not str:
                return [k], v, "a string"
        return None
    if not _is(value, schema):
        return [], value, _article(schema)
    return None


def _is(v: Any, t: str) -> bool:
    if t == STR:
        return isinstance(v, str)
    if t == INT:
        return type(v) is int
    if t == BOOL:
        return type(v) is bool
    if t == QTY:
        return isinstance(v, str) or type(v) in (int, float)
    if t == OBJ:
        return isinstance(v, dict)
    raise AssertionError(t)  # pragma: no cover - the schemas above use only these


def _name(v: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            int: "a number", float: "a number", type(None): "null"}.get(type(v), "a value")


def _article(t: str) -> str:
    return f"an {t}" if t[0] in "aeiou" else f"a {t}"


def _key(k: str) -> str:
    return k[:60] if k.replace("-", "").replace("_", "").replace(".", "").replace(
        "/", "").isalnum() else repr(k[:60])

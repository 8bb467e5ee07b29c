"""The fake API server's watch-lists (KEP-3157 streaming lists), as a 1.35 API server answers them.

Why: api/watchlist.py reads a list as one watch where the server serves it, the paged list
where not; both halves must be tested against the HTTP answers a real server gives. What this
answers (fakecluster.FakeCluster._list hands it every `watch=` request):

- the request validated as apimachinery's ValidateListOptions does for a watch
  (staging/src/k8s.io/apimachinery/pkg/apis/meta/internalversion/validation/validation.go:
  sendInitialEvents needs resourceVersionMatch=NotOlderThan, resourceVersionMatch needs
  sendInitialEvents, and with the `WatchList` gate off sendInitialEvents is forbidden), each
  failure a 422 Invalid Status made as handlers/get.go's ListResource makes it
  (errors.NewInvalid of kind ListOptions in meta.k8s.io, name "");
- then, as a 200 chunked stream of one JSON event a line (Go's encoder: compact, "\\n" after
  each): an ADDED event for each object, then one BOOKMARK whose object is the kind's empty
  object with only metadata.resourceVersion and the annotation `k8s.io/initial-events-end:
  "true"` (the cacher's bookmark: https://kubernetes.io/docs/reference/using-api/
  api-concepts/#streaming-lists), then nothing while the stream stays open: until the client
  leaves (counted in `watch_left`) or timeoutSeconds (at most WATCH_OPEN_S here);
- switches on the cluster: `watch_list` (False: the gate is off), `watch_cut_after` (the stream
  ends after that many ADDED events, before the bookmark: a proxy or load balancer cut),
  `watch_error_after` (an ERROR event with the cacher's 410 Expired Status after that many,
  then the end, as handlers/watch.go ends a stream after an error), `watch_trickle_s` (the
  stream sent a few bytes at a time, this long apart), `watch_event_delay_s` (one event at a
  time, this long apart), `watch_lines` (these raw lines instead of the events, then the end:
  a hostile server).
"""
from __future__ import annotations

import asyncio
import contextvars
import json
import time
from typing import Any, Callable

import kmock

INITIAL_EVENTS_END = "k8s.io/initial-events-end"
WATCH_OPEN_S = 30.0  # the longest the fake keeps a stream open after its bookmark
# the cacher's Status for a resourceVersion older than its window
# (staging/src/k8s.io/apiserver/pkg/storage/cacher/watch_cache.go: NewResourceExpired)
EXPIRED = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": "too old resource version: 1 (1000)", "reason": "Expired", "code": 410}
GATE_OFF = "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"

# the request being answered (set by FakeCluster._dispatch): a stream watches its transport
REQUEST: contextvars.ContextVar = contextvars.ContextVar("fake_request", default=None)


def line(event_type: str, obj: Any) -> bytes:
    return json.dumps({"type": event_type, "object": obj}, separators=(",", ":")).encode() + b"\n"


def invalid(q: dict, gate_on: bool) -> dict | None:
    """The 422 Status a real server answers for this watch's options, or None."""
    causes = []
    send, match = q.get("sendInitialEvents"), q.get("resourceVersionMatch")
    if send is not None:
        if match != "NotOlderThan":
            causes.append(("resourceVersionMatch", "FieldValueForbidden", "Forbidden",
                           "sendInitialEvents requires setting resourceVersionMatch to "
                           "NotOlderThan"))
        if not gate_on:
            causes.append(("sendInitialEvents", "FieldValueForbidden", "Forbidden", GATE_OFF))
    if match:
        if send is None:
            causes.append(("resourceVersionMatch", "FieldValueForbidden", "Forbidden",
                           "resourceVersionMatch is forbidden for watch unless "
                           "sendInitialEvents is provided"))
        if match != "NotOlderThan":
            causes.append(("resourceVersionMatch", "FieldValueNotSupported",
                           "Unsupported value", f'"{match}": supported values: '
                                                f'"NotOlderThan"'))
    if not causes:
        return None
    errs = [f"{field}: {kind}: {text}" for field, _, kind, text in causes]
    agg = errs[0] if len(errs) == 1 else "[" + ", ".join(errs) + "]"
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": f'ListOptions.meta.k8s.io "" is invalid: {agg}', "reason": "Invalid",
            "details": {"group": "meta.k8s.io", "kind": "ListOptions", "causes": [
                {"reason": reason, "message": f"{kind}: {text}", "field": field}
                for field, reason, kind, text in causes]},
            "code": 422}


def bookmark(kind: str) -> bytes:
    """The BOOKMARK that ends the initial events: the kind's empty object (a Pod's encodes
    `spec.containers` as null and an empty status), its resourceVersion, the annotation."""
    obj: dict = {"kind": kind, "apiVersion": "v1", "metadata": {
        "resourceVersion": "1000", "annotations": {INITIAL_EVENTS_END: "true"}}}
    if kind == "Pod":
        obj.update({"spec": {"containers": None}, "status": {}})
    return line("BOOKMARK", obj)


def answer(fc: Any, list_kind: str, selected: Callable[[], list[dict]], q: dict) -> Any:
    """The answer to a watch of the list `list_kind` (e.g. PodList) whose objects are
    `selected()` (selectors applied)."""
    bad = invalid(q, fc.watch_list)
    if bad is not None:
        return kmock.Response(status=422, payload=bad)
    fc.watches_served += 1
    kind = list_kind[:-4] if list_kind.endswith("List") else list_kind
    initial = q.get("sendInitialEvents") == "true" or (
        q.get("sendInitialEvents") is None and not q.get("resourceVersion"))
    key = (list_kind, q.get("labelSelector"), q.get("fieldSelector"))
    body = fc.watch_cache.get(key) if fc.cache_lists else None
    if body is None:
        body = b"".join(line("ADDED", o) for o in selected()) if initial else b""
        if fc.cache_lists:
            fc.watch_cache[key] = body
    try:
        open_s = min(WATCH_OPEN_S, float(q.get("timeoutSeconds") or WATCH_OPEN_S))
    except ValueError:
        open_s = WATCH_OPEN_S
    ends = q.get("sendInitialEvents") == "true" and q.get("allowWatchBookmarks") == "true"
    return kmock.Response(status=200, payload=_stream(fc, body, kind, ends, open_s,
                                                      REQUEST.get()),
                          headers={"Content-Type": "application/json"})


def prebuild(fc: Any, list_kind: str, objects: list[dict], field_selector: str | None = None
             ) -> None:
    """Encode a cached watch answer ahead (the bench: the first watch of 150,000 pods would
    encode them on the fake's event loop while the CLI's other lists wait)."""
    fc.watch_cache[(list_kind, None, field_selector)] = b"".join(
        line("ADDED", o) for o in objects)


async def _stream(fc: Any, body: bytes, kind: str, ends: bool, open_s: float, request: Any):
    fc.watches_open += 1
    try:
        if fc.watch_lines is not None:  # a hostile server: these lines, then the end
            for raw in fc.watch_lines:
                fc.watch_bytes_sent += len(raw)
                yield raw
            return
        cut, err = fc.watch_cut_after, fc.watch_error_after
        limits = [n for n in (cut, err) if n is not None]
        stop = min(limits) if limits else None
        if stop is not None:  # after that many events, the cut or the error
            end = 0
            for _ in range(stop):
                end = body.find(b"\n", end) + 1
                if not end:
                    end = len(body)
                    break
            body = body[:end]
        if fc.watch_event_delay_s:  # one event at a time, this long apart
            for ev in body.splitlines(keepends=True):
                await asyncio.sleep(fc.watch_event_delay_s)
                yield ev
            body = b""
        step = 7 if fc.watch_trickle_s else 1 << 18
        for i in range(0, len(body), step):
            if fc.watch_trickle_s:
                await asyncio.sleep(fc.watch_trickle_s)
            yield body[i:i + step]
        if stop is not None:
            if stop == err:
                yield line("ERROR", EXPIRED)
            return
        if ends:
            yield bookmark(kind)
        t = time.monotonic() + open_s
        try:
            while time.monotonic() < t:  # open, silent, until the client leaves
                if _gone(request):
                    fc.watch_left += 1
                    return
                await asyncio.sleep(0.02)
        except (asyncio.CancelledError, GeneratorExit):  # aiohttp ends the handler: it left
            fc.watch_left += 1
            raise
    finally:
        fc.watches_open -= 1


def _gone(request: Any) -> bool:
    raw = getattr(request, "_raw_request", None)
    transport = getattr(raw, "transport", None) if raw is not None else None
    return raw is not None and (transport is None or transport.is_closing())

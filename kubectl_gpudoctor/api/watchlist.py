"""Streaming lists (KEP-3157 watch-lists): a list read as one watch, the paged list where not.

Why: a paged list of 150,000 pods is 150 LIST calls that the API server answers from etcd, or
from its watch cache, each page built whole in its memory before the first byte goes out; the
API server's memory, not ours, is what large clusters run out of (kubernetes.io blog
"Enhancing Kubernetes API Server Efficiency with API Streaming", 2024-12-17). A watch with
`sendInitialEvents=true` streams the same objects one event at a time from the watch cache:
`ADDED` for each object that exists, then one `BOOKMARK` whose object carries the annotation
`k8s.io/initial-events-end: "true"` (the list is complete there), then the changes since,
which a list does not want: the stream is closed as soon as the bookmark arrives.
The request is the one client-go's reflector sends (reflector.go, watchList):
`watch=1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan`
with no resourceVersion (a consistent read: the bookmark comes once the state is at least as
new as when the request started; https://kubernetes.io/docs/reference/using-api/api-concepts/
#streaming-lists), plus timeoutSeconds (600) so the server ends a stream its client forgot.
The server-side gate `WatchList` is beta since 1.32, on by default except in 1.33; client-go
uses it by default from 1.35 (WatchListClient). A server without it answers 422 Invalid
(`ListOptions.meta.k8s.io "" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is
forbidden for watch unless the WatchList feature gate is enabled`; older ones reject
resourceVersionMatch on a watch the same way), RBAC may allow `list` but not `watch` (403).

The contract is pager.list_items's, so `nodes` chooses with one name: the same reductions
(each event's object, in batches of PAGE_SIZE made into a list page, parsed by the same
page parsers -- typedpods' msgspec types for pods, in child processes for long lists), the
same fold (`into.page`), the same bounds (items, bytes, kept bytes, resident memory sized
from the nodes: pager.Memory). Events are split by msgspec's line decoder, each one's
object kept as raw bytes, never built here.

Never hang, never grow: one deadline for the whole stream (deadline.py's watchdog shuts the
socket), which starts at the request timeout and grows by one request timeout for every
PAGE_SIZE objects that arrive -- the time the paged list would have had for them -- so bytes
that trickle never extend it; a line (one event: one object, which etcd caps at 1.5 MiB)
past LINE_MAX_BYTES is an error as soon as it is seen, not a buffer.

A server that rejects the request (an error status), or a stream that ends, breaks or sends
an ERROR event (e.g. 410 Expired) or any event but ADDED before the bookmark, is listed again
with the paged list, from scratch (`into.reset()`), once, without a word; the user hears only
if that fails too (its own error, one line). Past the deadline, or an answer no API server
gives (an event that is not JSON, of the wrong types, an oversize line), it is an error, as
for a page: the paged list against the same server would not do better.
"""
from __future__ import annotations

import collections
import queue
import signal
import threading
import time
from typing import Any, Callable, Sequence

from .. import errors
from . import deadline, pageparse, pager, shape, typedpods
from .kube import OBJECT_MAX_BYTES, Kube, malformed
from .slim import slim

INITIAL_EVENTS_END = "k8s.io/initial-events-end"
# one event is one object: the size one GET may answer (etcd stores at most 1.5 MiB)
LINE_MAX_BYTES = OBJECT_MAX_BYTES
READ_BYTES = 1 << 20      # what one read of the stream may return
BATCH_BYTES = 16 << 20    # a batch ends at PAGE_SIZE events or this many bytes of them
# timeoutSeconds: the server ends a watch its client forgot (client-go asks 5-10 minutes);
# a list that outlasts it ends before its bookmark, and is paged
QUERY = (("watch", "1"), ("sendInitialEvents", "true"), ("allowWatchBookmarks", "true"),
         ("resourceVersionMatch", "NotOlderThan"), ("timeoutSeconds", "600"))


ENV = "GPU_DOCTOR_WATCH_LIST"  # 1: streaming lists where served; 0: paged lists only
DEFAULT = False


def wanted(environ: Any = None) -> bool:
    """Whether `nodes` reads its pods and events as streaming lists (ENV, else DEFAULT)."""
    import os
    v = (os.environ if environ is None else environ).get(ENV, "").strip().lower()
    return DEFAULT if v not in ("0", "1", "true", "false") else v in ("1", "true")


class Fallback(Exception):
    """The streaming list cannot be used here: the paged list instead (why: the message)."""


def usable(kube: Any) -> bool:
    """Whether this client can read a streaming list fast: msgspec splits its events (without
    it every list is paged) and `kube` streams."""
    return typedpods.available and hasattr(kube, "stream")


def list_items(kube: Kube, path: str, query: Sequence[tuple[str, Any]] = (), *,
               page_size: int = pager.PAGE_SIZE, timeout: float | None = None,
               each: Callable[[dict], dict] | None = slim,
               parsers: "pageparse.ParsePool | None" = None,
               max_rss: int | None = None, into: Any = None,
               memory: "pager.Memory | None" = None) -> tuple[list[dict], int]:
    """pager.list_items's answer (every item, or each batch handed to `into.page`; and how
    many batches or pages), from a streaming list where the server serves one, else from the
    paged list (see the module's docstring)."""
    mem = memory if memory is not None else pager.Memory(max_rss)
    kw = dict(page_size=page_size, timeout=timeout, each=each, parsers=parsers, into=into,
              memory=mem)
    if usable(kube):
        try:
            return _stream(kube, path, list(query), page_size, timeout, each, parsers, mem,
                           into)
        except Fallback:
            if into is not None:
                into.reset()
    return pager.list_items(kube, path, query, **kw)


def _envelope() -> Any:
    """msgspec's decoder of watch events, one a line: (type, object as raw bytes)."""
    import msgspec
    event = msgspec.defstruct("WatchEvent", [("type", str), ("object", msgspec.Raw)],
                              gc=False)
    return msgspec.json.Decoder(event)


_DECODER: Any = None


def _stream(kube: Kube, path: str, query: list, page_size: int, timeout: float | None,
            each: Callable[[dict], dict] | None, parsers: "pageparse.ParsePool | None",
            mem: "pager.Memory", into: Any) -> tuple[list[dict], int]:
    global _DECODER
    if _DECODER is None:
        _DECODER = _envelope()
    each, kind, compactor = pager.reductions(path, each)
    idle = float(timeout or getattr(kube, "timeout_s", 0) or 15.0)
    got_so_far = pager.Collected(path, into, mem)
    # the longest the stream may take in all: a request timeout per page of the most items
    # (the watchdog's deadline, moved as objects arrive, ends it long before)
    hard = idle * (2 + pager.MAX_FOLDED_ITEMS // page_size)
    q = query + list(QUERY)
    batches = 0
    use_children = parsers is not None and bool(parsers.workers) and kind is not None
    inflight: collections.deque = collections.deque()  # (page, future) with a child

    def parsed(page: bytes, fut: Any) -> None:
        try:
            if fut is not None:
                got, _, size = parsers.result(fut, lambda: page, each)
            else:
                got, _ = pageparse.parse_reduced(page, each, compactor)
                size = None
        except pageparse.NotJson:
            raise errors.ApiError(f"the API server sent non-JSON for {path}") from None
        except shape.Malformed as exc:
            raise malformed(path, exc) from None
        finally:
            if hasattr(kube, "pass_notes"):
                kube.pass_notes(f"the API server's answer for {path}: ")
        if got:
            got_so_far.add(got, size, batches)

    def batch(raws: list, last: bool) -> None:
        """One batch of objects: a list page, parsed by a child (long lists) or here."""
        nonlocal batches
        if not raws:
            return
        batches += 1
        page = b'{"items":[' + b",".join(raws) + b"]}"
        if use_children and not (last and not inflight):
            inflight.append((page, parsers.submit(page, kind)))
            while len(inflight) > parsers.workers:
                parsed(*inflight.popleft())
        else:
            while inflight:
                parsed(*inflight.popleft())
            parsed(page, None)

    reader = _Reader(kube, path, q, idle, hard, page_size, got_so_far.most_bytes)
    reader.start()
    try:
        while True:
            try:
                got = reader.out.get(timeout=0.5)
            except queue.Empty:   # the reader's deadline bounds the wait
                continue
            if isinstance(got, BaseException):
                raise got
            raws, last = got
            batch(raws, last)
            reader.most_bytes, reader.folded = got_so_far.most_bytes, got_so_far.count
            if last:
                break
        while inflight:
            parsed(*inflight.popleft())
    finally:
        reader.close()
        for _page, fut in inflight:
            fut.cancel()
    return got_so_far.items, batches


class _Reader(threading.Thread):
    """Reads the stream and splits its events, in its own thread (the socket read releases
    the GIL: the next events arrive while the caller's thread folds), and hands the objects
    over in batches of `page_size` (`out`: at most 1 waiting), then (objects, True) at the
    bookmark, or the exception that ended the stream (Fallback, or the tool's error)."""

    def __init__(self, kube: Kube, path: str, query: list, idle: float, hard: float,
                 page_size: int, most_bytes: int) -> None:
        super().__init__(name="watchlist", daemon=True)
        self.kube, self.path, self.query = kube, path, query
        self.idle, self.hard, self.page_size = idle, hard, page_size
        self.most_bytes = most_bytes   # updated by the folding thread (sized from the nodes)
        self.folded = 0                # objects folded so far (said in errors)
        self.out: queue.Queue = queue.Queue(maxsize=1)
        self.stop = threading.Event()
        self.ticket: deadline.Ticket | None = None
        self.seen = False   # whether a watch event came (before: an answer that is not a
                            # stream means the server does not serve streaming lists)

    def close(self) -> None:
        """Stop reading: the socket is shut (a watch's connection is never reused; the
        server sees its client leave), the thread ends."""
        self.stop.set()
        ticket = self.ticket
        if ticket is not None:
            ticket.expire()
        self.join(10)

    def _put(self, item: Any) -> None:
        while not self.stop.is_set():
            try:
                self.out.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def run(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            self._read()
        except BaseException as exc:  # noqa: BLE001 - handed to the folding thread
            self._put(exc)

    def _events(self, region: Any, raws: list) -> tuple[bool, int]:
        """The events of `region` (whole lines) into `raws`: (whether the bookmark that ends
        the initial events came -- what follows it is not read --, the objects' bytes)."""
        import msgspec
        try:
            evs = _DECODER.decode_lines(region)
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError) as exc:
            if not self.seen:  # not a watch stream at all (a proxy's list, a page)
                raise Fallback(f"the answer is not a watch stream: {exc}"[:300]) from None
            raise _bad_event(self.path, exc) from None
        self.seen = self.seen or bool(evs)
        size = 0
        for ev in evs:
            t = ev.type
            if t == "ADDED":
                raws.append(ev.object)
                size += len(ev.object)
            elif t == "BOOKMARK":
                if _ends_initial(self.path, ev.object):
                    return True, size
            elif t == "ERROR":
                raise Fallback(f"ERROR event: {_status_words(ev.object)}")
            else:  # a change before the list is whole: not a streaming list we can read
                raise Fallback(f"a {t[:20]!r} event before the initial events ended")
        return False, size

    def _read(self) -> None:
        path, idle, page_size = self.path, self.idle, self.page_size
        budget = idle
        t0 = time.monotonic()
        gen = self.kube.stream(path, self.query, connect_timeout=idle, read_timeout=self.hard,
                               chunk_size=READ_BYTES, deadline_s=budget)
        tail: list[bytes] = []   # the line being read (no newline yet), in pieces
        since_nl = 0             # its length so far
        raws: list = []
        raw_bytes = arrived = fetched = 0
        done = False
        try:
            try:
                for chunk in gen:
                    if self.stop.is_set():
                        return
                    if self.ticket is None:
                        self.ticket = deadline.current_ticket()
                    fetched += len(chunk)
                    if fetched > self.most_bytes:
                        raise pager._endless(path, 0, self.folded + len(raws))
                    last = chunk.rfind(b"\n")
                    if last < 0:
                        since_nl += len(chunk)
                        if since_nl > LINE_MAX_BYTES:
                            raise _line_too_long(path, self.folded, self.seen)
                        tail.append(chunk)
                        continue
                    first = chunk.find(b"\n")
                    if since_nl + first > LINE_MAX_BYTES:
                        raise _line_too_long(path, self.folded, self.seen)
                    lines = memoryview(chunk)[:last + 1]   # whole lines, never copied here
                    if tail:   # the line the last chunks began: the one copy of a line
                        tail.append(chunk[:first + 1])
                        done, n = self._events(b"".join(tail), raws)
                        raw_bytes += n
                        lines = lines[first + 1:]
                    if not done and len(lines):
                        done, n = self._events(lines, raws)
                        raw_bytes += n
                    del lines
                    since_nl = len(chunk) - last - 1
                    if since_nl > LINE_MAX_BYTES:
                        raise _line_too_long(path, self.folded, self.seen)
                    tail = [chunk[last + 1:]] if since_nl else []
                    while len(raws) >= page_size:   # pages of page_size objects
                        arrived += page_size
                        self._put((raws[:page_size], False))
                        del raws[:page_size]
                    if done or raw_bytes >= BATCH_BYTES:
                        arrived += len(raws)
                        self._put((raws, done))
                        raws, raw_bytes = [], 0
                    if done:
                        return
                    # a request timeout more for each page of objects that arrived
                    budget = idle * (1 + (arrived + len(raws)) // page_size)
                    if self.ticket is not None:
                        self.ticket.extend(budget)
            except errors.StreamBroken as exc:
                if self.stop.is_set():
                    return
                if time.monotonic() >= t0 + budget:
                    raise _too_slow(path, budget, self.folded) from None
                raise Fallback(f"the stream broke: {exc.message}") from None
            except errors.ClientTimeout:
                raise _too_slow(path, budget, self.folded) from None
            except (errors.ClientError, errors.ServerError) as exc:
                # the server answered with an error status: it does not serve this (a gate
                # off, an older server, RBAC without `watch`)
                raise Fallback(f"{exc.status} {exc.reason}: {exc.message}"[:300]) from None
            if not self.stop.is_set():   # what is left is a line cut short
                raise Fallback("the stream ended before its initial events did")
        finally:
            # a watch's connection is never reused: shut it (the server sees its client leave)
            if self.ticket is not None:
                self.ticket.expire()
            gen.close()


def _ends_initial(path: str, raw: Any) -> bool:
    """Whether a BOOKMARK's object carries `k8s.io/initial-events-end: "true"`."""
    import msgspec
    try:
        obj = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise _bad_event(path, exc) from None
    md = obj.get("metadata") if type(obj) is dict else None
    ann = md.get("annotations") if type(md) is dict else None
    return type(ann) is dict and ann.get(INITIAL_EVENTS_END) == "true"


def _status_words(raw: Any) -> str:
    """An ERROR event's Status as `CODE Reason: message` (data: quoted as the server's)."""
    import msgspec
    try:
        st = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return "an ERROR event that is not a Status"
    if type(st) is not dict:
        return "an ERROR event that is not a Status"
    return " ".join(str(st.get(k))[:200] for k in ("code", "reason", "message")
                    if st.get(k) is not None) or "an ERROR event"


def _bad_event(path: str, exc: Exception) -> errors.BadAnswer:
    return errors.BadAnswer(f"the API server's streaming list of {path} sent an event that is "
                            f"not a watch event: {str(exc)[:160]}", path=path)


def _line_too_long(path: str, count: int, seen: bool = True) -> Exception:
    """An event over LINE_MAX_BYTES: an error; before any event came, an answer that is not a
    watch stream (a list page answered to a watch): the paged list."""
    if not seen:
        return Fallback("the answer is not a watch stream (a first line over "
                        f"{LINE_MAX_BYTES >> 20} MiB)")
    return errors.TooLarge(f"the API server's streaming list of {path} sent an event over "
                           f"{LINE_MAX_BYTES >> 20} MiB (after {count} items); not read further",
                           path=path)


def _too_slow(path: str, budget: float, count: int) -> errors.ClientTimeout:
    return errors.ClientTimeout(
        f"client-side timeout: no complete answer within {budget:g}s (a streaming list: "
        f"{count} items had come, a page's request timeout is allowed for every "
        f"{pager.PAGE_SIZE})", status=504, reason="Timeout", path=path)

"""List pages parsed in child processes: json.loads and the per-item reduction off the main one.

Why: on 150,000 pods the client spends most of its time in one core's worth of Python --
json.loads of ~7 MiB pages (~50 ms each), freeing the parsed trees, and reducing each pod to
what the analyses read (slim.PodCompactor) -- while fetching a page costs ~7 ms. The GIL
keeps threads from sharing that work, so `nodes` hands raw pages to a few child processes
(plain pipes, no multiprocessing machinery: it runs the same way from a PyInstaller build)
and gets back only the reduced items, marshalled (~0.5 MiB a page, ~5 ms to load). Children
are our own code, start in their own session (Ctrl-C goes to the CLI, which closes them),
exit when their stdin closes (so also when the CLI dies), and a child that breaks, stalls or
cannot start costs nothing but speed: the page is parsed in the CLI instead. A child's answer
is checked before it is believed: a status we do not know, a length past what the page can
reduce to (answer_cap: never a buffer of the claimed 1 GiB), or a result that is not
(list of objects, token) is a broken child, like any other failure of its thread.

Run as `python -m kubectl_gpudoctor.api.pageparse` (the child); `ParsePool` is the CLI's side.
"""
from __future__ import annotations

import concurrent.futures as cf
import gc
import json
import marshal
import os
import queue
import re
import signal
import struct
import subprocess
import sys
import threading
from json.decoder import scanstring
from typing import Any, Callable

from . import depth
from .slim import DECODER

_HEAD = struct.Struct("!BQ")  # kind (request) or status (answer), payload length
KIND_SLIM, KIND_PODS, KIND_PODS_IDS = 0, 1, 2  # slim.slim, slim.PodCompactor(container_ids)
_OK, _NOT_JSON, _DEEP = 0, 1, 2   # _DEEP: an item was cut (depth.py): the CLI parses it
PAGE_TIMEOUT_S = 30.0  # one page in a child: ~0.1 s; past this the child is killed


class NotJson(ValueError):
    """The page was not a JSON document."""


def parse_page(raw: bytes, each: Callable[[dict], Any] | None) -> tuple[list, str | None]:
    """(reduced items, the page's continue token) of one raw list page. Raises NotJson.

    Item by item (JSONDecoder.raw_decode at each element of `items`), each reduced by `each`
    before the next is parsed: the page is never one tree of ~2,000 whole pods (~35 MiB)."""
    was = gc.isenabled()
    gc.disable()  # JSON trees have no cycles; the cyclic GC would rescan every new dict
    try:
        text = raw.decode("utf-8") if not isinstance(raw, str) else raw
        return _walk_list(text, each)
    except (ValueError, IndexError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise NotJson("not JSON") from None
    finally:
        if was:
            gc.enable()


_WS = re.compile(r"[ \t\n\r]*")


_DECODE = DECODER.raw_decode  # member names interned (slim.DECODER)


def _walk_list(s: str, each: Callable[[dict], Any] | None) -> tuple[list, str | None]:
    """The top-level object's members one by one; `items` element by element."""
    ws, decode = _WS.match, _DECODE
    i = ws(s, 0).end()
    if s[i] != "{":  # not a list object: whatever json.loads makes of it
        depth.loads(s)
        return [], None
    items: list = []
    token = None
    i = ws(s, i + 1).end()
    if s[i] == "}":
        i += 1
    else:
        while True:
            if s[i] != '"':
                raise ValueError("member name expected")
            key, i = scanstring(s, i + 1)
            i = ws(s, i).end()
            if s[i] != ":":
                raise ValueError("':' expected")
            i = ws(s, i + 1).end()
            if key == "items" and s[i] == "[":
                items = []  # a repeated key: the last one counts, as in json.loads
                i = ws(s, i + 1).end()
                if s[i] == "]":
                    i += 1
                else:
                    while True:
                        obj, i, n = depth.raw_decode(decode, s, i)
                        if n:   # this one item was nested past the decoder: cut, and said
                            depth.note(f"{_named(obj)}: {depth.cut_words(n)}")
                        items.append(each(obj) if each and isinstance(obj, dict) else obj)
                        del obj
                        i = ws(s, i).end()
                        c = s[i]
                        i = ws(s, i + 1).end()
                        if c == "]":
                            break
                        if c != ",":
                            raise ValueError("',' or ']' expected")
            else:
                val, i, n = depth.raw_decode(decode, s, i)
                if n:
                    depth.note(f"{key[:40]!r}: {depth.cut_words(n)}")
                if key == "metadata":
                    t = val.get("continue") if isinstance(val, dict) else None
                    token = t if isinstance(t, str) and t else None
            i = ws(s, i).end()
            c = s[i]
            i += 1
            if c == "}":
                break
            if c != ",":
                raise ValueError("',' or '}' expected")
            i = ws(s, i).end()
    if ws(s, i).end() != len(s):
        raise ValueError("extra data")
    return items, token


def _named(obj: Any) -> str:
    """`namespace/name` of a list item, for a note (quoted data: the item's own text)."""
    md = obj.get("metadata") if isinstance(obj, dict) else None
    md = md if isinstance(md, dict) else {}
    ns, name = md.get("namespace"), md.get("name")
    name = name if isinstance(name, str) else "?"
    return ascii(f"{ns}/{name}" if isinstance(ns, str) and ns else name)[:120]


KIND_BITS = 3   # a page's kind byte: the reduction (low bits), shape.SCHEMA_IDS (high bits)


def _each(kind: int) -> tuple[Callable[[dict], Any], Any]:
    """(the reduction `kind` names, checked against its schema; its slim.PodCompactor when
    the items are pods that typedpods may decode, else None)."""
    from . import shape, slim
    # a fresh compactor per page: the CLI gets each page's shared parts once (marshal keeps
    # references), and the child's table does not grow with the list
    reduce, sid = kind & ((1 << KIND_BITS) - 1), kind >> KIND_BITS
    if reduce in (KIND_PODS, KIND_PODS_IDS):
        comp = slim.PodCompactor(container_ids=reduce == KIND_PODS_IDS)
        return shape.checking(comp, sid), comp if shape.SCHEMA_IDS.get(sid) is shape.POD \
            else None
    return shape.checking(slim.slim, sid), None


def parse_reduced(raw: bytes, each: Callable[[dict], Any],
                  compactor: Any = None) -> tuple[list, str | None]:
    """parse_page(raw, each). With `compactor` (the slim.PodCompactor of a pod list's `each`,
    shape.checking(compactor, POD)), typedpods decodes the page where it can (~5x cheaper,
    the same items); a page it declines is parsed here, by the stdlib."""
    if compactor is not None and isinstance(raw, (bytes, bytearray)):
        from . import typedpods
        got = typedpods.parse(raw, each, compactor)
        if got is not None:
            return got
    return parse_page(raw, each)


def child_argv() -> list[str]:
    """argv that runs this module in a child, also from the frozen (PyInstaller) build, whose
    executable runs `__run_module MODULE` (packaging/kubectl-gpu_doctor.py)."""
    if getattr(sys, "frozen", False):
        return [sys.executable, "__run_module", __name__]
    return [sys.executable, "-m", "kubectl_gpudoctor.api.pageparse"]


class _Child:
    def __init__(self) -> None:
        self.pages = 0  # pages this child parsed
        self.closing = False  # close() asked: a page in flight fails as PoolClosed, not broken
        self.proc = subprocess.Popen(child_argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        self.jobs: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._serve, name="pageparse", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:  # closed: what is still queued is not parsed
                self._fail_rest(PoolClosed("the page parsers were closed"))
                return
            raw, kind, fut = job
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                size = len(raw)
                self.proc.stdin.write(_HEAD.pack(kind, size))
                self.proc.stdin.write(raw)
                self.proc.stdin.flush()
                del raw
                head = _read_exact(self.proc.stdout, _HEAD.size)
                status, n = _HEAD.unpack(head)
                if status not in (_OK, _NOT_JSON, _DEEP) or n > answer_cap(size):
                    raise ValueError(f"answer of status {status}, {n} bytes, to a page of "
                                     f"{size} bytes")
                body = _read_exact(self.proc.stdout, n)
                if status == _NOT_JSON:
                    fut.set_exception(NotJson("not JSON"))
                    continue
                if status == _DEEP:   # parsed again in the CLI, where its notes are said
                    fut.set_exception(BrokenChild("an item nested too deep"))
                    continue
                result = _checked(marshal.loads(body))
                del body
                self.pages += 1
                fut.set_result((*result, n))  # n: what the reduced page weighs (pager.py)
            except Exception as exc:  # noqa: BLE001 - whatever it sent: this child is done
                # the child closed under a page (the pool is ending): the walk stops too,
                # instead of fetching that page again to parse it here
                fut.set_exception(PoolClosed("the page parsers were closed") if self.closing
                                  else BrokenChild(f"{type(exc).__name__}: {exc}"[:200]))
                self.kill()
                self._fail_rest()
                return

    def _fail_rest(self, exc: Exception | None = None) -> None:
        while True:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                return
            if job is not None and job[2].set_running_or_notify_cancel():
                job[2].set_exception(exc or BrokenChild("page parser gone"))

    def kill(self) -> None:
        try:
            self.proc.kill()
        except OSError:
            pass

    def close(self) -> None:
        self.closing = True
        self.jobs.put(None)
        try:
            self.proc.stdin.close()  # the child exits at EOF
        except OSError:
            pass


class BrokenChild(Exception):
    """A page parser child died, stalled or answered nonsense: parse that page here."""


class PoolClosed(Exception):
    """The pool was closed (the CLI is ending, e.g. Ctrl-C): a list still walking stops here
    instead of fetching and parsing the rest of its pages itself."""


class ParsePool:
    """Up to `workers` page-parser children, started with the first page sent to them (a
    small cluster's lists never are: see pager). `submit(raw, kind)` returns a future of
    (items, token); a page a child could not handle is parsed in this process with `each`
    instead (see `result`)."""

    def __init__(self, workers: int) -> None:
        self.children: list[_Child] = []
        self._planned = max(0, workers)
        self._started = False
        self._closed = False
        self._next = 0
        self._lock = threading.Lock()

    def _start(self) -> None:  # under self._lock
        self._started = True
        for _ in range(self._planned):
            try:
                self.children.append(_Child())
            except OSError:
                break  # no child process here (fd limits, no exec): parse in this process

    @property
    def workers(self) -> int:
        return len(self.children) if self._started else self._planned

    @property
    def pages(self) -> int:
        """Pages parsed in children so far."""
        return sum(c.pages for c in self.children)

    def submit(self, raw: bytes, kind: int) -> cf.Future:
        fut: cf.Future = cf.Future()
        with self._lock:
            if self._closed:
                fut.set_exception(PoolClosed("the page parsers were closed"))
                return fut
            if not self._started:
                self._start()
            alive = [c for c in self.children if c.proc.poll() is None]
            if not alive:
                fut.set_exception(BrokenChild("no page parser running"))
                return fut
            child = alive[self._next % len(alive)]
            self._next += 1
        child.jobs.put((raw, kind, fut))
        return fut

    def result(self, fut: cf.Future, again: Callable[[], bytes],
               each: Callable[[dict], Any] | None) -> tuple[list, str | None, int | None]:
        """The future's (items, token, their marshalled size). When the child failed or
        stalled, the page is fetched `again` (same continue token) and parsed here (size None):
        the CLI keeps no copy of pages it sent."""
        try:
            return fut.result(timeout=PAGE_TIMEOUT_S)
        except (BrokenChild, cf.TimeoutError, cf.CancelledError):
            if not fut.done():  # stalled: that child is of no more use
                with self._lock:
                    for c in self.children:
                        c.kill()
            return (*parse_page(again(), each), None)

    def close(self) -> None:
        with self._lock:
            self._started = self._closed = True  # none starts, no page is taken after this
            children = list(self.children)
        for c in children:
            c.close()

    def __enter__(self) -> "ParsePool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def default_workers() -> int:
    """One child per CPU this process may use, at most 2 (the CLI itself fetches and merges;
    more children only add memory); none on one CPU."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return 0 if cpus < 2 else min(2, cpus)


def answer_cap(page_bytes: int) -> int:
    """The longest answer a child may give to a page of `page_bytes`: its reduced items,
    marshalled, are smaller than the page's JSON (~0.5 MiB for 7 MiB); twice it, plus room."""
    return 2 * page_bytes + (1 << 20)


def _checked(result: Any) -> tuple[list, str | None]:
    """A child's (items, token), or ValueError for anything else it could have sent."""
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], list)
            and (result[1] is None or isinstance(result[1], str))
            and all(isinstance(i, dict) for i in result[0])):
        raise ValueError("the answer is not (list of objects, continue token)")
    return result


def _read_exact(f: Any, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = f.readinto(view[got:])
        if not k:
            raise EOFError("page parser closed its output")
        got += k
    return bytes(buf) if n < 1 << 16 else buf


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the CLI's to handle
    gc.disable()
    inp = os.fdopen(0, "rb", buffering=0)
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # nothing but answers goes to the CLI's pipe
    while True:
        try:
            head = _read_exact(inp, _HEAD.size)
        except EOFError:
            return 0
        kind, n = _HEAD.unpack(head)
        raw = _read_exact(inp, n)
        try:
            each, comp = _each(kind)
            got = None
            if comp is not None:
                from . import typedpods
                got = typedpods.parse(raw, each, comp)
                if got is None:  # declined, maybe half way: the stdlib path from scratch
                    each, comp = _each(kind)
            if got is None:
                text = raw.decode("utf-8")
                del raw  # one copy of the page at a time
                got = parse_page(text, each)
            body, status = marshal.dumps(got), _OK
            del got
            if depth.take_notes():
                body, status = b"", _DEEP
        except (NotJson, ValueError):  # ValueError: not UTF-8
            body, status = b"", _NOT_JSON
        raw = text = None
        out.write(_HEAD.pack(status, len(body)))
        out.write(body)
        out.flush()


if __name__ == "__main__":
    sys.exit(main())

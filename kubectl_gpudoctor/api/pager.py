"""Paged LIST calls (`limit`/`continue`), each page slimmed as it arrives.

Why: `nodes` on 5,000 nodes / 150,000 pods must stay under 500 MiB (DESIGN.md section 8). One
unpaged pod list is ~500 MiB of JSON on such a cluster and several times that as Python dicts;
paged, only one page of raw JSON is alive at a time, and each object loses the bulk no analysis
reads (managedFields, volumes, env) before the next page is fetched. Small clusters still need
one call: a list that fits in one page comes back without a `continue` token. The pages are a
consistent read (no resourceVersion=0: a watch cache that predates ListFromCacheSnapshot
ignores `limit`), and an expired token (410 Gone, the list outlived etcd's compaction) restarts
the list once from the beginning. Pages are parsed item by item (pageparse.parse_page: never a
whole page as one tree), in child processes when `nodes` gives a pageparse.ParsePool.
A list is bounded like every read: a `continue` token the server already gave is an error (a
list that would go round forever), and so are more items than a cluster has (max_items_for:
MAX_NODES nodes, 200,000 items of another list; a list folded as it is read -- `nodes`' pods,
analysis/resources/podfold.py -- PODS_PER_NODE a node seen, at most MAX_FOLDED_ITEMS) or
MAX_LIST_BYTES of pages: a list that never ends.
And memory is bounded by bytes, not only by items (audit L-01: 199,990 fat pods took the CLI
past 512 MiB under the item bound): after each page the CLI's resident memory must stay under
its bound (Memory: MAX_RSS_BYTES, plus NODE_RSS_BYTES a node past BASE_NODES: what `nodes`
holds grows with the nodes), and what a list keeps (its items as the reduction leaves them,
or what the fold kept of them, counted as their marshalled size) under MAX_KEPT_BYTES; past
either the list stops with one error that says how far it got and how to narrow it.
"""
from __future__ import annotations

import marshal
import os
import re
import sys
from typing import Any, Callable, Sequence

from .. import errors
from . import pageparse, shape
from .kube import Kube, malformed
from .slim import PodCompactor, slim

PAGE_SIZE = 1000  # ~3.5 MiB of pod JSON per page: bounded memory (in the CLI and each page
                  # parser), one page parsed while the next arrives; 2,000 cost ~30 MiB more at
                  # 150,000 pods for no measurable speed

MiB = 1 << 20
MAX_NODES = 200_000    # GKE sells 65,000-node clusters (130,000 in preview); NVSentinel tests 100,000
MAX_ITEMS = 200_000    # of any other list (pods share skeletons: far less per item)
MAX_LIST_BYTES = 2 << 30
# The CLI's own resident memory, checked after each page: with its two page parsers (~35 MiB
# each at their peak) the whole stays under the 512 MiB the CLI promises against any stream.
# bench/nodes_scale.py: 150,000 fat pods on 5,000 nodes peak at ~345 MiB (~380 before list
# items' member names were interned: slim.DECODER).
MAX_RSS_BYTES = 432 << 20
# what one list keeps, as marshal measures it (~1/6 of a skeleton pod's size in memory, ~1/3
# of a whole pod's): the bound where the resident size cannot be read (no /proc, no resource)
MAX_KEPT_BYTES = 96 << 20
# A fleet's pods are folded into per-node tallies as they are read
# (analysis/resources/podfold.py), so what `nodes` holds grows with the nodes, not the pods:
# past BASE_NODES the memory bound grows by NODE_RSS_BYTES a node (bench/nodes_scale.py: what
# a node costs with its row, findings and tallies). A folded list bounds items and bytes only
# against a list that never ends.
BASE_NODES = 5_000
# measured (bench/nodes_scale.py): the CLI's peak grew by 14 KiB a node from 5,000 to 20,000
# nodes -- a slimmed node ~4.9 KiB, its tallies ~1.6 KiB (podfold.NodeFold), its row and the
# row's copy in the JSON document, its findings, and the events growing with the fleet
NODE_RSS_BYTES = 16 << 10
NODE_KEPT_BYTES = 3 << 10  # a slimmed node as marshal measures it is ~1-2 KiB
MAX_FOLDED_ITEMS = 5_000_000
PODS_PER_NODE = 250        # a folded list's item bound: this many a node seen, at least
                           # MAX_ITEMS (kubelet's maxPods is 110 by default)
FOLDED_ITEM_BYTES = 16 << 10  # its byte bound: this much a pod of its item bound


class Memory:
    """The memory bound of one scan's lists, sized from the nodes it has seen (the node list's
    items, or the distinct nodes of the pods folded so far): the lists of one scan share it."""

    def __init__(self, base: int | None = None) -> None:
        self.base = MAX_RSS_BYTES if base is None else base
        self.nodes = 0

    def saw(self, nodes: int) -> None:
        if nodes > self.nodes:
            self.nodes = nodes

    def bound(self) -> int:
        return self.base + NODE_RSS_BYTES * max(0, self.nodes - BASE_NODES)

    def kept_bound(self) -> int:
        """MAX_KEPT_BYTES, plus NODE_KEPT_BYTES a node past BASE_NODES (the node list keeps
        every node it reads)."""
        return MAX_KEPT_BYTES + NODE_KEPT_BYTES * max(0, self.nodes - BASE_NODES)


_CONTINUE = re.compile(rb'"continue"\s*:\s*"([^"]*)"')
_REMAINING = re.compile(rb'"remainingItemCount"\s*:\s*([0-9]+)')


def _worth_children(head: bytes, token: str | None, page_size: int) -> bool:
    """Whether a list whose first page is `head` is long enough for child parsers (their
    start costs ~0.1 s of CPU and ~20 MiB each): at least two more full pages."""
    if not token:
        return False
    m = _REMAINING.search(head, 0, 4096)
    return m is None or int(m.group(1)) >= 2 * page_size


def resident_bytes() -> int | None:
    """This process's resident memory now (Linux: /proc/self/statm), else its peak so far
    (getrusage: what macOS has), else None."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except (ImportError, OSError, ValueError):
        return None
    return peak if sys.platform == "darwin" else peak * 1024


def _page_size() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 4096


_PAGE = _page_size()


def list_items(kube: Kube, path: str, query: Sequence[tuple[str, Any]] = (), *,
               page_size: int = PAGE_SIZE, timeout: float | None = None,
               each: Callable[[dict], dict] | None = slim,
               parsers: "pageparse.ParsePool | None" = None,
               max_rss: int | None = None, into: Any = None,
               memory: Memory | None = None) -> tuple[list[dict], int]:
    """Every item of the list at `path` and the number of pages it took. The next page is
    fetched while this one is parsed: its token is read from the head of the raw page (the
    API server writes `metadata` before `items`). With `parsers` (child processes), pages are
    parsed and reduced there, a few at a time, and merged here in order. `max_rss`: the
    memory bound (MAX_RSS_BYTES by default); `memory`: a bound sized from the nodes instead.
    `into` (analysis/podfold.PodFold): each page's items are handed to `into.page(items)`
    (which returns how many it kept) and not returned; `into.reset()` when the list restarts
    (an expired continue token: the pages so far are read again), as client-go's pager does."""
    restarted = False
    mem = memory if memory is not None else Memory(max_rss)
    while True:
        try:
            return _walk(kube, path, list(query), page_size, timeout, each, parsers, mem, into)
        except errors.Gone:
            if restarted:
                raise
            restarted = True  # the token expired mid-list: one consistent restart
            if into is not None:
                into.reset()


def reductions(path: str, each: Callable[[dict], dict] | None
               ) -> tuple[Callable[[dict], Any] | None, int | None, Any]:
    """(`each` checked against the path's schema; the page parsers' kind for it, None where
    pages must be parsed here; the compactor typedpods decodes pods with, or None): what a
    page of `path` is reduced with, here or in a child (watchlist.py's batches too)."""
    sid = shape.schema_id(path)   # items checked (in the child, else here) before reduced
    kind = None
    if each is slim:
        kind = pageparse.KIND_SLIM
    elif type(each) is PodCompactor:
        kind = pageparse.KIND_PODS_IDS if each.container_ids else pageparse.KIND_PODS
    # pages parsed here: typedpods decodes pod pages where it can (pageparse.parse_reduced)
    compactor = each if kind is not None and shape.SCHEMA_IDS.get(sid) is shape.POD \
        and type(each) is PodCompactor else None
    if kind is not None:
        kind |= sid << pageparse.KIND_BITS
    return shape.checking(each, sid), kind, compactor


class Collected:
    """What a list has read so far -- its items, or the share the fold (`into`) kept -- and
    its bounds, sized from the nodes seen: one accounting for the paged list and the
    streaming one (watchlist.py)."""

    def __init__(self, path: str, into: Any, mem: Memory) -> None:
        self.path, self.into, self.mem = path, into, mem
        self.items: list[dict] = []
        self.count = 0   # items so far (handed to `into`, or in `items`)
        self.kept = 0    # bytes of what the reduction kept (marshal's measure)
        self.nodes_list = path.rstrip("/").endswith("/nodes")
        self.most, self.most_bytes = self.bounds()

    def bounds(self) -> tuple[int, int]:
        """(most items, most bytes of pages): a folded list's grow with the nodes seen."""
        if self.into is None:
            return max_items_for(self.path), MAX_LIST_BYTES
        n = min(MAX_FOLDED_ITEMS, max(MAX_ITEMS, PODS_PER_NODE * self.mem.nodes))
        return n, max(MAX_LIST_BYTES, n * FOLDED_ITEM_BYTES)

    def add(self, got: list, size: int | None, pages: int) -> None:
        """One parsed page's items (`size`: their marshalled bytes, None: measured here), kept
        or folded; errors.BadAnswer past a bound."""
        objects_only(self.path, got)
        self.count += len(got)
        mem, into = self.mem, self.into
        if into is not None:  # folded: only what it keeps counts (its share of the page)
            n = into.page(got)
            if n:
                self.kept += (size if size is not None
                              else len(marshal.dumps(got))) * n // len(got)
            mem.saw(len(into.nodes))
            self.most, self.most_bytes = self.bounds()
        else:
            self.kept += size if size is not None else len(marshal.dumps(got))
            self.items.extend(got)
            if self.nodes_list:
                mem.saw(len(self.items))
        if self.count > self.most:
            raise _endless(self.path, pages, self.count)
        rss = resident_bytes()
        max_rss, max_kept = mem.bound(), mem.kept_bound()
        if self.kept > max_kept or (rss is not None and rss > max_rss):
            raise _too_big(self.path, pages, self.count, self.kept, rss, max_rss, max_kept)


def _walk(kube: Kube, path: str, query: list, page_size: int, timeout: float | None,
          each: Callable[[dict], dict] | None,
          parsers: "pageparse.ParsePool | None", mem: Memory,
          into: Any = None) -> tuple[list[dict], int]:
    import collections
    import concurrent.futures as cf

    def fetch(token: str | None) -> bytes:
        q = query + [("limit", str(page_size))] + ([("continue", token)] if token else [])
        return kube.request("GET", path, q, timeout=timeout)

    each, kind, compactor = reductions(path, each)
    if parsers is None or not parsers.workers or kind is None:
        parsers, ahead = None, 1
    else:
        # pages with the children, not yet merged: one each (the next page is being fetched
        # meanwhile); this bounds the raw pages the CLI holds while they wait for a child
        ahead = parsers.workers
    got_so_far = Collected(path, into, mem)
    pages = 0
    seen: set[str] = set()  # continue tokens given so far
    fetched = 0             # bytes of pages so far
    # (raw page, or None once a child has it; its parse in a child or None; the token that
    # fetched it; the token read from its head)
    inflight: collections.deque = collections.deque()
    with cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="page") as pool:
        asked: str | None = None  # the continue token of the fetch in flight (`nxt`)
        nxt = pool.submit(fetch, asked)
        try:
            while nxt is not None or inflight:
                if nxt is not None and len(inflight) < ahead:
                    raw, this = nxt.result(), asked
                    pages += 1
                    fetched += len(raw)
                    m = _CONTINUE.search(raw, 0, 4096)
                    token = m.group(1).decode() if m and m.group(1) else None
                    _bounded(path, token, seen, pages, fetched, got_so_far.count,
                             got_so_far.most, got_so_far.most_bytes)
                    asked, nxt = token, pool.submit(fetch, token) if token else None
                    if pages == 1 and parsers is not None and not _worth_children(
                            raw, token, page_size):
                        parsers, ahead = None, 1  # a list of a page or two: parse it here
                    if parsers is not None:  # the child has it now; refetched if it fails
                        inflight.append((None, parsers.submit(raw, kind), this, token))
                    else:
                        inflight.append((raw, None, this, token))
                    del raw
                    continue
                raw, fut, this, token = inflight.popleft()
                try:
                    if fut is not None:
                        got, real, size = parsers.result(fut, lambda t=this: fetch(t), each)
                    else:
                        got, real = pageparse.parse_reduced(raw, each, compactor)
                        size = None
                except pageparse.NotJson:
                    raise errors.ApiError(
                        f"the API server sent non-JSON for {path}") from None
                except shape.Malformed as exc:
                    raise malformed(path, exc) from None
                finally:   # an item nested too deep was cut (api/depth.py): say which
                    if hasattr(kube, "pass_notes"):
                        kube.pass_notes(f"the API server's answer for {path}: ")
                del raw, fut
                got_so_far.add(got, size, pages)
                del got
                if real != token:  # the head scan disagreed with the parsed page: trust the
                    inflight.clear()  # page; what was fetched after it came from a wrong token
                    if nxt is not None:
                        nxt.cancel()
                    _bounded(path, real, seen, pages, fetched, got_so_far.count,
                             got_so_far.most, got_so_far.most_bytes)
                    asked, nxt = real, pool.submit(fetch, real) if real else None
        finally:
            if nxt is not None:
                nxt.cancel()
    return got_so_far.items, pages


def objects_only(path: str, got: list) -> None:
    """BadAnswer unless every item of a parsed page is an object (the page parsers hand a
    number or a string through unchecked: `{"items": ["x"]}` ended `nodes` with exit 70)."""
    for item in got:
        if type(item) is not dict:
            raise malformed(path, shape.Malformed(
                f"an item is {shape._name(item)}, not an object"))


def max_items_for(path: str) -> int:
    return MAX_NODES if path.rstrip("/").endswith("/nodes") else MAX_ITEMS


def _bounded(path: str, token: str | None, seen: set[str], pages: int, fetched: int,
             items: int, most: int, most_bytes: int = MAX_LIST_BYTES) -> None:
    """Raise errors.BadAnswer for a token given before, or a list past its bounds."""
    if token is not None:
        if token in seen:
            raise errors.BadAnswer(f"the API server gave the same continue token twice for "
                                   f"{path} (after {pages} pages): the list would never end")
        seen.add(token)
    if fetched > most_bytes or items > most:
        raise _endless(path, pages, items)


def _too_big(path: str, pages: int, items: int, kept: int, rss: int | None,
             max_rss: int, max_kept: int = MAX_KEPT_BYTES) -> errors.BadAnswer:
    held = (f"{rss / MiB:.0f} MiB resident, over {max_rss / MiB:.0f} MiB"
            if rss is not None and rss > max_rss else
            f"{kept / MiB:.0f} MiB kept, over {max_kept / MiB:.0f} MiB")
    return errors.BadAnswer(
        f"the list {path} is too large to analyse in the memory gpu-doctor allows itself "
        f"({held} after {pages} pages, {items} items); narrow the scan (`nodes -l "
        f"SELECTOR`)")


def _endless(path: str, pages: int, items: int) -> errors.BadAnswer:
    return errors.BadAnswer(f"the list {path} did not end after {pages} pages ({items} items); "
                            f"not read further")

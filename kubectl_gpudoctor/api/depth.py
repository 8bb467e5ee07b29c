"""JSON nested past what the decoders can recurse: cut to a bounded depth, never exit 70.

Why: json and msgspec both recurse once per level of nesting and raise RecursionError past
Python's limit (~1,000 levels). Any API answer can carry such nesting -- a tenant writes it
into a ResourceClaim's opaque parameters (a RawExtension: 3 KB of `[` is inside DRA's 10 KiB
limit) and the cluster-wide claim list then failed every `node`, `nodes`, `pod` and MCP run
(audit round 5, JS-01). No Kubernetes object the tool reads is nested anywhere near
MAX_DEPTH levels, so a value below it is replaced by null and the caller says so in a note:
the one object is truncated, the rest of the answer stands.

The decoders are tried first (the common case costs nothing); only an answer that raised
RecursionError is scanned here, once, in linear time.
"""
from __future__ import annotations

import json
import re
import threading
from typing import Any, Callable

MAX_DEPTH = 100   # levels kept; deeper values become null
MAX_NOTES = 20    # notes kept per thread until taken

# a whole JSON string (escapes included) or one bracket: everything else cannot nest
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.S)

_local = threading.local()


def cut(s: str, limit: int = MAX_DEPTH) -> tuple[str, int]:
    """(`s` with every object or array that opens below `limit` levels replaced by null, how
    many were replaced). `s` is a JSON text or one value of it; not JSON stays not JSON (the
    decoder then says so). Linear in len(s); no recursion."""
    out: list[str] = []
    depth = 0
    start = 0      # where the text not yet copied begins
    cut_at = -1    # the opening of the value being dropped, -1 when none
    n = 0
    for m in _TOKEN.finditer(s):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > limit and cut_at < 0:
                cut_at = m.start()
        elif c in "]}":
            depth -= 1
            if cut_at >= 0 and depth == limit:
                out.append(s[start:cut_at])
                out.append("null")
                start = m.end()
                cut_at = -1
                n += 1
    if cut_at >= 0:   # never closed: leave it as it is (the decoder says "not JSON")
        return s, 0
    out.append(s[start:])
    return "".join(out), n


def span_end(s: str, i: int) -> int:
    """The index just past the object or array that opens at s[i] (len(s) when it never
    closes). Linear; no recursion."""
    depth = 0
    for m in _TOKEN.finditer(s, i):
        c = m.group()
        if c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
            if depth <= 0:
                return m.end()
        elif depth == 0:   # a string where a container was expected
            return m.end()
    return len(s)


def loads(text: str, decode: Callable[[str], Any] = json.loads) -> tuple[Any, int]:
    """(the document, how many values were cut). Decoded as it is unless that raised
    RecursionError; then decoded again with values below MAX_DEPTH replaced by null."""
    try:
        return decode(text), 0
    except RecursionError:
        pass
    shallow, n = cut(text)
    return decode(shallow), n


def raw_decode(decode: Callable[[str, int], tuple[Any, int]], s: str,
               i: int) -> tuple[Any, int, int]:
    """(value, end, how many values were cut) of the value at s[i], as JSONDecoder.raw_decode
    gives (value, end); a value nested past what `decode` recurses is cut as `cut` does."""
    try:
        obj, end = decode(s, i)
        return obj, end, 0
    except RecursionError:
        pass
    end = span_end(s, i)
    shallow, n = cut(s[i:end])
    obj, _ = decode(shallow, 0)
    return obj, end, n


def note(text: str) -> None:
    """Remember a note in this thread (bounded) for the caller that owns the request."""
    notes = getattr(_local, "notes", None)
    if notes is None:
        notes = _local.notes = []
    if len(notes) < MAX_NOTES:
        notes.append(text)


def take_notes() -> list[str]:
    """This thread's notes since the last call."""
    notes = getattr(_local, "notes", None) or []
    _local.notes = []
    return notes


def cut_words(n: int) -> str:
    return (f"{n} value{'s' if n != 1 else ''} nested deeper than {MAX_DEPTH} levels "
            f"left out (null)")

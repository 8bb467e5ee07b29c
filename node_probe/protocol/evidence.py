"""Evidence for people: the values a finding carries, spelled as an on-call engineer reads them.

Why: evidence is raw data with units in key names (`waiting_s: 633`, `gpu: None`,
`trigger_present: True`), exact in JSON for bots. On a terminal and in markdown the same values
read better as `waiting: 10m`, `gpu: -`, `trigger present: true`, and a list of objects
(the stuck pods, the goroutines) as a small table instead of inline JSON. This module only
turns values into text; the renderers (render.py, the client's markdown) decide where it goes
and escape it for their medium. Stdlib only (the probe renders its own table too).
"""
from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from .duration import human

MAX_CELL = 60        # a table cell or a list item longer than this is cut
MAX_VALUE = 400      # a scalar value longer than this is cut
MAX_ROWS = 10        # rows of one evidence table
MAX_COLUMNS = 6      # columns of one evidence table
MAX_ITEMS = 20       # items of one inline list or mapping
NONE = "-"       # a value that is absent or empty (kubectl describe says <none>: a
                 # person reads a dash faster, and an unknown value is simply left out)

# key suffix -> how a number with it is shown; the longest suffix first (`_per_s` is a rate,
# not seconds: `pgmajfault_per_s` once read as a duration, "6.6s")
_UNITS: tuple[tuple[str, str], ...] = (
    ("_per_s", "/s"), ("_bytes", "B"), ("_mib", "MiB"), ("_kib", "KiB"), ("_pct", "%"),
    ("_min", "min"), ("_ms", "ms"), ("_s", "s"))
# kernel and internal names as a person says them
_WORDS = {"pgmajfault": "major page faults", "refault_file": "file refaults",
          "refault_anon": "anonymous refaults", "refault": "refaults",
          "pod_uid": "pod uid", "tid": "thread", "comm": "process"}


fmt_duration = human  # the one duration format (protocol/duration.py: kubectl's HumanDuration)


def cut(text: str, limit: int) -> str:
    """`text` no longer than `limit`, ending in `…` when cut."""
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "\u2026"


def _unit(key: str) -> tuple[str, str | None]:
    for suffix, unit in _UNITS:
        if key.endswith(suffix) and len(key) > len(suffix):
            return key[: -len(suffix)], unit
    return key, None


def label(key: Any) -> str:
    """The key as a person reads it: unit suffix dropped (the value says it), `_` as space;
    a share keeps `(%)` (`mem available` and `mem available (%)` are two values); a name
    with capitals (an environment variable, a config field) stays as written."""
    base, unit = _unit(str(key))
    word = _WORDS.get(base)
    if word is None:
        head, _, rest = base.partition("_")
        word = (f"{head} {rest}" if rest and not rest.islower() and head.islower()
                else base if not base.islower() else base.replace("_", " "))
    return word + (" (%)" if unit == "%" else "")


def _number(v: float, unit: str | None) -> str:
    if unit == "s":
        return fmt_duration(v)
    if unit == "min":
        return fmt_duration(v * 60)
    if unit == "ms":
        return f"{v:g}ms"
    if unit == "%":
        return f"{v:g}%"
    if unit in ("MiB", "B"):
        return f"{v:g} {unit}"
    if unit == "/s":
        return f"{v:g}/s"
    if unit == "KiB":
        return f"{v:g} KiB"
    return f"{v:g}" if isinstance(v, float) else str(v)


def scalar(key: Any, v: Any, limit: int = MAX_VALUE) -> str | None:
    """A value that fits on a line, as text; None for a list of objects (a table's job)."""
    if isinstance(v, (list, tuple)) and v and all(isinstance(x, Mapping) for x in v):
        return None
    return cut(_inline(key, v, 0), limit)


def _inline(key: Any, v: Any, depth: int, item: int = MAX_CELL) -> str:
    """Any value as words on one line: never JSON braces or quotes (`admission race: kind:
    no_healthy_devices; resource: nvidia.com/gpu`), nested at most two levels."""
    _, unit = _unit(str(key))
    if v is None:
        return NONE
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return _number(v, unit)
    if isinstance(v, str):  # on one line: its line breaks and tabs are spaces to a reader
        return cut(" ".join(v.split()), MAX_VALUE) if v.strip() else '""'
    if isinstance(v, Mapping):
        if not v:
            return NONE
        if depth >= 2:
            return f"{len(v)} field{'s' if len(v) != 1 else ''}"
        flat = all(not isinstance(x, (Mapping, list, tuple)) for x in v.values())
        items = [f"{k}={_inline(k, x, depth + 1, item)}" if flat else
                 f"{label(k)}: {_inline(k, x, depth + 1, item)}"
                 for k, x in list(v.items())[:MAX_ITEMS] if x is not None]
        more = len(v) - MAX_ITEMS
        return (", " if flat else "; ").join(items) + (f", +{more} more" if more > 0 else "")
    if isinstance(v, (list, tuple)):
        if not v:
            return NONE
        if depth >= 1 and all(isinstance(x, Mapping) for x in v):
            return f"{len(v)} item{'s' if len(v) != 1 else ''}"
        items = [cut(_inline(key, x, depth + 1, item), item) for x in v[:MAX_ITEMS]]
        more = len(v) - MAX_ITEMS
        return ", ".join(items) + (f", +{more} more" if more > 0 else "")
    return str(v)


def table(rows: Sequence[Mapping[str, Any]], cell_limit: int = MAX_CELL
          ) -> tuple[list[str], list[list[str]], int]:
    """(column labels, rows of cells, rows left out) of a list of objects; each column a key
    (the first MAX_COLUMNS keys seen), each cell one line of at most `cell_limit` (--details
    and markdown ask for whole values: MAX_VALUE)."""
    keys: list[str] = []
    for r in rows[:MAX_ROWS]:
        for k in r:
            if k not in keys and len(keys) < MAX_COLUMNS:
                keys.append(k)
    body = []
    for r in rows[:MAX_ROWS]:
        cells = []
        for k in keys:
            v = r.get(k, None) if k in r else ""
            if isinstance(v, (list, tuple)) and v and all(isinstance(x, Mapping) for x in v):
                text = f"{len(v)} item{'s' if len(v) != 1 else ''}"
            else:
                text = "" if k not in r else _inline(k, v, 1, cell_limit)
            cells.append(cut(text, cell_limit))
        body.append(cells)
    return [label(k).upper() for k in keys], body, max(0, len(rows) - MAX_ROWS)


def split(evidence: Mapping[str, Any]) -> tuple[list[tuple[str, str]], list[tuple[str, Any]]]:
    """(scalar entries as (label, text), table entries as (label, list of objects))."""
    scalars, tables = [], []
    for k, v in list(evidence.items())[:200]:
        if v is None:
            continue  # nothing known: left out rather than shown as a placeholder
        if isinstance(v, Mapping) and v and all(isinstance(x, Mapping) for x in v.values()):
            # a mapping of objects (resource -> counts): one row per key
            tables.append((label(k), [{"name": n, **x} for n, x in list(v.items())[:MAX_ROWS]]
                           + [{}] * max(0, len(v) - MAX_ROWS)))
            continue
        text = scalar(k, v)
        if text is None:
            tables.append((label(k), v))
        else:
            scalars.append((label(k), text))
    return scalars, tables


def aligned(columns: Sequence[str], rows: Sequence[Sequence[str]], sep: str = "  ") -> list[str]:
    """Rows under their column labels, each column as wide as its widest cell."""
    widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(columns)]
    out = [sep.join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()]
    out += [sep.join(x.ljust(w) for x, w in zip(r, widths)).rstrip() for r in rows]
    return out

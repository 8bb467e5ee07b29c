"""The plugin's own click parameter types: durations and Kubernetes object names.

Why one module: every duration option (`--timeout`, `--trace-seconds`, `--start-timeout`,
`--stall-threshold`, `--kubelet-timeout`, `--request-timeout`, ...) takes the spellings
kubectl users type (`60s`, `2m`, `1m30s`, bare seconds) through ONE type, which also
rejects `nan`/`inf` before anything is created; and every node, pod or namespace name is
checked the way the API server checks it (DNS-1123 subdomain for nodes and pods, DNS-1123
label for namespaces), so `node ../nodes/gpu-1` or `node 'gpu-1?watch=true'` is a usage error
(exit 2), never a request about another object. The duration grammar itself lives in
node_probe.protocol.duration, shared with the node probe's argparse CLI.

A node or pod argument may also be written as kubectl writes it, TYPE/NAME (`node/gpu-1`,
`nodes/gpu-1`, `no/gpu-1`, `pod/train-0`, `pods/...`, `po/...`), so a name copied from
`kubectl get -o name` or from our own output works; another TYPE is a usage error that names
the right command.
"""
from __future__ import annotations

import re

import click

from node_probe.protocol import duration

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_LABEL = re.compile(_LABEL)
DNS1123_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")


class Duration(click.ParamType):
    """Seconds from `60s`, `2m`, `1m30s`, `500ms`, `1h` or bare `60`; finite, >= minimum."""

    name = "duration"

    def __init__(self, minimum: float = 0.0) -> None:
        self.minimum = minimum

    def convert(self, value, param, ctx):  # noqa: ANN001 - click's signature
        if isinstance(value, float):
            return value
        try:
            seconds = duration.parse(value)
        except duration.DurationError as exc:
            self.fail(str(exc), param, ctx)
        if seconds < self.minimum:
            self.fail(f"{value!r} is shorter than the minimum {self.minimum:g}s", param, ctx)
        return seconds

    def get_metavar(self, param, ctx=None):  # noqa: ANN001 - click >= 8.2 passes ctx
        return "DURATION"


class Count(click.ParamType):
    """A whole number within [minimum, maximum], said in words when it is not (click's
    IntRange would print `[1<=x<=64]` after the option's help)."""

    name = "integer"

    def __init__(self, minimum: int, maximum: int | None = None) -> None:
        self.minimum, self.maximum = minimum, maximum

    def convert(self, value, param, ctx):  # noqa: ANN001 - click's signature
        try:
            n = int(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a whole number", param, ctx)
        if n < self.minimum or (self.maximum is not None and n > self.maximum):
            span = (f"from {self.minimum} to {self.maximum}" if self.maximum is not None
                    else f"at least {self.minimum}")
            self.fail(f"{n} is out of range: it must be {span}", param, ctx)
        return n

    def get_metavar(self, param, ctx=None):  # noqa: ANN001 - click >= 8.2 passes ctx
        return "N"


# `--request-timeout 0`: no client-side limit, as in kubectl; a day stands for it (the API
# server's own request timeout still ends a call it never answers; Ctrl-C always works)
NO_REQUEST_LIMIT_S = 24 * 3600.0


class RequestTimeout(Duration):
    """kubectl's --request-timeout: a Duration of at least 0.1s, or 0 for no limit."""

    def __init__(self) -> None:
        super().__init__(0.1)

    def convert(self, value, param, ctx):  # noqa: ANN001 - click's signature
        if not isinstance(value, float):
            try:
                if duration.parse(value) == 0:
                    return NO_REQUEST_LIMIT_S
            except duration.DurationError:
                pass  # said by Duration below
        return super().convert(value, param, ctx)


def name_problem(kind: str, name: str) -> str | None:
    """Why `name` is not a valid `kind` name ("node", "pod" or "namespace"), or None."""
    label = kind == "namespace"
    limit = 63 if label else 253
    rx = DNS1123_LABEL if label else DNS1123_SUBDOMAIN
    if not name:
        return f"a {kind} name must not be empty"
    if len(name) > limit:
        return f"{kind} name {name[:40]!r}... is longer than {limit} characters"
    if not rx.fullmatch(name):
        what = "DNS-1123 label" if label else "DNS-1123 subdomain"
        return (f"{kind} name {name!r} is not valid: a {what} is lowercase letters, digits"
                f"{'' if label else ', dots'} and '-', starting and ending with a letter or "
                f"digit")
    return None


# kubectl's spellings of a TYPE in TYPE/NAME (kind, plural, short name), for the two kinds
# that take a positional name; the value is the command that takes that kind.
TYPE_SPELLINGS = {"node": "node", "nodes": "node", "no": "node",
                  "pod": "pod", "pods": "pod", "po": "pod"}


def strip_type(kind: str, value: str) -> tuple[str, str | None]:
    """(`NAME`, None) from `NAME` or `TYPE/NAME` of `kind`; (value, problem) for another TYPE."""
    if "/" not in value:
        return value, None
    typ, name = value.split("/", 1)
    named = TYPE_SPELLINGS.get(typ.lower())
    if named == kind:
        return name, None
    if named is not None:
        return value, (f"{value!r} names a {named}, not a {kind}: use "
                       f"`kubectl gpu-doctor {named} {name}`")
    return value, (f"{kind} name {value!r} is not valid: as TYPE/NAME the type must be "
                   f"{kind} ({', '.join(t for t, k in TYPE_SPELLINGS.items() if k == kind)})")


class ObjectName(click.ParamType):
    """A node, pod or namespace name, validated as the API server validates it; a node or a
    pod also as kubectl's TYPE/NAME of its own type."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.name = f"{kind} name"

    def convert(self, value, param, ctx):  # noqa: ANN001 - click's signature
        value = str(value)
        if self.kind in TYPE_SPELLINGS:
            value, problem = strip_type(self.kind, value)
            if problem:
                self.fail(problem, param, ctx)
        problem = name_problem(self.kind, value)
        if problem:
            self.fail(problem, param, ctx)
        return value

    def get_metavar(self, param, ctx=None):  # noqa: ANN001 - click >= 8.2 passes ctx
        return self.kind.upper()


NODE_NAME = ObjectName("node")
POD_NAME = ObjectName("pod")
NAMESPACE = ObjectName("namespace")


# -- "did you mean": the names nearest a mistyped one ------------------------------------------

# characters a tired eye takes for one another in a name (l/1, O/0: `gpu-0l50`)
_LOOKALIKE = str.maketrans({"l": "1", "i": "1", "o": "0"})
_DIGITS = re.compile(r"\d+")
MAX_SUGGESTIONS = 3


def _plain(name: str) -> str:
    """The name as a typo is judged: lookalikes folded, each number without leading zeros
    (`gpu-001` and `gpu-0001` are the same node to the person typing)."""
    return _DIGITS.sub(lambda m: m.group().lstrip("0") or "0",
                       name.lower().translate(_LOOKALIKE))


def _within(a: str, b: str, most: int) -> int | None:
    """The edit distance between a and b if it is at most `most`, else None (a band of
    2*most+1 cells a row: linear in the names' length)."""
    if abs(len(a) - len(b)) > most:
        return None
    prev = {j: j for j in range(min(len(b), most) + 1)}
    for i in range(1, len(a) + 1):
        cur = {}
        for j in range(max(0, i - most), min(len(b), i + most) + 1):
            if j == 0:
                cur[j] = i
                continue
            cost = 0 if a[i - 1] == b[j - 1] else 1
            cur[j] = min(prev.get(j, most + 1) + 1, cur.get(j - 1, most + 1) + 1,
                         prev.get(j - 1, most + 1) + cost)
        if min(cur.values()) > most:
            return None
        prev = cur
    d = prev.get(len(b), most + 1)
    return d if d <= most else None


def closest_names(name: str, names, limit: int = MAX_SUGGESTIONS) -> list[str]:
    """The names a mistyped `name` most likely meant, best first, at most `limit`: the same
    name once lookalikes and leading zeros are set aside (`gpu-001` -> `gpu-0001`,
    `gpu-0l50` -> `gpu-0150`), else those one edit away, else two -- never one that differs
    only in its digits, which is another node of the series (one pass over `names`)."""
    want = _plain(name)
    most = 1 if len(want) < 6 else 2
    same: list[str] = []
    near: list[tuple[int, str]] = []
    for other in names:
        if other == name:
            continue
        plain = _plain(other)
        if plain == want:
            same.append(other)
            continue
        if len(plain) == len(want) and all(a == b or (a.isdigit() and b.isdigit())
                                           for a, b in zip(plain, want)):
            continue  # only other digits: another node of the series (gpu-9 is not gpu-1)
        d = _within(want, plain, most)
        if d is not None:
            near.append((d, other))
    if same:
        return sorted(same)[:limit]
    return [n for _, n in sorted(near)][:limit]


def did_you_mean(names: list[str]) -> str:
    """`did you mean a?` / `did you mean a, b or c?` ('' for none)."""
    if not names:
        return ""
    said = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
    return f"did you mean {said}?"

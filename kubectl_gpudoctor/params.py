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

"""The fleet view of `nodes`: one row per sick node with its verdict, the healthy ones counted.

Why: on 1,000 GPU nodes with 5 sick, an on-call engineer needs the 5 on one screen, the worst
first (a NotReady node before a slow one), each with a one-line verdict and the ids of its
findings, and a count of the rest -- not 1,000 rows and then every finding's details block
(`kubectl gpu-doctor node NAME` gives those for one node). Bots get every row in the JSON/YAML
document (`nodes`), healthy ones included. Rows are built by commands/nodes.py; this module
only presents them. Everything shown passes terminal_safe (node names, titles and the agent's
messages come from the cluster).
"""
from __future__ import annotations

import textwrap
from typing import IO, Any, Mapping, Sequence

from node_probe.protocol import Report, render
from node_probe.protocol.render import terminal_safe

from ..analysis.common import fmt_duration

MAX_NAMED = 5              # nodes named in the agent line before "+N more"
INTERNAL = ("top", "top_sev", "black_hole_failed")


def is_sick(row: Mapping[str, Any]) -> bool:
    """Listed by default: a finding above info, or a node that is not Ready."""
    return bool(row.get("critical") or row.get("warning")) or row.get("ready") is False


def sort_key(row: Mapping[str, Any]) -> tuple:
    """Black holes first (Ready nodes that fail the GPU pods still sent to them), the one that
    failed the most pods first, then critical nodes, and among them NotReady ones (nothing runs
    there), then by how many problems, then by name."""
    return ("node.gpu_black_hole" not in (row.get("findings") or ()),
            -int(row.get("black_hole_failed") or 0),
            -bool(row.get("critical")), -bool(row.get("warning")), row.get("ready") is not False,
            -int(row.get("critical") or 0), -int(row.get("warning") or 0), str(row["node"]))


def ordered(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return sorted(rows, key=sort_key)


def row_doc(row: Mapping[str, Any]) -> dict:
    """A row as the JSON/YAML document's `nodes` array carries it."""
    return {k: v for k, v in row.items() if k not in INTERNAL}


def _ready(row: Mapping[str, Any]) -> str:
    text = {True: "Ready", False: "NotReady", None: "Unknown"}[row.get("ready")]
    return text if row.get("schedulable", True) else text + ",SchedulingDisabled"


def _agent(row: Mapping[str, Any]) -> str:
    a = row.get("agent") or {}
    if a.get("state") == "watching":
        return "watching"
    if a.get("state") == "stale":
        age = a.get("heartbeat_age_s")
        return "stale" + (f" {_age(age)}" if age is not None else "")
    return "-"


def _age(s: float | None) -> str:
    return "-" if s is None else fmt_duration(s)


def names(rows: Sequence[Mapping[str, Any]], show_healthy: bool = False) -> str:
    """`-o name`, as kubectl prints it: `node/NAME` a line, the nodes the table would list
    (the sick ones worst first; every node with `show_healthy`), nothing else."""
    shown = [r for r in ordered(rows) if show_healthy or is_sick(r)]
    return "".join(f"node/{terminal_safe(r['node'])}\n" for r in shown)


def table(rows: Sequence[Mapping[str, Any]], show_healthy: bool = False,
          cols: int | None = None, wide: bool = False, headers: bool = True) -> str:
    """The fleet table (sick nodes first; every node with `show_healthy`) and its count lines.
    Each sick node's verdict goes on its own line below its row, wrapped, never cut (`wide`:
    on the row itself, whole, as kubectl's wide output runs past the terminal). `headers`
    False (--no-headers): the column titles left out, as kubectl's."""
    cols = cols or render.table_width()
    rows = ordered(rows)
    sick = [r for r in rows if is_sick(r)]
    shown = rows if show_healthy else sick
    watched = wide or any((r.get("agent") or {}).get("state") != "none" for r in rows)
    probed = any("probe" in r for r in rows)  # `--probe`: which way each node was reached
    lines: list[str] = []
    if shown:
        head = (["NODE", "READY", "GPU A/C", "FREE", "PODS", "LEASE"]
                + (["AGENT"] if watched else []) + (["PROBE VIA"] if probed else []))
        right = {"FREE", "PODS"}
        body = [[r["node"], _ready(r),
                 "-" if r.get("gpu_capacity") is None else
                 f"{r.get('gpu_allocatable')}/{r.get('gpu_capacity')}",
                 "-" if r.get("gpu_free") is None else str(r["gpu_free"]),
                 str(r.get("pods", 0)), _age(r.get("lease_age_s"))]
                + ([_agent(r)] if watched else [])
                + ([str(r.get("probe") or "-")] if probed else []) for r in shown]
        body = [[terminal_safe(c) for c in b] for b in body]
        widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]

        def line(cells: list[str]) -> str:
            return "  ".join(c.rjust(w) if h in right else c.ljust(w)
                             for c, w, h in zip(cells, widths, head)).rstrip()
        if headers:
            lines.append(line(head) + ("  VERDICT" if wide else ""))
        for b, r in zip(body, shown):
            verdict = terminal_safe(" ".join(str(r.get("verdict") or "-").split())) \
                if is_sick(r) else "-"
            if wide:
                ids = ", ".join(r.get("findings") or ()) if is_sick(r) else ""
                lines.append(line(b) + "  " + verdict + (f"  [{terminal_safe(ids)}]" if ids
                                                          else ""))
                continue
            lines.append(line(b))
            if is_sick(r):
                lines += _wrap(verdict, cols, INDENT, INDENT)
                if r.get("findings"):
                    lines += _wrap("findings: " + terminal_safe(", ".join(r["findings"])),
                                   cols, INDENT, INDENT + "  ")
    healthy = len(rows) - len(sick)
    cordoned = sum(1 for r in rows if not r.get("schedulable", True))
    count = (f"{len(rows)} node(s): {len(sick)} with problems, {healthy} healthy"
             + (" (--show-healthy lists them)" if healthy and not show_healthy
                else "") + (f"; {cordoned} cordoned" if cordoned else ""))
    lines += _wrap(count, cols, "", "  ")
    if rows:
        lines += _wrap(_agent_line(rows), cols, "", "  ")
    if probed:
        ways: dict[str, int] = {}
        for r in rows:
            w = str(r.get("probe") or "not probed")
            ways[w] = ways.get(w, 0) + 1
        lines += _wrap("node probe: " + ", ".join(
            f"{n} via {w}" if w in ("agent", "debug pod") else f"{n} {w}"
            for w, n in sorted(ways.items())), cols, "", "  ")
    if sick:
        lines += _wrap(f"next: `kubectl gpu-doctor node {terminal_safe(sick[0]['node'])}` "
                       f"for one node's evidence and fix; `kubectl gpu-doctor explain ID` "
                       f"for a finding", cols, "", "  ")
    return "\n".join(lines) + "\n"


INDENT = "    "


def _wrap(text: str, width: int, first: str, rest: str) -> list[str]:
    return textwrap.wrap(text, width, initial_indent=first, subsequent_indent=rest,
                         break_on_hyphens=False, break_long_words=False) or [first.rstrip()]


def _agent_line(rows: Sequence[Mapping[str, Any]]) -> str:
    """Which nodes a watching agent covers, and which it does not (named, a few)."""
    by: dict[str, list[str]] = {"watching": [], "stale": [], "none": []}
    for r in rows:
        by.setdefault((r.get("agent") or {}).get("state") or "none", []).append(str(r["node"]))
    if not by["watching"] and not by["stale"]:
        return "agent: no node has a watching agent (`kubectl gpu-doctor agent install`)"

    def named(names: list[str]) -> str:
        more = f" (+{len(names) - MAX_NAMED} more)" if len(names) > MAX_NAMED else ""
        return terminal_safe(", ".join(names[:MAX_NAMED])) + more
    parts = [f"agent watching {len(by['watching'])} of {len(rows)} node(s)"]
    if by["stale"]:
        parts.append(f"stale heartbeat: {named(by['stale'])}")
    if by["none"]:
        parts.append(f"no agent: {named(by['none'])}")
    return "; ".join(parts)


def footer(report: Report, stream: IO, fail_on: str, exit_code: int) -> None:
    """What follows the fleet table instead of every finding's details block (one node's
    details: `node NAME`): the checks that did not finish or could not look, the warning that
    explains an incomplete run, and the totals with the exit code -- as every report ends."""
    render.write_footer(report, stream, fail_on, exit_code, render.table_width())


def nothing(report: Report, stream: IO, fail_on: str, exit_code: int) -> None:
    """No node matched: the one stderr line the command wrote is the whole answer."""

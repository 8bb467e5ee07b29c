"""The table of `job`: the job in one line, then its nodes side by side -- the ones that
differ first, each with what it has that its siblings do not and the job's pods on it -- and
the alike ones counted. The verdict and the findings follow (report/output.py).

Why its own view: 64 rows of identical healthy nodes hide the one that matters; the reader
needs the odd node and its ranks on one screen. Rows are built by commands/job.py; this only
presents them, every cell through terminal_safe (names come from the cluster).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from node_probe.protocol import render
from node_probe.protocol.render import terminal_safe

MAX_ROWS = 20


def _cut(s: str, n: int) -> str:
    return s if len(s) <= n else s[: max(1, n - 3)] + "..."


def heading(doc: Mapping[str, Any]) -> str:
    what = (f"pods -l {doc.get('selector')}" if doc.get("selector")
            else f"{doc.get('kind')} {doc.get('name')}")
    n, p = int(doc.get("nodes") or 0), int(doc.get("pods") or 0)
    differ = len(doc.get("differ") or ())
    text = (f"JOB {what} in {doc.get('namespace')}: {p} pod{'s' if p != 1 else ''} on {n} "
            f"node{'s' if n != 1 else ''}")
    if doc.get("unscheduled"):
        text += f", {doc['unscheduled']} not scheduled"
    text += f"; {differ} node{'s differ' if differ != 1 else ' differs'}" if differ else \
        "; no node differs"
    return terminal_safe(text)


def table(doc: Mapping[str, Any], rows: Sequence[Mapping[str, Any]],
          cols: int | None = None) -> str:
    cols = cols or render.table_width()
    lines = [heading(doc)]
    shown = [r for r in rows if r.get("differs") or r.get("severity") in ("critical",
                                                                           "warning")]
    if shown:
        probed = any("probe" in r for r in rows)
        head = ["NODE", "SEVERITY", "GPUS", "DIFFERS BY", "RANKS"] + (["PROBE"] if probed
                                                                      else [])
        body = []
        for r in shown[:MAX_ROWS]:
            ranks = list(r.get("job_pods") or ())
            rk = ", ".join(x.split("/", 1)[-1] for x in ranks[:2])
            if int(r.get("job_pods_on_node") or 0) > 2:
                rk += f" +{int(r['job_pods_on_node']) - 2}"
            by = ", ".join(r.get("differs_by") or ()) or (
                "(waiting for a peer)" if r.get("waiting") is True
                else "(shared)" if r.get("signature") else "-")
            body.append([str(r.get("node")), str(r.get("severity")),
                         "-" if r.get("gpu_allocatable") is None else str(r["gpu_allocatable"]),
                         _cut(by, 34), _cut(rk, 28)]
                        + ([str(r.get("probe") or "-")] if probed else []))
        body = [[terminal_safe(c) for c in b] for b in body]
        widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
        lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip())
        lines += ["  ".join(c.ljust(w) for c, w in zip(b, widths)).rstrip()[:max(cols, 40)]
                  for b in body]
        if len(shown) > MAX_ROWS:
            lines.append(f"... {len(shown) - MAX_ROWS} more in -o json")
    alike = len(rows) - len(shown)
    if alike:
        lines.append(f"{alike} node{'s' if alike != 1 else ''} alike with no problem")
    return "\n".join(lines) + "\n\n"

"""Renderers: present records and reports; they never collect anything.

Why here (stdlib only): `gpu-doctor-probe` renders its own output on a node with no client
installed, and `kubectl gpu-doctor` renders the very same stream, so both use these functions.
Output is TTY-aware: colour only on a terminal and never with NO_COLOR; live progress is one
status line on stderr, only when stderr is a terminal, so pipes and bots see clean stdout.
The table leads with the verdict (computed by the client, passed in as its dict), shows each
finding once, and spells evidence for people (evidence.py).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import sys
import textwrap
import threading
import time
from typing import IO, Any, Mapping

from node_probe.protocol import Finding, Report, encode
from node_probe.protocol import evidence as human
from node_probe.protocol.evidence import cut, fmt_duration

_COLORS = {"critical": "\033[1;31m", "warning": "\033[33m", "info": "\033[36m",
           "ok": "\033[32m"}
_RESET = "\033[0m"


# -- the terminal sanitiser --------------------------------------------------------------------
# Titles, subjects, evidence, event and log messages carry tenant-controlled strings (process
# names, annotations, pod names, container waiting messages). Printed raw, an ESC or C1 CSI
# sequence can move the cursor, rewrite or hide lines, or set the clipboard (OSC 52). Every
# string a terminal renderer prints goes through terminal_safe(): C0 controls, DEL, C1
# controls, bidi overrides and lone surrogates are shown as visible escapes (`\x1b`, `\u009b`,
# `\u202e`, `\ud800`). JSON/YAML/JSONL output is never passed through it: it stays exact.
_UNSAFE_RE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069"
                        "\ud800-\udfff]")


def _escape_char(m: re.Match) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x80 else f"\\u{c:04x}"


def terminal_safe(value: Any) -> str:
    """`value` as text a terminal shows literally (control characters made visible)."""
    s = value if isinstance(value, str) else str(value)
    return _UNSAFE_RE.sub(_escape_char, s)


def _safe_evidence_value(v: Any) -> Any:
    # mappings and lists are printed as JSON (ensure_ascii escapes every control character)
    return terminal_safe(v) if isinstance(v, str) else v


def terminal_safe_finding(f: Finding) -> Finding:
    """A copy of `f` whose every printable string went through terminal_safe()."""
    return dataclasses.replace(
        f, id=terminal_safe(f.id), subject=terminal_safe(f.subject),
        title=terminal_safe(f.title),
        remediation="\n".join(terminal_safe(ln) for ln in f.remediation.splitlines()),
        refs=tuple(terminal_safe(r) for r in f.refs),
        evidence={terminal_safe(k): _safe_evidence_value(v) for k, v in f.evidence.items()})


def use_color(stream: IO) -> bool:
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return hasattr(stream, "isatty") and stream.isatty()


def _sev(sev: str, color: bool, width: int = 8) -> str:
    label = sev.upper().ljust(width)
    return f"{_COLORS.get(sev, '')}{label}{_RESET}" if color else label


class JsonlWriter:
    """Writes each record as one NDJSON line, flushed at once (the pod log is our transport)."""

    def __init__(self, stream: IO) -> None:
        self.stream = stream

    def __call__(self, rec: Mapping[str, Any]) -> None:
        self.stream.write(encode(rec) + "\n")
        self.stream.flush()


class LiveProgress:
    """Live progress on a terminal: ONE status line, rewritten in place as work proceeds and
    cleared before the report; silent when the stream is not a terminal (pipes and bots see
    nothing). A record that carries `deadline_s` (a debug pod waiting to start) or the trace
    window shows its elapsed time, refreshed once a second by a ticker thread while it lasts.
    `node`: the node a record is about in a multi-node run, shown first on the line."""

    TICK_S = 1.0

    def __init__(self, stream: IO = sys.stderr, enabled: bool | None = None,
                 width: int | None = None) -> None:
        self.stream = stream
        self.enabled = stream.isatty() if enabled is None else enabled
        self.color = use_color(stream)
        self.width = width
        self._lock = threading.Lock()
        self._text = ""          # what the line says now (without the clock)
        self._since = 0.0        # monotonic start of the timed part, 0: untimed
        self._deadline = 0.0     # seconds, 0: none
        self._shown = False
        self._counts = {"critical": 0, "warning": 0}
        self._trace_s = 0.0
        self._ticker: threading.Thread | None = None
        self._stop = threading.Event()

    def __call__(self, rec: Mapping[str, Any], node: str | None = None) -> None:
        if not self.enabled:
            return
        text, timed, deadline = self._describe(rec)
        if text is None:
            return
        if node:
            text = f"{terminal_safe(node)}: {text}"
        with self._lock:
            self._text = text
            self._since = time.monotonic() if timed else 0.0
            self._deadline = deadline
            self._draw()
        if timed:
            self._start_ticker()

    def _describe(self, rec: Mapping[str, Any]) -> tuple[str | None, bool, float]:
        kind = rec.get("kind")
        safe = {k: terminal_safe(v) if isinstance(v, str) else v for k, v in rec.items()}
        if kind == "finding" and rec.get("severity") in self._counts:
            self._counts[str(rec["severity"])] += 1
            c = self._counts
            return (f"{c['critical']} critical, {c['warning']} warning so far; last: "
                    f"{safe.get('id')} on {safe.get('subject')}"), False, 0.0
        if kind == "progress" and rec.get("phase") == "start":
            trace = rec.get("trace_s")
            self._trace_s = float(trace) if isinstance(trace, (int, float)) else 0.0
            return "node checks started", False, 0.0
        if kind == "progress" and rec.get("phase") == "trace":
            return (f"tracing {self._trace_s:g}s" if self._trace_s else "tracing"), True, \
                self._trace_s
        if kind == "progress" and rec.get("phase") == "check":
            msg = safe.get("message")
            return (f"check {safe.get('check')}: {safe.get('status')}"
                    f"{' ' + msg if isinstance(msg, str) and msg else ''}"), False, 0.0
        if kind == "progress" and rec.get("message"):
            deadline = rec.get("deadline_s")
            ok = isinstance(deadline, (int, float)) and not isinstance(deadline, bool)
            return str(safe["message"]), ok, float(deadline) if ok else 0.0
        if kind == "event":
            return f"event {safe.get('name')}: {safe.get('message')}", False, 0.0
        if kind == "log" and rec.get("level") in ("error", "warning"):
            return f"{safe.get('level')}: {safe.get('message')}", False, 0.0
        return None, False, 0.0

    def _draw(self) -> None:
        text = self._text
        if self._since:
            el = fmt_duration(int(time.monotonic() - self._since))
            text += f" ({el}/{fmt_duration(self._deadline)})" if self._deadline else f" ({el})"
        width = self.width or shutil.get_terminal_size((80, 24)).columns
        text = cut(text, max(10, width - 1))  # never wraps: \r returns to ITS start
        self.stream.write("\r\033[2K" + text)
        self.stream.flush()
        self._shown = True

    def _start_ticker(self) -> None:
        if self._ticker is not None and self._ticker.is_alive():
            return
        self._stop.clear()

        def tick() -> None:
            while not self._stop.wait(self.TICK_S):
                with self._lock:
                    if not self._since or not self._shown:
                        return
                    self._draw()

        self._ticker = threading.Thread(target=tick, name="gpu-doctor-status", daemon=True)
        self._ticker.start()

    def clear(self) -> None:
        """Erase the status line (before the report, an error line, or the end)."""
        self._stop.set()
        with self._lock:
            self._since = 0.0
            if self.enabled and self._shown:
                self.stream.write("\r\033[2K")
                self.stream.flush()
            self._shown = False


DETAIL_SEVERITIES = ("critical", "warning")
COMPACT_EVIDENCE_LINES = 1  # evidence lines of a default details block (--details: all)
MIN_WIDTH, MAX_WIDTH = 40, 240
SEP = " | "
EXPLAIN = "kubectl gpu-doctor explain"


def table_width(width: int | None = None) -> int:
    """The width a table renders at: `width`, else the terminal's (COLUMNS first), bounded."""
    if width is None:
        width = shutil.get_terminal_size((120, 24)).columns
    return max(MIN_WIDTH, min(MAX_WIDTH, int(width)))


def _wrap(text: str, width: int, first: str, rest: str) -> list[str]:
    return textwrap.wrap(text, width, initial_indent=first, subsequent_indent=rest,
                         break_on_hyphens=False, break_long_words=True) or [first.rstrip()]


def verdict_lines(verdict: Mapping[str, Any], width: int, color: bool = False,
                  max_actions: int = 6) -> list[str]:
    """The verdict block (at most ~10 lines): the headline naming the root cause and the pods
    held up, the chain from cause to effect, then the ordered actions, one line each: the
    command whole (never cut: it is copied), what it does and its risk after it, cut to the
    width. `verdict` is verdict.to_dict() or a replayed copy: every string is escaped."""
    sev = str(verdict.get("severity") or "ok")
    head = terminal_safe(str(verdict.get("headline") or ""))
    lines = _wrap(head, width, " " * 10, " " * 10)
    lines[0] = f"{_sev(sev, color)}  {lines[0][10:]}"
    lines = lines[:3]
    chain = [terminal_safe(str(c)) for c in verdict.get("chain") or () if c][:8]
    if len(chain) > 1:
        lines.append(cut(" " * 10 + "cause -> effect: " + " -> ".join(chain), width))
    elif chain:
        lines.append(cut(" " * 10 + f"root cause: {chain[0]}", width))
    actions = [a for a in verdict.get("actions") or () if isinstance(a, Mapping)]
    for i, a in enumerate(actions[:max_actions], 1):
        stage = terminal_safe(str(a.get("stage") or ""))
        text = terminal_safe(str(a.get("text") or ""))
        risk = terminal_safe(str(a.get("risk") or ""))
        cmd = a.get("command")
        start = f"  {i}. {stage:<8} "
        if cmd:
            line = start + terminal_safe(str(cmd))
            note = f"  # {text}; risk: {risk}"
            room = width - len(line)
            lines.append(line + (cut(note, room) if room > 12 else ""))
        else:
            lines.append(cut(start + f"{text} (risk: {risk})", width))
    if len(actions) > max_actions:
        lines.append(f"  ... {len(actions) - max_actions} more in -o json")
    return lines


def _details(f: Finding, width: int, color: bool, full: bool, cut_title: bool) -> list[str]:
    """One finding's details. Compact (default): the full title when the table cut it, and
    the scalar evidence packed on one line. Full (--details): evidence one entry a
    line, lists of objects as small tables, the fix and the references."""
    ind = "    "
    fixed = len(f.severity.value) + 1 + len(f.id) + 2
    subject = cut(f.subject, max(12, width - fixed))
    head = f"{_sev(f.severity.value, color, 0)} {f.id}  {subject}"
    page = f"({EXPLAIN} {f.id})"
    out = ([f"{head}  {page}"] if fixed + len(subject) + 2 + len(page) <= width
           else [head, ind + page])
    if cut_title or full:
        out += _wrap(f.title, width, ind, ind)
    scalars, tables = human.split(f.evidence)
    # nested values are joined from parts terminal_safe_finding did not reach: escape again
    scalars = [(terminal_safe(k), terminal_safe(v)) for k, v in scalars]
    tables = [(terminal_safe(k), rows) for k, rows in tables]
    if not full:
        more = " (more: --details)"
        parts = [f"{k}: {v}" for k, v in scalars]
        parts += [f"{k}: {len(v)} row{'s' if len(v) != 1 else ''}" for k, v in tables]
        room = COMPACT_EVIDENCE_LINES
        if parts:
            packed = _wrap(SEP.join(parts), width, ind, ind)
            if len(packed) > room or tables:
                packed = packed[:room]
                packed[-1] = (packed[-1] + more if len(packed[-1]) + len(more) <= width
                              else cut(packed[-1], width - len(more)) + more)
            out += packed
        return out
    if scalars or tables:
        out.append(f"{ind}evidence:")
    for k, v in scalars:
        out += _wrap(f"{k}: {v}", width, ind + "  ", ind + "    ")
    for k, rows in tables:
        cols, body, more = human.table(rows)
        body = [[terminal_safe(c) for c in r] for r in body]
        cols = [terminal_safe(c) for c in cols]
        out.append(f"{ind}  {k}:")
        out += [cut(ind + "    " + ln, width) for ln in human.aligned(cols, body)]
        if more:
            out.append(f"{ind}    ... {more} more (-o json)")
    for i, para in enumerate(f.remediation.splitlines() or ([] if not f.remediation else [""])):
        out += _wrap(para, width, f"{ind}fix: " if i == 0 else ind + "     ", ind + "     ")
    out += [f"{ind}ref: {r}" for r in f.refs]
    return out


def render_table(report: Report, stream: IO, fail_on: str, exit_code: int,
                 color: bool | None = None, width: int | None = None,
                 verdict: Mapping[str, Any] | None = None, details: bool = False) -> None:
    """Human report: the verdict first (when the caller has one), each finding ONCE in a
    compact table, details blocks (critical and warning; everything with `details`), the
    checks that did not finish or could not look, the warning that explains an incomplete
    run, and one summary line."""
    color = use_color(stream) if color is None else color
    width = table_width(width)
    # made terminal-safe one at a time as they are printed (a copy of each held at once is
    # ~300 B a finding: too much for 300,000 of them in a replayed bundle)
    findings = report.sorted_findings()
    t = {k: terminal_safe(v) for k, v in report.target.items() if v is not None}
    head = f"gpu-doctor {report.version}  target: {t.get('kind', '?')} {t.get('name', '')}"
    if t.get("node") and t.get("node") != t.get("name"):
        head += f" (node {t['node']})"
    w = stream.write
    w(head + "\n")
    if verdict:
        w("".join(ln + "\n" for ln in verdict_lines(verdict, width, color)))
    w("\n")
    long_titles: set[int] = set()
    if findings:
        idw = max(len("ID"), max(len(terminal_safe(f.id)) for f in findings))
        # one subject for all (a node's own findings): the details blocks name it
        one_subject = all(f.subject == findings[0].subject for f in findings)
        subw = (0 if one_subject else
                max(8, min(32, width - 10 - idw - 2 - 2 - 24,
                           max(len("SUBJECT"),
                               max(len(terminal_safe(f.subject)) for f in findings)))))
        subcol = (lambda text: f"{cut(text, subw):{subw}}  ") if subw else (lambda text: "")
        titlew = max(20, width - 8 - 2 - idw - 2 - (subw + 2 if subw else 0))
        w(f"{'SEVERITY':8}  {'ID':{idw}}  {subcol('SUBJECT')}TITLE\n")
        for i, f in enumerate(findings):
            safe_title = terminal_safe(f.title)
            title = cut(" ".join(safe_title.split()), titlew)
            if title != safe_title:
                long_titles.add(i)
            w(f"{_sev(f.severity.value, color)}  {terminal_safe(f.id):{idw}}  "
              f"{subcol(terminal_safe(f.subject))}{title}\n")
        w(cut(f"(a finding's page: {EXPLAIN} ID{'' if details else '; every detail: --details'})",
              width) + "\n")
        shown = [i for i, f in enumerate(findings)
                 if details or f.severity.value in DETAIL_SEVERITIES]
        if shown:
            w("\n")
        for n, i in enumerate(shown):
            if details and n:
                w("\n")  # full blocks are long: a blank line between them
            w("".join(ln + "\n" for ln in _details(terminal_safe_finding(findings[i]), width,
                                                    color, details, i in long_titles)))
    else:
        w("No findings.\n")
    write_footer(report, stream, fail_on, exit_code, width)


def write_footer(report: Report, stream: IO, fail_on: str, exit_code: int,
                 width: int = MAX_WIDTH) -> None:
    """What ends every table report: the checks that did not finish or could not look, the
    warning that explains an incomplete run, and the one summary line with the exit code."""
    w = stream.write
    bad = [c for c in report.checks if c.status not in ("ok", "skipped")]
    if bad:
        w("\nChecks that did not finish:\n")
        for c in bad:
            w(cut(f"  {terminal_safe(c.id)}: {terminal_safe(c.status)} after "
                  f"{fmt_duration(c.duration_s)}"
                  f"{' - ' + terminal_safe(c.message) if c.message else ''}", width) + "\n")
    _write_skipped(report, stream, width)
    doc = report.document(fail_on, exit_code, lazy=True)  # its summary
    s = doc["summary"]
    if not s["complete"]:
        last = last_warning(report)
        if last:
            w(cut(f"\nlast warning: {terminal_safe(last)}", width + 1) + "\n")
    why = terminal_safe(s.get("incomplete_reason") or "some checks did not finish")
    last = (f"{s['critical']} critical, {s['warning']} warning, {s['info']} info"
            f"{'' if s['complete'] else ' (INCOMPLETE: ' + why + ')'}"
            f"; {fmt_duration(doc['duration_s'])}; exit {exit_code}")
    w("\n" + "\n".join(_wrap(last, width, "", "  ")) + "\n")
    stream.flush()


def last_warning(report: Report) -> str | None:
    """What explains an incomplete run, so it reaches the report and not only the live line:
    the last warning or error the run logged (a failed read, the agent's note of the probe's
    last stderr line), else the probe's last line that was not a record (its stderr, merged
    into the debug pod's log)."""
    raw = None
    for rec in reversed(report.logs):
        msg = " ".join(str(rec.get("message") or "").split())
        if not msg:
            continue
        if rec.get("level") in ("warning", "error"):
            return msg
        if raw is None and rec.get("raw"):
            raw = f"the probe's last output line: {msg}"
    return raw


def _write_skipped(report: Report, stream: IO, width: int = MAX_WIDTH) -> None:
    """Footer: the checks that could not look, each with its own reason (a check that did
    not look is never shown as ok)."""
    skipped = [c for c in report.checks if c.status == "skipped"]
    if not skipped:
        return
    stream.write("\nChecks that could not look (skipped):\n")
    for c in skipped:
        why = c.reason or c.message or "no reason given"
        stream.write(cut(f"  {terminal_safe(c.id)}: {terminal_safe(why)}", width) + "\n")


def render_json(report: Report, stream: IO, fail_on: str, exit_code: int) -> None:
    json.dump(report.document(fail_on, exit_code), stream, indent=2, default=str)
    stream.write("\n")
    stream.flush()

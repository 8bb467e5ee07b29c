"""Renderers: present records and reports; they never collect anything.

Why here (stdlib only): `gpu-doctor-probe` renders its own output on a node with no client
installed, and `kubectl gpu-doctor` renders the very same stream, so both use these functions.
Output is TTY-aware: colour only on a terminal and never with NO_COLOR; live progress only
goes to stderr when stderr is a terminal, so pipes and bots see clean stdout.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import sys
import textwrap
from typing import IO, Any, Mapping

from node_probe.protocol import Finding, Report, encode

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
    """One short line per notable record on a terminal; silent otherwise."""

    def __init__(self, stream: IO = sys.stderr, enabled: bool | None = None) -> None:
        self.stream = stream
        self.enabled = stream.isatty() if enabled is None else enabled
        self.color = use_color(stream)

    def __call__(self, rec: Mapping[str, Any]) -> None:
        if not self.enabled:
            return
        kind = rec.get("kind")
        line = None
        rec = {k: terminal_safe(v) if isinstance(v, str) else v for k, v in rec.items()}
        if kind == "finding" and rec.get("severity") in ("critical", "warning"):
            line = f"{_sev(rec['severity'], self.color)} {rec.get('id')}: {rec.get('title')}"
        elif kind == "event":
            line = f"  event   {rec.get('name')}: {rec.get('message')}"
        elif kind == "progress" and rec.get("phase") == "check" and rec.get("status") != "ok":
            line = f"  check   {rec.get('check')} {rec.get('status')} {rec.get('message', '')}"
        elif kind == "progress" and rec.get("message"):
            line = f"  ...     {rec.get('message')}"
        elif kind == "log" and rec.get("level") in ("error", "warning"):
            line = f"  {rec.get('level'):7} {rec.get('message')}"
        if line:
            self.stream.write(line + "\n")
            self.stream.flush()


def _json_chunks(v: Any) -> list[str]:
    """JSON text of `v` cut only between values ('{"a": 1,' / '"b": "x-y"}'), never inside
    a key, a string or a number."""
    if isinstance(v, Mapping) and v:
        items: list = [(json.dumps(str(k)) + ": ", x) for k, x in v.items()]
        opening, closing = "{", "}"
    elif isinstance(v, (list, tuple)) and v:
        items = [("", x) for x in v]
        opening, closing = "[", "]"
    else:
        return [json.dumps(v, default=str)]
    out: list[str] = []
    for i, (key, x) in enumerate(items):
        sub = _json_chunks(x)
        sub[0] = (opening if i == 0 else "") + key + sub[0]
        sub[-1] += closing if i == len(items) - 1 else ","
        out.extend(sub)
    return out


def _pack(chunks: list[str], width: int, first: str, rest: str) -> list[str]:
    """Greedy fill of whole chunks; a chunk wider than the line gets a line of its own."""
    lines: list[str] = []
    cur = first
    bare = True
    for c in chunks:
        if not bare and len(cur) + 1 + len(c) > width:
            lines.append(cur)
            cur, bare = rest + c, False
        else:
            cur, bare = (cur + c if bare else cur + " " + c), False
    lines.append(cur)
    return lines


def evidence_lines(key: str, value: Any, width: int, indent: str) -> list[str]:
    """One evidence entry as table lines. JSON values wrap between values, never in the
    middle of a word; a list of objects prints one object per line."""
    cont = indent + "  "
    if isinstance(value, (list, tuple)) and value and all(isinstance(x, Mapping)
                                                          for x in value):
        out = [f"{indent}{key}:"]
        for x in value:
            out += _pack(_json_chunks(x), width, cont + "- ", cont + "  ")
        return out
    if isinstance(value, (Mapping, list, tuple)):
        return _pack(_json_chunks(value), width, f"{indent}{key}: ", cont)
    text = str(value)
    return textwrap.wrap(f"{key}: {text}", width, initial_indent=indent,
                         subsequent_indent=cont, break_on_hyphens=False,
                         break_long_words=False) or [f"{indent}{key}: "]


def render_table(report: Report, stream: IO, fail_on: str, exit_code: int,
                 color: bool | None = None) -> None:
    """Human report: a table of findings, then details (evidence, fix, refs), then a verdict."""
    color = use_color(stream) if color is None else color
    width = max(60, min(140, shutil.get_terminal_size((120, 24)).columns))
    findings = [terminal_safe_finding(f) for f in report.sorted_findings()]
    t = {k: terminal_safe(v) for k, v in report.target.items() if v is not None}
    head = f"gpu-doctor {report.version}  target: {t.get('kind', '?')} {t.get('name', '')}"
    if t.get("node") and t.get("node") != t.get("name"):
        head += f" (node {t['node']})"
    stream.write(head + "\n\n")
    if findings:
        idw = max(len("ID"), *(len(f.id) for f in findings))
        subw = min(40, max(len("SUBJECT"), *(len(f.subject) for f in findings)))
        stream.write(f"{'SEVERITY':8}  {'ID':{idw}}  {'SUBJECT':{subw}}  TITLE\n")
        for f in findings:
            subj = f.subject if len(f.subject) <= subw else f.subject[: subw - 1] + "~"
            stream.write(f"{_sev(f.severity.value, color)}  {f.id:{idw}}  {subj:{subw}}  "
                         f"{f.title}\n")
        details = [f for f in findings if f.severity.value in ("critical", "warning")]
        if details:
            stream.write("\n")
        for f in details:
            _write_details(f, stream, color, width)
    else:
        stream.write("No findings.\n")
    bad = [c for c in report.checks if c.status not in ("ok", "skipped")]
    if bad:
        stream.write("\nChecks that did not finish:\n")
        for c in bad:
            stream.write(f"  {terminal_safe(c.id)}: {terminal_safe(c.status)} after "
                         f"{c.duration_s:.1f}s"
                         f"{' - ' + terminal_safe(c.message) if c.message else ''}\n")
    _write_skipped(report, stream)
    doc = report.document(fail_on, exit_code)
    s = doc["summary"]
    if s.get("incomplete_reason"):
        s = dict(s, incomplete_reason=terminal_safe(s["incomplete_reason"]))
    verdict = (f"\n{s['critical']} critical, {s['warning']} warning, {s['info']} info"
               f"{'' if s['complete'] else ' (INCOMPLETE: ' + (s.get('incomplete_reason') or 'some checks did not finish') + ')'}"
               f"; {doc['duration_s']:.1f}s; exit {exit_code}\n")
    stream.write(verdict)
    stream.flush()


def _write_skipped(report: Report, stream: IO) -> None:
    """Footer: the checks that could not look, each with its own reason (a check that did
    not look is never shown as ok)."""
    skipped = [c for c in report.checks if c.status == "skipped"]
    if not skipped:
        return
    stream.write("\nChecks that could not look (skipped):\n")
    for c in skipped:
        why = c.reason or c.message or "no reason given"
        stream.write(f"  {terminal_safe(c.id)}: {terminal_safe(why)}\n")


def _write_details(f: Finding, stream: IO, color: bool, width: int) -> None:
    ind = "    "
    stream.write(f"{_sev(f.severity.value, color, 0)} {f.id}  [{f.subject}]\n")
    stream.write(textwrap.fill(f.title, width, initial_indent=ind, subsequent_indent=ind) + "\n")
    if f.evidence:
        stream.write(f"{ind}evidence:\n")
        for k, v in f.evidence.items():
            stream.writelines(ln + "\n" for ln in evidence_lines(k, v, width, ind + "  "))
    if f.remediation:
        for i, para in enumerate(f.remediation.splitlines() or [""]):
            prefix = f"{ind}fix: " if i == 0 else ind + "     "
            stream.write(textwrap.fill(para, width, initial_indent=prefix,
                                       subsequent_indent=ind + "     ") + "\n")
    for r in f.refs:
        stream.write(f"{ind}ref: {r}\n")
    stream.write("\n")


def render_json(report: Report, stream: IO, fail_on: str, exit_code: int) -> None:
    json.dump(report.document(fail_on, exit_code), stream, indent=2, default=str)
    stream.write("\n")
    stream.flush()

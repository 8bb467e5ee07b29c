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
from typing import IO, Any, Iterator, Mapping

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
        evidence={terminal_safe(k): _safe_evidence_value(v) for k, v in f.evidence.items()},
        quoted=tuple({k: terminal_safe(v) for k, v in q.items()} for q in f.quoted))


def quoted_lines(f: Finding, width: int, ind: str, first_only: bool = False) -> list[str]:
    """What the finding quotes from the cluster or a bundle, marked as quoted and escaped:
    `quoted from event ml/train-0 FailedMount (message): "..."`."""
    out: list[str] = []
    for q in f.quoted[:1] if first_only else f.quoted:
        where = " ".join(terminal_safe(q.get("source", "")).split())
        field = terminal_safe(q.get("field", ""))
        text = " ".join(terminal_safe(q.get("text", "")).split())
        out += _wrap(f'quoted from {where}{f" ({field})" if field else ""}: "{text}"', width,
                     ind, ind + "  ")
    if first_only and len(f.quoted) > 1:
        out.append(f"{ind}({len(f.quoted) - 1} more quoted: --details)")
    return out


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
        waited = rec.get("waited_s")  # the clock started before the record (an API wait)
        waited = float(waited) if isinstance(waited, (int, float)) and \
            not isinstance(waited, bool) else 0.0
        with self._lock:
            self._text = text
            self._since = time.monotonic() - waited if timed else 0.0
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
COMPACT_EVIDENCE_LINES = 1  # evidence lines of a --details-less block when asked (wide)
MIN_WIDTH, MAX_WIDTH = 40, 240
SEP = " | "
TOOL = "kubectl gpu-doctor"   # the one name the tool goes by in what it prints
EXPLAIN = f"{TOOL} explain"
IND = " " * 10                # the verdict's and the findings' text column
STEP_W = 9                    # "mitigate" (the longest step name) and a space


def table_width(width: int | None = None) -> int:
    """The width a table renders at: `width`, else the terminal's (COLUMNS first), bounded."""
    if width is None:
        width = shutil.get_terminal_size((120, 24)).columns
    return max(MIN_WIDTH, min(MAX_WIDTH, int(width)))


def _wrap(text: str, width: int, first: str, rest: str) -> list[str]:
    """Wrapped between words; a word longer than the line (a path, a name) stays whole."""
    return textwrap.wrap(text, width, initial_indent=first, subsequent_indent=rest,
                         break_on_hyphens=False, break_long_words=False) or [first.rstrip()]


def shell_lines(cmd: str, width: int, first: str, rest: str) -> list[str]:
    """A command as a shell continues it: cut between words, each cut line ending in ` \\`,
    so the lines pasted together are the same command. A word longer than the width stays
    whole (a name is never cut)."""
    words = cmd.split(" ")
    lines, cur = [], first + words[0]
    for word in words[1:]:
        if len(cur) + 1 + len(word) + 2 > width and cur.strip():
            lines.append(cur + " \\")
            cur = rest + word
        else:
            cur += " " + word
    return lines + [cur]


def verdict_lines(verdict: Mapping[str, Any], width: int, color: bool = False,
                  max_actions: int = 6) -> list[str]:
    """The verdict block: the headline naming the root cause and the pods held up, then the
    ordered actions -- each its command as a shell continues a long one (never cut: it is
    copied) and below it what it does and its whole risk, wrapped (a short read-only one on
    one line). The chain from cause to effect is the order the findings follow below it.
    `verdict` is verdict.to_dict() or a replayed copy: every string is escaped."""
    sev = str(verdict.get("severity") or "ok")
    head = terminal_safe(" ".join(str(verdict.get("headline") or "").split()))
    lines = _wrap(head, width, IND, IND)
    lines[0] = f"{_sev(sev, color)}  {lines[0][len(IND):]}"
    actions = [a for a in verdict.get("actions") or () if isinstance(a, Mapping)]
    for i, a in enumerate(actions[:max_actions], 1):
        step = terminal_safe(str(a.get("step") or a.get("stage") or ""))
        text = terminal_safe(" ".join(str(a.get("text") or "").split()))
        risk = terminal_safe(" ".join(str(a.get("risk") or "").split()))
        cmd = a.get("command")
        start = f"  {i}. {step:<{STEP_W}} "
        pad = " " * len(start)
        note = f"{text[:1].upper()}{text[1:]}" + (
            "" if not risk else " (read-only)" if risk == "none (read-only)"
            else f". Risk: {risk}")
        if cmd:
            cmd = " ".join(terminal_safe(str(cmd)).split())
            one = f"{start}{cmd}  # {text}" + (" (read-only)" if risk == "none (read-only)"
                                               else "")
            if len(one) <= width and risk.startswith("none"):  # short and harmless: one line
                lines.append(one)
                continue
            lines += shell_lines(cmd, width, start, pad + "  ")
            lines += _wrap(note, width, pad, pad)
        else:
            lines += _wrap(note, width, start, pad)
    if len(actions) > max_actions:
        lines.append(f"  ... {len(actions) - max_actions} more in -o json")
    return lines


def reach_of(report: Report) -> dict:
    """How the node side was reached, as fields (the `reach` of the JSON document): `how` is
    one of local, agent_exec, debug_pod, api_only; `pod` the agent or debug pod (namespace/
    name) when one ran the probe; `why` the reason it was not reached, when one was said."""
    if report.target.get("kind") == "local":
        return {"how": "local", "pod": None, "why": None}
    probe = next((c for c in report.checks if c.id == "node.probe"), None)
    if probe is None:
        return {"how": "api_only", "pod": None, "why": None}
    msg = " ".join(str(probe.message or probe.reason or "").split())[:300]
    for prefix, how in (("via agent pod ", "agent_exec"), ("via debug pod ", "debug_pod")):
        if msg.startswith(prefix):
            return {"how": how, "pod": msg[len(prefix):].split(" ", 1)[0] or None,
                    "why": None}
    return {"how": "api_only", "pod": None, "why": msg or probe.status}


def reached(report: Report) -> str:
    """How the node side was reached, in words: the agent pod by name, a debug pod, this host,
    or why it was not (from the `node.probe` check the client records)."""
    if report.target.get("kind") == "local":
        return "on this host"
    probe = next((c for c in report.checks if c.id == "node.probe"), None)
    if probe is None:
        return "API side only"
    msg = terminal_safe(" ".join(str(probe.message or probe.reason or "").split()))
    if msg.startswith("via agent pod "):
        return f"node side by exec in agent pod {msg[len('via agent pod '):]}"
    if msg.startswith("via debug pod "):
        return f"node side in debug pod {msg[len('via debug pod '):]} (deleted)"
    if probe.status == "skipped":
        why = ("the node is NotReady" if "NotReady" in msg else
               "the kubelet admits no pod" if "admits no pod" in msg else
               "it never started" if "never started" in msg else "")
        return "API side only" + (f" (no debug pod: {why})" if why else
                                  f" ({msg})" if msg and len(msg) < 60 else "")
    return f"node side: {msg or probe.status}"


def header_lines(report: Report, width: int, origin: str | None = None) -> list[str]:
    """The first line(s): the target, when the evidence is from (live, or the bundle's
    capture for a replay) and how the node was reached."""
    t = {k: terminal_safe(v) for k, v in report.target.items() if v is not None}
    what = f"{t.get('kind', '?')} {t.get('name', '')}".strip()
    if t.get("node") and t.get("node") != t.get("name"):
        what += f" on node {t['node']}"
    when = terminal_safe(origin) if origin else "live " + time.strftime(
        "%Y-%m-%d %H:%M UTC", time.gmtime(report.started_at))
    return _wrap(f"{what}: {when}, {reached(report)} ({TOOL} {terminal_safe(report.version)})",
                 width, "", "  ")


def _subject_shown(f: Finding, target: Mapping[str, Any]) -> str:
    """The subject unless it is the target itself, node or pod (then the header said it)."""
    node = target.get("node") or target.get("name")
    if f.subject in ("node", "", f"node/{node}", f"node {node}"):
        return ""
    if target.get("kind") == "pod" and f.subject in (f"pod/{target.get('name')}",
                                                     f"pod {target.get('name')}"):
        return ""
    return f.subject


def _finding_block(f: Finding, width: int, color: bool, target: Mapping[str, Any],
                   headline: str = "") -> list[str]:
    """A problem finding, once: its severity and id, [its subject], and its title, wrapped
    (never cut) in the text column -- unless the verdict's headline above already says the
    title, word for word (then it points there instead of saying it twice)."""
    subj = _subject_shown(f, target)
    title = " ".join(f.title.split())
    said = len(title) > 20 and (title.lower() in headline.lower())
    text = f"{f.id}  " + (f"[{subj}] " if subj else "") + (
        "(the cause: the verdict above)" if said else title)
    out = _wrap(text, width, IND, IND)
    out[0] = f"{_sev(f.severity.value, color)}  " + out[0][len(IND):]
    return out + quoted_lines(f, width, IND, first_only=True)


def _wide_rows(findings: list[Finding], color: bool) -> Iterator[str]:
    """-o wide: one line per finding, every column whole (as kubectl's wide output: a line
    may run past the terminal; nothing is cut), each made terminal-safe as it is printed."""
    idw = max(len("ID"), *(len(terminal_safe(f.id)) for f in findings))
    subw = max(len("SUBJECT"), *(len(terminal_safe(f.subject)) for f in findings))
    yield f"{'SEVERITY':8}  {'ID':{idw}}  {'SUBJECT':{subw}}  TITLE"
    for f in findings:
        yield (f"{_sev(f.severity.value, color)}  {terminal_safe(f.id):{idw}}  "
               f"{terminal_safe(f.subject):{subw}}  {' '.join(terminal_safe(f.title).split())}")


def _details(f: Finding, width: int, color: bool) -> list[str]:
    """One finding's full details (--details): evidence one entry a line, lists of objects
    as small tables, the fix and the references."""
    ind = "    "
    head = f"{_sev(f.severity.value, color, 0)} {f.id}  {f.subject}"
    out = _wrap(head, width, "", ind) + _wrap(" ".join(f.title.split()), width, ind, ind)
    out += quoted_lines(f, width, ind)
    scalars, tables = human.split(f.evidence)
    # nested values are joined from parts terminal_safe_finding did not reach: escape again
    scalars = [(terminal_safe(k), terminal_safe(v)) for k, v in scalars]
    tables = [(terminal_safe(k), rows) for k, rows in tables]
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
    out.append(f"{ind}page: {EXPLAIN} {f.id}")
    return out


def render_table(report: Report, stream: IO, fail_on: str, exit_code: int,
                 color: bool | None = None, width: int | None = None,
                 verdict: Mapping[str, Any] | None = None, details: bool = False,
                 origin: str | None = None, wide: bool = False) -> None:
    """Human report: a header saying what, when and how the node was reached; the verdict
    (when the caller has one); each finding ONCE -- a problem as its id and its title wrapped
    in the text column, info and ok findings folded into one line (all of them in full with
    `details`; one line each, nothing cut, with `wide`) --; the checks that did not finish,
    the ones that could not look in one line (each with its reason with `details`), the
    warning that explains an incomplete run, and one summary line."""
    color = use_color(stream) if color is None else color
    width = table_width(width)
    # made terminal-safe one at a time as they are printed (a copy of each held at once is
    # ~300 B a finding: too much for 300,000 of them in a replayed bundle)
    findings = report.sorted_findings()
    w = stream.write
    w("".join(ln + "\n" for ln in header_lines(report, width, origin)))
    if verdict:
        w("".join(ln + "\n" for ln in verdict_lines(verdict, width, color)))
    w("\n")
    if not findings:
        w("No findings.\n")
    elif wide:
        for ln in _wide_rows(findings, color):
            w(ln + "\n")
    elif details:
        for n, f in enumerate(findings):
            w(("\n" if n else "") + "".join(ln + "\n" for ln in _details(
                terminal_safe_finding(f), width, color)))
    else:
        problems = [f for f in findings if f.severity.value in DETAIL_SEVERITIES]
        # cause first, then its effects in order (the verdict's chain), then the rest
        chain = [str(c) for c in (verdict or {}).get("chain") or ()]
        problems.sort(key=lambda f: chain.index(f.id) if f.id in chain else len(chain))
        headline = terminal_safe(" ".join(str((verdict or {}).get("headline") or "").split()))
        for f in problems:
            w("".join(ln + "\n" for ln in _finding_block(terminal_safe_finding(f), width,
                                                          color, report.target, headline)))
        by: dict[str, dict[str, None]] = {}
        for f in findings:
            if f.severity.value not in DETAIL_SEVERITIES:
                by.setdefault(f.severity.value, {})[terminal_safe(f.id)] = None
        folded = "; ".join(f"{sev}: {', '.join(ids)}" for sev, ids in by.items())
        if folded:
            w("".join(ln + "\n" for ln in _wrap(folded, width, "", "  ")))
        page = verdict.get("page") if verdict else None
        w("".join(ln + "\n" for ln in _wrap(
            "(--details: evidence, fix, references; "
            + (f"page: {terminal_safe(page)})" if isinstance(page, str) and page
               and len(page) < width - 50 else f"page: {EXPLAIN} ID)"), width, "", " ")))
    write_footer(report, stream, fail_on, exit_code, width, details=details)


def write_footer(report: Report, stream: IO, fail_on: str, exit_code: int,
                 width: int = MAX_WIDTH, details: bool = False) -> None:
    """What ends every table report: the checks that did not finish, the ones that could not
    look (one line; each with its reason with `details`), the warning that explains an
    incomplete run, and the one summary line with the exit code."""
    w = stream.write
    bad = [c for c in report.checks if c.status not in ("ok", "skipped")]
    if bad:
        w("\nChecks that did not finish:\n")
        for c in bad:
            w("".join(ln + "\n" for ln in _wrap(
                f"{terminal_safe(c.id)}: {terminal_safe(c.status)} after "
                f"{fmt_duration(c.duration_s)}"
                f"{' - ' + terminal_safe(c.message) if c.message else ''}", width, "  ",
                "    ")))
    w("\n")
    _write_skipped(report, stream, width, details)
    doc = report.document(fail_on, exit_code, lazy=True)  # its summary
    s = doc["summary"]
    if not s["complete"]:
        last = last_warning(report)
        if last:
            w("".join(ln + "\n" for ln in _wrap(f"last warning: {terminal_safe(last)}",
                                                       width, "", "  ")))
    why = terminal_safe(s.get("incomplete_reason") or "some checks did not finish")
    last = (f"{s['critical']} critical, {s['warning']} warning, {s['info']} info"
            f"{'' if s['complete'] else ' (INCOMPLETE: ' + why + ')'}"
            f"; {fmt_duration(doc['duration_s'])}; exit {exit_code}")
    w("\n".join(_wrap(last, width, "", "  ")) + "\n")
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


def skipped_checks(report: Report) -> list:
    return [c for c in report.checks if c.status == "skipped"]


def _write_skipped(report: Report, stream: IO, width: int = MAX_WIDTH,
                   details: bool = False) -> None:
    """The checks that could not look: one line (a check that did not look is never shown as
    ok, and is never noise either); with `details` each with its own reason."""
    skipped = skipped_checks(report)
    if not skipped:
        return
    n = len(skipped)
    if not details:
        stream.write("".join(ln + "\n" for ln in _wrap(
            f"{n} check{'s' if n != 1 else ''} could not look here (--details says why)",
            width, "", "  ")))
        return
    stream.write(f"Checks that could not look ({n}):\n")
    for c in skipped:
        why = c.reason or c.message or "no reason given"
        stream.write("".join(ln + "\n" for ln in _wrap(
            f"{terminal_safe(c.id)}: {terminal_safe(' '.join(str(why).split()))}", width, "  ",
            "    ")))


def render_json(report: Report, stream: IO, fail_on: str, exit_code: int) -> None:
    json.dump(report.document(fail_on, exit_code), stream, indent=2, default=str)
    stream.write("\n")
    stream.flush()

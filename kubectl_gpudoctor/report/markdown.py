"""`-o markdown` and `-o chat`: the report for a ticket or an incident channel, safe to paste.

Why: on-call engineers paste the answer into GitHub, Jira, Slack or Teams. The paste must lead
with the verdict (headline, impact, the commands to run), show each finding once, stay under
the size those tools accept, and never let a string a tenant or a node controls (pod names,
titles, evidence, the headline built from a finding's title, a replayed bundle) render as
markup, a link, an image, an HTML tag or a @mention.

Two forms, because the tools render different subsets:
- `markdown` (GitHub-flavoured: GitHub, GitLab, Jira's markdown): a heading, the verdict, the
  actions as numbered steps with `sh` code blocks, ONE table (the findings of a node or pod;
  the sick nodes of `nodes`), the evidence in a collapsible <details> block. Titles are whole
  (markdown has no width) and said once: the evidence block does not repeat them.
- `chat` (Slack and Microsoft Teams): neither renders tables nor <details>, and Slack shows a
  backslash escape literally, so: plain lines in our words, numbered steps, commands in ```
  blocks, findings as a bulleted list, every tenant-controlled string in a single-backtick
  code span (the one markup both render and inside which neither makes links or mentions),
  no headings, no emphasis, no escapes; at most CHAT_CHARS.

Every tenant-controlled string goes into a code span with its control characters made
visible; our own words are backslash-escaped (markdown) or contain no markup (chat); commands
go into fenced code blocks.
"""
from __future__ import annotations

import re
import time
from typing import Any, Mapping, Sequence

from node_probe.protocol import Report
from node_probe.protocol import evidence as human
from node_probe.protocol.render import EXPLAIN, TOOL, last_warning, reached, terminal_safe

MAX_CHARS = 40000          # Slack's message limit; GitHub comments take 65,536
CHAT_CHARS = 12000         # a chat message people read (Teams refuses ~28 KB)
MAX_CODE = 300             # one code span
MAX_TITLE = 1000           # a title in the table: whole (markdown has no width), bounded
MAX_FINDINGS = 50          # table rows
MAX_NODES = 50             # fleet table rows
# the characters that start markup in CommonMark/GFM, Slack and Jira; fewer escapes than
# CommonMark allows, since Slack shows a backslash literally
_MD_ACTIVE = re.compile(r"([\\`*_\[\]<>|~#])")
_BACKTICKS = re.compile(r"`+")
_PLAIN_KEY = re.compile(r"[A-Za-z0-9 .()%-]{1,80}")


def text(s: Any) -> str:
    """Our own words (and evidence keys) as markdown text: markup characters escaped, `@`,
    `://` and `www.` broken by a word joiner so no mention or autolink forms."""
    t = " ".join(terminal_safe(str(s)).split())
    t = _MD_ACTIVE.sub(r"\\\1", t)
    return (t.replace("@", "@\u2060").replace("://", ":\u2060//")
            .replace("www.", "www\u2060."))


def code(s: Any, limit: int = MAX_CODE, cell: bool = False) -> str:
    """Any string as an inline code span: nothing inside renders (no link, mention, tag or
    emphasis); newlines become spaces, control and bidi characters visible escapes; in a
    table cell `|` is escaped (GFM splits cells on it even inside code)."""
    t = human.cut(" ".join(terminal_safe(str(s)).split()), limit)
    if not t:
        return "` `"
    if cell:
        t = t.replace("|", "\\|")
    longest = max((len(m) for m in _BACKTICKS.findall(t)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if t.startswith("`") or t.endswith("`") or longest else ""
    return f"{fence}{pad}{t}{pad}{fence}"


def chat_code(s: Any, limit: int = MAX_CODE) -> str:
    """A code span Slack and Teams both render: one backtick each side (Slack has no longer
    fences), so a backtick inside becomes a prime; never empty."""
    t = human.cut(" ".join(terminal_safe(str(s)).split()), limit).replace("`", "\u2032")
    return f"`{t}`" if t else "` `"


def key(k: str) -> str:
    """An evidence key: plain when it is a plain word, else a code span (a bundle's keys are
    as hostile as its values)."""
    return text(k) if _PLAIN_KEY.fullmatch(k) else code(k, 80)


def _fence(cmd: str, indent: str = "   ") -> list[str]:
    body = " ".join(terminal_safe(cmd).split())
    longest = max((len(m) for m in _BACKTICKS.findall(body)), default=0)
    f = "`" * max(3, longest + 1)
    return [f"{indent}{f}sh", f"{indent}{body}", f"{indent}{f}"]


def _when(report: Report, origin: str | None) -> str:
    return origin or "live " + time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(report.started_at))


def _actions(v: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [a for a in v.get("actions") or () if isinstance(a, Mapping)][:8]


def _verdict(v: Mapping[str, Any]) -> list[str]:
    sev = str(v.get("severity") or "ok").upper()
    out = [f"**{text(sev)}**: {code(v.get('headline') or '', 600)}", ""]
    chain = [c for c in v.get("chain") or () if c]
    if len(chain) > 1:
        out += ["Cause \u2192 effect: " + " \u2192 ".join(code(c) for c in chain[:8]), ""]
    actions = _actions(v)
    if actions:
        out += ["**What to do**", ""]
        for i, a in enumerate(actions, 1):
            step = a.get("step") or a.get("stage") or ""
            out.append(f"{i}. **{text(step)}**: {text(a.get('text') or '')} "
                       f"_\\(risk: {text(a.get('risk') or '')}\\)_")
            if a.get("command"):
                out += _fence(str(a["command"]))
        out.append("")
    if isinstance(v.get("page"), str) and v["page"]:
        out += [f"Page of the cause: {code(v['page'])}", ""]
    return out


def _evidence(f) -> list[str]:
    """A finding's evidence, under its id (its title is in the table above: said once)."""
    scalars, tables = human.split(f.evidence)
    out = [f"**{text(f.severity.value.upper())}** {code(f.id)} on {code(f.subject)}", ""]
    # what others wrote: marked as quoted, as code (never markup, never our words)
    out += [f"- quoted from {code(q.get('source', ''), 200)} "
            f"\\({text(q.get('field', ''))}\\): {code(q.get('text', ''), 600)}"
            for q in f.quoted]
    out += [f"- {key(k)}: {code(v)}" for k, v in scalars]
    for k, rows in tables:
        cols, body, more = human.table(rows)
        out.append(f"- {key(k)}:")
        out.append("")
        out.append("  | " + " | ".join(key(c) if _PLAIN_KEY.fullmatch(c) else
                                       code(c, 60, cell=True) for c in cols) + " |")
        out.append("  |" + "---|" * len(cols))
        out += ["  | " + " | ".join(code(c, 60, cell=True) for c in r) + " |" for r in body]
        if more:
            out.append(f"  \\.\\.\\. {more} more \\(\\-o json\\)")
        out.append("")
    out += ["", f"Page: {code(f'{EXPLAIN} {f.id}')}", ""]
    return out


def _fleet_heading(report: Report, rows: Sequence[Mapping[str, Any]]) -> str:
    sick = sum(1 for r in rows if _sick(r))
    name = str(report.target.get("name") or "")
    what = "GPU nodes" if name == "GPU nodes" else "nodes" if name == "all nodes" else \
        f"nodes {code('-l ' + name)}"
    return f"{len(rows)} {what}, {sick} with problems"


def _sick(r: Mapping[str, Any]) -> bool:
    return bool(r.get("critical") or r.get("warning")) or r.get("ready") is False


def _fleet_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The sick nodes, worst first (the order `nodes` already gave them), one row each."""
    sick = [r for r in rows if _sick(r)]
    if not sick:
        return ["No node has a problem\\.", ""]
    out = ["| Node | Ready | GPU A/C | Free | Verdict |", "|---|---|---|---|---|"]
    for r in sick[:MAX_NODES]:
        ready = {True: "Ready", False: "NotReady", None: "Unknown"}[r.get("ready")]
        if not r.get("schedulable", True):
            ready += ",SchedulingDisabled"
        gpus = "-" if r.get("gpu_capacity") is None else \
            f"{r.get('gpu_allocatable')}/{r.get('gpu_capacity')}"
        free = "-" if r.get("gpu_free") is None else str(r.get("gpu_free"))
        out.append(f"| {code(r.get('node'), 80, True)} | {text(ready)} | {text(gpus)} | "
                   f"{text(free)} | {code(r.get('verdict') or '-', MAX_TITLE, True)} |")
    if len(sick) > MAX_NODES:
        out.append(f"\n{len(sick) - MAX_NODES} more sick nodes in \\-o json")
    return out + [""]


def render(report: Report, fail_on: str, exit_code: int, verdict: Mapping[str, Any] | None,
           rows: Sequence[Mapping[str, Any]] | None = None, origin: str | None = None,
           chat: bool = False, pre_table: str = "") -> str:
    """The whole document: GitHub-flavoured markdown, or the chat form (`chat`). `rows`:
    the fleet of `nodes` (one table of its sick nodes instead of every finding)."""
    if chat:
        return render_chat(report, fail_on, exit_code, verdict, rows, origin)
    t = report.target
    if rows is not None:
        head = [f"### {text(TOOL)}: {_fleet_heading(report, rows)}", "",
                f"{text(_when(report, origin))}", ""]
        head += _fleet_table(rows)
        findings = []
    else:
        head = [f"### {text(TOOL)}: {text(t.get('kind') or '?')} {code(t.get('name') or '')}",
                "", f"{text(_when(report, origin))}; {text(reached(report))}", ""]
        if verdict:
            head += _verdict(verdict)
        findings = report.sorted_findings()
        if findings:
            head += ["| Severity | ID | Subject | Title |", "|---|---|---|---|"]
            for f in findings[:MAX_FINDINGS]:
                head.append(f"| {text(f.severity.value.upper())} | {code(f.id, 80, True)} | "
                            f"{code(f.subject, 120, True)} | {code(f.title, MAX_TITLE, True)} |")
            if len(findings) > MAX_FINDINGS:
                head.append(f"\n{len(findings) - MAX_FINDINGS} more findings in \\-o json")
            head.append("")
        else:
            head += ["No findings\\.", ""]
    doc = report.document(fail_on, exit_code, lazy=True)  # its summary
    s = doc["summary"]
    tail = []
    if not s["complete"]:
        why = s.get("incomplete_reason") or "some checks did not finish"
        tail.append(f"**Incomplete**: {code(why)}")
        last = last_warning(report)
        if last:
            tail.append(f"last warning: {code(last)}")
        tail.append("")
    skipped = [c for c in report.checks if c.status == "skipped"]
    if skipped:
        tail.append(f"{len(skipped)} check{'s' if len(skipped) != 1 else ''} could not look: "
                    + ", ".join(
            code(c.id, 60) for c in skipped[:30]))
        tail.append("")
    tail.append(f"{s['critical']} critical, {s['warning']} warning, {s['info']} info; "
                f"exit {int(exit_code)}; {text(TOOL)} {text(report.version)}")
    body = "\n".join(head)
    budget = MAX_CHARS - len(body) - len("\n".join(tail)) - 200
    blocks, left_out = [], 0
    for f in findings:
        block = "\n".join(_evidence(f))
        if len(block) > budget:
            left_out += 1
            continue
        blocks.append(block)
        budget -= len(block) + 1
    if blocks or left_out:
        body += (f"\n<details><summary>Evidence of {len(findings)} finding"
                 f"{'s' if len(findings) != 1 else ''}</summary>\n\n" + "\n".join(blocks))
        if left_out:
            body += f"\n{left_out} finding(s) left out to stay short: \\-o json has them\n"
        body += "\n</details>\n\n"
    out = body.rstrip("\n") + "\n\n" + "\n".join(tail) + "\n"
    return out if len(out) <= MAX_CHARS else out[: MAX_CHARS - 40] + "\n\n\\(cut: \\-o json\\)\n"


def render_chat(report: Report, fail_on: str, exit_code: int,
                verdict: Mapping[str, Any] | None,
                rows: Sequence[Mapping[str, Any]] | None = None,
                origin: str | None = None) -> str:
    """The chat form: what Slack and Teams both render (see the module docstring)."""
    t = report.target
    c = chat_code
    out: list[str] = []
    when = _when(report, origin)
    if rows is not None:
        sick = [r for r in rows if _sick(r)]
        out += [f"{TOOL} nodes: {len(rows)} nodes, {len(sick)} with problems ({when})", ""]
        for r in sick[:20]:
            out.append(f"\u2022 {c(r.get('node'), 80)} {c(r.get('verdict') or '-', 300)}")
        if len(sick) > 20:
            out.append(f"{len(sick) - 20} more: -o json")
        if sick:
            out += ["", f"One node's evidence and fix: {c(f'{TOOL} node ' + str(sick[0]['node']))}"]
    else:
        out.append(f"{TOOL} {str(t.get('kind') or '?')} {c(t.get('name') or '', 120)} "
                   f"({when}; {reached(report)})")
        out.append("")
        if verdict:
            out.append(f"{str(verdict.get('severity') or 'ok').upper()}: "
                       f"{c(verdict.get('headline') or '', 600)}")
            actions = _actions(verdict)
            if actions:
                out += ["", "What to do:"]
            for i, a in enumerate(actions, 1):
                step = str(a.get("step") or a.get("stage") or "")
                out.append(f"{i}. {step}: {c(a.get('text') or '', 400)} (risk: "
                           f"{c(a.get('risk') or '', 400)})")
                if a.get("command"):
                    out += ["```", " ".join(terminal_safe(str(a["command"])).split())
                            .replace("`", "\u2032"), "```"]
            if isinstance(verdict.get("page"), str) and verdict["page"]:
                out.append(f"Page of the cause: {c(verdict['page'])}")
        findings = report.sorted_findings()
        if findings:
            out += ["", "Findings:"]
            for f in findings[:20]:
                out.append(f"\u2022 {f.severity.value.upper()} {c(f.id, 80)} "
                           f"{c(f.title, 300)}")
            if len(findings) > 20:
                out.append(f"{len(findings) - 20} more: -o json")
    s = report.document(fail_on, exit_code)["summary"]
    out += ["", f"{s['critical']} critical, {s['warning']} warning, {s['info']} info; exit "
                f"{int(exit_code)}" + ("" if s["complete"] else
                                      f"; incomplete: {c(s.get('incomplete_reason') or '')}")]
    text_ = "\n".join(out) + "\n"
    return text_ if len(text_) <= CHAT_CHARS else text_[:CHAT_CHARS - 30] + "\n(cut: -o json)\n"

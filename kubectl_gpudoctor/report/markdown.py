"""`-o markdown`: the report for an incident channel or a ticket, safe to paste.

Why: on-call engineers paste the answer into Slack, GitHub or Jira. The paste must lead with
the verdict (headline, impact, the commands to run), keep the findings to one compact table,
fold the evidence into a collapsible <details> block, stay under the size chat tools accept,
and never let a string a tenant or a node controls (pod names, titles, evidence, a replayed
bundle) render as markup, a link, an image, an HTML tag or a @mention. Every such string goes
into a code span (where nothing renders) with its control characters made visible; our own
words are backslash-escaped; commands go into fenced code blocks.
"""
from __future__ import annotations

import re
from typing import Any, Mapping

from node_probe.protocol import Report
from node_probe.protocol import evidence as human
from node_probe.protocol.render import EXPLAIN, last_warning, terminal_safe

MAX_CHARS = 40000          # Slack's message limit; GitHub comments take 65,536
MAX_TITLE = 120            # table cell
MAX_CODE = 300             # one code span
MAX_FINDINGS = 50          # table rows
# the characters that start markup in CommonMark/GFM, Slack and Jira; fewer escapes than
# CommonMark allows, since Slack shows a backslash literally
_MD_ACTIVE = re.compile(r"([\\`*_\[\]<>|~#])")
_BACKTICKS = re.compile(r"`+")
_PLAIN_KEY = re.compile(r"[A-Za-z0-9 .-]{1,80}")


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


def key(k: str) -> str:
    """An evidence key: plain when it is a plain word, else a code span (a bundle's keys are
    as hostile as its values)."""
    return text(k) if _PLAIN_KEY.fullmatch(k) else code(k, 80)


def _fence(cmd: str) -> list[str]:
    body = " ".join(terminal_safe(cmd).split())
    longest = max((len(m) for m in _BACKTICKS.findall(body)), default=0)
    f = "`" * max(3, longest + 1)
    return [f"   {f}sh", f"   {body}", f"   {f}"]


def _verdict(v: Mapping[str, Any]) -> list[str]:
    sev = str(v.get("severity") or "ok").upper()
    out = [f"**{text(sev)}**: {text(v.get('headline') or '')}", ""]
    chain = [c for c in v.get("chain") or () if c]
    if len(chain) > 1:
        out += ["Cause \u2192 effect: " + " \u2192 ".join(code(c) for c in chain[:8]), ""]
    actions = [a for a in v.get("actions") or () if isinstance(a, Mapping)]
    if actions:
        out.append("**What to do**")
        out.append("")
        for i, a in enumerate(actions[:8], 1):
            out.append(f"{i}. **{text(a.get('stage') or '')}**: {text(a.get('text') or '')} "
                       f"_\\(risk: {text(a.get('risk') or '')}\\)_")
            if a.get("command"):
                out += _fence(str(a["command"]))
        out.append("")
    return out


def _evidence(f) -> list[str]:
    scalars, tables = human.split(f.evidence)
    out = [f"**{text(f.severity.value.upper())}** {code(f.id)} on {code(f.subject)}", "",
           code(f.title, 1000), ""]
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


def render(report: Report, fail_on: str, exit_code: int, verdict: Mapping[str, Any] | None,
           pre_table: str = "") -> str:
    """The whole markdown document, at most MAX_CHARS characters."""
    t = report.target
    head = [f"### gpu\\-doctor: {text(t.get('kind') or '?')} {code(t.get('name') or '')}", ""]
    if verdict:
        head += _verdict(verdict)
    if pre_table.strip():  # `nodes`: its fleet table, verbatim but inert
        head += ["```text", *(terminal_safe(ln).replace("```", "'''") for ln in
                              pre_table.splitlines()[:60]), "```", ""]  # line by line:
        # terminal_safe escapes a newline too
    findings = report.sorted_findings()
    if findings:
        head += ["| Severity | ID | Subject | Title |", "|---|---|---|---|"]
        for f in findings[:MAX_FINDINGS]:
            head.append(f"| {text(f.severity.value.upper())} | {code(f.id, 80, True)} | "
                        f"{code(f.subject, 60, True)} | {code(f.title, MAX_TITLE, True)} |")
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
        tail.append("Checks that could not look: " + ", ".join(
            code(c.id, 60) for c in skipped[:30]))
        tail.append("")
    tail.append(f"{s['critical']} critical, {s['warning']} warning, {s['info']} info; "
                f"exit {int(exit_code)}; gpu\\-doctor {text(report.version)}")
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
    out = body + "\n".join(tail) + "\n"
    return out if len(out) <= MAX_CHARS else out[: MAX_CHARS - 40] + "\n\n\\(cut: \\-o json\\)\n"

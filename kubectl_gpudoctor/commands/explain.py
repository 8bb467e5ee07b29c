"""`explain ID`: a finding's page (what it means, the fix, the cause, the evidence, refs),
offline, from the installed plugin.

Why: every finding the report prints has a stable id and a page in docs/findings/<id>.md, but
an on-call engineer at 3 a.m. should not need the repository or a network to read it. The pages
travel with the plugin: beside the package in a checkout and in the frozen krew build
(scripts/build-plugin.sh adds docs/findings), under <prefix>/share/gpu-doctor/findings for a
pip install (pyproject data-files). Only ids in the catalog are looked up (a typed id never
becomes a path). The page is rendered for a terminal: it opens with the id's one-line meaning,
then the fix (what the reader came for), then the cause, the evidence and the references;
headings in capitals, code without its backticks, bold on a colour terminal. The agent's
NodeCondition types (`GpuDoctorDevicePluginStuck`) and reasons (`DevicepluginBlockedInNvml`,
the finding id in CamelCase) are accepted as well: they name the same pages.
"""
from __future__ import annotations

import difflib
import re
import sys
import textwrap
from pathlib import Path

import click

from node_probe.protocol import ExitStatus, catalog

from .. import errors
from ..session import Session

MAX_PAGE_BYTES = 256 * 1024
MAX_WIDTH = 100
MIN_WIDTH = 40
HEADING = re.compile(r"^(#{1,6})\s+(.*)$")
BOLD = re.compile(r"\*\*(.+?)\*\*")
BULLET = re.compile(r"^(\s*)([-*]|\d+\.)\s+(.*)$")


def pages_dirs() -> list[Path]:
    """Where the pages may be, in order: beside the package (a checkout, the frozen build),
    then the data a pip install put under sys.prefix."""
    import kubectl_gpudoctor
    beside = Path(kubectl_gpudoctor.__file__).resolve().parent.parent / "docs" / "findings"
    return [beside, Path(sys.prefix) / "share" / "gpu-doctor" / "findings"]


def page_text(fid: str) -> str:
    """The Markdown page of a catalog id (InternalError when the install lacks it)."""
    for d in pages_dirs():
        p = d / f"{fid}.md"
        if p.is_file():
            with open(p, "rb") as f:
                return f.read(MAX_PAGE_BYTES).decode("utf-8", "replace")
    raise errors.InternalError(f"the page of {fid} is missing from this installation (looked "
                               f"in {', '.join(str(d) for d in pages_dirs())}); reinstall the "
                               f"plugin")


def close_matches(text: str, ids: list[str], n: int = 3) -> list[str]:
    """Ids like `text`: the ones whose family or name starts with it first (`nvml` ->
    nvml.*), then the ones containing it, then difflib's closest."""
    low = text.lower()
    starts = [i for i in ids if low and any(part.startswith(low) for part in i.split("."))]
    contains = [i for i in ids if low and low in i]
    near = difflib.get_close_matches(low, ids, n=n, cutoff=0.5)
    return list(dict.fromkeys(starts + contains + near))[:n]


def from_condition(text: str) -> tuple[list[str], str] | None:
    """The finding ids behind one of the watching agent's NodeCondition types or reasons
    (protocol/conditions.py), and a line saying which it was; None when it is neither."""
    from node_probe.protocol import conditions
    if text in conditions.CLASSES:
        return list(conditions.CLASSES[text]), (
            f"{text} is the watching agent's NodeCondition for: "
            + ", ".join(conditions.CLASSES[text]))
    if text == conditions.WATCHING_TYPE:
        return ["agent.heartbeat_stale"], (f"{text} is the watching agent's heartbeat "
                                           "(True while it watches the node)")
    fid = conditions.finding_id_of(text, catalog.CATALOG)
    if fid:
        return [fid], f"{text} is the agent's reason for {fid}"
    for ctype in conditions.CLASSES:  # NoXidErrors, XidErrorsCleared
        if text in (conditions.quiet_reason(ctype), conditions.cleared_reason(ctype)):
            ids = list(conditions.CLASSES[ctype])
            state = "no problem since the agent started" if text.startswith("No") else \
                "the problem cleared"
            return ids, f"{text}: {ctype} is False ({state}); it is raised by {', '.join(ids)}"
    return None


def _width() -> int:
    from node_probe.protocol.render import terminal_columns  # piped: stderr's terminal, else 80
    return max(MIN_WIDTH, min(MAX_WIDTH, terminal_columns()))


CODE = re.compile(r"`([^`]+)`")
ORDER = ("fix", "cause", "evidence", "refs")  # what the reader came for first


def reorder(markdown: str, fid: str | None = None) -> str:
    """The page as read at 3 a.m.: the title, the id's one-line meaning, then the sections
    in ORDER (others after, as written)."""
    lines = markdown.splitlines()
    head: list[str] = []
    sections: list[tuple[str, list[str]]] = []
    for line in lines:
        m = HEADING.match(line)
        if m and len(m.group(1)) == 2:
            sections.append((m.group(2).strip(), [line]))
        elif sections:
            sections[-1][1].append(line)
        else:
            head.append(line)
    rank = {name: i for i, name in enumerate(ORDER)}
    sections.sort(key=lambda s: rank.get(s[0].lower(), len(ORDER)))
    meaning = catalog.CATALOG.get(fid or "")
    if meaning and head and HEADING.match(head[0]):
        head = [head[0], "", meaning + "."] + head[1:]
    return "\n".join(head + [ln for _, body in sections for ln in [""] + body]) + "\n"


def render(markdown: str, width: int, bold: bool = False) -> str:
    """Text for a terminal: headings as capitals, paragraphs and list items wrapped, code
    blocks kept as they are (indented), inline code without its backticks, **bold** as bold
    on a colour terminal (`bold`), else plain."""
    out: list[str] = []
    para: list[str] = []
    bullet: tuple[str, str] | None = None  # (first-line prefix, text) of the open list item
    in_code = False
    strong = (lambda m: f"\033[1m{m.group(1)}\033[0m") if bold else (lambda m: m.group(1))

    def words(text: str) -> str:
        return CODE.sub(r"\1", BOLD.sub(strong, text))

    def flush() -> None:
        nonlocal para, bullet
        if bullet is not None:
            lead, text = bullet
            out.append(textwrap.fill(words(text), width, initial_indent=lead,
                                     subsequent_indent=" " * len(lead),
                                     break_on_hyphens=False, break_long_words=False))
            bullet = None
        if para:
            out.append(textwrap.fill(words(" ".join(para)), width, break_on_hyphens=False,
                                     break_long_words=False))
            para = []

    for line in markdown.splitlines():
        if line.strip().startswith("```"):
            flush()
            in_code = not in_code
            continue
        if in_code:
            out.append("    " + line)
            continue
        if not line.strip():
            flush()
            if out and out[-1] != "":
                out.append("")
            continue
        m = HEADING.match(line)
        if m:
            flush()
            text = CODE.sub(r"\1", m.group(2).strip())
            text = text if len(m.group(1)) == 1 else text.upper()
            out.append(f"\033[1m{text}\033[0m" if bold else text)
            continue
        b = BULLET.match(line)
        if b:
            flush()
            bullet = ("  " + b.group(1) + b.group(2) + " ", b.group(3).strip())
            continue
        if bullet is not None:        # a list item's continuation line
            bullet = (bullet[0], bullet[1] + " " + line.strip())
        else:
            para.append(line.strip())
    flush()
    while out and out[-1] == "":
        out.pop()
    return "\n".join(out) + "\n"


def page(fid: str, width: int, bold: bool = False) -> str:
    """A catalog id's page as `explain` prints it: reordered, rendered for a terminal."""
    return render(reorder(page_text(fid), fid), width, bold=bold)


def listing(width: int) -> str:
    """Every id with its one-line meaning (`explain` without an id)."""
    ids = sorted(catalog.CATALOG)
    w = max(len(i) for i in ids)
    return "".join(textwrap.fill(catalog.CATALOG[i], width, initial_indent=f"{i:{w}}  ",
                                 subsequent_indent=" " * (w + 2)) + "\n" for i in ids)


def known_id(finding_id: str) -> tuple[str, str | None]:
    """(the catalog id `finding_id` names -- an id, or one of the agent's condition types or
    reasons --, a note saying which when it was not the id itself), else the usage error that
    says the closest ids (shared with the MCP server's `explain` tool, so both say the same)."""
    fid = finding_id.strip()
    if fid in catalog.CATALOG:
        return fid, None
    known = from_condition(fid)
    if known is None:
        near = close_matches(fid, sorted(catalog.CATALOG))
        raise errors.UsageError(
            f"unknown finding id {fid[:80]!r}"
            + (f"; did you mean {', '.join(near)}?" if near else
               "; `kubectl gpu-doctor explain` lists every id"))
    (fid, *_), note = known
    return fid, note


def explain(session: Session, finding_id: str | None) -> ExitStatus:
    if finding_id is None:
        click.echo(listing(_width()), nl=False)
        return ExitStatus.OK
    fid, note = known_id(finding_id)
    from node_probe.protocol.render import use_color
    text = page(fid, _width(), bold=use_color(sys.stdout))
    click.echo((textwrap.fill(note, _width()) + "\n\n" if note else "") + text, nl=False)
    return ExitStatus.OK

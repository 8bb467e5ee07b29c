"""`explain ID`: a finding's page (cause, evidence, fix, refs), offline, from the installed plugin.

Why: every finding the report prints has a stable id and a page in docs/findings/<id>.md, but
an on-call engineer at 3 a.m. should not need the repository or a network to read it. The pages
travel with the plugin: beside the package in a checkout and in the frozen krew build
(scripts/build-plugin.sh adds docs/findings), under <prefix>/share/gpu-doctor/findings for a
pip install (pyproject data-files). Only ids in the catalog are looked up (a typed id never
becomes a path), and the Markdown is rendered as plain text for a terminal.
"""
from __future__ import annotations

import difflib
import re
import shutil
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
    """Ids like `text`: the ones containing it, then difflib's closest."""
    low = text.lower()
    contains = [i for i in ids if low and low in i]
    near = difflib.get_close_matches(low, ids, n=n, cutoff=0.5)
    return list(dict.fromkeys(contains + near))[:n]


def _width() -> int:
    return max(MIN_WIDTH, min(MAX_WIDTH, shutil.get_terminal_size((MAX_WIDTH, 24)).columns))


def render(markdown: str, width: int) -> str:
    """Plain text for a terminal: headings as capitals, paragraphs and list items wrapped,
    code blocks kept as they are (indented)."""
    out: list[str] = []
    para: list[str] = []
    bullet: tuple[str, str] | None = None  # (first-line prefix, text) of the open list item
    in_code = False

    def flush() -> None:
        nonlocal para, bullet
        if bullet is not None:
            lead, text = bullet
            out.append(textwrap.fill(BOLD.sub(r"\1", text), width, initial_indent=lead,
                                     subsequent_indent=" " * len(lead)))
            bullet = None
        if para:
            out.append(textwrap.fill(BOLD.sub(r"\1", " ".join(para)), width))
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
            text = m.group(2).strip()
            out.append(text if len(m.group(1)) == 1 else text.upper())
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


def listing(width: int) -> str:
    """Every id with its one-line meaning (`explain` without an id)."""
    ids = sorted(catalog.CATALOG)
    w = max(len(i) for i in ids)
    return "".join(textwrap.fill(catalog.CATALOG[i], width, initial_indent=f"{i:{w}}  ",
                                 subsequent_indent=" " * (w + 2)) + "\n" for i in ids)


def known_id(finding_id: str) -> str:
    """The catalog id `finding_id` names, else the usage error that says the closest ones
    (shared with the MCP server's `explain` tool, so both say the same)."""
    fid = finding_id.strip()
    if fid not in catalog.CATALOG:
        near = close_matches(fid, sorted(catalog.CATALOG))
        shown = fid[:80]
        raise errors.UsageError(
            f"unknown finding id {shown!r}"
            + (f"; did you mean {', '.join(near)}?" if near else
               "; `kubectl gpu-doctor explain` lists every id"))
    return fid


def explain(session: Session, finding_id: str | None) -> ExitStatus:
    if finding_id is None:
        click.echo(listing(_width()), nl=False)
        return ExitStatus.OK
    click.echo(render(page_text(known_id(finding_id)), _width()), nl=False)
    return ExitStatus.OK

"""Every finding id is in the catalog, emitted somewhere, and documented (DESIGN.md section 6)."""
import re
from pathlib import Path

import pytest

from node_probe.protocol.catalog import CATALOG

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "findings"
SECTIONS = ("## Cause", "## Evidence", "## Fix", "## Refs")
SOURCES = [p for pkg in ("node_probe", "kubectl_gpudoctor") for p in (REPO / pkg).rglob("*.py")]


@pytest.mark.parametrize("fid", sorted(CATALOG))
def test_every_id_has_a_doc_page(fid):
    page = DOCS / f"{fid}.md"
    assert page.is_file(), f"missing {page.relative_to(REPO)}"
    text = page.read_text()
    assert text.startswith(f"# {fid}\n")
    assert "Severity" in text
    for s in SECTIONS:
        assert s in text, f"{page.name} lacks {s}"
    refs = text.split("## Refs", 1)[1]
    assert re.search(r"https?://", refs), f"{page.name}: Refs has no URL"


def test_no_doc_page_without_an_id():
    extra = {p.stem for p in DOCS.glob("*.md")} - set(CATALOG) - {"README"}
    assert not extra


def test_every_id_is_emitted_by_some_code():
    text = "\n".join(p.read_text() for p in SOURCES)
    # the catalog itself mentions every id once; an emitted id appears at least twice
    counts = {fid: text.count(f'"{fid}"') for fid in CATALOG}
    unused = [fid for fid, n in counts.items() if n < 2]
    assert not unused, f"ids in the catalog that no code emits: {unused}"


def test_literal_ids_in_code_are_in_the_catalog():
    pat = re.compile(r'catalog\.make\(\s*"([a-z_]+\.[a-z_.]+)"')
    for p in SOURCES:
        for fid in pat.findall(p.read_text()):
            assert fid in CATALOG, f"{p.relative_to(REPO)} emits unknown id {fid}"

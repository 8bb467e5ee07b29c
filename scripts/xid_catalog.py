#!/usr/bin/env python3
"""Check (default) or regenerate node_probe/protocol/data/xid_catalog.tsv, our copy of NVIDIA's
Xid catalog; check the SXid (Fabric Manager guide) and DCGM failure-code tables beside it.

Why: the catalog is data NVIDIA revises (new codes with each driver branch); a table that no
script reads is a table that rots. `--check` parses every row (the probe's own parser), checks
the codes are unique and the buckets known, and that every curated entry in
node_probe/protocol/xid_catalog.py agrees with NVIDIA's bucket for its code. `--from-xlsx FILE`
rewrites the table from the spreadsheet NVIDIA links from
https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html (sheet "Catalog"; read
with the standard library: an .xlsx is a zip of XML), keeping the header comment with the date.

Usage: .venv/bin/python scripts/xid_catalog.py [--check] [--from-xlsx Xid-Catalog.xlsx]
Exit status: 0 when the table is good, 1 when a row does not parse or disagrees.
"""
from __future__ import annotations

import argparse
import datetime
import re
import sys
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from node_probe.host import sxid  # noqa: E402
from node_probe.protocol import dcgm_catalog, xid_catalog  # noqa: E402

_NS = "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}"
_RNS = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}"


def check(path: Path) -> list[str]:
    """Problems with the table at `path` (empty when it is good)."""
    problems: list[str] = []
    try:
        table = xid_catalog.parse_table(path.read_text(encoding="utf-8"))
    except (OSError, xid_catalog.CatalogError) as exc:
        return [f"{path}: {exc}"]
    if not table:
        return [f"{path}: no rows"]
    missing = [c for c in range(1, max(table) + 1) if c not in table]
    if missing:
        problems.append(f"codes missing between 1 and {max(table)}: {missing[:20]}")
    for code, cur in xid_catalog.CURATED.items():
        row = table.get(code)
        if row is None:
            problems.append(f"curated Xid {code} is not in NVIDIA's table")
        elif row.nvidia_bucket and cur.nvidia_bucket != row.nvidia_bucket:
            problems.append(f"Xid {code}: curated says NVIDIA's bucket is {cur.nvidia_bucket!r}, "
                            f"the table {row.nvidia_bucket!r}")
    return problems


def _cells(zf: zipfile.ZipFile, sheet: str, shared: list[str]) -> list[list[str]]:
    rows: list[list[str]] = []
    root = ET.fromstring(zf.read(sheet))
    for r in root.iter(f"{_NS}row"):
        row: dict[int, str] = {}
        for c in r.iter(f"{_NS}c"):
            col = 0
            for ch in re.match(r"[A-Z]+", c.get("r", "A")).group(0):
                col = col * 26 + ord(ch) - 64
            v = c.find(f"{_NS}v")
            if c.get("t") == "s" and v is not None:
                text = shared[int(v.text)]
            elif c.get("t") == "inlineStr":
                text = "".join(t.text or "" for t in c.iter(f"{_NS}t"))
            else:
                text = v.text if v is not None and v.text else ""
            row[col - 1] = " ".join(text.split())
        rows.append([row.get(i, "") for i in range(max(row) + 1)] if row else [])
    return rows


def from_xlsx(xlsx: Path) -> list[tuple[str, ...]]:
    """The "Catalog" sheet's rows as (code, mnemonic, description, immediate, investigatory)."""
    with zipfile.ZipFile(xlsx) as zf:
        shared = []
        if "xl/sharedStrings.xml" in zf.namelist():
            for si in ET.fromstring(zf.read("xl/sharedStrings.xml")).iter(f"{_NS}si"):
                shared.append("".join(t.text or "" for t in si.iter(f"{_NS}t")))
        wb = ET.fromstring(zf.read("xl/workbook.xml"))
        rels = ET.fromstring(zf.read("xl/_rels/workbook.xml.rels"))
        targets = {r.get("Id"): r.get("Target") for r in rels}
        sheet = None
        for s in wb.iter(f"{_NS}sheet"):
            if s.get("name", "").strip().lower() == "catalog" or sheet is None:
                sheet = "xl/" + targets[s.get(f"{_RNS}id")].lstrip("/").removeprefix("xl/")
        rows = _cells(zf, sheet, shared)
    head = next(i for i, r in enumerate(rows) if any(c.lower() == "mnemonic" for c in r))
    names = [c.lower() for c in rows[head]]

    def col(*words: str) -> int:
        return next(i for i, n in enumerate(names) if all(w in n for w in words))
    ic, im, idesc = col("code"), col("mnemonic"), col("description")
    iimm, iinv = col("immediate"), col("investigatory")
    out = []
    for r in rows[head + 1:]:
        r = r + [""] * (len(names) - len(r))
        if r[ic].split(".")[0].isdigit():
            out.append((r[ic].split(".")[0], r[im], r[idesc], r[iimm], r[iinv]))
    return out


def write(rows: list[tuple[str, ...]], path: Path, source: str) -> None:
    old = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    header = [ln for ln in old if ln.startswith("#")]
    header = [ln for ln in header if not ln.startswith("# regenerated:")]
    header.append(f"# regenerated: {datetime.date.today().isoformat()} from {source}")
    body = ["\t".join(xid_catalog.COLUMNS)]
    body += ["\t".join(f.replace("\t", " ") for f in r) for r in rows]
    path.write_text("\n".join(header + body) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="check the table (the default)")
    ap.add_argument("--from-xlsx", type=Path, help="regenerate from NVIDIA's spreadsheet")
    ap.add_argument("--table", type=Path, default=xid_catalog.DATA)
    a = ap.parse_args(argv)
    if a.from_xlsx:
        write(from_xlsx(a.from_xlsx), a.table, a.from_xlsx.name)
    problems = check(a.table)
    for label, path, parse in (("SXid", sxid.DATA, sxid.parse_table),
                               ("DCGM", dcgm_catalog.DATA, dcgm_catalog.parse_table)):
        try:
            n = len(parse(path.read_text(encoding="utf-8")))
            print(f"{path.relative_to(REPO)}: {n} {label} codes, every row parses")
        except (OSError, ValueError) as exc:
            problems.append(f"{path}: {exc}")
    for p in problems:
        print(f"xid_catalog: {p}", file=sys.stderr)
    if not problems:
        n = len(xid_catalog.parse_table(a.table.read_text(encoding="utf-8")))
        print(f"{a.table.relative_to(REPO) if a.table.is_relative_to(REPO) else a.table}: "
              f"{n} Xids, every row parses, {len(xid_catalog.CURATED)} curated agree")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

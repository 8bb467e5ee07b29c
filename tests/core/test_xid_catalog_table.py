"""Every Xid NVIDIA documents, from the data table node_probe/protocol/data/xid_catalog.tsv.

The table is NVIDIA's catalog ("Analyzing Xid Errors with the Xid Catalog",
https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, codes 1-172 with their
mnemonic, description and resolution buckets), cross-checked against leptonai/gpud's
generated catalog (components/accelerator/nvidia/xid/catalog_generated.go, 172 rows). The
kernel line each code is fed in has the driver's format (`NVRM: Xid (PCI:<bus>): <code>, <msg>`,
open-gpu-kernel-modules' nvErrorLog); the messages are ours: the decode must come from the code.
"""
import io
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from node_probe.checks import kmsg
from node_probe.protocol import xid_catalog

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import xid_catalog as script  # noqa: E402


def rows():
    out = {}
    for line in xid_catalog.DATA.read_text().splitlines():
        if line.startswith("#") or line.startswith("code\t"):
            continue
        code, mnemonic, desc, immediate, _inv = line.split("\t")
        out[int(code)] = (mnemonic, desc, immediate)
    return out


def test_every_row_parses_and_the_script_agrees():
    table = xid_catalog.parse_table(xid_catalog.DATA.read_text())
    assert sorted(table) == list(range(1, 173))
    assert script.check(xid_catalog.DATA) == []
    p = subprocess.run([sys.executable, str(REPO / "scripts/xid_catalog.py")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "172 Xids" in p.stdout


@pytest.mark.parametrize("line, why", [
    ("12\tX\tY\tRESTART_APP", "fields"),
    ("twelve\tX\tY\tRESTART_APP\t", "not an Xid number"),
    ("12\tX\tY\tREBOOT_THE_WORLD\t", "unknown bucket"),
    ("12\t\tY\tRESTART_APP\t", "no mnemonic"),
])
def test_a_bad_row_is_refused_with_its_line(line, why, tmp_path):
    with pytest.raises(xid_catalog.CatalogError, match=why):
        xid_catalog.parse_row(line, 7)
    bad = tmp_path / "t.tsv"
    bad.write_text("code\tmnemonic\tdescription\timmediate\tinvestigatory\n" + line + "\n")
    assert script.main(["--table", str(bad)]) == 1


def test_one_line_per_documented_xid_is_known_with_its_bucket():
    table = rows()
    recs = [(float(c), f"NVRM: Xid (PCI:0000:{c % 200:02x}:00): {c}, pid=1234, name=python3, "
                       f"test line") for c in table]
    found = {}
    for f in kmsg.analyze(recs):
        assert f.id == "gpu.xid"
        for c in f.evidence["codes"]:
            found[c["xid"]] = c
    assert sorted(found) == sorted(table)          # none dropped, none merged away
    for code, (mnemonic, desc, immediate) in table.items():
        c = found[code]
        assert c["known"] is True, code
        assert c["nvidia_resolution_bucket"] == immediate, code
        # curated entries keep their words (and may split a mnemonic's aliases); the rest are
        # NVIDIA's text as published
        if code not in xid_catalog.CURATED:
            assert (c["mnemonic"], c["meaning"]) == (mnemonic, desc), code
        want = xid_catalog.NVIDIA_BUCKETS.get(immediate) if immediate else None
        if code not in xid_catalog.CURATED:
            assert c["resolution_bucket"] == want, code
        assert c["severity"] == xid_catalog.SEVERITY[c["resolution_bucket"]]


def test_buckets_map_to_the_severity_that_follows():
    d = xid_catalog.describe
    assert (d(39).bucket, d(39).severity) == ("restart_app", "warning")      # CE0 exception
    assert (d(46).bucket, d(46).severity) == ("reset_gpu", "critical")
    assert (d(44).bucket, d(44).severity) == ("ignore", "info")
    assert (d(151).bucket, d(151).nvidia_bucket) == ("reboot", "RESTART_VM")
    assert d(78).nvidia_bucket == "UPDATE_SWFW" and "vGPU" in d(78).action
    assert d(4).blame == "unused" and "unused" in d(4).action


def test_an_unknown_code_is_shown_with_its_number_and_message_never_dropped():
    recs = [(1.0, "NVRM: Xid (PCI:0000:3b:00): 999, pid=77, name=train, Something New")]
    (f,) = kmsg.analyze(recs)
    assert f.evidence["xid"] == 999 and f.evidence["known"] is False
    assert "Xid 999 (unknown" in f.title and "Something New" in f.title


def _xlsx(cells):
    """A minimal spreadsheet as Excel writes one: shared strings, a workbook, one sheet."""
    strings = sorted({v for row in cells for v in row if not v.isdigit()})
    idx = {s: i for i, s in enumerate(strings)}
    ns = 'xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"'
    rns = 'xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships"'
    sheet_rows = []
    for r, row in enumerate(cells, 1):
        cs = []
        for c, v in enumerate(row):
            ref = f"{chr(65 + c)}{r}"
            cs.append(f'<c r="{ref}"><v>{v}</v></c>' if v.isdigit()
                      else f'<c r="{ref}" t="s"><v>{idx[v]}</v></c>')
        sheet_rows.append(f'<row r="{r}">{"".join(cs)}</row>')
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("xl/sharedStrings.xml", f"<sst {ns}>" + "".join(
            f"<si><t>{s}</t></si>" for s in strings) + "</sst>")
        z.writestr("xl/workbook.xml", f'<workbook {ns} {rns}><sheets><sheet name="Catalog" '
                                      'sheetId="1" r:id="rId1"/></sheets></workbook>')
        z.writestr("xl/_rels/workbook.xml.rels",
                   '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/'
                   'relationships"><Relationship Id="rId1" Target="worksheets/sheet1.xml"/>'
                   '</Relationships>')
        z.writestr("xl/worksheets/sheet1.xml",
                   f"<worksheet {ns}><sheetData>{''.join(sheet_rows)}</sheetData></worksheet>")
    return buf.getvalue()


def test_regenerated_from_nvidias_spreadsheet(tmp_path):
    head = ["Type (XID)", "Code", "Mnemonic", "Description", "Resolution Bucket (Immediate "
            "Action)", "Resolution Bucket (Investigatory Action)"]
    x = tmp_path / "Xid-Catalog.xlsx"
    x.write_bytes(_xlsx([head, ["XID", "8", "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT",
                                "GPU stopped processing", "RESTART_APP", "CONTACT_SUPPORT"]]))
    assert script.from_xlsx(x) == [("8", "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT",
                                    "GPU stopped processing", "RESTART_APP", "CONTACT_SUPPORT")]
    out = tmp_path / "t.tsv"
    script.write(script.from_xlsx(x), out, x.name)
    assert xid_catalog.parse_table(out.read_text())[8].bucket == "restart_app"

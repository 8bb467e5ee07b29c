"""Every NVSwitch SXid the Fabric Manager user guide documents (issue 40.2), from the data
table node_probe/protocol/data/sxid_catalog.tsv: its class (the guide's non-fatal, fatal and
always-fatal tables, and its "other notable" SXids) and what it cuts (the guide's impact column:
nothing, the port's throughput, the GPU's traffic on that port, the port, the whole fabric).
Source: https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/index.html
("NVSwitch SXid Errors"), cross-checked against leptonai/gpud's sxid.go transcription.

The kernel lines have the switch driver's format (open-gpu-kernel-modules src/common/nvswitch:
`nvidia-%s: SXid (PCI:%04x:%02x:%02x.%x): %05d, ...`); the verbatim ones are the public threads'
(leptonai/gpud PR #338: `nvidia-nvswitch1: SXid (PCI:0000:84:00.0): 12028, Data {...}`).
"""
import pytest

from node_probe.checks import kmsg
from node_probe.host import sxid


def rows():
    out = {}
    for line in sxid.DATA.read_text().splitlines():
        if line.startswith("#") or line.startswith("sxid\t"):
            continue
        code, name, table, cuts = line.split("\t")
        out[int(code)] = (name, table, cuts)
    return out


def test_every_row_parses():
    table = sxid.parse_table(sxid.DATA.read_text())
    assert len(table) == 93 and len(rows()) == 93
    with pytest.raises(sxid.CatalogError):
        sxid.parse_table("12028\tegress\tsometimes\tnone\n")


def test_one_line_per_documented_sxid_is_known_with_its_class():
    table = rows()
    recs = [(float(i), f"nvidia-nvswitch{i % 4}: SXid (PCI:0000:{0x80 + i % 4:02x}:00.0): "
                       f"{code:05d}, Data {{0x00000001}}") for i, code in enumerate(table)]
    found = {}
    for f in kmsg.analyze(recs):
        for c in f.evidence["codes"]:
            found[c["sxid"]] = c
    assert sorted(found) == sorted(table)
    for code, (name, fm_table, cuts) in table.items():
        c = found[code]
        want = sxid.NONFATAL if fm_table == sxid.OTHER else fm_table
        assert (c["name"], c["class"], c["cuts"]) == (name, want, cuts), code
        assert c["severity"] == ("critical" if want in (sxid.FATAL, sxid.ALWAYS_FATAL)
                                 or cuts == "gpu_traffic" else
                                 "info" if cuts == "none" else "warning"), code


def test_what_each_cuts_is_said():
    fatal = kmsg.analyze([(1.0, "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 23005, Fatal, "
                                "Link 30 ingress packet burst error")])
    (f,) = list(fatal)
    assert f.evidence["cuts"] == "fabric" and "every GPU behind the NVSwitches" in f.title
    # the guide's "other notable" SXid: a thermal event lowers the port's throughput
    (t,) = list(kmsg.analyze([(2.0, "nvidia-nvswitch1: SXid (PCI:0000:84:00.0): 10004, "
                                    "Data {0x1}")]))
    assert t.severity.value == "warning" and t.evidence["cuts"] == "throughput"


def test_gpud_338_line_cuts_the_gpus_traffic():
    line = ("kern  :err   : 2025-01-25T10:34:54,859532+00:00 nvidia-nvswitch1: SXid "
            "(PCI:0000:84:00.0): 12028, Data {0x000001c0, 0x00bd5c8a, 0x00000500, 0x00000064, "
            "0x00000000, 0x40008000, 0x5a001100, 0x00000000, 0x00000000}")
    (f,) = list(kmsg.analyze([(None, line)]))
    assert f.severity.value == "critical" and f.evidence["cuts"] == "gpu_traffic"
    assert "Xid 45" in f.title and "reboot" in f.remediation


def test_corrected_sxid_stays_informational():
    (f,) = list(kmsg.analyze([(None, "nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, "
                                     "Non-fatal, Link 44 Minion Link DLREQ interrupt")]))
    assert f.severity.value == "info" and f.evidence["cuts"] == "none"

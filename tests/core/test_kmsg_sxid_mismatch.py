"""NVSwitch SXid lines and `NVRM: API mismatch` messages are read in bounded memory, whatever a
kernel log (or a hostile --kmsg-file) holds; the real lines these readers answer are in the
corpus (tests/realworld/corpus_kmsg_nvswitch.py, corpus_kmsg_driver.py)."""
from node_probe.checks import kmsg
from node_probe.host import nvrm, sxid


def test_an_sxid_storm_is_grouped_per_switch_and_code_and_bounded():
    lines = [(float(i), f"nvidia-nvswitch{i % 9}: SXid (PCI:0000:{i % 9:02x}:00.0): "
                        f"{20000 + i % 500}, Non-fatal, Link {i % 64} TX Replay Error")
             for i in range(60_000)]
    g = sxid.Grouper()
    for ts, msg in lines:
        assert g.feed(ts, msg)
    groups = g.groups()
    assert len(groups) == sxid.MAX_GROUPS and g.dropped > 0
    assert all(len(x.links) <= sxid.MAX_LINKS and len(x.sample) <= sxid.MAX_MESSAGE
               for x in groups)
    found = [f for f in kmsg.analyze(lines) if f.id == "nvswitch.sxid"]
    assert 1 <= len(found) <= 9 and all(f.severity.value == "info" for f in found)


def test_the_driver_word_decides_and_the_guide_fills_in():
    fatal = "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 30 sourcetrack timeout error"
    data_only = "nvidia-nvswitch1: SXid (PCI:0000:84:00.0): 20009, Data {0x1, 0x2}"
    unknown = "nvidia-nvswitch2: SXid (PCI:0000:85:00.0): 99999, Data {0x1}"
    by = {f.evidence["sxid"]: f for f in kmsg.analyze([(None, fatal), (None, data_only),
                                                        (None, unknown)])
          if f.id == "nvswitch.sxid"}
    assert by[24007].severity.value == "critical" and "reboot" in by[24007].remediation
    assert by[20009].severity.value == "info"          # the guide's non-fatal table
    assert by[99999].severity.value == "warning"       # not in the guide's tables: say so


def test_api_mismatch_storms_are_one_finding_with_bounded_text():
    head = "NVRM: API mismatch: the client has the version 535.54.03, but" + "x" * 5000
    r = nvrm.Reader()
    for _ in range(10_000):
        r.feed(None, head)
        r.feed(None, "               NVRM: this kernel module has the version 530.30.02.  Please")
    assert r.mismatch["count"] == 10_000 and len(r.mismatch["sample"]) <= nvrm.MAX_LINE
    assert r.unrecognized() == []                      # its lines are not "unknown" ones


def test_a_mismatch_continuation_needs_its_head():
    r = nvrm.Reader()
    r.feed(None, "               NVRM: this kernel module has the version 530.30.02.  Please")
    assert r.mismatch is None

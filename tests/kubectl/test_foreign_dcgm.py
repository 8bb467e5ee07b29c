"""DCGM health-watch failure codes in other monitors' conditions and events (issue 40.7),
decoded the way Xids are: DCGM's own table (NVIDIA/DCGM dcgmlib/src/dcgm_errors.c,
node_probe/protocol/data/dcgm_errors.tsv) says ISOLATE (drain the GPU) or MONITOR.

The messages are NVIDIA NVSentinel's GPU health monitor's, as its platform connector's tests
quote them (https://github.com/NVIDIA/NVSentinel, TestCompactMessageField: `ErrorCode:
DCGM_FR_NVLINK_DOWN GPU:3 Link down Recommended Action=RESTART_VM`), and its docs' table of codes
(DCGM_FR_CLOCK_THROTTLE_THERMAL -> NONE, GpuThermalWatch). NVSentinel established the causes:
an NVLink down needs the node restarted; a thermal throttle needs nothing.
"""
from kubectl_gpudoctor.analysis.monitors import foreign
from node_probe.protocol import dcgm_catalog

from .test_foreign_conditions import NOW, cond, node, node_event

NVLINK = "ErrorCode:DCGM_FR_NVLINK_DOWN GPU:3 Link down Recommended Action=RESTART_VM"


def test_nvsentinel_dcgm_condition_is_decoded_with_dcgm_severity():
    n = node([cond("GpuNvlinkWatch", "True", "GpuNvlinkWatchIsNotHealthy", NVLINK)])
    (f,) = foreign.foreign_conditions(n, [], NOW)
    assert f.severity.value == "critical"
    assert f.evidence["dcgm"][0]["name"] == "DCGM_FR_NVLINK_DOWN"
    assert f.evidence["dcgm"][0]["code"] == 14 and f.evidence["dcgm"][0]["dcgm_severity"] == "ISOLATE"
    assert f.evidence["recommended_action"] == "RESTART_VM"
    assert "an NVLink is down" in f.title and "reboot the node" in f.title


def test_a_monitor_code_is_a_warning_and_an_unknown_one_is_shown_as_such():
    thermal = node([cond("GpuThermalWatch", "True", "GpuThermalWatchIsNotHealthy",
                         "ErrorCode:DCGM_FR_CLOCK_THROTTLE_THERMAL GPU:0 Recommended Action=NONE")])
    (f,) = foreign.foreign_conditions(thermal, [], NOW)
    assert f.severity.value == "warning" and f.evidence["dcgm"][0]["dcgm_severity"] == "MONITOR"
    odd = node([cond("GpuMemWatch", "True", "GpuMemWatchIsNotHealthy",
                     "ErrorCode:DCGM_FR_SOMETHING_NEW GPU:0")])
    (f,) = foreign.foreign_conditions(odd, [], NOW)
    assert f.evidence["dcgm"][0]["known"] is False and "DCGM_FR_SOMETHING_NEW" in f.title


def test_dcgm_codes_in_events_are_decoded_too():
    ev = node_event("GpuNvlinkWatchIsNotHealthy", NVLINK, "nvsentinel-platform-connector")
    fs = foreign.foreign_conditions(node([]), [ev], NOW)
    (f,) = [f for f in fs if f.evidence.get("kind") == "event"]
    assert f.severity.value == "critical" and f.evidence["dcgm"][0]["name"] == "DCGM_FR_NVLINK_DOWN"


def test_healthy_dcgm_conditions_stay_quiet():
    n = node([cond("GpuNvlinkWatch", "False", "GpuNvlinkWatchIsHealthy", "No Health Failures")])
    assert foreign.foreign_conditions(n, [], NOW) == []


def test_the_dcgm_table_parses_every_row():
    table = dcgm_catalog.parse_table(dcgm_catalog.DATA.read_text())
    assert len(table) == 88 and sorted(e.code for e in table.values()) == list(range(88))
    assert table["DCGM_FR_VOLATILE_DBE_DETECTED"].severity == "critical"
    assert table["DCGM_FR_CLOCK_THROTTLE_THERMAL"].severity == "warning"
    import pytest
    with pytest.raises(dcgm_catalog.CatalogError):
        dcgm_catalog.parse_table("3\tDCGM_FR_X\tSOMETIMES\n")

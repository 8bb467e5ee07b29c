"""memory.pressure false alarms (issue 12 item 12): IO stall alone on a busy, healthy node is
not memory pressure, and processes faulting at 0/s are not named as evidence."""
from __future__ import annotations

from node_probe.checks import memory
from tests.memory.test_memory_pressure import _ev

ZERO_FAULTERS = [{"pid": 1234, "comm": "python3", "major": 1, "major_per_s": 0.2},
                 {"pid": 99, "comm": "java", "major": 1, "major_per_s": 0.0}]


def test_io_pressure_alone_with_ample_memory_is_not_a_warning():
    # the case seen: "io PSI full 5.5%; top major faulters: ... 0/s" with 95% available
    f = memory.analyze(_ev(psi_io_full_window_pct=5.5, psi_io_full_avg10_pct=5.5,
                           mem_available_pct=95.0, pgmajfault_per_s=0.4,
                           top_major_faulters=ZERO_FAULTERS))
    assert f.severity.value == "ok", f.title
    assert "io PSI" not in f.title and "faulters" not in f.title


def test_io_pressure_with_memory_stall_still_counts():
    f = memory.analyze(_ev(psi_io_full_window_pct=12.0, psi_memory_full_window_pct=6.0,
                           mem_available_pct=40.0))
    assert f.severity.value == "warning" and "io PSI full 12.0%" in f.title


def test_io_pressure_with_refaults_and_low_memory_is_still_a_warning():
    f = memory.analyze(_ev(psi_io_full_window_pct=8.0, refault_file_per_s=1500.0,
                           mem_available_pct=8.0))
    assert f.severity.value == "warning"


def test_zero_rate_faulters_are_not_named():
    top = [{"pid": 7, "comm": "busy", "major": 900, "major_per_s": 300.0}] + ZERO_FAULTERS
    f = memory.analyze(_ev(pgmajfault_per_s=300.0, psi_memory_full_window_pct=6.0,
                           top_major_faulters=top))
    assert f.severity.value == "warning"
    assert "busy[7] 300/s" in f.title and "java" not in f.title and "python3" not in f.title

"""Fixtures for the memory tests: a fake /proc tree for the file-format cases (the kernel's
formats, written out verbatim) and a root guard for the real cgroup run."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

VMSTAT = """nr_free_pages 5883466
workingset_refault_anon {refault_anon}
workingset_refault_file {refault_file}
workingset_activate_file 1211
pgmajfault {majflt}
"""

MEMINFO = """MemTotal:       24683348 kB
MemFree:        23560000 kB
MemAvailable:   {avail} kB
Buffers:           10240 kB
"""

STAT = "{pid} ({comm}) S 1 {pid} {pid} 0 -1 4194560 1000 0 {majflt} 0 5 3 0 0 20 0 1 0 {start} 1000000 300 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n"


class FakeProc:
    """A directory laid out like /proc, for the cases the live kernel cannot be made to show
    on demand (no PSI, a pid reused between samples)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def set_counters(self, majflt=0, refault_file=0, refault_anon=0, avail_kib=20000000):
        (self.root / "vmstat").write_text(VMSTAT.format(majflt=majflt, refault_file=refault_file,
                                                        refault_anon=refault_anon))
        (self.root / "meminfo").write_text(MEMINFO.format(avail=avail_kib))

    def set_psi(self, resource: str, some_total: int, full_total: int | None,
                some_avg10=0.0, full_avg10=0.0):
        d = self.root / "pressure"
        d.mkdir(exist_ok=True)
        text = f"some avg10={some_avg10:.2f} avg60=0.00 avg300=0.00 total={some_total}\n"
        if full_total is not None:
            text += f"full avg10={full_avg10:.2f} avg60=0.00 avg300=0.00 total={full_total}\n"
        (d / resource).write_text(text)

    def set_proc(self, pid: int, comm: str, majflt: int, start: int = 100):
        d = self.root / str(pid)
        d.mkdir(exist_ok=True)
        (d / "stat").write_text(STAT.format(pid=pid, comm=comm, majflt=majflt, start=start))


@pytest.fixture
def fake_proc(tmp_path):
    return FakeProc(tmp_path / "proc")


@pytest.fixture
def need_root():
    if os.geteuid() != 0:
        pytest.skip("needs root: creates a memory cgroup")

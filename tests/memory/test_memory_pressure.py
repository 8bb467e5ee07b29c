"""memory.pressure (node side): PSI, refaults, major faults per process, and the verdict.

The rules are tested on the kernel's own file formats; the mechanism is tested for real in
test_real_thrash_in_a_memory_cgroup (a memory cgroup at its limit, an mmap re-reader)."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from node_probe.checks import memory
from node_probe.engine.context import ProbeContext, ProbeOptions
from tests.probe_run import run_probe


def _ev(**kw):
    base = {"window_s": 3.0, "psi_memory_some_avg10_pct": 0.0, "psi_memory_full_avg10_pct": 0.0,
            "psi_memory_some_window_pct": 0.0, "psi_memory_full_window_pct": 0.0,
            "psi_io_full_window_pct": 0.0, "pgmajfault_per_s": 0.0, "refault_file_per_s": 0.0,
            "mem_available_pct": 80.0, "top_major_faulters": [], "daemons_faulting": []}
    base.update(kw)
    return base


def test_parse_psi_some_and_full():
    p = memory.parse_psi("some avg10=1.50 avg60=0.20 avg300=0.00 total=123456\n"
                         "full avg10=0.75 avg60=0.10 avg300=0.00 total=65432\n")
    assert (p.some_avg10, p.some_total_us, p.full_avg10, p.full_total_us) == (1.5, 123456, 0.75, 65432)


def test_parse_psi_cpu_style_without_full_line():
    p = memory.parse_psi("some avg10=0.00 avg60=0.00 avg300=0.00 total=42\n")
    assert p.full_total_us is None and p.some_total_us == 42


def test_parse_psi_garbage_is_none():
    assert memory.parse_psi("") is None
    assert memory.parse_psi("some avg10=x total=1") is None


def test_idle_is_ok():
    f = memory.analyze(_ev())
    assert f.severity.value == "ok" and f.id == "memory.pressure"


def test_daemon_refaulting_under_stall_is_critical_and_named():
    kubelet = {"pid": 812, "comm": "kubelet", "major": 900, "major_per_s": 300.0}
    f = memory.analyze(_ev(pgmajfault_per_s=2400.0, refault_file_per_s=50000.0,
                           psi_memory_full_window_pct=41.0, top_major_faulters=[kubelet],
                           daemons_faulting=[kubelet]))
    assert f.severity.value == "critical"
    assert "page cache thrash" in f.title and "kubelet" in f.title
    assert "kubelet[812]" in f.title


def test_thrash_without_stall_or_daemon_is_a_warning():
    f = memory.analyze(_ev(pgmajfault_per_s=1500.0, psi_memory_some_window_pct=3.0))
    assert f.severity.value == "warning"


def test_rereads_without_any_node_signal_are_info():
    """Seen on this VM: 4,000 refaults/s from one memory cgroup at its limit while the node had
    98% MemAvailable and no PSI stall. The node is fine: info, not a warning."""
    f = memory.analyze(_ev(refault_file_per_s=3976.0, pgmajfault_per_s=15.5,
                           mem_available_pct=97.8))
    assert f.severity.value == "info"
    assert "without node pressure" in f.title
    assert memory.analyze(_ev(refault_file_per_s=3976.0, mem_available_pct=8.0)
                          ).severity.value == "warning"


def test_the_probe_does_not_blame_itself():
    import os
    a = memory.Sample(t=0.0, psi={}, vmstat={}, meminfo_kib={},
                      procs={os.getpid(): (1, "python3", 10), 4242: (7, "reader", 0)})
    b = memory.Sample(t=1.0, psi={}, vmstat={}, meminfo_kib={},
                      procs={os.getpid(): (1, "python3", 500), 4242: (7, "reader", 30)})
    assert [p["pid"] for p in memory.major_fault_deltas(a, b)] == [4242]


def test_daemon_faulting_alone_is_a_warning():
    d = {"pid": 9, "comm": "containerd", "major": 90, "major_per_s": 30.0}
    f = memory.analyze(_ev(daemons_faulting=[d], top_major_faulters=[d]))
    assert f.severity.value == "warning" and "containerd[9]" in f.title


def test_light_pressure_is_info():
    f = memory.analyze(_ev(psi_memory_some_window_pct=4.0))
    assert f.severity.value == "info"


def test_low_mem_available_is_a_warning():
    f = memory.analyze(_ev(mem_available_pct=3.0))
    assert f.severity.value == "warning" and "MemAvailable" in f.title


def test_daemon_names():
    assert memory.is_node_daemon("kubelet") and memory.is_node_daemon("containerd-shim")
    assert memory.is_node_daemon("dockerd") and memory.is_node_daemon("crio")
    assert not memory.is_node_daemon("python3") and not memory.is_node_daemon("kubeletx")


def test_window_deltas_from_proc_files(fake_proc):
    """Counters at both ends of the window -> rates; a reused pid counts from zero; a process
    that exits in the window drops out; daemons over the threshold are named."""
    fake_proc.set_counters(majflt=1000, refault_file=5000)
    fake_proc.set_psi("memory", some_total=1_000_000, full_total=500_000)
    fake_proc.set_psi("io", some_total=0, full_total=0)
    fake_proc.set_proc(100, "kubelet", majflt=50)
    fake_proc.set_proc(200, "python3", majflt=7, start=100)
    fake_proc.set_proc(300, "gone", majflt=1)
    a = memory.sample(fake_proc.root)
    fake_proc.set_counters(majflt=4000, refault_file=35000)
    fake_proc.set_psi("memory", some_total=2_500_000, full_total=1_700_000)
    fake_proc.set_proc(100, "kubelet", majflt=350)
    fake_proc.set_proc(200, "python3", majflt=40, start=999)   # same pid, new process
    import shutil
    shutil.rmtree(fake_proc.root / "300")
    b = memory.sample(fake_proc.root)
    b.t = a.t + 3.0
    ev = memory.measurements(a, b, fake_proc.root)
    assert ev["pgmajfault_per_s"] == 1000.0 and ev["refault_file_per_s"] == 10000.0
    assert ev["psi_memory_some_window_pct"] == 50.0 and ev["psi_memory_full_window_pct"] == 40.0
    assert [(p["pid"], p["comm"], p["major"]) for p in ev["top_major_faulters"]] == [
        (100, "kubelet", 300), (200, "python3", 40)]
    assert [p["comm"] for p in ev["daemons_faulting"]] == ["kubelet"]
    assert memory.analyze(ev).severity.value == "critical"


def test_no_psi_is_said_not_crashed(fake_proc):
    fake_proc.set_counters()
    fake_proc.set_proc(1, "init", majflt=0)
    out = []
    ctx = ProbeContext(ProbeOptions(proc_root=fake_proc.root, trace_s=0.0), out.append)
    findings = list(memory.memory_check(ctx))
    assert len(findings) == 1
    ev = findings[0].evidence
    assert ev["psi_memory"].startswith("unavailable") and ev["psi_io"].startswith("unavailable")
    assert findings[0].severity.value == "ok"
    assert any(r.get("kind") == "log" and "PSI unavailable" in r["message"] for r in out)


def test_live_probe_without_tracing_is_quick_and_complete():
    run = run_probe("--only", "memory", "--trace-seconds", "0")
    assert run.summary["complete"] is True
    (f,) = run.findings("memory.pressure")
    assert f["evidence"]["window_s"] >= 0.4 and "mem_total_mib" in f["evidence"]


@pytest.mark.root
@pytest.mark.slow
def test_real_thrash_in_a_memory_cgroup(tmp_path, need_root):
    """A 256 MiB memory cgroup: a hog holds 176 MiB anonymous, a reader mmaps a 160 MiB file and
    touches every page in a loop. The probe must see the major faults and name the reader."""
    from tests.memory.thrash import Thrash, memcg_v1_root, memcg_v2_root
    if memcg_v1_root() is None and memcg_v2_root() is None:
        pytest.skip("no memory cgroup controller on this host")
    workdir = Path("/var/tmp") if Path("/var/tmp").is_dir() else tmp_path
    import tempfile
    with tempfile.TemporaryDirectory(dir=workdir, prefix="gd-thrash-") as d:
        with Thrash(Path(d)) as t:
            m0 = t.reader_majflt()
            faulting_by = time.monotonic() + 30   # polled: a loaded machine may run it late
            while t.reader_majflt() <= m0 and time.monotonic() < faulting_by:
                time.sleep(0.1)
            assert t.reader_majflt() > m0, "the reader does not fault: no thrash to observe"
            run = run_probe("--only", "memory", "-o", "jsonl", "--trace-seconds", "3")
            assert t.reader.poll() is None and t.hog.poll() is None
            assert t.usage_bytes() <= t.limit
            reader_pid = t.reader.pid
        assert not t.cgroup.exists()
    assert run.summary["complete"] is True
    (f,) = run.findings("memory.pressure")
    ev = f["evidence"]
    top = {p["pid"]: p for p in ev["top_major_faulters"]}
    assert reader_pid in top, ev["top_major_faulters"]
    assert top[reader_pid]["comm"] == "gd-reader" and top[reader_pid]["major"] > 0
    assert ev["pgmajfault_per_s"] > 0 and ev["refault_file_per_s"] > 0
    assert f["severity"] in ("warning", "critical")
    assert f"gd-reader[{reader_pid}]" in f["title"]


def test_a_tenant_process_named_kubelet_is_not_a_node_daemon(fake_proc):
    """Node daemons raise the verdict to critical; a pod's process named `kubelet` is in a pod's
    cgroup, so it stays a plain faulter (the host's kubelet, outside every pod, still counts)."""
    fake_proc.set_counters(majflt=0, refault_file=0)
    fake_proc.set_psi("memory", some_total=0, full_total=0)
    fake_proc.set_proc(100, "kubelet", majflt=0)
    fake_proc.set_proc(101, "kubelet", majflt=0)
    (fake_proc.root / "100/cgroup").write_text(
        "4:memory:/kubepods/burstable/pod0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b/"
        + "a" * 64 + "\n")
    (fake_proc.root / "101/cgroup").write_text("4:memory:/system.slice/kubelet.service\n")
    a = memory.sample(fake_proc.root)
    fake_proc.set_proc(100, "kubelet", majflt=3000)
    fake_proc.set_proc(101, "kubelet", majflt=3000)
    b = memory.sample(fake_proc.root)
    b.t = a.t + 3.0
    ev = memory.measurements(a, b, fake_proc.root)
    assert {p["pid"] for p in ev["top_major_faulters"]} == {100, 101}
    assert [p["pid"] for p in ev["daemons_faulting"]] == [101]

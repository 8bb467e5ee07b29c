"""The slow-GPU check end to end: a real probe process, the stand-in libnvidia-ml.so.1
(tests/fakes/fake_nvml.c) and a sysfs tree under a temp host root.

PROVEN ONLY ON THE STAND-IN: no real GPU was at hand in this session. The NVML calls, their
signatures and the event-reason bits are nvml.h's (pynvml drives the stand-in as it drives the
real library); what a real driver answers on a given GPU (e.g. which NVLink indices answer,
whether GetGpuMaxPcieLinkGeneration is supported) is still to be captured with
scripts/capture-real-gpu.sh.
"""
import os
from pathlib import Path

from tests.fakes.nvml import FakeGpu, build_fake_nvml
from tests.probe_run import run_probe

LIBDIR = "usr/lib/x86_64-linux-gnu"
ONLY = ("--only", "gpu.slow", "--trace-seconds", "0")
BUSY = (("util_gpu", 100), ("clock_reasons", 0), ("sm_mhz", 1980))


def host(tmp_path: Path, gpus, sysfs=()) -> Path:
    root = tmp_path / "host"
    build_fake_nvml(root / LIBDIR, gpus=gpus)
    for chain in sysfs:
        make_chain(root, chain)
    return root


def make_chain(root: Path, chain):
    """chain: [(bdf, cur GT/s text, cur width, max GT/s text, max width, numa)], root port
    first. Builds /sys/devices/pci0000:00/<bdf>/<bdf>/... and /sys/bus/pci/devices links."""
    path = root / "sys/devices/pci0000:00"
    for bdf, cur, w, top, wmax, node in chain:
        path = path / bdf
        path.mkdir(parents=True, exist_ok=True)
        for name, val in (("current_link_speed", cur), ("current_link_width", w),
                          ("max_link_speed", top), ("max_link_width", wmax),
                          ("numa_node", node)):
            (path / name).write_text(f"{val}\n")
        link = root / "sys/bus/pci/devices" / bdf
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            os.symlink(os.path.relpath(path, link.parent), link)


def test_a_healthy_busy_gpu_and_an_idle_gen1_gpu_raise_nothing(tmp_path):
    root = host(tmp_path, [FakeGpu("GPU-busy", attrs=(*BUSY, ("pcie_gen_cur", 5))),
                           FakeGpu("GPU-proc", minor=2, processes=((4242, 1 << 30),)),
                           FakeGpu("GPU-idle", minor=1, attrs=(("pcie_gen_cur", 1),))])
    run = run_probe("--host-root", str(root), *ONLY)
    assert [f for f in run.findings() if f["check"] == "gpu.slow"] == [], run.findings()
    assert run.summary["complete"] is True, run.stderr
    [c] = [c for c in run.summary["checks"] if c["id"] == "gpu.slow"]
    assert c["status"] == "ok"


def test_busy_gpu_at_gen2_is_downtrained_with_its_bandwidth_share(tmp_path):
    root = host(tmp_path, [FakeGpu("GPU-slow", attrs=(*BUSY, ("pcie_gen_cur", 2)))])
    run = run_probe("--host-root", str(root), *ONLY)
    [f] = run.findings("gpu.pcie_downtrained")
    assert "Gen2 x16 of Gen5 x16: 1/8 of host bandwidth" in f["title"]
    assert f["evidence"]["pci_bus_id"] == "00000000:01:00.0" and f["subject"] == "GPU-slow"


def test_application_clocks_and_idle_reasons_raise_nothing(tmp_path):
    root = host(tmp_path, [FakeGpu("GPU-app", attrs=(*BUSY[:1], ("clock_reasons", 0x2),
                                                     ("sm_mhz", 1410), ("pcie_gen_cur", 5)))])
    run = run_probe("--host-root", str(root), *ONLY)
    assert run.findings("gpu.clocks_throttled") == []


def test_thermal_slowdown_under_load_on_an_old_driver_name(tmp_path):
    # clock_api=1: only nvmlDeviceGetCurrentClocksThrottleReasons answers (drivers < 535)
    root = host(tmp_path, [FakeGpu("GPU-hot", attrs=(
        ("util_gpu", 97), ("pcie_gen_cur", 5), ("clock_reasons", 0x40 | 0x20),
        ("sm_mhz", 1095), ("temp_c", 88), ("clock_api", 1)))])
    run = run_probe("--host-root", str(root), *ONLY)
    [f] = run.findings("gpu.clocks_throttled")
    ev = f["evidence"]
    assert ev["reasons"] == ["hw_thermal", "sw_thermal"] and ev["thermal_margin_c"] == -1
    assert ev["sm_mhz"] == 1095 and ev["sm_max_mhz"] == 1980


def test_nvlink_down_against_peers_and_counters(tmp_path):
    links = (("nvlinks", 18),)
    root = host(tmp_path, [
        FakeGpu("GPU-a", attrs=(*BUSY, ("pcie_gen_cur", 5), *links, ("nvlink_down", 0b1000))),
        FakeGpu("GPU-b", minor=1, attrs=(*BUSY, ("pcie_gen_cur", 5), *links),
                nvlink_errors=((0, 0, 7),))])
    run = run_probe("--host-root", str(root), *ONLY)
    by = {f["subject"]: f for f in run.findings("gpu.nvlink_degraded")}
    assert by["GPU-a"]["severity"] == "warning" and by["GPU-a"]["evidence"]["links_down"] == [3]
    assert by["GPU-b"]["severity"] == "info"
    assert by["GPU-b"]["evidence"]["error_counts"]["replay"] == 7


def test_retired_pages_pending(tmp_path):
    root = host(tmp_path, [FakeGpu("GPU-mem", attrs=(("retired_pending", 1), ("ecc_sbe", 3)))])
    run = run_probe("--host-root", str(root), *ONLY)
    [f] = run.findings("gpu.memory_degrading")
    assert f["evidence"]["retired_pages_pending"] is True and f["evidence"]["sbe_volatile"] == 3


def test_queries_the_gpu_does_not_support_say_nothing(tmp_path):
    none = tuple((k, "none") for k in ("pcie_gen_cur", "pcie_width_cur", "util_gpu",
                                       "clock_reasons", "temp_c", "power_mw", "ecc_sbe",
                                       "retired_pending"))
    root = host(tmp_path, [FakeGpu("GPU-old", attrs=none)])
    run = run_probe("--host-root", str(root), *ONLY)
    assert [f for f in run.findings() if f["check"] == "gpu.slow"] == []


def test_sysfs_switch_uplink_downtrained_above_a_busy_gpu(tmp_path):
    chain = [("0000:00:01.0", "32.0 GT/s PCIe", 16, "32.0 GT/s PCIe", 16, 0),
             ("0000:01:00.0", "8.0 GT/s PCIe", 16, "32.0 GT/s PCIe", 16, 0),   # switch up
             ("0000:02:00.0", "32.0 GT/s PCIe", 16, "32.0 GT/s PCIe", 16, 0),  # switch down
             ("0000:3b:00.0", "32.0 GT/s PCIe", 16, "32.0 GT/s PCIe", 16, 0)]  # the GPU
    root = host(tmp_path, [FakeGpu("GPU-sw", pci_bus_id="00000000:3B:00.0",
                                   attrs=(*BUSY, ("pcie_gen_cur", 5)))], [chain])
    run = run_probe("--host-root", str(root), *ONLY)
    [f] = run.findings("gpu.pcie_downtrained")
    assert f["evidence"]["at"] == "bridge" and f["evidence"]["at_bdf"] == "0000:01:00.0"
    assert "Gen3 x16 of Gen5 x16" in f["title"]

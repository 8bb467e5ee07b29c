"""NVML checks end to end: a real probe process, a real gcc-built libnvidia-ml.so.1 under a
temp host root, pynvml as the client."""
import json
import os
import sys
from pathlib import Path

import pytest

from tests.fakes.nvml import H20_MIXED, FakeGpu, build_fake_nvml
from tests.probe_run import run_probe

LIBDIR = "usr/lib/x86_64-linux-gnu"
NVML_ONLY = ("--only", "nvml", "--only", "driver", "--trace-seconds", "0")


def host_with_lib(tmp_path: Path, **cfg) -> Path:
    root = tmp_path / "host"
    build_fake_nvml(root / LIBDIR, **cfg)
    return root


def test_no_driver_on_this_host_is_info_not_failure():
    run = run_probe("--trace-seconds", "0")
    assert not run.actionable(), run.actionable()
    assert run.returncode == run.expected_exit(), run.stderr
    f = run.findings("nvml.unavailable")
    assert f and f[0]["severity"] == "info"
    # the probe runs on a remote node too (`node X`, `pod Y`): never "this host" (ux-round-5
    # N10: `pod cuda-1` printed "No NVIDIA driver on this host" about gpu-0061)
    assert "this host" not in f[0]["title"] and "on the node" in f[0]["title"]
    assert run.summary["complete"] is True


def test_init_that_blocks_forever_ends_within_timeout(tmp_path):
    root = host_with_lib(tmp_path, init="block", driver_version="550.54.15",
                         gpus=[FakeGpu("GPU-1")])
    run = run_probe("--host-root", str(root), "--timeout", "4", *NVML_ONLY)
    # the probe's own clock (start-up under load not counted); run_probe's 60 s: hang guard
    assert run.summary["duration_s"] < 4 + 2, (run.summary["duration_s"], run.wall_s)
    assert run.returncode == 1
    hang = run.findings("nvml.init_hang")
    assert hang and hang[0]["severity"] == "critical"
    assert hang[0]["evidence"]["stage"] == "init"
    assert hang[0]["evidence"]["library"].endswith("libnvidia-ml.so.1")
    # the child was killed: no process is left running our fake library
    left = [p for p in os.listdir("/proc") if p.isdigit()
            and str(root) in _safe_read(f"/proc/{p}/cmdline")]
    assert not left


def _safe_read(p):
    try:
        return open(p, "rb").read().decode(errors="replace")
    except OSError:
        return ""


def test_known_bad_driver_with_mixed_mig_is_critical(tmp_path):
    root = host_with_lib(tmp_path, driver_version="570.158.01", gpus=H20_MIXED)
    run = run_probe("--host-root", str(root), *NVML_ONLY)
    assert run.returncode == 1
    bad = run.findings("driver.known_bad")
    assert bad and bad[0]["severity"] == "critical"
    assert bad[0]["evidence"]["trigger_present"] is True
    assert "570.172.08" in bad[0]["evidence"]["fixed_in"]
    mig = run.findings("mig.layout")
    assert mig and mig[0]["evidence"]["mixed"] is True
    assert mig[0]["evidence"]["mig_gpus"][0]["instances"] == ["3g.48gb", "1g.24gb"]
    inv = run.findings("nvml.inventory")[0]
    assert inv["evidence"]["driver_version"] == "570.158.01"
    assert [g["uuid"] for g in inv["evidence"]["gpus"]] == [g.uuid for g in H20_MIXED]


def test_known_bad_driver_without_trigger_is_info(tmp_path):
    root = host_with_lib(tmp_path, driver_version="570.158.01",
                         gpus=[FakeGpu("GPU-a", minor=0), FakeGpu("GPU-b", minor=1)])
    run = run_probe("--host-root", str(root), *NVML_ONLY)
    bad = run.findings("driver.known_bad")
    assert bad and bad[0]["severity"] == "info"
    assert run.returncode == 0


def test_init_error_reports_the_nvml_message(tmp_path):
    root = host_with_lib(tmp_path, init="error:18", driver_version="570.172.08")
    run = run_probe("--host-root", str(root), *NVML_ONLY)
    err = run.findings("nvml.init_error")
    assert err and err[0]["severity"] == "critical"
    assert err[0]["evidence"]["error"] == "Driver/library version mismatch"
    assert err[0]["evidence"]["nvml_return"] == 18
    assert run.returncode == 1


def test_gpu_operator_layout_and_absolute_symlinks_stay_inside_host_root(tmp_path):
    root = tmp_path / "host"
    real_dir = root / "run/nvidia/driver/usr/lib/x86_64-linux-gnu"
    lib = build_fake_nvml(real_dir, driver_version="535.161.08", gpus=[FakeGpu("GPU-op")])
    real = real_dir / "libnvidia-ml.so.535.161.08"
    lib.rename(real)
    # absolute symlink, as on the host: must resolve under --host-root, not the probe's /
    (real_dir / "libnvidia-ml.so.1").symlink_to("/run/nvidia/driver/usr/lib/x86_64-linux-gnu/"
                                                "libnvidia-ml.so.535.161.08")
    (real_dir / "fake_nvml.conf").exists()
    (root / "proc/driver/nvidia").mkdir(parents=True)
    (root / "proc/driver/nvidia/version").write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 18:56:32 UTC 2023\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
    run = run_probe("--host-root", str(root), *NVML_ONLY)
    inv = run.findings("nvml.inventory")
    assert inv and inv[0]["evidence"]["library"] == str(real)
    mm = run.findings("driver.version_mismatch")
    assert mm and mm[0]["evidence"] == {"kernel_module_version": "535.129.03",
                                        "library_version": "535.161.08", "library": str(real)}


def test_gpu_health_from_remapping_and_ecc(tmp_path):
    root = host_with_lib(tmp_path, gpus=[FakeGpu("GPU-ok"), FakeGpu("GPU-pend", minor=1,
                                                                     remap_pending=True),
                                         FakeGpu("GPU-dead", minor=2, remap_failed=True),
                                         FakeGpu("GPU-ecc", minor=3, ecc_uncorrected=4)])
    run = run_probe("--host-root", str(root), *NVML_ONLY)
    health = {f["subject"]: f["severity"] for f in run.findings("gpu.health")}
    assert health == {"GPU-ecc": "warning"}
    assert [f["subject"] for f in run.findings("gpu.row_remap_pending")] == ["GPU-pend"]
    assert [f["subject"] for f in run.findings("gpu.row_remap_failed")] == ["GPU-dead"]


def test_hang_on_known_bad_build_is_critical_even_without_layout(tmp_path):
    root = tmp_path / "host"
    d = root / LIBDIR
    lib = build_fake_nvml(d, init="block")
    lib.rename(d / "libnvidia-ml.so.570.148.08")
    (d / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.570.148.08")
    run = run_probe("--host-root", str(root), "--nvml-timeout", "1.5", *NVML_ONLY)
    bad = run.findings("driver.known_bad")
    assert bad and bad[0]["severity"] == "critical"
    assert bad[0]["evidence"]["nvml_status"] == "hang"
    assert run.findings("nvml.init_hang")

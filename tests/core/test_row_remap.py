"""Row remapping pending or failed while the GPU still answers NVML (issue 25, class 5).

Real process, real gcc-built libnvidia-ml.so.1 exporting nvmlDeviceGetRemappedRows and
nvmlDeviceGetRowRemapperHistogram with nvml.h's signatures, pynvml as the client."""
from tests.core.test_nvml import NVML_ONLY, host_with_lib
from tests.fakes.nvml import FakeGpu
from tests.probe_run import run_probe

A100 = "NVIDIA A100-SXM4-80GB"


def test_pending_needs_a_reset_and_failed_needs_a_replacement(tmp_path):
    root = host_with_lib(tmp_path, driver_version="570.172.08", gpus=[
        FakeGpu("GPU-pending", A100, 0, remap_pending=True, remap_uncorrectable_rows=2,
                remap_histogram=(636, 2, 1, 1, 0), pci_bus_id="00000000:07:00.0"),
        FakeGpu("GPU-failed", A100, 1, remap_failed=True, remap_uncorrectable_rows=8,
                remap_correctable_rows=3, remap_histogram=(630, 4, 2, 3, 1)),
    ])
    run = run_probe("--host-root", str(root), *NVML_ONLY)
    pending = run.findings("gpu.row_remap_pending")
    failed = run.findings("gpu.row_remap_failed")
    assert [f["subject"] for f in pending] == ["GPU-pending"]
    assert [f["subject"] for f in failed] == ["GPU-failed"]
    p, f = pending[0], failed[0]
    assert p["severity"] == "warning" and f["severity"] == "critical"
    assert p["evidence"]["rows_remapped_uncorrectable"] == 2
    assert p["evidence"]["remapper_histogram"] == {"max": 636, "high": 2, "partial": 1,
                                                   "low": 1, "none": 0}
    assert "nvidia-smi -r -i 00000000:07:00.0" in p["remediation"]
    assert f["evidence"]["banks_without_spare_rows"] == 1
    assert f["evidence"]["rows_remapped_correctable"] == 3
    assert "replaced" in f["remediation"] and "reset does not fix" in f["remediation"]
    assert not run.findings("gpu.health")   # one finding per GPU, not two
    assert run.returncode == 1


def test_healthy_gpus_stay_quiet(tmp_path):
    # rows already remapped and applied (not pending) is a healthy, repaired GPU; a pre-Ampere
    # GPU has no remapper at all (NOT_SUPPORTED)
    root = host_with_lib(tmp_path, gpus=[
        FakeGpu("GPU-repaired", A100, 0, remap_correctable_rows=3, remap_uncorrectable_rows=1,
                remap_histogram=(638, 2, 0, 0, 0)),
        FakeGpu("GPU-t4", "Tesla T4", 1, remap_supported=False),
    ])
    run = run_probe("--host-root", str(root), *NVML_ONLY)
    assert not run.actionable(), run.actionable()
    assert not [f for f in run.findings() if f["id"].startswith("gpu.")]
    inv = run.findings("nvml.inventory")
    assert len(inv[0]["evidence"]["gpus"]) == 2

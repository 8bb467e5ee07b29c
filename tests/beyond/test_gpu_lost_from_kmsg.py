"""gpu_lost reads the kmsg check's one pass over the kernel log (issue 41.2) and sees the forms
of a lost GPU that have no Xid 79 (issue 40.8): the driver's one-line `NVRM: GPU <bdf>: GPU has
fallen off the bus.` (https://github.com/NVIDIA/nvidia-docker/issues/1553: a GPU that failed
under a running container) and a fatal PCIe AER on its link
(https://github.com/wilicc/gpu-burn/issues/1: a Surprise Down on the root port above the GPU).
A real probe process with the stand-in libnvidia-ml.so.1."""
from __future__ import annotations

from tests.beyond.conftest import healthy_gpus, make_host
from tests.fakes.nvml import FakeGpu
from tests.probe_run import run_probe


def probe(root, kfile, *only):
    sel = [a for c in ("nvml", *only) for a in ("--only", c)]
    return run_probe("--host-root", str(root), "--kmsg-file", str(kfile), "--trace-seconds", "0",
                     "--kubelet-dir", str(root / "var/lib/kubelet"), *sel)


def test_off_the_bus_without_an_xid_is_a_lost_gpu(tmp_path):
    gpus = [FakeGpu("GPU-ok", minor=0, pci_bus_id="00000000:1A:00.0"),
            FakeGpu("GPU-gone", minor=1, pci_bus_id="00000000:09:00.0")]
    kmsg = ("[1084456.074566] NVRM: GPU 0000:09:00.0: GPU has fallen off the bus.\n"
            "[1084456.074567] NVRM: GPU 0000:09:00.0: GPU is on Board .\n")
    root, kfile = make_host(tmp_path, gpus, kmsg=kmsg)
    run = probe(root, kfile, "kmsg", "gpu_lost")
    lost = {f["subject"]: f for f in run.findings("gpu.lost")}
    assert list(lost) == ["pci 0000:09:00.0"], run.findings()
    ev = lost["pci 0000:09:00.0"]["evidence"]
    assert ev["sources"] == ["kernel_off_the_bus"] and ev["kernel_log"] is None
    assert "fallen off the bus (no Xid line)" in lost["pci 0000:09:00.0"]["title"]


def test_fatal_aer_then_xid79_is_a_lost_gpu_read_once(tmp_path):
    gpus = [FakeGpu("GPU-660d987e-5b28-3bf6-2a2d-1d5ecae7f6df", minor=0,
                    pci_bus_id="00000000:02:00.0")]
    kmsg = ("[74889.542031] pcieport 0000:00:02.0: AER: Uncorrected (Fatal) error received: id=0010\n"
            "[74889.542044] pcieport 0000:00:02.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, id=0010(Receiver ID)\n"
            "[74889.542184] pcieport 0000:00:02.0:    [ 5] Surprise Down Error    (First)\n"
            "[74889.542234] pcieport 0000:00:02.0: broadcast error_detected message\n"
            "[74889.542239] nvidia 0000:02:00.0: device has no AER-aware driver\n"
            "[74889.644138] NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.\n")
    root, kfile = make_host(tmp_path, gpus, kmsg=kmsg)
    run = probe(root, kfile, "kmsg", "gpu_lost")
    (lost,) = run.findings("gpu.lost")
    assert lost["evidence"]["sources"] == ["xid_79", "pcie_aer_fatal"]
    assert lost["evidence"]["xid79_count"] == 1
    (aer,) = run.findings("gpu.pcie_aer")
    assert aer["severity"] == "critical"
    (x,) = run.findings("gpu.xid")
    assert x["evidence"]["caused_by_aer"]["device"] == "0000:00:02.0"


def test_healthy_node_with_a_corrected_aer_elsewhere_is_quiet(tmp_path):
    root, kfile = make_host(tmp_path, healthy_gpus(2), kmsg=(
        "[1086487.613065] pcieport 0000:00:01.1: AER: Corrected error received: 0000:00:00.0\n"
        "[1086487.613071] pcieport 0000:00:01.1: AER: PCIe Bus Error: severity=Corrected, type=Data Link Layer, (Receiver ID)\n"))
    run = probe(root, kfile, "kmsg", "gpu_lost")
    assert [f for f in run.findings() if f["severity"] != "info"] == [], run.findings()
    assert not run.findings("gpu.lost") and not run.findings("gpu.pcie_aer")

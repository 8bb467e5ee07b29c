"""The agent watches slow GPUs (issue 38 item 4): one GpuDoctorGpuDegraded condition with a
reason per cause on the fake API server, and per-GPU gauges (link generation/width current and
max, clock event reasons, thermal margin) on /metrics.

PROVEN ONLY ON THE STAND-IN libnvidia-ml (tests/fakes/fake_nvml.c): no real GPU was at hand.
"""
from __future__ import annotations

import socket
import urllib.request

import pytest

from node_probe.engine.context import ProbeOptions
from node_probe.watch import detect, metrics
from node_probe.watch.state import ConditionState
from tests.fakes.nvml import FakeGpu, build_fake_nvml
from tests.watch.conftest import wait_for

NODE = "gpu-node-slow"
DEGRADED = "GpuDoctorGpuDegraded"
LIBDIR = "usr/lib/x86_64-linux-gnu"
BUSY = (("util_gpu", 100), ("clock_reasons", 0), ("sm_mhz", 1980))


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _metrics(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            return r.read().decode()
    except OSError:
        return None


def _pass(tmp_path, gpus):
    root = tmp_path / "root"
    build_fake_nvml(root / LIBDIR, gpus=gpus)
    (tmp_path / "proc").mkdir(exist_ok=True)
    kmsg = tmp_path / "kmsg.txt"
    kmsg.write_text("[1.0] Linux version 6.1\n")
    return detect.run_pass(ProbeOptions(host_root=root, cgroup_root=tmp_path / "cg",
                                        proc_root=tmp_path / "proc", kmsg_file=kmsg), 20.0)


def test_healthy_busy_and_idle_gen1_gpus_raise_no_condition(tmp_path):
    res = _pass(tmp_path, [FakeGpu("GPU-busy", attrs=(*BUSY, ("pcie_gen_cur", 5))),
                           FakeGpu("GPU-idle", minor=1)])
    assert DEGRADED not in res.problems and DEGRADED not in res.unsure
    assert ConditionState().update({k: v for k, v in res.problems.items()
                                    if k == DEGRADED}) == []
    idle = next(g for g in res.gpus if g["uuid"] == "GPU-idle")
    assert idle["pcie_gen_cur"] == 1 and idle["pcie_gen_max"] == 5   # shown, not judged


def test_gauges_of_a_throttled_gpu(tmp_path):
    res = _pass(tmp_path, [FakeGpu("GPU-hot", attrs=(("util_gpu", 99), ("pcie_gen_cur", 5),
                                                     ("clock_reasons", 0x40), ("temp_c", 85)))])
    [p] = res.problems[DEGRADED]
    assert p.finding_id == "gpu.clocks_throttled"
    text = "\n".join(metrics.gpu_lines(res.gpus))
    assert ('gpu_doctor_gpu_clocks_event_reasons{uuid="GPU-hot",pci_bus_id="00000000:01:00.0"}'
            ' 64') in text
    assert 'gpu_doctor_gpu_thermal_margin_celsius{uuid="GPU-hot",' in text and "} 2" in text
    assert ('gpu_doctor_gpu_pcie_link_generation{uuid="GPU-hot",pci_bus_id="00000000:01:00.0",'
            'which="max"} 5') in text


def test_a_gauge_nvml_could_not_give_writes_no_sample():
    text = "\n".join(metrics.gpu_lines([{"uuid": "GPU-x", "pci_bus_id": "b",
                                         "thermal_margin_c": None, "pcie_gen_cur": 4}]))
    assert "gpu_doctor_gpu_thermal_margin_celsius{" not in text
    assert 'which="current"} 4' in text


@pytest.mark.slow
def test_downtrained_gpu_marks_the_node_with_its_reason_and_metrics(api, start_agent,
                                                                   tmp_path):
    api.cluster.add_capture_node(NODE)
    api.bind("tok-slow", NODE)
    root, cg = tmp_path / "root", tmp_path / "cg"
    cg.mkdir()
    build_fake_nvml(root / LIBDIR, gpus=[
        FakeGpu("GPU-5ee1a0b2-0b0e-4c1e-9d7a-6a1f3c2b9e01",
                attrs=(*BUSY, ("pcie_gen_cur", 2))),
        FakeGpu("GPU-b", minor=1)])
    (tmp_path / "proc").mkdir()
    kmsg = tmp_path / "kmsg.txt"
    kmsg.write_text("[1.0] Linux version 6.1\n")
    port = _port()
    start_agent("--host-root", str(root), "--cgroup-root", str(cg), "--kmsg-file", str(kmsg),
                "--node-name", NODE, "--interval", "1", "--metrics-port", str(port),
                "--api-token-file", str(api.token_file), "--api-ca-file", str(api.ca),
                "--no-evidence", env=api.env())
    cond = wait_for(lambda: api.cluster.conditions(NODE).get(DEGRADED, {}).get("status")
                    == "True" and api.cluster.conditions(NODE)[DEGRADED], 60,
                    "the GpuDegraded condition")
    assert cond["reason"] == "GpuPcieDowntrained"
    assert "Gen2 x16 of Gen5 x16" in cond["message"]
    text = wait_for(lambda: (t := _metrics(port)) and "gpu_doctor_gpu_pcie_link_generation" in t
                    and t, 30, "the per-GPU gauges")
    assert ('gpu_doctor_gpu_pcie_link_generation{uuid="GPU-5ee1a0b2-0b0e-4c1e-9d7a-6a1f3c2b9e01",'
            'pci_bus_id="00000000:01:00.0",which="current"} 2') in text
    assert f'gpu_doctor_condition{{condition="{DEGRADED}"}} 1' in text


def test_counters_rising_between_two_passes_raise_the_condition():
    one = [{"uuid": "GPU-a", "pci_bus_id": "00000000:3B:00.0", "nvlink_errors": 5,
            "sbe_volatile": 10}]
    same = [dict(one[0])]
    assert detect.rising(one, same) == []          # still counters: history
    assert detect.rising([], one) == []             # one sample says nothing about rising
    later = [dict(one[0], nvlink_errors=40, sbe_volatile=400)]
    got = {p.finding_id: p for p in detect.rising(one, later)}
    assert set(got) == {"gpu.nvlink_degraded", "gpu.memory_degrading"}
    assert got["gpu.nvlink_degraded"].ctype == DEGRADED and "rose by 35" in \
        got["gpu.nvlink_degraded"].title
    reloaded = [dict(one[0], nvlink_errors=0, sbe_volatile=0)]   # driver reloaded: reset
    assert detect.rising(one, reloaded) == []

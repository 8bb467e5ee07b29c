"""gpu.collective_spin end to end: a real probe process, the real NVML child and the stand-in
libnvidia-ml.so.1 (tests/fakes/fake_nvml.c) answering utilisation, power and clocks.

The signature is the one the threads established (node_probe/checks/collective.py quotes them):
NVIDIA/nccl#968 "When the hang happens, the GPU util is 100% but the power consumption is
pretty low (~70W)" (an A100, 400 W limit); vllm-project/vllm#41725 "rank stuck spinning at ~96%
GPU / ~20 W drawing no real power, peer blocked in `ncclAllReduce`".
PROVEN ONLY ON THE STAND-IN: what a real driver answers on a spinning GPU is what those threads
report from nvidia-smi (which reads the same NVML calls).
"""
from tests.fakes.nvml import FakeGpu, build_fake_nvml
from tests.probe_run import run_probe

from node_probe.checks import collective

LIBDIR = "usr/lib/x86_64-linux-gnu"
ONLY = ("--only", "gpu.collective", "--trace-seconds", "0")
A100 = (("power_limit_mw", 400000), ("power_default_mw", 400000), ("sm_max_mhz", 1410))


def _run(tmp_path, gpus):
    root = tmp_path / "host"
    build_fake_nvml(root / LIBDIR, gpus=gpus)
    return run_probe("--host-root", str(root), *ONLY)


def test_the_968_numbers_look_like_a_spin_and_a_computing_gpu_does_not(tmp_path):
    run = _run(tmp_path, [
        # nccl#968: 100 % busy at ~70 W of an A100's 400 W, clocks up
        FakeGpu("GPU-spin", attrs=(*A100, ("util_gpu", 100), ("power_mw", 70000),
                                   ("sm_mhz", 1410), ("clock_reasons", 0))),
        # healthy control: the same GPU really computing draws most of its limit
        FakeGpu("GPU-work", minor=1, attrs=(*A100, ("util_gpu", 100), ("power_mw", 352000),
                                            ("sm_mhz", 1410), ("clock_reasons", 0)))])
    [f] = run.findings("gpu.collective_spin")
    assert f["subject"] == "GPU-spin" and f["severity"] == "warning"
    assert "100 % busy at 70 W of 400 W (18%)" in f["title"]
    assert "looks like" in f["title"] and "one sample" in f["title"]
    assert f["evidence"]["samples"] == 1 and f["evidence"]["sm_mhz"] == 1410
    assert "https://github.com/NVIDIA/nccl/issues/968" in f["refs"]
    [c] = [c for c in run.summary["checks"] if c["id"] == "gpu.collective"]
    assert c["status"] == "ok"


def test_healthy_idle_and_busy_gpus_raise_nothing(tmp_path):
    run = _run(tmp_path, [
        FakeGpu("GPU-idle"),   # the stand-in's default: 0 %, 70 W of 700 W, idle clocks
        FakeGpu("GPU-busy", minor=1, attrs=(("util_gpu", 100), ("power_mw", 650000),
                                            ("sm_mhz", 1980), ("clock_reasons", 0)))])
    assert run.findings("gpu.collective_spin") == []
    assert not [f for f in run.findings() if f["check"] == "gpu.collective"
                and f["severity"] in ("warning", "critical")]
    [c] = [c for c in run.summary["checks"] if c["id"] == "gpu.collective"]
    assert c["status"] == "ok"


def test_no_power_reading_means_skipped_not_ok(tmp_path):
    run = _run(tmp_path, [FakeGpu("GPU-old", attrs=(("util_gpu", "none"), ("power_mw", "none")))])
    [c] = [c for c in run.summary["checks"] if c["id"] == "gpu.collective"]
    assert c["status"] == "skipped" and "utilisation" in c["reason"]


def test_judge_needs_clocks_up_and_low_power():
    base = {"uuid": "GPU-x", "index": 0, "utilization_gpu_pct": 100,
            "power": {"draw_w": 20.0, "limit_w": 700.0}, "clocks": {"sm_mhz": 1980,
                                                                    "sm_max_mhz": 1980}}
    assert collective.judge(base)
    assert not collective.judge({**base, "clocks": {"sm_mhz": 345, "sm_max_mhz": 1980}})
    assert not collective.judge({**base, "power": {"draw_w": 300.0, "limit_w": 700.0}})
    assert not collective.judge({**base, "utilization_gpu_pct": 60})
    assert not collective.judge({**base, "lost": True})
    # no clock reading: still the signature (util and power say it), same wording
    assert collective.judge({**base, "clocks": {}})


# -- the idle GPU among a pod's spinning ones (Theano/libgpuarray#387) ---------------------------

from tests.deviceplugin.conftest import host, podres, start_plugin  # noqa: E402,F401 - fixtures

SPIN = (*A100, ("util_gpu", 100), ("power_mw", 70000), ("sm_mhz", 1410), ("clock_reasons", 0))
G = [f"GPU-{i}a1b2c3d-0000-4000-8000-00000000000{i}" for i in range(4)]


def _pod_run(host, podres, start_plugin, gpus, rows):  # noqa: F811
    lib = build_fake_nvml(host.root / LIBDIR, gpus=gpus)
    start_plugin("nvidia-gpu.sock", mode="healthy", nvml_lib=lib, devices=tuple(G))
    podres(rows)
    return run_probe("--host-root", str(host.root), "--only", "gpu.collective", "--only",
                     "deviceplugin", "--trace-seconds", "0")


def _rows(pod, uuids):
    return [{"namespace": "ml", "pod": pod, "container": "main",
             "resource": "nvidia.com/gpu", "device_ids": list(uuids)}]


def test_the_idle_gpu_of_a_pod_whose_other_gpus_spin_is_named(host, podres,  # noqa: F811
                                                              start_plugin):
    """libgpuarray#387: "all GPUs pegged at 100% except for one which is at 0%": three GPUs of
    pod ml/train-0 spin, its fourth is idle -> that one is named, with the pod."""
    gpus = [FakeGpu(G[i], minor=i, attrs=SPIN) for i in range(3)] + [FakeGpu(G[3], minor=3)]
    run = _pod_run(host, podres, start_plugin, gpus, _rows("train-0", G))
    [f] = run.findings("gpu.collective_idle_peer")
    assert f["subject"] == G[3] and f["severity"] == "warning"
    assert f["evidence"]["pod"] == "ml/train-0" and len(f["evidence"]["spinning_gpus"]) == 3
    assert "of pod ml/train-0 is idle (0 %) while 3 of its other GPUs spin" in f["title"]
    assert len(run.findings("gpu.collective_spin")) == 3


def test_an_idle_gpu_of_another_pod_says_nothing(host, podres, start_plugin):  # noqa: F811
    gpus = [FakeGpu(G[i], minor=i, attrs=SPIN) for i in range(3)] + [FakeGpu(G[3], minor=3)]
    run = _pod_run(host, podres, start_plugin, gpus,
                   _rows("train-0", G[:3]) + _rows("notebook", G[3:]))
    assert run.findings("gpu.collective_idle_peer") == []

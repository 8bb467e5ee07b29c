"""NVLink P2P not available between GPUs of one pod that NVLink connects (issue 38 item 1,
third NVLink bullet).

The public case, NVIDIA/nccl#2329 (https://github.com/NVIDIA/nccl/issues/2329, "Should NCCL
validate NVLink P2P status via NVML to allow graceful fallback?"): on degraded hardware an
NVLink is detected by the topology but P2P over it does not work, and NCCL stops with
    P2P is disabled between NVLINK connected GPUs 1 and 0. This should not be the case given
    their connectivity, and is probably due to a hardware issue. If you still want to proceed,
    you can set NCCL_IGNORE_DISABLED_P2P=1.
The reporter's patch asks NVML per pair (ncclNvmlDevicePairs[g1][g2].p2pStatusRead !=
NVML_P2P_STATUS_OK) to skip such paths: NVML's nvmlDeviceGetP2PStatus is the source that sees it
before NCCL does. That is what the NVML child asks here (NVML_P2P_CAPS_INDEX_NVLINK = 2 and
_READ = 0, nvml.h; pynvml 12.x spells _READ as the tuple `0,`, so the child uses the numbers),
only for pairs whose NVLink remote ends (nvmlDeviceGetNvLinkRemotePciInfo_v2) say NVLink joins
them.

PROVEN ONLY ON THE STAND-IN (tests/fakes/fake_nvml.c): no NVLink machine was at hand; what a
real driver answers for the remote PCI info of an NVSwitch port is nvml.h's contract, not a
capture.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

from node_probe.checks.slow import judge, nvlink
from node_probe.host import nvml_child
from tests.deviceplugin.conftest import host, podres  # noqa: F401 - fixtures
from tests.fakes.nvml import FakeGpu, build_fake_nvml
from tests.probe_run import run_probe

REPO = Path(__file__).resolve().parents[2]
LIBDIR = "usr/lib/x86_64-linux-gnu"
A, B, C = "GPU-a0000000-0000-0000-0000-00000000000a", "GPU-b0000000-0000-0000-0000-00000000000b", \
    "GPU-c0000000-0000-0000-0000-00000000000c"
ONLY = ("--only", "gpu.slow", "--only", "deviceplugin", "--trace-seconds", "0")
BUSY = (("util_gpu", 100), ("clock_reasons", 0), ("pcie_gen_cur", 5))


def rec(uuid, index, bus, remote=()):
    return {"uuid": uuid, "index": index, "pci_bus_id": bus, "utilization_gpu_pct": 100,
            "nvlink": [{"link": i, "active": True, "remote_bus_id": r, "errors": {}}
                       for i, r in enumerate(remote)]}


GA = rec(A, 0, "00000000:01:00.0", ["00000000:02:00.0"] * 2)
GB = rec(B, 1, "00000000:02:00.0", ["00000000:01:00.0"] * 2)


def test_a_pod_holding_both_gpus_of_a_pair_without_nvlink_p2p_is_told():
    pairs = [{"a": A, "b": B, "nvlink": "gpu_not_supported", "read": "ok"}]
    [f] = judge.judge_gpus([GA, GB], holders={A: ["ml/train-0"], B: ["ml/train-0"]}, p2p=pairs)
    assert f.id == "gpu.nvlink_degraded" and f.severity == "warning" and f.subject == A
    assert f.evidence["pod"] == "ml/train-0" and f.evidence["peer_uuid"] == B
    assert f.evidence["p2p_nvlink"] == "gpu_not_supported"
    assert "NVLink P2P is not available" in f.title and "ml/train-0" in f.title


def test_p2p_ok_and_pairs_no_pod_holds_together_raise_nothing():
    ok = [{"a": A, "b": B, "nvlink": "ok", "read": "ok"}]
    both = {A: ["ml/train-0"], B: ["ml/train-0"]}
    assert judge.judge_gpus([GA, GB], holders=both, p2p=ok) == []
    bad = [{"a": A, "b": B, "nvlink": "not_supported", "read": "ok"}]
    # two pods, one GPU each: no pod's traffic crosses this pair
    assert nvlink.judge_p2p(bad, [GA, GB], {A: ["ml/a"], B: ["ml/b"]}) == []
    assert nvlink.judge_p2p([{**bad[0], "nvlink": None}], [GA, GB], both) == []


def test_the_child_asks_only_pairs_nvlink_joins():
    nvsw = "00000000:c0:00.0"   # an NVSwitch port: both GPUs' links end there
    gpus = [rec(A, 0, "00000000:01:00.0", ["00000000:02:00.0"]),
            rec(B, 1, "00000000:02:00.0", ["00000000:01:00.0"]),
            rec(C, 2, "00000000:03:00.0")]                      # no NVLink
    assert nvml_child.nvlink_pairs(gpus) == [(0, 1)]
    sw = [rec(A, 0, "00000000:01:00.0", [nvsw]), rec(B, 1, "00000000:02:00.0", [nvsw]),
          rec(C, 2, "00000000:03:00.0")]
    assert nvml_child.nvlink_pairs(sw) == [(0, 1)]
    many = [rec(f"GPU-{i}", i, f"00000000:{i + 1:02x}:00.0", [nvsw]) for i in range(16)]
    assert len(nvml_child.nvlink_pairs(many)) == nvml_child.MAX_P2P_PAIRS   # bounded


def _child(root: Path, lib: Path) -> dict:
    p = subprocess.run([sys.executable, "-m", "node_probe.host.nvml_child", "--host-root",
                        str(root), str(lib)], capture_output=True, text=True, timeout=60,
                       cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    (result,) = [json.loads(x)["result"] for x in p.stdout.splitlines() if '"result"' in x]
    return result


def _gpus(status: int, nvlinks: int = 2):
    links = (("nvlinks", nvlinks),) if nvlinks else ()
    remote = tuple(("nvlink_remote", f"{i},1") for i in range(nvlinks))
    back = tuple(("nvlink_remote", f"{i},0") for i in range(nvlinks))
    return [FakeGpu(A, minor=0, attrs=(*BUSY, *links, *remote, ("p2p", f"1,2,{status}"))),
            FakeGpu(B, minor=1, attrs=(*BUSY, *links, *back)),
            FakeGpu(C, minor=2, attrs=BUSY)]


def test_the_nvml_child_reads_remote_ends_and_p2p_from_the_library(tmp_path):
    root = tmp_path / "host"
    lib = build_fake_nvml(root / LIBDIR, gpus=_gpus(2))
    got = _child(root, lib)
    assert got["status"] == "ok", got
    assert got["gpus"][0]["nvlink"][0]["remote_bus_id"] == "00000000:02:00.0"
    assert got["p2p"] == [{"a": A, "b": B, "nvlink": "gpu_not_supported", "read": "ok"}]


def _probe(host, podres, gpus):  # noqa: F811
    build_fake_nvml(host.root / LIBDIR, gpus=gpus)
    podres([{"namespace": "ml", "pod": "train-0", "container": "main",
             "resource": "nvidia.com/gpu", "device_ids": [A, B, C]}])
    # pod-resources rows reach gpu.slow through the deviceplugin check's fact
    return run_probe(*host.args(*ONLY))


def test_probe_names_the_pod_whose_nvlink_pair_has_no_p2p(host, podres):  # noqa: F811
    run = _probe(host, podres, _gpus(2))
    [f] = run.findings("gpu.nvlink_degraded")
    assert f["evidence"]["pod"] == "ml/train-0" and f["subject"] == A
    assert f["evidence"]["peer_uuid"] == B


def test_probe_healthy_p2p_and_a_pair_without_nvlink_raise_nothing(host, podres):  # noqa: F811
    run = _probe(host, podres, _gpus(0))
    assert [f for f in run.findings() if f["check"] == "gpu.slow"] == [], run.findings()
    [c] = [c for c in run.summary["checks"] if c["id"] == "gpu.slow"]
    assert c["status"] == "ok"
    # no NVLink at all: the stand-in would answer "not_supported" if asked; it is not asked
    host2_gpus = _gpus(5, nvlinks=0)
    build_fake_nvml(host.root / LIBDIR, gpus=host2_gpus)
    run = run_probe(*host.args(*ONLY))
    assert [f for f in run.findings() if f["check"] == "gpu.slow"] == [], run.findings()


def test_the_pod_lead_says_the_pair_not_counters():
    """`pod Y` on the Running pod leads with the pair (not the NVLink counters' words)."""
    from kubectl_gpudoctor.analysis.verdict import decide
    pairs = [{"a": A, "b": B, "nvlink": "gpu_not_supported", "read": "ok"}]
    fs = judge.judge_gpus([GA, GB], holders={A: ["ml/train-0"], B: ["ml/train-0"]}, p2p=pairs)
    v = decide(fs, {"kind": "pod", "name": "ml/train-0", "node": "gpu-1"},
               context={"pod_phase": "Running", "pod_running": True})
    assert v.root_cause == "gpu.nvlink_degraded"
    assert v.headline == ("Pod ml/train-0 runs slow: GPU 0 (00000000:01:00.0): NVLink P2P to "
                          "GPU 1 (00000000:02:00.0) not available")

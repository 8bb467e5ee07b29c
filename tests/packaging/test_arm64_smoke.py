"""The linux/arm64 probe image, run under qemu-user against a Grace-like host root: every check
but eBPF must reach the verdict the amd64 image reaches on the same node (issue 33, item 2).

What it proves: the arm64 image's CPython, grpc/protobuf/pynvml wheels and the probe's NVML
child (ctypes loading an aarch64 libnvidia-ml.so.1 from --host-root) work on arm64, and the
aarch64 driver layout (NVIDIA's aarch64 multiarch library dir, the open kernel module's
/proc/driver/nvidia/version) gives the same findings as the x86_64 one. Each image gets the
host root of its own architecture: the same seed-000 driver (570.158.01, a MIG-partitioned H20
beside a full one; tests/fakes/fake_nvml.c compiled for that machine, aarch64 with Debian's
cross gcc) and the same kernel log. What it cannot prove: BCC on an arm64 kernel (emulation
runs user space only; tracing is skipped in both runs; docs/kernel-headers.md).

Not in the default suite's work: it runs when dist/ holds the arm64 archive (`sudo
GPU_DOCTOR_ARCH=arm64 scripts/build-image.sh`, ~8 min cold under qemu, 50 s warm) and this
machine runs aarch64 binaries (binfmt_misc qemu-aarch64); the release workflow's image job
runs it after building both archives. ~25 s here (the archive load ~10 s, the emulated probe
~11 s)."""
from __future__ import annotations

import json
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from node_probe import __version__
from tests.fakes.nvml import H20_MIXED, SRC, config_text
from tests.packaging.conftest import REPO

pytestmark = [pytest.mark.image, pytest.mark.slow, pytest.mark.root, pytest.mark.arm64]

ARM64_ARCHIVE = REPO / "dist" / f"gpu-doctor-probe-{__version__}-arm64.oci.tar"
BINFMT = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
CC = {"x86_64": "gcc", "aarch64": "aarch64-linux-gnu-gcc"}
DRIVER = "570.158.01"     # seed 000's driver: driver.known_bad
# the open kernel module's banner (NVIDIA/open-gpu-kernel-modules utils.mk GENERATE_NVIDSTRING)
NVRM = ("NVRM version: NVIDIA UNIX Open Kernel Module for {m}  {v}  Release Build  "
        "(dvs-builder@U22-I3-AE18-09-3)  Tue Jun 10 11:07:42 UTC 2025\nGCC version:  gcc 12.2.0\n")
# Xid 79 on the first H20 (tests/core/test_kmsg.py's line, on this node's bus id)
KMSG = ("[ 2200.100000] NVRM: Xid (PCI:0000:01:00): 79, pid='<unknown>', name=<unknown>, "
        "GPU has fallen off the bus.\n")
ARGS = ["--host-root", "/host", "--kmsg-file", "/host/kmsg", "--skip", "trace", "-o", "jsonl",
        "--timeout", "120"]


def grace_like_root(root: Path, machine: str) -> Path:
    """A node of `machine`: the driver library in its multiarch dir, the open module's version
    file, a kubelet dir, the kernel log."""
    lib = root / f"usr/lib/{machine}-linux-gnu"
    lib.mkdir(parents=True)
    r = subprocess.run([CC[machine], "-shared", "-fPIC", "-O1", "-Wall", "-Wno-unused-result",
                        "-o", str(lib / "libnvidia-ml.so.1"), str(SRC), "-ldl"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    (lib / "fake_nvml.conf").write_text(config_text("ok", DRIVER, 12080, H20_MIXED))
    drv = root / "proc/driver/nvidia"
    drv.mkdir(parents=True)
    (drv / "version").write_text(NVRM.format(m=machine, v=DRIVER))
    (root / "var/lib/kubelet/device-plugins").mkdir(parents=True)
    (root / "kmsg").write_text(KMSG)
    return root


@pytest.fixture(scope="module")
def arm64_image():
    """The arm64 archive loaded into a private image store: (store argv, image name)."""
    if not ARM64_ARCHIVE.exists():
        pytest.skip("no arm64 image archive in dist/ (sudo GPU_DOCTOR_ARCH=arm64 "
                    "scripts/build-image.sh builds it under qemu)")
    if not BINFMT.exists():
        pytest.skip("cannot run aarch64 binaries here (no qemu-aarch64 binfmt_misc handler: "
                    "apt-get install qemu-user-static binfmt-support)")
    if shutil.which(CC["aarch64"]) is None:
        pytest.skip("no aarch64 cross compiler for the stand-in NVML (apt-get install "
                    "gcc-aarch64-linux-gnu)")
    from kubectl_gpudoctor.reach.podspec import DEFAULT_IMAGE
    top = Path(tempfile.mkdtemp(prefix="gd-arm-"))      # podman wants a short runroot
    store = ["podman", "--root", str(top / "root"), "--runroot", str(top / "run")]
    try:
        r = subprocess.run(store + ["load", "-q", "-i", str(ARM64_ARCHIVE)], capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0 and DEFAULT_IMAGE in r.stdout, r.stderr
        yield store, DEFAULT_IMAGE
    finally:
        subprocess.run(store + ["rmi", "-a", "-f"], capture_output=True, timeout=120)
        shutil.rmtree(top, ignore_errors=True)


def run_image(store: list[str], image: str, arch: str, root: Path, *args: str,
              entrypoint: str | None = None) -> subprocess.CompletedProcess:
    argv = store + ["run", "--rm", "--arch", arch, "--runtime", "runc", "--network", "none",
                    "--pull", "never", "--ulimit", "nofile=20000:20000",
                    "--ulimit", "nproc=32768:32768", "-v", f"{root}:/host:ro"]
    argv += (["--entrypoint", entrypoint] if entrypoint else []) + [image, *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


def verdict(stdout: str) -> dict:
    recs = [json.loads(line) for line in stdout.splitlines() if line.strip()]
    assert recs and recs[-1]["kind"] == "summary" and recs[-1]["complete"] is True, recs[-1:]
    # memory.pressure judges this machine's memory at that moment: not the node's layout
    findings = [r for r in recs if r["kind"] == "finding" and r["id"] != "memory.pressure"]
    inventory = next(r for r in recs if r.get("id") == "nvml.inventory")["evidence"]
    return {"checks": sorted((c["id"], c["status"]) for c in recs[-1]["checks"]),
            "findings": sorted((f["id"], f["severity"], f["subject"]) for f in findings),
            "gpus": sorted(g["uuid"] for g in inventory["gpus"]),
            "driver": inventory.get("driver_version")}


def test_arm64_image_runs_the_probe_checks_like_the_amd64_image(arm64_image, probe_image_archive,
                                                               tmp_path: Path):
    store, image = arm64_image
    if platform.machine() != "x86_64":
        pytest.skip("compares an emulated arm64 run with this machine's native amd64 image")
    r = run_image(store, image, "arm64", tmp_path, "-c",
                  "import json, platform, grpc, google.protobuf, pynvml, bcc\n"
                  "from node_probe.tracing import kheaders\n"
                  "hs, why = kheaders.find()\n"
                  "print(json.dumps([platform.machine(), hs and hs.to_dict(), why]))",
                  entrypoint="python3")
    assert r.returncode == 0, r.stderr[-2000:]
    machine, headers, why = json.loads(r.stdout)
    assert machine == "aarch64"
    # the image's own set is arm64's, and the probe there takes it for this machine's
    assert headers is not None, why
    assert (headers["machine"], headers["bundle"], headers["path"]) == \
        ("aarch64", "image", "/opt/gpu-doctor/kheaders")
    assert any(p.startswith("linux-headers-") and "-arm64 " in p for p in headers["packages"])

    arm = run_image(store, image, "arm64", grace_like_root(tmp_path / "arm", "aarch64"), *ARGS)
    assert arm.returncode == 1, arm.stderr[-2000:]     # 1: findings at/above --fail-on
    amd = run_image(["podman"], f"localhost/gpu-doctor-probe:{__version__}", "amd64",
                    grace_like_root(tmp_path / "amd", "x86_64"), *ARGS)
    assert amd.returncode == 1, amd.stderr[-2000:]
    got, want = verdict(arm.stdout), verdict(amd.stdout)

    assert got == want
    # and it is the real diagnosis, not two empty runs: NVML answered through the aarch64
    # library, seed 000's driver and the Xid 79 were judged
    assert got["driver"] == DRIVER and len(got["gpus"]) == 2
    ids = {f[0]: f[1] for f in got["findings"]}
    assert ids["driver.known_bad"] == "critical" and "gpu.xid" in ids
    assert ("nvml", "ok") in got["checks"] and "trace" not in dict(got["checks"])
    (layout,) = [r for r in map(json.loads, arm.stdout.splitlines()) if r.get("phase") == "layout"]
    assert layout["driver_root"]["library"] == "/host/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1"

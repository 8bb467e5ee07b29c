"""Fixtures for the checks beyond the seed incidents: a temp host root with the stand-in
libnvidia-ml.so.1, the driver's procfs GPU directories, NVSwitch devices, and real host daemons
(a copy of /bin/sleep under the daemon's name, so /proc/PID/comm and argv[0] are the real
thing). Every process started here is killed and reaped when the test ends."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.nvml import FakeGpu, build_fake_nvml

LIBDIR = "usr/lib/x86_64-linux-gnu"


def make_host(tmp_path: Path, gpus, *, driver_version="570.172.08", kmod_version=None,
              procfs_gpus=None, nvswitches=0, kmsg="", root: Path | None = None,
              libdir: str = LIBDIR) -> tuple[Path, Path]:
    """(host root, kmsg file). procfs_gpus: bus ids under /proc/driver/nvidia/gpus (default:
    those of `gpus`). root: use this host root instead of <tmp_path>/host. libdir: where the
    driver's libnvidia-ml.so.1 is under the host root (a distribution's driver root)."""
    root = root or tmp_path / "host"
    build_fake_nvml(root / libdir, driver_version=driver_version, gpus=gpus)
    drv = root / "proc/driver/nvidia"
    drv.mkdir(parents=True, exist_ok=True)
    (drv / "version").write_text(
        f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {kmod_version or driver_version}  "
        "Tue Jun 10 11:07:42 UTC 2025\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
    for bus in (procfs_gpus if procfs_gpus is not None
                else [g.bus_id[4:].lower() for g in gpus]):
        d = drv / "gpus" / bus
        d.mkdir(parents=True, exist_ok=True)
        uuid = next((g.uuid for g in gpus if g.bus_id[4:].lower() == bus), "GPU-unknown")
        (d / "information").write_text(f"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 42\n"
                                       f"GPU UUID: \t {uuid}\nBus Location: \t {bus}\n")
    for i in range(nvswitches):
        sw = root / "proc/driver/nvidia-nvswitch/devices" / f"0000:{0x80 + i:02x}:00.0"
        sw.mkdir(parents=True, exist_ok=True)
        (sw / "information").write_text("Fabric Status: ...\n")
    kfile = tmp_path / "kmsg.log"
    kfile.parent.mkdir(parents=True, exist_ok=True)
    kfile.write_text(kmsg)
    return root, kfile


def healthy_gpus(n=2, **kw) -> list[FakeGpu]:
    return [FakeGpu(f"GPU-{i:08d}-aaaa-bbbb-cccc-000000000000", "NVIDIA H100 80GB HBM3", i, **kw)
            for i in range(n)]


_CHROOTED = """
import os, sys, time
open("/proc/self/comm", "w").write(sys.argv[2])
os.chroot(sys.argv[1]); os.chdir("/")
os.write(1, b"in\\n")
time.sleep(300)
"""


@pytest.fixture
def chrooted():
    """chrooted(root, name="nvidia-persistenced") -> pid of a live process named `name` (comm
    and argv[0]) whose root is `root`: the host's daemon when `root` is the test's host root."""
    procs: list[subprocess.Popen] = []

    def start(root, name: str = "nvidia-persistenced") -> int:
        root.mkdir(parents=True, exist_ok=True)
        p = subprocess.Popen([name, "-c", _CHROOTED, str(root), name],
                             executable=sys.executable, stdout=subprocess.PIPE)
        procs.append(p)
        assert p.stdout.readline() == b"in\n"
        return p.pid
    yield start
    for p in procs:
        p.kill()
        p.wait(timeout=10)

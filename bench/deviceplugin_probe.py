#!/usr/bin/env python3
"""Cost of the device-plugin side of the probe on this host, with real fake-plugin processes.

Prints medians of N runs (default 5):
  - discovery (socket -> process via /proc/*/net/unix and /proc/*/fd) with 1 and 8 plugins,
    and how many processes the host has (the scan is linear in processes and their fds)
  - the /proc thread view with the nvmlInit stack scan of one plugin process
  - a whole `--only deviceplugin` run against 8 healthy plugins (all RPCs answer)
  - a whole run against one plugin blocked in nvmlInit_v2 (the 5 s GetPreferredAllocation
    deadline dominates; the verdict should follow it by well under a second)
Usage: .venv/bin/python bench/deviceplugin_probe.py [--runs 5]
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from node_probe.host import procfs, proctasks  # noqa: E402
from node_probe.deviceplugin import discovery  # noqa: E402
from tests.fakes.nvml import build_fake_nvml  # noqa: E402

PLUGIN = REPO / "tests" / "fakes" / "fake_device_plugin.py"


def start(sock: Path, *extra: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, str(PLUGIN), "--socket", str(sock), *extra],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert b"READY" in p.stdout.readline()
    return p


def median_s(fn, runs: int) -> float:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def probe(root: Path, *args: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "node_probe", "--host-root", str(root), "-o", "jsonl",
                    "--only", "deviceplugin", *args], cwd=REPO, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=60)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gd-bench-", dir="/tmp"))
    kdir = root / "var/lib/kubelet"
    (kdir / "device-plugins").mkdir(parents=True)
    procs: list[subprocess.Popen] = []
    try:
        procs.append(start(kdir / "device-plugins" / "nvidia-gpu.sock"))
        nproc = sum(1 for _ in procfs.pids())
        d1 = median_s(lambda: discovery.discover(kdir), a.runs)
        for i in range(7):
            procs.append(start(kdir / "device-plugins" / f"nvidia-mig-{i}g.10gb.sock"))
        d8 = median_s(lambda: discovery.discover(kdir), a.runs)
        view = median_s(lambda: proctasks.process_threads(procs[0].pid), a.runs)
        healthy = statistics.median(probe(root, "--trace-seconds", "0") for _ in range(a.runs))
        for p in procs:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
        procs.clear()
        for f in (kdir / "device-plugins").iterdir():
            f.unlink()
        lib = build_fake_nvml(root / "nvml", init="block")
        procs.append(start(kdir / "device-plugins" / "nvidia-gpu.sock", "--mode", "nvml-block",
                           "--nvml-lib", str(lib)))
        blocked = statistics.median(probe(root, "--trace-seconds", "0") for _ in range(max(1, a.runs // 2)))
    finally:
        for p in procs:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
        shutil.rmtree(root, ignore_errors=True)
    print(f"host processes:                          {nproc}")
    print(f"discovery, 1 plugin:                     {d1 * 1000:7.1f} ms")
    print(f"discovery, 8 plugins:                    {d8 * 1000:7.1f} ms")
    print(f"/proc thread view + stack scan, 1 pid:   {view * 1000:7.1f} ms")
    print(f"probe run, 8 healthy plugins (no trace): {healthy:7.2f} s")
    print(f"probe run, 1 plugin blocked in NVML:     {blocked:7.2f} s (5 s RPC deadline)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

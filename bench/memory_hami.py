#!/usr/bin/env python3
"""Cost of the memory and hami node checks on this host, and of the API-side analyses at scale.

Prints medians of N runs:
  - `--only memory --trace-seconds 0` wall time (the 0.5 s window + two /proc sweeps)
  - one /proc sweep (PSI, vmstat, meminfo, every /proc/PID/stat) as the memory check does it
  - one HAMi discovery sweep (every /proc/PID/environ, filtered)
  - kubectl_gpudoctor.analysis.{hami,memory}.analyze_node over 1,000 synthetic nodes x 30 pods
Usage: .venv/bin/python bench/memory_hami.py [--runs 5]
"""
from __future__ import annotations

import argparse
import datetime as dt
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kubectl_gpudoctor.analysis.scheduling import hami as hami_api  # noqa: E402
from kubectl_gpudoctor.analysis.resources import memory as memory_api  # noqa: E402
from node_probe.checks import hami, memory  # noqa: E402


def timed(fn, runs):
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def fleet(n_nodes=1000, pods_per_node=30):
    uuid = "GPU-03f69c50-207a-2038-9b45-23cac89cb67d"
    nodes = []
    for i in range(n_nodes):
        node = {"metadata": {"name": f"gpu-{i}", "annotations": {
            "hami.io/node-nvidia-register": f"{uuid},10,46068,100,NVIDIA-NVIDIA A40,0,true:" * 8,
            "hami.io/node-handshake": "Requesting_2024.05.14 07:09:50",
            "hami.io/mutex.lock": "2024-05-14T07:00:00Z,default,p-0"}},
            "status": {"capacity": {"memory": "64956716Ki"}, "allocatable": {"memory": "64956716Ki"}}}
        pods = [{"metadata": {"name": f"p-{j}", "namespace": "default", "uid": f"u{i}-{j}",
                              "annotations": {"hami.io/vgpu-devices-allocated": f"{uuid},NVIDIA,3000,30:;",
                                              "hami.io/bind-phase": "success"}},
                 "spec": {"containers": [{"resources": {"limits": {"memory": "2Gi",
                                                                   "nvidia.com/gpu": "1"}}}]},
                 "status": {"phase": "Running"}} for j in range(pods_per_node)]
        nodes.append((node, pods))
    return nodes


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    probe = [sys.executable, "-m", "node_probe", "-o", "jsonl", "--only", "memory",
             "--trace-seconds", "0"]
    wall = timed(lambda: subprocess.run(probe, cwd=REPO, capture_output=True, check=False), a.runs)
    sweep = timed(lambda: memory.sample(Path("/proc")), a.runs)
    disc = timed(lambda: hami.discover(Path("/proc"), None), a.runs)
    n_procs = len(memory.sample(Path("/proc")).procs)
    nodes = fleet()
    now = dt.datetime(2024, 5, 14, 7, 10, tzinfo=dt.timezone.utc)

    def api():
        for node, pods in nodes:
            hami_api.analyze_node(node, pods, [], now, all_pods_index={})
            memory_api.analyze_node(node, pods, None)
    api_s = timed(api, max(1, a.runs // 2))
    print(f"processes on this host:                       {n_procs}")
    print(f"probe --only memory --trace-seconds 0 (wall): {wall:.3f} s")
    print(f"memory sample (PSI+vmstat+meminfo+all stat):  {sweep * 1000:.1f} ms")
    print(f"hami discovery (all environ, filtered):       {disc * 1000:.1f} ms")
    print(f"API-side hami+memory, 1000 nodes x 30 pods:   {api_s:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

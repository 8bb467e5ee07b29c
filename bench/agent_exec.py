"""Benchmark: `kubectl gpu-doctor node X --trace-seconds 0` through the standing agent, end to end.

Method: the fake API server (tests/kubectl/fakeexec.py: kmock over TCP, websocket exec with the
v5/v4 channel protocol) serves a healthy node with a Running agent pod; its exec runs the REAL
node probe (`python3 -m node_probe ... --host-root /host`, /host mapped to this machine's /) as
the container process would. The clock runs from the CLI process start to its exit: interpreter
start, kubernetes import, API-side reads (node, pods, Lease, events, configz, healthz, goroutine
dump), agent lookup and namespace check, exec handshake, the probe's full run, rendering. Also
timed: the probe alone (`python3 -m node_probe --trace-seconds 0`), to separate the plugin's
cost from the probe's. Prints the numbers; asserts nothing.

    .venv/bin/python bench/agent_exec.py [--runs 5]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.kubectl.fakeexec import PROBE_NS, ExecCluster, local_probe_argv  # noqa: E402
from tests.kubectl.kubelet_dump import healthy_kubelet_dump  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    fc = ExecCluster()
    fc.namespaces["gpu-doctor"] = {PROBE_NS: "true"}
    fc.add_node("gpu-1")
    fc.add_pod("ml", "train-0", "gpu-1", gpus=1)
    fc.goroutines["gpu-1"] = healthy_kubelet_dump()
    fc.configz["gpu-1"] = {"cpuManagerPolicy": "none", "cgroupDriver": "systemd"}
    fc.add_agent_pod("gpu-1")
    fc.exec_argv = local_probe_argv("/")
    fc.start()
    env = dict(os.environ, PYTHONPATH=str(REPO), NO_COLOR="1")
    walls, probe_walls = [], []
    try:
        with tempfile.TemporaryDirectory() as d:
            kc = fc.kubeconfig(Path(d) / "kc")
            for i in range(a.runs + 1):  # run 0 warms the page cache; not counted
                t0 = time.monotonic()
                r = subprocess.run([sys.executable, "-m", "kubectl_gpudoctor", "node", "gpu-1",
                                    "--kubeconfig", str(kc), "-o", "json",
                                    "--trace-seconds", "0"],
                                   capture_output=True, text=True, env=env, timeout=120)
                wall = time.monotonic() - t0
                doc = json.loads(r.stdout)
                via = {c["id"]: c.get("message", "") for c in doc["checks"]}.get("node.probe")
                t1 = time.monotonic()
                subprocess.run([sys.executable, "-m", "node_probe", "-o", "jsonl",
                                "--trace-seconds", "0", "--timeout", "60"],
                               capture_output=True, env=env, timeout=120)
                probe = time.monotonic() - t1
                if i:
                    walls.append(wall)
                    probe_walls.append(probe)
                print(f"{'warm-up' if i == 0 else f'run {i}'}: node X via agent {wall:.2f}s "
                      f"(exit {r.returncode}, {via}); probe alone {probe:.2f}s")
    finally:
        fc.stop()
    print(f"median: node X via agent {statistics.median(walls):.2f}s, probe alone "
          f"{statistics.median(probe_walls):.2f}s, plugin + API + exec "
          f"{statistics.median(walls) - statistics.median(probe_walls):.2f}s over {len(walls)} "
          f"runs (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs); "
          f"budget 2 s (turn-2 target 3 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: `kubectl gpu-doctor nodes` over 1,000 GPU nodes and 30,000 pods (budget < 5 s).

DESIGN.md section 8: API-side analysis with O(1) list calls, under 5 s. Serves a fake API
server (kmock, over TCP, pods with realistic bulk: managedFields, projected token volume,
tolerations) and times the real CLI as a user runs it (a fresh process: interpreter start,
kubernetes import, four lists, json.loads, analysis, rendering). Prints the numbers; it does
not assert them (timing belongs in benchmarks, not in tests).

    .venv/bin/python bench/nodes_scale.py [--nodes 1000] [--pods 30000] [--runs 3]
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

from tests.kubectl.fakecluster import FakeCluster, build_fleet  # noqa: E402

LISTS = ("/api/v1/nodes", "/api/v1/pods", "/api/v1/events",
         "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=30000)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    fc = FakeCluster()
    t = time.monotonic()
    build_fleet(fc, a.nodes, a.pods, wedged=(3, 500, 997), fat=True, cpu_nodes=10)
    pods_bytes = len(json.dumps(list(fc.pods.values())))
    print(f"fleet: {a.nodes} GPU nodes + 10 CPU nodes, {len(fc.pods)} pods "
          f"({pods_bytes / 2**20:.1f} MiB of pod JSON), {len(fc.events)} events; "
          f"built in {time.monotonic() - t:.1f}s")
    fc.cache_lists = True  # a real API server serves resourceVersion=0 lists from its cache,
    fc.start()             # on its own CPUs; only the first run pays the fake's encoding
    times = []
    try:
        with tempfile.TemporaryDirectory() as d:
            kc = fc.kubeconfig(Path(d) / "kc")
            env = dict(os.environ, PYTHONPATH=str(REPO), NO_COLOR="1")
            for i in range(a.runs + 1):  # run 0 warms the fake's list cache; not counted
                before = len(fc.requests())
                t0 = time.monotonic()
                r = subprocess.run([sys.executable, "-m", "kubectl_gpudoctor", "nodes",
                                    "--kubeconfig", str(kc), "-o", "json"],
                                   capture_output=True, text=True, env=env, timeout=300)
                dt = time.monotonic() - t0
                if i:
                    times.append(dt)
                reqs = fc.requests()[before:]
                lists = sum(1 for m, p, _ in reqs if p in LISTS)
                doc = json.loads(r.stdout)
                stalled = sum(1 for f in doc["findings"] if f["id"] == "kubelet.admission_stalled")
                checks = {c["id"]: c["duration_s"] for c in doc["checks"]}
                print(f"{'warm-up' if i == 0 else f'run {i}'}: {dt:.2f}s wall (exit {r.returncode}); {lists} list calls, "
                      f"{len(reqs) - lists} per-node calls; {stalled} stalled nodes found; "
                      f"in-process: lists {checks.get('api.list_pods_events_leases', 0):.2f}s, "
                      f"analysis done at {checks.get('api.analysis', 0):.2f}s")
    finally:
        fc.stop()
    med = statistics.median(times)
    print(f"median {med:.2f}s, best {min(times):.2f}s over {len(times)} runs "
          f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs); budget 5.0s -> "
          f"{'OK' if med < 5.0 else 'OVER BUDGET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

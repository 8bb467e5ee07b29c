"""Benchmark: the Pending-pod GPU fit (analysis/scheduling/fit.py) over large clusters.

The fit is one pass over the pods (what each node holds) and one over the nodes (capacity,
allocatable, placement): linear in nodes + pods. This prints
1. the pure computation (fit.compute + findings, and the `nodes` FREE column) at several sizes,
   with the cost per object, so linearity is visible;
2. `kubectl gpu-doctor pod NAME --no-probe -o json` as a user runs it (a fresh process) against
   the fake API server holding 1,000 GPU nodes and 30,000 realistic pods (3 list calls).
It prints numbers and does not assert them (timing belongs in benchmarks, not in tests).

    .venv/bin/python bench/fit_scale.py [--sizes 250:7500,1000:30000,5000:150000] [--runs 3]
"""
from __future__ import annotations

import argparse
import datetime as dt
import gc
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

from kubectl_gpudoctor.analysis.scheduling import fit, fit_findings, gpu_held  # noqa: E402
from tests.kubectl.fakecluster import FakeCluster, build_fleet, fatten  # noqa: E402


def cluster(nodes: int, pods: int) -> tuple[FakeCluster, dict]:
    fc = FakeCluster()
    names = build_fleet(fc, nodes, pods, fat=True, cpu_nodes=10)
    for i, n in enumerate(names):  # some placement to evaluate: a tainted pool, a labelled one
        node = fc.nodes[n]
        if i % 4 == 0:
            node["spec"]["taints"] = [{"key": "dedicated", "value": "infer",
                                       "effect": "NoSchedule"}]
        node["metadata"]["labels"]["pool"] = "a100" if i % 2 else "h100"
    p = fc.add_pod("ml", "trainer-0", None, phase="Pending", gpus=8, age_s=300)
    fatten(p)
    p["spec"]["nodeSelector"] = {"pool": "a100"}
    return fc, p


def time_pure(nodes: int, pods: int, runs: int) -> None:
    fc, pod = cluster(nodes, pods)
    node_list, pod_list = list(fc.nodes.values()), list(fc.pods.values())
    now = dt.datetime.now(dt.timezone.utc)
    gc.disable()  # as the CLI runs (no cycles in API JSON)
    ts, case = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        f = fit.compute(pod, node_list, pod_list, now)
        fs = fit_findings.findings(pod, f, (), now)
        ts.append(time.perf_counter() - t0)
        case = fs[0].id
    by_node: dict = {}
    for p in pod_list:
        by_node.setdefault((p.get("spec") or {}).get("nodeName"), []).append(p)
    t0 = time.perf_counter()
    free = [gpu_held.node_free(n, by_node.get(n["metadata"]["name"], [])) for n in node_list]
    t_free = time.perf_counter() - t0
    gc.enable()
    med = statistics.median(ts)
    objs = len(node_list) + len(pod_list)
    print(f"pure fit: {len(node_list):>5} nodes + {len(pod_list):>6} pods: median "
          f"{med * 1000:7.1f} ms ({med / objs * 1e6:.2f} us per object) -> {case}; "
          f"FREE column for every node {t_free * 1000:.1f} ms "
          f"({sum(x or 0 for x in free)} free GPUs)")


def time_cli(nodes: int, pods: int, runs: int) -> None:
    fc, _ = cluster(nodes, pods)
    fc.cache_lists = True  # a real API server serves resourceVersion=0 lists from its cache
    fc.start()
    times = []
    try:
        with tempfile.TemporaryDirectory() as d:
            kc = fc.kubeconfig(Path(d) / "kc")
            env = dict(os.environ, PYTHONPATH=str(REPO), NO_COLOR="1")
            for i in range(runs + 1):  # run 0 warms the fake's list cache; not counted
                before = len(fc.requests())
                t0 = time.monotonic()
                r = subprocess.run([sys.executable, "-m", "kubectl_gpudoctor", "pod",
                                    "trainer-0", "-n", "ml", "--no-probe", "-o", "json",
                                    "--kubeconfig", str(kc)],
                                   capture_output=True, text=True, env=env, timeout=300)
                wall = time.monotonic() - t0
                doc = json.loads(r.stdout)
                reqs = fc.requests()[before:]
                checks = {c["id"]: c for c in doc["checks"]}
                fitc = checks.get("api.gpu_fit") or {}
                ids = [f["id"] for f in doc["findings"]]
                if i:
                    times.append(wall)
                print(f"{'warm-up' if i == 0 else f'run {i}'}: {wall:.2f}s wall, report says "
                      f"{doc['duration_s']:.2f}s; {len(reqs)} API calls; fit (lists + "
                      f"analysis) {fitc.get('duration_s', 0):.2f}s; {ids}")
    finally:
        fc.stop()
    print(f"pod NAME over {nodes} nodes / {pods} pods: median {statistics.median(times):.2f}s, "
          f"best {min(times):.2f}s over {len(times)} runs (load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="250:7500,1000:30000,5000:150000")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-cli", action="store_true")
    a = ap.parse_args()
    for size in a.sizes.split(","):
        n, p = (int(x) for x in size.split(":"))
        time_pure(n, p, a.runs)
    if not a.no_cli:
        time_cli(1000, 30000, a.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())

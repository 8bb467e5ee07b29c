#!/usr/bin/env python3
"""Wall time of a `local` run on this host against the DESIGN.md section 8 budgets.

Prints, each as the median of N runs (default 5), wall and CPU (the CLI and its probe child):
  - time to the first record on stdout          (budget: under 1 s)
  - full run without tracing (--trace-seconds 0) (budget: under 1.5 s)
  - full run with the default trace window (5 s) (budget: trace window + 2 s)
  - `python -c pass`, the floor any Python command starts from
Runs the probe exactly as `kubectl gpu-doctor local` does: a child process printing NDJSON.
Usage: .venv/bin/python bench/local_wall.py [--runs 5] [--cmd probe|kubectl]
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from installed_env import installed_env  # bench/, beside this script

REPO = Path(__file__).resolve().parent.parent


def one(cmd: list[str]) -> tuple[float, float, float, int]:
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=REPO,
                         env=installed_env())  # bytecode as installed
    first = None
    for _ in p.stdout:
        if first is None:
            first = time.monotonic() - t0
    rc = p.wait()
    wall = time.monotonic() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)   # the CLI and its probe
    return first or float("nan"), wall, cpu, rc


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cmd", choices=("probe", "kubectl"), default="probe")
    a = ap.parse_args()
    if a.cmd == "kubectl":
        exe = shutil.which("kubectl-gpu_doctor", path=str(REPO / ".venv/bin")) or "kubectl-gpu_doctor"
        base = [exe, "local", "-o", "jsonl"]
    else:
        base = [sys.executable, "-m", "node_probe", "-o", "jsonl"]
    one(base + ["--trace-seconds", "0"])  # writes the bytecode an install would have
    rows = []
    for label, extra, budget in (("no tracing", ["--trace-seconds", "0"], 1.5),
                                 ("default trace window (5 s)", [], 5 + 2)):
        firsts, walls, cpus = [], [], []
        for _ in range(a.runs):
            f, w, c, rc = one(base + extra)
            firsts.append(f)
            walls.append(w)
            cpus.append(c)
        rows.append((label, statistics.median(firsts), statistics.median(walls),
                     statistics.median(cpus), budget, rc))
    bare = [one([sys.executable, "-c", "pass"]) for _ in range(a.runs)]
    print(f"{'run':30} {'first record':>13} {'wall (median)':>14} {'cpu (median)':>13} "
          f"{'budget':>8}  exit")
    for label, f, w, c, budget, rc in rows:
        ok = "ok" if w <= budget and f <= 1.0 else "OVER"
        print(f"{label:30} {f:12.3f}s {w:13.3f}s {c:12.3f}s {budget:7.1f}s  {rc}  {ok}")
    print(f"{'python -c pass (the floor)':30} {'':13} {statistics.median(b[1] for b in bare):13.3f}s "
          f"{statistics.median(b[2] for b in bare):12.3f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

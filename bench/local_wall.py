#!/usr/bin/env python3
"""Wall time of a `local` run on this host against the DESIGN.md section 8 budgets.

Prints, each as the median of N runs (default 5):
  - time to the first record on stdout          (budget: under 1 s)
  - full run without tracing (--trace-seconds 0) (budget: under 1.5 s)
  - full run with the default trace window (5 s) (budget: trace window + 2 s)
Runs the probe exactly as `kubectl gpu-doctor local` does: a child process printing NDJSON.
Usage: .venv/bin/python bench/local_wall.py [--runs 5] [--cmd probe|kubectl]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def one(cmd: list[str]) -> tuple[float, float, int]:
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=REPO)
    first = None
    for _ in p.stdout:
        if first is None:
            first = time.monotonic() - t0
    rc = p.wait()
    return first or float("nan"), time.monotonic() - t0, rc


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
    rows = []
    for label, extra, budget in (("no tracing", ["--trace-seconds", "0"], 1.5),
                                 ("default trace window (5 s)", [], 5 + 2)):
        firsts, walls = [], []
        for _ in range(a.runs):
            f, w, rc = one(base + extra)
            firsts.append(f)
            walls.append(w)
        rows.append((label, statistics.median(firsts), statistics.median(walls), budget, rc))
    print(f"{'run':30} {'first record':>13} {'wall (median)':>14} {'budget':>8}  exit")
    for label, f, w, budget, rc in rows:
        ok = "ok" if w <= budget and f <= 1.0 else "OVER"
        print(f"{label:30} {f:12.3f}s {w:13.3f}s {budget:7.1f}s  {rc}  {ok}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

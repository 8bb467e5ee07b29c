"""Benchmark: peak RSS and wall time of `kubectl gpu-doctor replay` on the largest bundles replay
accepts, against the CLI's 512 MiB bound (issue 28: replaying 150,000 findings `-o json` peaked
at 712 MiB, table at 415 MiB).

Bundles (each within replay's own bounds: report/bundle_io.MAX_BUNDLE_BYTES of JSON and
MAX_CONTAINERS objects/arrays, so the CLI reads them all):
  audit    150,000 copies of a real finding (the smallest finding of tests/kubectl/data/
           probe_stream.ndjson, a recorded probe stream: nvml.init_hang) with distinct
           subjects: the audit's findings_150k case
  count    as many findings as the bounds allow, each as small as check_report accepts (id,
           severity, subject): the most Python objects a bundle can make
  fat      findings whose titles and evidence strings fill the 64 MiB: the most bytes
Each bundle is written by a child process (this process stays small: a child inherits its
parent's RSS high-water mark across fork+exec on Linux), then the real CLI runs on it in a
fresh process per format; its peak RSS is ru_maxrss from wait4(). Prints the numbers; asserts
nothing.

    .venv/bin/python bench/replay_scale.py [--bundles audit,count,fat] [--formats json,table]
    .venv/bin/python bench/replay_scale.py --baseline DIR   # DIR: `git archive REV | tar -x -C DIR`
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BOUND_MIB = 512

WRITER = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from kubectl_gpudoctor.report import bundle, bundle_io
kind, out = sys.argv[2], sys.argv[3]
limit = bundle_io.MAX_BUNDLE_BYTES - 4096
rep = {"target": {"kind": "node", "name": "gpu-1", "node": "gpu-1"}, "version": "0.1.0",
       "started_at": 1795319200.0, "fail_on": "warning", "exit_code": 1, "checks": [],
       "findings": []}
if kind == "audit":
    with open(sys.argv[4]) as f:   # the smallest: 150,000 of it fit in the 64 MiB
        base = min((r for r in map(json.loads, (l for l in f if l.startswith("{")))
                    if r.get("kind") == "finding"), key=lambda r: len(json.dumps(r)))
    base.pop("schema", None); base.pop("kind", None)
    rep["findings"] = [dict(base, subject=f"s{i}") for i in range(150_000)]
elif kind == "count":
    n = bundle_io.MAX_CONTAINERS - 10
    rep["findings"] = [{"id": "gpu.xid", "severity": "warning", "subject": f"s{i}"}
                       for i in range(n)]
else:  # fat: ~4 KiB per finding until the bundle is full
    text = "x" * 2000
    n = limit // 4200
    rep["findings"] = [{"id": "gpu.xid", "severity": "warning", "subject": f"s{i}",
                        "title": text, "evidence": {"message": text}} for i in range(n)]
doc = {"schema": bundle.SCHEMA, "report": rep}
data = json.dumps(doc, separators=(",", ":"))
while len(data) > limit:   # trim to the bound replay accepts
    rep["findings"] = rep["findings"][: int(len(rep["findings"]) * limit / len(data)) - 1]
    data = json.dumps(doc, separators=(",", ":"))
with open(out, "w") as f:
    f.write(data)
print(len(rep["findings"]), len(data))
"""


def write_bundle(kind: str, path: Path) -> tuple[int, int]:
    r = subprocess.run([sys.executable, "-c", WRITER, str(REPO), kind, str(path),
                        str(REPO / "tests/kubectl/data/probe_stream.ndjson")],
                       capture_output=True, text=True, check=True)
    n, size = r.stdout.split()
    return int(n), int(size)


def run_cli(tree: Path, bundle: Path, fmt: str) -> tuple[int, float, float]:
    """(exit code, wall seconds, peak RSS MiB) of `replay BUNDLE -o FMT` from `tree`."""
    env = dict(os.environ, PYTHONPATH=str(tree), NO_COLOR="1")
    t0 = time.monotonic()
    with open(os.devnull, "wb") as null:
        p = subprocess.Popen([sys.executable, "-m", "kubectl_gpudoctor", "replay", str(bundle),
                              "-o", fmt], stdout=null, stderr=subprocess.PIPE, env=env,
                             cwd=str(tree))
        err = p.stderr.read()
        _, status, usage = os.wait4(p.pid, 0)
    rc = os.waitstatus_to_exitcode(status)
    if rc not in (0, 1, 4):
        print(f"   stderr: {err.decode(errors='replace')[-300:]}")
    return rc, time.monotonic() - t0, usage.ru_maxrss / 1024


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundles", default="audit,count,fat")
    ap.add_argument("--formats", default="json,table")
    ap.add_argument("--baseline", default=None,
                    help="another checkout: its CLI runs on the same bundles, alternately")
    a = ap.parse_args()
    trees = [("this tree", REPO)] + ([("baseline", Path(a.baseline).resolve())]
                                     if a.baseline else [])
    worst: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="gd-replay-") as d:
        for kind in a.bundles.split(","):
            path = Path(d) / f"{kind}.json"
            n, size = write_bundle(kind, path)
            print(f"bundle {kind}: {n:,} findings, {size / 2**20:.1f} MiB", flush=True)
            for fmt in a.formats.split(","):
                for label, tree in trees:
                    rc, wall, rss = run_cli(tree, path, fmt)
                    worst[label] = max(worst.get(label, 0.0), rss)
                    print(f"  -o {fmt:6} [{label}]: exit {rc}, {wall:.1f}s, peak RSS "
                          f"{rss:.0f} MiB", flush=True)
            path.unlink()
    for label, rss in worst.items():
        print(f"[{label}] worst peak RSS {rss:.0f} MiB; bound {BOUND_MIB} MiB -> "
              f"{'OK' if rss < BOUND_MIB else 'OVER'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

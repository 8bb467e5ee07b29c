"""`python -m node_probe agent-history list|get N`: read the evidence ring, nothing else.

Why: the client reaches the agent's bundles through the exec path it already has into the agent
pod; this command is what it runs there. Read-only, bounded: `list` prints one JSON line per
bundle (newest first, at most MAX_LIST), `get N` prints bundle N of that list (at most the
client's replay limit).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .ring import DEFAULT_RING, Ring, RingError

MAX_LIST = 100
MAX_GET = 64 * 1024 * 1024


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpu-doctor-probe agent-history")
    p.add_argument("action", choices=("list", "get"))
    p.add_argument("n", nargs="?", type=int, default=None)
    p.add_argument("--evidence-dir", type=Path, default=DEFAULT_RING)
    try:
        a = p.parse_args(argv)
    except SystemExit as exc:
        return 2 if exc.code else 0
    if a.action == "get" and (a.n is None or a.n < 1):
        print("gpu-doctor-probe agent-history: error: get needs N >= 1 (see list)",
              file=sys.stderr)
        return 2
    ring = Ring(a.evidence_dir, create=False)
    try:
        entries = list(reversed(ring.entries()))[:MAX_LIST] if a.evidence_dir.exists() else []
        if a.action == "list":
            for i, e in enumerate(entries, 1):
                sys.stdout.write(json.dumps({"n": i, **e}) + "\n")
            return 0
        if a.n > len(entries):
            print(f"gpu-doctor-probe agent-history: error: no bundle {a.n} "
                  f"({len(entries)} kept)", file=sys.stderr)
            return 2
        sys.stdout.buffer.write(ring.read(entries[a.n - 1]["name"], MAX_GET))
        return 0
    except RingError as exc:
        print(f"gpu-doctor-probe agent-history: error: {exc}", file=sys.stderr)
        return 3

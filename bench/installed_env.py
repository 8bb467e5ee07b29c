"""The environment a benchmark runs the tool in: the one it was started with, as an installed copy sees it.

Why: an installed gpu-doctor runs from compiled bytecode (pip compiles at install, the krew
build is frozen, the agent image is built with it), while a sandbox or CI shell may set
PYTHONDONTWRITEBYTECODE=1. A benchmark that passes that on makes every timed process compile
the sources it imports again: measured on `local --trace-seconds 0`, 0.34 s of CPU instead of
0.21 s and the first record at 0.65 s instead of 0.11 s (bench/local_wall.py, 2026-11-29).
The first (warm-up) run writes the bytecode; the timed runs use it.
"""
from __future__ import annotations

import os


def installed_env(**extra: str) -> dict[str, str]:
    """os.environ without PYTHONDONTWRITEBYTECODE, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(extra)
    return env

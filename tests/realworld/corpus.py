"""Every corpus module, found by name: tests/realworld/corpus_*.py, each with a list ARTIFACTS.

Why: the corpus grows in several branches at once (kernel log, API objects, container starts);
a module added to this folder is counted and fed without anyone editing a list of imports.
"""
from __future__ import annotations

import importlib
from pathlib import Path

from .artifact import Artifact

HERE = Path(__file__).parent


def module_names() -> list[str]:
    return sorted(p.stem for p in HERE.glob("corpus_*.py"))


def artifacts(channels: set[str] | frozenset[str] | None = None) -> list[Artifact]:
    """Every artifact of every corpus module (in module order), or those of `channels`."""
    out: list[Artifact] = []
    for name in module_names():
        mod = importlib.import_module(f"{__package__}.{name}")
        out.extend(a for a in mod.ARTIFACTS if channels is None or a.channel in channels)
    return out

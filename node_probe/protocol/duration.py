"""Durations as kubectl users type them, for both CLIs: Go's `time.ParseDuration` syntax
(`60s`, `2m`, `1m30s`, `500ms`, `1h`, `1.5h`) or bare seconds (`60`, `2.5`).

Why in the protocol package: the kubectl plugin (click) and the node probe (argparse, stdlib
only) must accept exactly the same spellings and reject the same nonsense (`nan`, `inf`,
`-5s`, `5x`), and the protocol package is the one both may import. `parse` is the only parser;
the plugin wraps it in one click ParamType (kubectl_gpudoctor/params.py), the probe in
`argparse_type`.
"""
from __future__ import annotations

import math
import re

_UNITS = {"ns": 1e-9, "us": 1e-6, "\u00b5s": 1e-6, "\u03bcs": 1e-6, "ms": 1e-3, "s": 1.0,
          "m": 60.0, "h": 3600.0}
_TERM = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")
_BARE = re.compile(r"(\d+\.?\d*|\.\d+)")
MAX_S = 365 * 24 * 3600.0  # a year: anything longer is a typo, and keeps float math exact


class DurationError(ValueError):
    pass


def parse(text: str) -> float:
    """Seconds (finite, >= 0) from `text`; DurationError (one clear sentence) otherwise."""
    s = str(text).strip()
    if not s:
        raise DurationError("empty duration")
    if _BARE.fullmatch(s):
        value = float(s)
    else:
        pos, value = 0, 0.0
        for m in _TERM.finditer(s):
            if m.start() != pos:
                break
            value += float(m.group(1)) * _UNITS[m.group(2)]
            pos = m.end()
        if pos != len(s) or pos == 0:
            raise DurationError(
                f"{text!r} is not a duration (use seconds or Go-style units: 60s, 2m, "
                f"1m30s, 500ms, 1h)")
    if not math.isfinite(value) or value > MAX_S:
        raise DurationError(f"{text!r} is not a usable duration (at most {MAX_S / 86400:g} "
                            f"days)")
    return value


def argparse_type(minimum: float = 0.0, exclusive: bool = False):
    """An argparse `type=` that parses a duration and checks its lower bound."""
    import argparse

    def convert(text: str) -> float:
        try:
            value = parse(text)
        except DurationError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if value < minimum or (exclusive and value == minimum):
            raise argparse.ArgumentTypeError(
                f"{text!r} must be {'more than' if exclusive else 'at least'} {minimum:g}s")
        return value
    convert.__name__ = "duration"
    return convert

"""Durations as kubectl users type them and read them, for both CLIs.

In: Go's `time.ParseDuration` syntax (`60s`, `2m`, `1m30s`, `500ms`, `1h`, `1.5h`) or bare
seconds (`60`, `2.5`). Out: kubectl's own way of printing an age (`human`, the AGE column of
`kubectl get`: `119s`, `3m10s`, `70m`, `3h1m`, `47h`, `2d1h`, `8d`, `2y1d`).

Why in the protocol package: the kubectl plugin (click) and the node probe (argparse, stdlib
only) must accept exactly the same spellings and reject the same nonsense (`nan`, `inf`,
`-5s`, `5x`), and print every age, wait and deadline the same way in titles, evidence, the
fleet table and the summary line; the protocol package is the one both may import. `parse` is
the only parser (the plugin wraps it in one click ParamType, kubectl_gpudoctor/params.py, the
probe in `argparse_type`) and `human` the only formatter (evidence.fmt_duration and the
client's analysis.common.fmt_duration are this function).
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


def human(seconds: float | None) -> str:
    """`seconds` as kubectl prints an age: apimachinery's `duration.HumanDuration`
    (k8s.io/apimachinery/pkg/util/duration), which gives two or three significant figures
    (`119s`, `2m`, `3m10s`, `10m`, `179m`, `3h`, `3h1m`, `8h`, `47h`, `2d`, `2d1h`, `8d`,
    `729d`, `2y`, `2y1d`, `8y`), "0s" for up to 2 s in the future (clock skew) and `<invalid>`
    beyond. One addition: a fraction of a second under 10 s keeps one decimal (`0.3s`,
    `2.5s`), where HumanDuration would truncate a 0.5 s deadline to `0s`. `?` for None (not
    known); anything that is not a finite number is shown as it is."""
    if seconds is None:
        return "?"
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) \
            or not math.isfinite(seconds):
        return str(seconds)
    s = float(seconds)
    if s < 0:
        return "<invalid>" if int(s) < -1 else "0s"
    if s < 9.95 and s != int(s):
        return f"{s:.1f}s"
    sec = int(s)
    if sec < 120:
        return f"{sec}s"
    minutes = sec // 60
    if minutes < 10:
        return f"{minutes}m{sec % 60}s" if sec % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = sec // 3600
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y{days}d" if days else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"

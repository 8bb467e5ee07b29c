"""Numbers the BPF C and its loader must agree on, read from the C itself.

Why: event kinds, fd kinds, array sizes and path caps used to be copied by hand into Python
and drifted silently. Their one home is the #define in bpf/ (the program or the header it
includes); a loader asks `Constants("nvidia_dev").NVDEV_EV_SLOW_IOCTL` and gets the value the
compiler sees. Only plain integer defines are read (decimal, hex, negative, U/L suffixes);
options a loader passes as -D are its own and are not looked up here.
"""
from __future__ import annotations

import re
from typing import Any

from . import sources

_DEFINE = re.compile(r"^\s*#\s*define\s+([A-Z][A-Z0-9_]*)\s+(-?(?:0[xX][0-9a-fA-F]+|\d+))[uUlL]*"
                     r"\s*(?:/\*.*\*/)?\s*$")


def parse_defines(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        m = _DEFINE.match(line)
        if m:
            out[m.group(1)] = int(m.group(2), 0)
    return out


class Constants:
    """The integer #defines of bpf/<program>.bpf.c (or of a header, "include/<name>.h") and
    the headers it includes, read on first use (so importing a loader never needs the C
    sources)."""

    def __init__(self, program: str) -> None:
        self._program = program
        self._values: dict[str, int] | None = None

    def _load(self) -> dict[str, int]:
        if self._values is None:
            p = self._program
            text = (sources.header_text(p.removeprefix("include/")) if p.endswith(".h")
                    else sources.unit_text([p]))
            self._values = parse_defines(text)
        return self._values

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        values = self._load()
        try:
            return values[name]
        except KeyError:
            where = self._program if self._program.endswith(".h") else f"{self._program}.bpf.c"
            raise AttributeError(f"{name} is not an integer #define in bpf/{where} "
                                 "or its headers") from None

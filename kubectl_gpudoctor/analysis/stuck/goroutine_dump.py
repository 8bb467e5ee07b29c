"""Parse the kubelet's goroutine dump (`debug/pprof/goroutine?debug=2`) into goroutines with their
state, wait time and frames. Pure text parsing, shared by the device-plugin (goroutines.py) and
DRA (dra.py) verdicts."""
from __future__ import annotations

import dataclasses
import re
from typing import Sequence




# ASCII digits, bounded: int() of a 5,000-digit id raises, `\d` also takes non-ASCII digits
_HEADER = re.compile(r"^goroutine ([0-9]{1,20})\b[^\[]*\[([^\]]*)\]:\s*$")
_MINUTES = re.compile(r"\b([0-9]{1,12}) minutes?")


@dataclasses.dataclass
class Goroutine:
    id: int
    state: str
    wait_minutes: int | None
    frames: list[str]

    def has(self, needles: Sequence[str]) -> bool:
        return any(n in f for f in self.frames for n in needles)

    @property
    def call(self) -> str:
        text = "\n".join(self.frames)
        if "GetPreferredAllocation" in text:
            return "GetPreferredAllocation"
        if "PreStartContainer" in text or "preStartContainer" in text:
            return "PreStartContainer"
        if ").Allocate" in text or ").allocate" in text:
            return "Allocate"
        return "device manager"


def parse_dump(text: str) -> list[Goroutine]:
    """Parse `debug=2` output: a header line per goroutine, then function/file line pairs."""
    out: list[Goroutine] = []
    cur: Goroutine | None = None
    for line in text.splitlines():
        m = _HEADER.match(line)
        if m:
            state = m.group(2)
            mm = _MINUTES.search(state)
            cur = Goroutine(int(m.group(1)), state.split(",")[0].strip(),
                            int(mm.group(1)) if mm else None, [])
            out.append(cur)
            continue
        if cur is None or not line.strip():
            continue
        if line.startswith(("\t", " ")):
            continue  # file:line +0x.. of the previous function
        cur.frames.append(line.strip())
    return out


def func_name(frame: str) -> str:
    """`pkg.(*T).Method(0xc0.., {...})` -> `pkg.(*T).Method` (arguments are noise)."""
    frame = frame.strip()
    if frame.endswith(")"):
        depth = 0
        for i in range(len(frame) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(frame[i], 0)
            if depth == 0:
                return frame[:i]
    return frame



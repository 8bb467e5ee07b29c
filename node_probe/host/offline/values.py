"""Values as nvidia-smi prints them (`16x`, `65 %`, `300.00 W`, `89 C`, `N/A`) into numbers,
and the clock event reason lines into NVML's bitmask. Shared by the text and XML readers."""
from __future__ import annotations

import re
from typing import Iterable, Mapping

_NUM = re.compile(r"^\s*([+-]?[0-9]{1,12}(?:\.[0-9]{1,6})?)\s*(?:x|%|W|C|MHz|MiB|bank\(s\))?\s*$")
_INT_X = re.compile(r"^\s*x([0-9]{1,3})\s*$")      # lspci-style width, for completeness


_BUS_ID = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]$")
_UUID = re.compile(r"^GPU-[0-9A-Za-z-]{1,64}$")


def bus_id(v: str | None) -> str | None:
    """A PCI bus id as nvidia-smi prints it (`00000000:3B:00.0`), else None: a pasted file's
    text never becomes a subject or a title unless it has that shape."""
    v = (v or "").strip()
    return v if _BUS_ID.match(v) else None


def uuid(v: str | None) -> str | None:
    v = (v or "").strip()
    return v if _UUID.match(v) else None


def number(v: str | None) -> float | None:
    """`300.00 W` -> 300.0; `N/A`, `Unknown Error`, '' -> None."""
    if v is None:
        return None
    m = _NUM.match(v)
    if not m:
        m2 = _INT_X.match(v)
        return float(m2.group(1)) if m2 else None
    return float(m.group(1))


def integer(v: str | None) -> int | None:
    """`16x` -> 16, `65 %` -> 65, `0x3` -> None (not a count), `N/A` -> None."""
    f = number(v)
    return None if f is None or f != int(f) else int(f)


def mib_bytes(v: str | None) -> int | None:
    f = number(v)
    return None if f is None else int(f * (1 << 20))


def yes_no(v: str | None) -> bool | None:
    s = (v or "").strip().lower()
    return True if s == "yes" else False if s == "no" else None


def total(vals: Iterable[str | None]) -> int | None:
    """The sum of the counters nvidia-smi printed as numbers; None when it printed none."""
    nums = [integer(v) for v in vals]
    nums = [n for n in nums if n is not None]
    return sum(nums) if nums else None


def reason_mask(states: Mapping[str, str | None], bits: Mapping[str, int]) -> int | None:
    """NVML's clock event reason bitmask from `Active` / `Not Active` lines; None when no
    known line said either (a GPU or driver that does not report reasons)."""
    mask, seen = 0, False
    for name, bit in bits.items():
        s = (states.get(name) or "").strip().lower()
        if s == "active":
            mask |= bit
            seen = True
        elif s == "not active":
            seen = True
    return mask if seen else None

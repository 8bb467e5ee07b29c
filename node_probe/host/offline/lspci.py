"""`lspci -vvv` text into one PCIe link record per PCI function (contract b of
node_probe/checks/slow: the shape the sysfs reader yields).

Why: `LnkCap` (what the function can do) and `LnkSta` (what it trained at, `(downgraded)` since
pciutils 3.6) are what people paste when a GPU runs slow, with the AER status lines of the
same function. The bridge above a function is the one whose `Bus: primary=.., secondary=..`
line names the function's bus (`upstream`; None when the text has no such bridge). Hex dumps
(`-xxxx`, as nvidia-bug-report.sh adds) and any other line are skipped; one pass, one
function's lines at a time, then one pass to link each function to its bridge.
"""
from __future__ import annotations

import re
from typing import Iterable, Iterator

from node_probe.host.offline import UnknownFormat

# `3b:00.0 3D controller: NVIDIA ...`, `0000:3b:00.0 ...` (-D), `3b:00.0 3D controller [0302]:`
DEV_RE = re.compile(r"^(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])\s+"
                    r"(.{0,300})$")
LNKCAP_RE = re.compile(r"^\s+LnkCap:\s+(.*)$")
LNKSTA_RE = re.compile(r"^\s+LnkSta:\s+(.*)$")
SPEED_RE = re.compile(r"Speed ([0-9]{1,3}(?:\.[0-9]{1,2})?)GT/s")
WIDTH_RE = re.compile(r"Width x([0-9]{1,2})\b")
AER_RE = re.compile(r"^\s+(UESta|CESta):\s+(.*)$")
DEVSTA_RE = re.compile(r"^\s+DevSta:\s+(.*)$")
# a bridge's `Bus: primary=00, secondary=3b, subordinate=3b, sec-latency=0`: the functions on
# its secondary bus sit below it, so `upstream` is known from `lspci -vvv` alone
BUS_RE = re.compile(r"^\s+Bus: primary=([0-9a-fA-F]{2}), secondary=([0-9a-fA-F]{2}),")
NUMA_RE = re.compile(r"^\s+NUMA node:\s+([0-9]{1,4})\s*$")
DRIVER_RE = re.compile(r"^\s+Kernel driver in use:\s+(\S{1,64})\s*$")
FLAG_RE = re.compile(r"([A-Za-z][A-Za-z0-9]{0,31})([+-])")
MAX_FUNCTIONS = 65536


def looks_like(lines: list[str]) -> bool:
    return any(DEV_RE.match(line) for line in lines) and \
        any(line.lstrip().startswith(("Control:", "Status:", "Capabilities:", "LnkSta:",
                                      "Subsystem:")) for line in lines)


def bdf(dom: str | None, bus: str, dev: str, fn: str) -> str:
    """The normalised key: `0000:3b:00.0` (lower case, 4-digit domain)."""
    return f"{int(dom or '0', 16):04x}:{bus.lower()}:{dev.lower()}.{fn}"


def _speed(text: str) -> float | None:
    m = SPEED_RE.search(text)
    return float(m.group(1)) if m else None


def _width(text: str) -> int | None:
    m = WIDTH_RE.search(text)
    return int(m.group(1)) if m else None


def _set_flags(text: str) -> list[str]:
    return [name for name, sign in FLAG_RE.findall(text) if sign == "+"]


def _record(key: str, desc: str, lines: list[str]) -> dict:
    rec: dict = {"bdf": key, "description": desc, "speed_cur_gts": None, "width_cur": None,
                 "speed_max_gts": None, "width_max": None, "upstream": None,
                 "downgraded": False, "aer": None, "numa_node": None, "driver": None}
    cap = sta = None
    aer: dict = {}
    for line in lines:
        if cap is None and (m := LNKCAP_RE.match(line)):
            cap = m.group(1)
        elif sta is None and (m := LNKSTA_RE.match(line)):
            sta = m.group(1)
        elif m := AER_RE.match(line):
            key_ = "uncorrectable" if m.group(1) == "UESta" else "correctable"
            aer.setdefault(key_, _set_flags(m.group(2)))
        elif m := DEVSTA_RE.match(line):
            aer.setdefault("device_status", _set_flags(m.group(1)))
        elif m := BUS_RE.match(line):
            rec["secondary_bus"] = m.group(2).lower()
        elif m := NUMA_RE.match(line):
            rec["numa_node"] = int(m.group(1))
        elif m := DRIVER_RE.match(line):
            rec["driver"] = m.group(1)
    if cap is not None:
        rec["speed_max_gts"], rec["width_max"] = _speed(cap), _width(cap)
    if sta is not None:
        rec["speed_cur_gts"], rec["width_cur"] = _speed(sta), _width(sta)
        if "(downgraded)" in sta or "(ok)" in sta:      # pciutils >= 3.6 says it
            rec["downgraded"] = "(downgraded)" in sta
        else:                                           # older lspci: compare the two
            rec["downgraded"] = any(
                c is not None and m_ is not None and c < m_
                for c, m_ in ((rec["speed_cur_gts"], rec["speed_max_gts"]),
                              (rec["width_cur"], rec["width_max"])))
    if aer:
        rec["aer"] = aer
    return rec


def _blocks(lines: Iterable[str]) -> Iterator[tuple[str, str, list[str]]]:
    key = desc = None
    body: list[str] = []
    n = 0
    for line in lines:
        m = DEV_RE.match(line)
        if m:
            if key is not None:
                yield key, desc or "", body
                n += 1
                if n >= MAX_FUNCTIONS:
                    return
            key, desc, body = bdf(*m.group(1, 2, 3, 4)), m.group(5).strip(), []
        elif key is not None and line[:1].isspace():
            if len(body) < 4096:            # a function's lines kept (hex dumps included)
                body.append(line)
        elif key is not None and line.strip():
            yield key, desc or "", body
            n += 1
            key, body = None, []
    if key is not None:
        yield key, desc or "", body


def parse(lines: Iterable[str]) -> dict[str, dict]:
    """bdf -> link record of every PCI function in `lspci -vvv` text (functions without a
    PCIe link capability have speeds and widths None); UnknownFormat when it holds none.
    `upstream` is the bridge whose secondary bus the function is on, when the text has it."""
    out = {key: _record(key, desc, body) for key, desc, body in _blocks(lines)}
    if not out:
        raise UnknownFormat("no `BB:DD.F description` line of `lspci -vvv`")
    below = {(k[:4], r["secondary_bus"]): k for k, r in out.items() if r.get("secondary_bus")}
    for k, r in out.items():
        up = below.get((k[:4], k[5:7]))
        if up is not None and up != k:
            r["upstream"] = up
    return out


def is_nvidia_gpu(rec: dict) -> bool:
    """An NVIDIA display/3D controller (not its audio function, not an NVSwitch bridge)."""
    d = rec.get("description") or ""
    return "NVIDIA" in d and ("VGA compatible controller" in d or "3D controller" in d)

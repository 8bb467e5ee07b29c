"""PCIe Advanced Error Reporting (AER) lines in the kernel log, joined to the GPU they concern.

Why: when a GPU drops off its PCIe link, the first witness is the kernel's AER driver, not the
NVIDIA driver: the root or switch port above the GPU reports an uncorrected fatal error
(often "Surprise Down Error"), the kernel broadcasts error_detected to the devices below it,
and the nvidia driver, which has no AER callbacks, "can't recover (no error_detected
callback)" / "device has no AER-aware driver". Only then does the driver log Xid 79. A reader
of Xids alone says "reset the GPU" or blames the application; the AER lines say the link is
gone and the node needs a reboot.

The formats are the kernel's (drivers/pci/pcie/aer.c and err.c): `<driver> <bdf>: AER:
Corrected error received: <source>` / `Uncorrected (Non-Fatal) ...` / `Uncorrected (Fatal)
...`, `PCIe Bus Error: severity=<...>, type=<layer>, (<agent> ID)` (with or without the `AER:`
word: older kernels print it bare), the status bits as `[ 5] Surprise Down Error`, `[14]
CmpltTO` (`Completion Timeout` on older kernels), and err.c's `AER: can't recover (no
error_detected callback)` / `device has no AER-aware driver`; pciehp's `Slot(N): Link Down`
is the surprise link down without AER. A line names the device that logged it (the port, or
the GPU itself: `nvidia 0000:3b:00.0: ...`); the GPU behind a port is found (a) from an
`nvidia <bdf>` line of the same report (the broadcast), (b) from sysfs topology under the host
root (the GPU's /sys/bus/pci/devices link runs through its upstream ports), or (c) by an Xid 79
on a GPU right after a fatal report (`caused_xid`). A corrected error on a port with no GPU
below it is not our business and stays quiet.

Pure and line-at-a-time, bounded like host/xid.py's Grouper.
"""
from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

CORRECTED, NONFATAL, FATAL = "corrected", "nonfatal", "fatal"
_RANK = {CORRECTED: 1, NONFATAL: 2, FATAL: 3}

# `pcieport 0000:00:02.0: <rest>` / `nvidia 0000:3b:00.0: <rest>`
_DEV_RE = re.compile(r"(?:^|\s)([a-z][a-z0-9_-]{0,31}) ([0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]):"
                     r"\s+(.*)$")
_RECEIVED_RE = re.compile(r"(?:AER: )?(?:Multiple )?(Corrected|Uncorrected \(Non-Fatal\)|"
                          r"Uncorrected \(Fatal\)) error (?:received|message received)")
_SEVERITY_RE = re.compile(r"PCIe Bus Error: severity=(Corrected|Uncorrected \(Non-Fatal\)|"
                          r"Uncorrected \(Fatal\)|Uncorrectable \(Non-Fatal\)|Uncorrectable "
                          r"\(Fatal\))")
_BIT_RE = re.compile(r"^\[\s?([0-9]{1,2})\] ([A-Za-z][A-Za-z0-9 ]{1,40}?)\s*(?:\(First\))?$")
_CANT_RECOVER = ("can't recover (no error_detected callback)", "device has no AER-aware driver")
_LINK_DOWN_RE = re.compile(r"pciehp: Slot\([0-9a-z-]{1,16}\): Link Down")
# the status bits the finding names (aer.c's aer_uncorrectable_error_string / correctable)
SURPRISE_DOWN = "Surprise Down Error"
COMPLETION_TIMEOUT = ("CmpltTO", "Completion Timeout")
MAX_DEVICES = 64
MAX_BITS = 8
MAX_LINE = 300
REPORT_LINES = 24        # lines after a report's head that still belong to it


def _sev(text: str) -> str:
    if "Fatal" in text and "Non-Fatal" not in text:
        return FATAL
    return NONFATAL if "Uncorrect" in text else CORRECTED


@dataclasses.dataclass(frozen=True)
class AerDevice:
    """Every AER report one PCIe device (a port, or the GPU itself) logged."""
    bdf: str
    driver: str                 # the driver name the kernel printed: pcieport, nvidia, ...
    worst: str                  # corrected / nonfatal / fatal
    counts: tuple[tuple[str, int], ...]
    bits: tuple[str, ...]       # status bits named: Surprise Down Error, CmpltTO, ...
    cant_recover: tuple[str, ...]   # devices below it whose driver could not recover
    link_down: int
    gpus: tuple[str, ...]       # nvidia devices named in its reports (the broadcast)
    first_fatal_s: float | None
    first_fatal_line: int | None
    last_s: float | None
    sample: str

    @property
    def surprise_down(self) -> bool:
        return SURPRISE_DOWN in self.bits or self.link_down > 0

    @property
    def completion_timeout(self) -> bool:
        return any(b in self.bits for b in COMPLETION_TIMEOUT)


class Reader:
    """Fold kernel log lines one at a time into one record per PCIe device."""

    def __init__(self) -> None:
        self.acc: dict[str, dict] = {}
        self.dropped = 0
        self._current: str | None = None     # the device whose report is being read
        self._left = 0

    def _dev(self, bdf: str, driver: str) -> dict | None:
        d = self.acc.get(bdf)
        if d is None:
            if len(self.acc) >= MAX_DEVICES:
                self.dropped += 1
                return None
            d = self.acc[bdf] = {"driver": driver, "counts": {}, "bits": [], "cant": [],
                                 "link_down": 0, "gpus": [], "first_fatal_s": None,
                                 "first_fatal_line": None, "last_s": None, "sample": ""}
        if driver == "nvidia":
            d["driver"] = driver
        return d

    def feed(self, ts: float | None, msg: str, lineno: int = 0) -> bool:
        """Read one line; True when it was part of an AER report (or a pciehp link down)."""
        if "AER" not in msg and "PCIe Bus Error" not in msg and "pciehp" not in msg \
                and self._left <= 0:
            return False
        m = _DEV_RE.search(msg)
        if not m:
            return False
        driver, bdf, rest = m.group(1), m.group(2).lower(), m.group(3).strip()
        head = _RECEIVED_RE.search(rest) or _SEVERITY_RE.search(rest)
        if head:
            sev = _sev(head.group(1))
            d = self._dev(bdf, driver)
            if d is None:
                return True
            if _RECEIVED_RE.search(rest) or self._current != bdf:
                d["counts"][sev] = d["counts"].get(sev, 0) + 1
            if sev == FATAL and d["first_fatal_line"] is None:
                d["first_fatal_s"], d["first_fatal_line"] = ts, lineno
            d["last_s"] = ts
            d["sample"] = f"{driver} {bdf}: {rest}"[:MAX_LINE]
            self._current, self._left = bdf, REPORT_LINES
            return True
        if _LINK_DOWN_RE.search(rest):
            d = self._dev(bdf, driver)
            if d is not None:
                d["link_down"] += 1
                d["last_s"] = ts
                d["sample"] = d["sample"] or f"{driver} {bdf}: {rest}"[:MAX_LINE]
                if d["first_fatal_line"] is None:
                    d["first_fatal_s"], d["first_fatal_line"] = ts, lineno
            return True
        if self._left <= 0 or self._current is None:
            return False
        self._left -= 1
        cur = self.acc.get(self._current)
        if cur is None:
            return False
        bit = _BIT_RE.match(rest)
        if bit:
            name = bit.group(2).strip()
            if name not in cur["bits"] and len(cur["bits"]) < MAX_BITS:
                cur["bits"].append(name)
            return True
        if any(c in rest for c in _CANT_RECOVER):
            if bdf not in cur["cant"] and len(cur["cant"]) < MAX_BITS:
                cur["cant"].append(bdf)
        if driver == "nvidia" and bdf != self._current and bdf not in cur["gpus"] \
                and len(cur["gpus"]) < MAX_BITS:
            cur["gpus"].append(bdf)
        return True

    def devices(self) -> list[AerDevice]:
        out = []
        for bdf, d in self.acc.items():
            counts = d["counts"]
            if d["link_down"]:
                worst = FATAL
            else:
                worst = max(counts, key=lambda s: _RANK[s]) if counts else CORRECTED
            out.append(AerDevice(bdf, d["driver"], worst, tuple(sorted(counts.items())),
                                 tuple(d["bits"]), tuple(d["cant"]), d["link_down"],
                                 tuple(d["gpus"]), d["first_fatal_s"], d["first_fatal_line"],
                                 d["last_s"], d["sample"]))
        return out


# -- sysfs topology ----------------------------------------------------------------------------

_BDF_RE = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def upstream_ports(sys_pci_devices: Path | None, bdf: str) -> tuple[str, ...]:
    """The PCIe devices above `bdf` (root port first), read from the link
    /sys/bus/pci/devices/<bdf> -> ../../../devices/pci0000:00/0000:00:02.0/0000:02:00.0
    (read as text: the link is not followed out of the host root)."""
    if sys_pci_devices is None:
        return ()
    try:
        target = os.readlink(sys_pci_devices / bdf)
    except OSError:
        return ()
    parts = [p.lower() for p in target.split("/")[:32]]
    if bdf.lower() not in parts:
        return ()
    return tuple(p for p in parts[:parts.index(bdf.lower())] if _BDF_RE.match(p))


def full_bdf(bus: str) -> str | None:
    """`0000:3b:00` / `00000000:3B:00.0` / `3b:00.0` -> `0000:3b:00.0`; None when it does not
    parse."""
    b = bus.strip().lower()
    if b.startswith("pci:"):
        b = b[4:]
    parts = b.split(":")
    if len(parts) == 2:
        parts = ["0000"] + parts
    if len(parts) != 3:
        return None
    dom, bus_, devfn = parts
    dev, _, fn = devfn.partition(".")
    fn = fn or "0"
    try:
        return f"{int(dom, 16):04x}:{int(bus_, 16):02x}:{int(dev, 16):02x}.{int(fn, 16)}"
    except ValueError:
        return None

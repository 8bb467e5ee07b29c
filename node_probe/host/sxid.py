"""NVSwitch SXid errors: the NVSwitch driver's own Xid lines, grouped per switch and code.

Why: on HGX/DGX nodes the GPUs talk through NVSwitches, and a switch fault stalls the NVLink
traffic of every GPU behind it (the GPUs then log Xid 45 or 74, or nothing, and NCCL hangs).
The switch driver reports it in the kernel log as an SXid, not an Xid, so a tool that reads only
`NVRM: Xid` is silent on exactly the fault that explains the hang.

The format is the driver's (NVIDIA/open-gpu-kernel-modules, src/common/nvswitch:
`"nvidia-%s: SXid (PCI:" NVLINK_PCI_DEV_FMT "): %05d, " _fmt`): one report is several lines of
one code, e.g. `nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44 Minion Link
DLREQ interrupt`, `..., 22013, Severity 0 Engine instance 44 Sub-engine instance 00`,
`..., 22013, Data {0x0000002b, ...}`. The fatality is in words (`Fatal` / `Non-fatal`) on one of
the lines; the driver's word decides, as for NVLink5 Xids. A report without the word (a pasted
`grep 12028`) falls back on NVIDIA's Fabric Manager user guide, which lists the SXids by class:
non-fatal (no impact; the hardware corrected it), fatal (the NVLink traffic through the port
stalls; CUDA jobs abort with Xid 45) and always fatal (the whole fabric). The classes below carry
those lists, with the guide's names, for the codes the guide documents
(https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/index.html, "NVSwitch SXid
Errors"); recovery from a fatal SXid on a bare-metal node is a reset of the GPUs and NVSwitches
with the fabric manager restarted, which in practice is a node reboot.

Pure and line-at-a-time, bounded like host/xid.py's Grouper.
"""
from __future__ import annotations

import dataclasses
import re

FM_GUIDE_URL = ("https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/"
                "index.html")

NONFATAL, FATAL, ALWAYS_FATAL, UNKNOWN = "nonfatal", "fatal", "always_fatal", "unknown"

# the Fabric Manager user guide's SXid tables (names as the guide gives them)
_NONFATAL = {
    11012: "Single bit ECC errors", 11021: "Single bit ECC errors",
    11022: "Single bit ECC errors", 11023: "Single bit ECC errors",
    12021: "Single bit ECC errors", 12023: "Single bit ECC errors",
    15008: "Single bit ECC errors", 15011: "Single bit ECC errors",
    19049: "Single bit ECC errors", 19055: "Single bit ECC errors",
    19057: "Single bit ECC errors", 19059: "Single bit ECC errors",
    19062: "Single bit ECC errors", 19065: "Single bit ECC errors",
    19068: "Single bit ECC errors", 19071: "Single bit ECC errors",
    24001: "Single bit ECC errors", 24002: "Single bit ECC errors",
    24003: "Single bit ECC errors", 20001: "TX Replay Error", 20009: "RX Short Error Rate",
    20012: "Broken/inconsistent connection", 22013: "Minion Link DLREQ interrupt",
}
_FATAL = {
    11001: "ingress invalid command", 11004: "Ingress invalid ACL",
    11009: "ingress invalid VCSet", 11013: "ingress header DBE", 11018: "ingress RID DBE",
    11019: "ingress RLAN DBE", 11020: "ingress control parity",
    12001: "egress crossbar overflow", 12002: "egress packet route",
    12022: "egress input ECC DBE error", 12024: "egress output ECC DBE error",
    12025: "egress credit overflow", 12026: "egress destination request ID error",
    12027: "egress destination response ID error",
    12028: "egress non-posted PRIV error", 12030: "egress control parity error",
    12031: "egress credit parity error", 12032: "egress flit type mismatch",
    14017: "TS ATO timeout", 15001: "route buffer over/underflow",
    15006: "route transdone over/underflow", 15009: "route GLT DBE", 15010: "route parity",
    15012: "route incoming DBE", 15013: "route credit parity",
    19047: "NCISOC HDR ECC DBE Error", 19048: "NCISOC DAT ECC DBE Error",
    19054: "HDR RAM ECC DBE Error", 19056: "DAT0 RAM ECC DBE Error",
    19058: "DAT1 RAM ECC DBE Error", 19060: "CREQ RAM HDR ECC DBE Error",
    19061: "CREQ RAM DAT ECC DBE Error", 19063: "Response RAM HDR ECC DBE Error",
    19064: "Response RAM DAT ECC DBE Error", 19066: "COM RAM HDR ECC DBE Error",
    19067: "COM RAM DAT ECC DBE Error", 19069: "RSP1 RAM HDR ECC DBE Error",
    19070: "RSP1 RAM DAT ECC DBE Error", 19084: "AN1 Heartbeat Timeout Error",
    20034: "LTSSM Fault Up", 22012: "Minion Link NA interrupt",
    24004: "sourcetrack TCEN0 crubmstore DBE", 24005: "sourcetrack TCEN0 TD crubmstore DBE",
    24006: "sourcetrack TCEN1 crubmstore DBE", 24007: "sourcetrack timeout error",
}
_ALWAYS_FATAL = {
    12020: "egress sequence ID error", 22003: "Minion Halt", 22011: "Minion exterror",
    **{c: "ingress/egress buffer or credit error (always fatal)" for c in range(23001, 23018)},
}


def describe(code: int) -> tuple[str, str]:
    """(class, name) of an SXid code by the Fabric Manager guide; UNKNOWN when not listed."""
    for cls, table in ((ALWAYS_FATAL, _ALWAYS_FATAL), (FATAL, _FATAL), (NONFATAL, _NONFATAL)):
        if code in table:
            return cls, table[code]
    return UNKNOWN, ""


# `nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44 ...`; bounded digits
SXID_RE = re.compile(r"(nvidia-nvswitch[0-9]{1,3}): SXid \(PCI:([0-9a-fA-F:.]{7,16})\):\s*"
                     r"([0-9]{1,6}),\s?(.{0,300})")
_WORD_RE = re.compile(r"^(Fatal|Non-fatal),")
_LINK_RE = re.compile(r"\bLink ([0-9]{1,3})\b")
MAX_GROUPS = 256        # (switch, code) pairs kept; a node has at most a dozen switches
MAX_LINKS = 32
MAX_MESSAGE = 300


@dataclasses.dataclass(frozen=True)
class SxidGroup:
    """Every line of one SXid code on one NVSwitch."""
    switch: str             # the driver's device name, nvidia-nvswitchN
    pci: str
    code: int
    lines: int
    fatal: int              # lines that said `Fatal,`
    nonfatal: int           # lines that said `Non-fatal,`
    links: tuple[int, ...]
    first_s: float | None
    last_s: float | None
    sample: str             # the line that described it (the word line when there was one)

    @property
    def klass(self) -> str:
        """The driver's word first, then the Fabric Manager guide's class for the code."""
        if self.fatal:
            return ALWAYS_FATAL if describe(self.code)[0] == ALWAYS_FATAL else FATAL
        if self.nonfatal:
            return NONFATAL
        return describe(self.code)[0]

    @property
    def severity(self) -> str:
        return {FATAL: "critical", ALWAYS_FATAL: "critical", NONFATAL: "info"}.get(
            self.klass, "warning")


_RANK = {ALWAYS_FATAL: 4, FATAL: 3, UNKNOWN: 2, NONFATAL: 1}


class Grouper:
    """Fold SXid lines one at a time; memory bounded by MAX_GROUPS and MAX_MESSAGE bytes."""

    def __init__(self) -> None:
        self.acc: dict[tuple[str, int], dict] = {}
        self.dropped = 0

    def feed(self, ts: float | None, msg: str) -> bool:
        """True when the line was an SXid line."""
        if "SXid" not in msg:
            return False
        m = SXID_RE.search(msg)
        if not m:
            return False
        switch, pci, code, rest = m.group(1), m.group(2).lower(), int(m.group(3)), m.group(4)
        key = (pci, code)
        d = self.acc.get(key)
        if d is None:
            if len(self.acc) >= MAX_GROUPS:
                self.dropped += 1
                return True
            d = self.acc[key] = {"switch": switch, "lines": 0, "fatal": 0, "nonfatal": 0,
                                 "links": [], "first_s": ts, "last_s": ts, "sample": ""}
        d["lines"] += 1
        if ts is not None:
            d["first_s"] = ts if d["first_s"] is None else min(d["first_s"], ts)
            d["last_s"] = ts if d["last_s"] is None else max(d["last_s"], ts)
        w = _WORD_RE.match(rest)
        if w:
            d["fatal" if w.group(1) == "Fatal" else "nonfatal"] += 1
            d["sample"] = m.group(0)[:MAX_MESSAGE]
            lm = _LINK_RE.search(rest)
            if lm and len(d["links"]) < MAX_LINKS and int(lm.group(1)) not in d["links"]:
                d["links"].append(int(lm.group(1)))
        elif not d["sample"]:
            d["sample"] = m.group(0)[:MAX_MESSAGE]
        return True

    def groups(self) -> list[SxidGroup]:
        return [SxidGroup(d["switch"], pci, code, d["lines"], d["fatal"], d["nonfatal"],
                          tuple(d["links"]), d["first_s"], d["last_s"], d["sample"])
                for (pci, code), d in self.acc.items()]


def per_switch(groups: list[SxidGroup]) -> list[tuple[str, list[SxidGroup]]]:
    """The groups of each NVSwitch (by PCI address, first appearance), worst class first."""
    out: dict[str, list[SxidGroup]] = {}
    for g in groups:
        out.setdefault(g.pci, []).append(g)
    return [(pci, sorted(gs, key=lambda g: (-_RANK[g.klass],
                                            -(g.last_s if g.last_s is not None else -1.0),
                                            g.code)))
            for pci, gs in out.items()]

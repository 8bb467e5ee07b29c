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
from pathlib import Path

FM_GUIDE_URL = ("https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/"
                "index.html")

NONFATAL, FATAL, ALWAYS_FATAL, UNKNOWN = "nonfatal", "fatal", "always_fatal", "unknown"

OTHER = "other"          # the guide's "Other Notable NVSwitch SXid Errors" (not fatal alone)
DATA = Path(__file__).resolve().parent.parent / "protocol" / "data" / "sxid_catalog.tsv"
# what a code cuts (the data file's last column; its header says each in words)
CUTS = ("none", "throughput", "link", "precedes_fatal", "gpu_traffic", "gpu_port", "fabric")
CUTS_TEXT = {
    "none": "nothing: the switch corrected it",
    "throughput": "the port's NVLink throughput (replays, single-lane mode)",
    "link": "the link: a broken or inconsistent connection",
    "precedes_fatal": "nothing yet: usually followed by a fatal SXid on the same port",
    "gpu_traffic": "the NVLink traffic of the GPU on that port (its CUDA jobs abort, Xid 45)",
    "gpu_port": "the GPU on that port (every partition across it on a trunk port)",
    "fabric": "every GPU behind the NVSwitches (the whole fabric)",
}
_TABLES = {NONFATAL, FATAL, ALWAYS_FATAL, OTHER}


class CatalogError(ValueError):
    pass


def parse_table(text: str) -> dict[int, tuple[str, str, str]]:
    """{sxid: (class, name, cuts)} from the data file's text; CatalogError on a bad row."""
    out: dict[int, tuple[str, str, str]] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#") or line.startswith("sxid\t"):
            continue
        f = line.split("\t")
        if len(f) != 4 or not f[0].isdigit() or not f[1] or f[2] not in _TABLES \
                or f[3] not in CUTS:
            raise CatalogError(f"line {n}: {line!r} is not `sxid<TAB>name<TAB>table<TAB>cuts`")
        if int(f[0]) in out:
            raise CatalogError(f"line {n}: SXid {f[0]} twice")
        out[int(f[0])] = (f[2], f[1], f[3])
    return out


def _load() -> dict[int, tuple[str, str, str]]:
    try:
        return parse_table(DATA.read_text(encoding="utf-8"))
    except OSError:
        return {}


TABLE = _load()


def describe(code: int) -> tuple[str, str]:
    """(class, name) of an SXid code by the Fabric Manager guide; UNKNOWN when not listed.
    The guide's "other notable" SXids read as non-fatal (not fatal by themselves)."""
    row = TABLE.get(code)
    if row is None:
        return UNKNOWN, ""
    return (NONFATAL if row[0] == OTHER else row[0]), row[1]


def cuts(code: int) -> str | None:
    """What the code cuts (a key of CUTS_TEXT), None when the guide does not list it."""
    row = TABLE.get(code)
    return row[2] if row else None


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
    def cuts(self) -> str | None:
        c = cuts(self.code)
        if self.fatal and c in (None, "none", "throughput", "link", "precedes_fatal"):
            return "gpu_port"          # the driver says Fatal: the port's traffic is cut
        return c

    @property
    def severity(self) -> str:
        """Fatal classes are critical; a non-fatal code by what it cuts: the GPU's traffic
        (the guide lists 11004 and 12028 as non-fatal to the fabric, but the GPU's CUDA jobs
        abort) critical, or a warning when the driver itself said Non-fatal; throughput, link
        and codes that precede a fatal one a warning; corrected ones informational."""
        k = self.klass
        if k in (FATAL, ALWAYS_FATAL):
            return "critical"
        if k == UNKNOWN:
            return "warning"
        c = cuts(self.code)
        if c == "gpu_traffic":
            return "warning" if self.nonfatal else "critical"
        return "info" if c in (None, "none") else "warning"


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

"""`nvidia-bug-report.log` (or its `.gz`: gzip members appended one per section) split into the
sections the probe's checks read: `nvidia-smi --query`, `nvidia-smi nvlink --status`, `lspci
-nnDvvvxxxx` (or any `lspci -vvv`), and the kernel log (`dmesg:`, else the `Scanning kernel log
files for NVIDIA kernel messages:` section).

Why: the bug report is the one file NVIDIA asks for, and it holds all three. The script writes
each section after a line of underscores and a blank line, then a header (the command it ran,
e.g. `/usr/bin/nvidia-smi --query`, or `dmesg:`). One pass: the nvidia-smi and lspci lines are
kept (bounded), the kernel log is copied to a file for the existing kernel-log check to read as
it reads any `--kmsg-file` (no second kernel-log parser).
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import IO

from node_probe.host.offline import UnknownFormat, bounded, lspci, nvlink, nvsmi_text

SEP_RE = re.compile(r"^_{20,}\s*$")
NVSMI_HEADER = re.compile(r"(?:^|/)nvidia-smi (?:--query|-q)\s*$")
NVLINK_HEADER = re.compile(r"(?:^|/)nvidia-smi nvlink (?:--status|-s)\s*$")
LSPCI_HEADER = re.compile(r"(?:^|/)lspci\s+(?:-\S*\s+)*-\S*vv")
KSCAN_HEADER = "Scanning kernel log files for NVIDIA kernel messages"
MARKERS = ("nvidia-bug-report", "NVIDIA bug report log")
MAX_SECTION_BYTES = 32 << 20       # text kept of the nvidia-smi, nvlink or lspci section
MAX_KERNEL_BYTES = 64 << 20        # bytes of kernel log copied out (a ring buffer is ~16 MiB)


@dataclasses.dataclass
class BugReport:
    gpus: list | None = None            # nvidia-smi --query records (None: no such section)
    links: dict | None = None           # lspci link records by bdf (None: no such section)
    kernel_log: Path | None = None      # the copied kernel log (None: no such section)
    kernel_source: str | None = None    # "dmesg" or "kernel log scan"
    sections: tuple = ()                # the headers read, in order (for the progress line)
    cut: str | None = None              # a cap the read stopped at


def looks_like(lines: list[str]) -> bool:
    return any(m in line for line in lines for m in MARKERS)


def _kind(header: str) -> str:
    h = header.strip()
    if NVSMI_HEADER.search(h):
        return "nvsmi"
    if NVLINK_HEADER.search(h):
        return "nvlink"
    if LSPCI_HEADER.search(h):
        return "lspci"
    if h == "dmesg:":
        return "dmesg"
    if h.startswith(KSCAN_HEADER):
        return "kscan"
    return "other"


def read(path: Path, kernel_dir: Path, stats: bounded.Stats | None = None) -> BugReport:
    """Split a bug report; the kernel log goes to `kernel_dir`/kernel.log. UnknownFormat when
    the file has none of the sections read here."""
    stats = stats if stats is not None else bounded.Stats()
    kept: dict[str, list[str]] = {"nvsmi": [], "lspci": [], "nvlink": []}
    size = {k: 0 for k in kept}
    dmesg_path, scan_path = kernel_dir / "dmesg.log", kernel_dir / "kernel-scan.log"
    outs: dict[str, IO[str]] = {}
    written = {"dmesg": 0, "kscan": 0}
    kind, want_header = "other", False
    headers: list[str] = []
    try:
        for line in bounded.iter_lines(path, stats):
            if SEP_RE.match(line):
                kind, want_header = "other", True
                continue
            if want_header:
                if not line.strip():
                    continue
                want_header = False
                kind = _kind(line)
                if kind != "other" and len(headers) < 64:
                    headers.append(line.strip()[:120])
                if kind in kept and kept[kind]:
                    kind = "other"              # the first such section only
                continue
            if kind in kept:
                if size[kind] < MAX_SECTION_BYTES:
                    kept[kind].append(line)
                    size[kind] += len(line) + 1
            elif kind in written:
                if written[kind] >= MAX_KERNEL_BYTES or not line.strip():
                    continue
                f = outs.get(kind)
                if f is None:
                    f = outs[kind] = open(dmesg_path if kind == "dmesg" else scan_path, "w",
                                          encoding="utf-8")
                f.write(line + "\n")
                written[kind] += len(line) + 1
    finally:
        for f in outs.values():
            f.close()
    rep = BugReport(sections=tuple(headers), cut=stats.cut)
    if kept["nvsmi"]:
        try:
            rep.gpus = nvsmi_text.parse(kept["nvsmi"])
        except UnknownFormat:
            rep.gpus = None
        if rep.gpus and kept["nvlink"]:
            nvlink.attach(rep.gpus, nvlink.parse(kept["nvlink"]))
    if kept["lspci"]:
        try:
            rep.links = lspci.parse(kept["lspci"])
        except UnknownFormat:
            rep.links = None
    if written["dmesg"]:
        rep.kernel_log, rep.kernel_source = dmesg_path, "dmesg"
    elif written["kscan"]:
        rep.kernel_log, rep.kernel_source = scan_path, "kernel log scan"
    if rep.gpus is None and rep.links is None and rep.kernel_log is None:
        raise UnknownFormat("no `nvidia-smi --query`, `lspci -vvv` or `dmesg:` section of an "
                            "nvidia-bug-report.log")
    return rep

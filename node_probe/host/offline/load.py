"""The three offline flags' files read into one OfflineInput, or one line saying why not.

Why one place: `--nvidia-smi-file`, `--lspci-file` and `--bug-report` are read before the run
starts (a file in a format the flag does not read is a usage error, exit 2, named with the
formats it reads), and the checks then take the records from the run's options.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from node_probe.host.offline import UnknownFormat, bounded, bugreport, lspci, nvsmi_text, \
    nvsmi_xml

NVSMI_FORMATS = "it reads `nvidia-smi -q` text and `nvidia-smi -q -x` XML"
LSPCI_FORMATS = "it reads `lspci -vvv` text"
BUGREPORT_FORMATS = "it reads nvidia-bug-report.log and nvidia-bug-report.log.gz"
# text read of an nvidia-smi or lspci file (a real 8-GPU `-q -x` is ~1 MB, an HGX node's
# `lspci -vvv` ~1 MB): what the parsed records can cost stays well below the probe's budget
MAX_FILE_TEXT = 64 << 20


class BadFile(Exception):
    """One line for stderr: the flag, the file, what is wrong, the formats the flag reads."""


@dataclasses.dataclass(frozen=True)
class OfflineInput:
    gpus: tuple = ()                  # GPU records (contract a); empty when none was given
    links: dict | None = None         # bdf -> link record (contract b); None when none given
    kernel_log: Path | None = None    # the bug report's kernel log, copied out
    sources: tuple = ()               # ("nvidia-smi -q text: FILE", ...) for the progress line
    notes: tuple = ()                 # caps a read stopped at (said as warnings)

    @property
    def gpu_source(self) -> bool:
        return bool(self.gpus)


def _lines(path: Path, stats: bounded.Stats):
    return bounded.iter_lines(path, stats, max_read=MAX_FILE_TEXT, max_text=MAX_FILE_TEXT)


def _why(flag: str, path: Path, what: str, formats: str) -> BadFile:
    return BadFile(f"{flag} {path}: {what}; {formats}")


def nvidia_smi(path: Path, flag: str = "--nvidia-smi-file") -> tuple[list[dict], str, str | None]:
    """(GPU records, "nvidia-smi -q text" or "... XML", cap note) of a file."""
    try:
        head = bounded.head(path)
        stats = bounded.Stats()
        if nvsmi_xml.looks_like(head):
            gpus, kind = nvsmi_xml.parse(_lines(path, stats)), "nvidia-smi -q -x XML"
        elif nvsmi_text.looks_like(head):
            gpus, kind = nvsmi_text.parse(_lines(path, stats)), "nvidia-smi -q text"
        else:
            raise _why(flag, path, "not a format it reads", NVSMI_FORMATS)
    except UnknownFormat as exc:
        raise _why(flag, path, f"not a format it reads ({exc})", NVSMI_FORMATS) from None
    except OSError as exc:
        raise BadFile(f"{flag} {path}: cannot read it ({exc.strerror or exc})") from None
    if not gpus:
        raise _why(flag, path, "no GPU in it", NVSMI_FORMATS)
    return gpus, kind, stats.cut


def lspci_file(path: Path, flag: str = "--lspci-file") -> tuple[dict, str | None]:
    try:
        head = bounded.head(path, 256)
        if not lspci.looks_like(head):
            raise _why(flag, path, "not a format it reads", LSPCI_FORMATS)
        stats = bounded.Stats()
        links = lspci.parse(_lines(path, stats))
    except UnknownFormat as exc:
        raise _why(flag, path, f"not a format it reads ({exc})", LSPCI_FORMATS) from None
    except OSError as exc:
        raise BadFile(f"{flag} {path}: cannot read it ({exc.strerror or exc})") from None
    return links, stats.cut


def bug_report(path: Path, workdir: Path, flag: str = "--bug-report") -> bugreport.BugReport:
    try:
        head = bounded.head(path, 200)
        if not bugreport.looks_like(head):
            raise _why(flag, path, "not a format it reads", BUGREPORT_FORMATS)
        return bugreport.read(path, workdir)
    except UnknownFormat as exc:
        raise _why(flag, path, f"not a format it reads ({exc})", BUGREPORT_FORMATS) from None
    except OSError as exc:
        raise BadFile(f"{flag} {path}: cannot read it ({exc.strerror or exc})") from None


def gpus_from_links(links: dict) -> list[dict]:
    """GPU records for the NVIDIA GPUs of an lspci file given alone: the bus id and name only
    (no utilisation: the link generation is then not judged, the width is)."""
    return [{"index": None, "uuid": None, "pci_bus_id": k, "name": r.get("description"),
             "numa_node": r.get("numa_node")}
            for k, r in links.items() if lspci.is_nvidia_gpu(r)]


def read_all(nvidia_smi_file: Path | None, lspci_path: Path | None, bug_report_path: Path | None,
             workdir: Path) -> OfflineInput | None:
    """The OfflineInput of the flags given (None when none was); BadFile on a bad file.
    A file given by flag wins over the bug report's section of the same kind."""
    if not (nvidia_smi_file or lspci_path or bug_report_path):
        return None
    gpus: list[dict] = []
    links: dict | None = None
    kernel = None
    sources: list[str] = []
    notes: list[str] = []
    if bug_report_path is not None:
        rep = bug_report(bug_report_path, workdir)
        got = []
        if rep.gpus:
            gpus = rep.gpus
            got.append(f"nvidia-smi --query ({len(rep.gpus)} GPUs)")
        if rep.links is not None:
            links = rep.links
            got.append(f"lspci ({len(rep.links)} functions)")
        if rep.kernel_log is not None:
            kernel = rep.kernel_log
            got.append(f"kernel log ({rep.kernel_source})")
        sources.append(f"bug report {bug_report_path}: " + (", ".join(got) or "nothing read"))
        if rep.cut:
            notes.append(f"{bug_report_path}: {rep.cut}")
    if nvidia_smi_file is not None:
        gpus, kind, cut = nvidia_smi(nvidia_smi_file)
        sources.append(f"{kind} {nvidia_smi_file}: {len(gpus)} GPUs")
        if cut:
            notes.append(f"{nvidia_smi_file}: {cut}")
    if lspci_path is not None:
        links, cut = lspci_file(lspci_path)
        sources.append(f"lspci -vvv {lspci_path}: {len(links)} functions")
        if cut:
            notes.append(f"{lspci_path}: {cut}")
    if not gpus and links:
        gpus = gpus_from_links(links)
    return OfflineInput(gpus=tuple(gpus), links=links, kernel_log=kernel,
                        sources=tuple(sources), notes=tuple(notes))

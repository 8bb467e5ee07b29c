"""DCGM's health-watch failure codes (`DCGM_FR_*`): what each means and how bad it is.

Why here, in the protocol: other monitors built on DCGM put these codes into node conditions and
Events (NVIDIA NVSentinel's GPU health monitor: `ErrorCode:DCGM_FR_NVLINK_DOWN GPU:3 Link down
Recommended Action=RESTART_VM`; dcgm-exporter based node-problem-detector rules; DCGM's own
`dcgmi health` output), and the client decodes them next to Xids
(kubectl_gpudoctor/analysis/monitors/foreign.py), which may import only node_probe.protocol. The
table is data: node_probe/protocol/data/dcgm_errors.tsv, DCGM's own dcgmErrorMeta table (the code,
its name, DCGM's severity: ISOLATE = drain the GPU, MONITOR = watch it), with its source and
date. Codes newer DCGM releases added are known by name (NEWER). Pure data, standard library.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "dcgm_errors.tsv"
SOURCE_URL = "https://github.com/NVIDIA/DCGM/blob/master/dcgmlib/src/dcgm_errors.c"
ISOLATE, MONITOR = "ISOLATE", "MONITOR"
SEVERITY = {ISOLATE: "critical", MONITOR: "warning"}
NAME_RE = re.compile(r"\bDCGM_FR_[A-Z0-9_]{2,48}\b")
# NVSentinel's condition messages end with the action it recommends
ACTION_RE = re.compile(r"Recommended Action=([A-Z_]{3,32})")

# what the codes seen in the field mean, in words (DCGM's message formats, dcgm_errors.h)
MEANING = {
    "DCGM_FR_PCI_REPLAY_RATE": "PCIe replay rate above the threshold: the GPU's link is bad",
    "DCGM_FR_VOLATILE_DBE_DETECTED": "a volatile double-bit (uncorrectable) ECC error",
    "DCGM_FR_VOLATILE_SBE_DETECTED": "volatile single-bit (corrected) ECC errors",
    "DCGM_FR_PENDING_PAGE_RETIREMENTS": "pages pending retirement: reset the GPU to retire them",
    "DCGM_FR_RETIRED_PAGES_LIMIT": "too many retired pages: the GPU's memory is failing",
    "DCGM_FR_RETIRED_PAGES_DBE_LIMIT": "too many pages retired for double-bit errors",
    "DCGM_FR_CORRUPT_INFOROM": "a corrupt InfoROM",
    "DCGM_FR_CLOCK_THROTTLE_THERMAL": "clocks throttled for temperature",
    "DCGM_FR_CLOCK_THROTTLE_POWER": "clocks throttled for power",
    "DCGM_FR_NVLINK_ERROR_THRESHOLD": "NVLink errors above the threshold",
    "DCGM_FR_NVLINK_DOWN": "an NVLink is down",
    "DCGM_FR_NVSWITCH_FATAL_ERROR": "a fatal NVSwitch error",
    "DCGM_FR_NVSWITCH_NON_FATAL_ERROR": "a non-fatal NVSwitch error",
    "DCGM_FR_NVSWITCH_DOWN": "an NVSwitch is down",
    "DCGM_FR_HOSTENGINE_CONN": "the monitor lost its connection to DCGM's host engine "
                               "(the monitor's failure, not the GPU's)",
    "DCGM_FR_TEMP_VIOLATION": "the GPU's temperature above its limit",
    "DCGM_FR_FAULTY_MEMORY": "faulty GPU memory found by the diagnostic",
    "DCGM_FR_ECC_DISABLED": "ECC is disabled",
    "DCGM_FR_CUDA_DBE": "a double-bit ECC error seen by CUDA",
    "DCGM_FR_NVLINK_CRC_ERROR_THRESHOLD": "NVLink CRC errors above the threshold",
    "DCGM_FR_NVLINK_ERROR_CRITICAL": "a critical NVLink error",
    "DCGM_FR_ROW_REMAP_FAILURE": "a memory row could not be remapped",
    "DCGM_FR_UNCONTAINED_ERROR": "an uncontained memory error (every process on the GPU hit)",
    "DCGM_FR_DBE_PENDING_PAGE_RETIREMENTS": "double-bit errors with pages pending retirement",
    "DCGM_FR_UNCORRECTABLE_ROW_REMAP": "an uncorrectable error with no row left to remap",
    "DCGM_FR_PENDING_ROW_REMAP": "a row remapping pending: reset the GPU to apply it",
    "DCGM_FR_PERSISTENCE_MODE": "persistence mode is off",
    "DCGM_FR_BROKEN_P2P_MEMORY_DEVICE": "peer-to-peer writes to this GPU's memory are corrupted",
    "DCGM_FR_BROKEN_P2P_WRITER_DEVICE": "peer-to-peer writes from this GPU are corrupted",
}
# codes newer DCGM releases added (not in the table's 2022 order), as NVSentinel reports them:
# name -> (DCGM severity, meaning)
NEWER = {
    "DCGM_FR_XID_ERROR": (ISOLATE, "the driver logged an Xid the health watch treats as fatal"),
    "DCGM_FR_SXID_ERROR": (ISOLATE, "an NVSwitch SXid error"),
    "DCGM_FR_FABRIC_PROBE_STATE": (ISOLATE, "the GPU is not registered with the NVLink fabric "
                                            "(fabric manager / IMEX probe state)"),
    "DCGM_FR_IMEX_UNHEALTHY": (ISOLATE, "the IMEX daemon of the NVLink domain is unhealthy"),
    "DCGM_FR_CLOCKS_EVENT_THERMAL": (MONITOR, "clocks throttled for temperature"),
    "DCGM_FR_CLOCKS_EVENT_POWER": (MONITOR, "clocks throttled for power"),
}
# NVSentinel's recommended actions, in words
ACTIONS = {
    "NONE": "no action", "IGNORE": "no action",
    "COMPONENT_RESET": "reset the GPU (drain its pods first)",
    "RESTART_VM": "reboot the node", "RESTART_BM": "reboot the node",
    "CONTACT_SUPPORT": "drain the node and contact NVIDIA / the hardware vendor",
}


@dataclasses.dataclass(frozen=True)
class DcgmError:
    code: int | None
    name: str
    dcgm_severity: str          # ISOLATE / MONITOR, DCGM's own
    meaning: str
    known: bool = True

    @property
    def severity(self) -> str:
        return SEVERITY.get(self.dcgm_severity, "warning")


class CatalogError(ValueError):
    pass


def parse_table(text: str) -> dict[str, DcgmError]:
    out: dict[str, DcgmError] = {}
    codes: set[int] = set()
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#") or line.startswith("code\t"):
            continue
        fields = line.split("\t")
        if len(fields) != 3 or not fields[0].isdigit() or not NAME_RE.fullmatch(fields[1]) \
                or fields[2] not in SEVERITY:
            raise CatalogError(f"line {n}: {line!r} is not `code<TAB>DCGM_FR_NAME<TAB>severity`")
        code, name, sev = int(fields[0]), fields[1], fields[2]
        if code in codes or name in out:
            raise CatalogError(f"line {n}: {name} ({code}) twice")
        codes.add(code)
        out[name] = DcgmError(code, name, sev, MEANING.get(name) or _words(name))
    return out


def _words(name: str) -> str:
    return name.removeprefix("DCGM_FR_").replace("_", " ").lower()


def _load() -> dict[str, DcgmError]:
    try:
        table = parse_table(DATA.read_text(encoding="utf-8"))
    except OSError:
        table = {}
    for name, (sev, meaning) in NEWER.items():
        table.setdefault(name, DcgmError(None, name, sev, meaning))
    return table


ERRORS: dict[str, DcgmError] = _load()


def describe(name: str) -> DcgmError:
    """The code by its `DCGM_FR_*` name; an unknown name is shown as such (warning)."""
    return ERRORS.get(name) or DcgmError(None, name, "", _words(name), known=False)


def names_in(text: str, limit: int = 8) -> list[str]:
    """The DCGM_FR_* names a text mentions, in order, each once (DCGM_FR_OK skipped)."""
    out: list[str] = []
    for m in NAME_RE.finditer(text[:2000]):
        if m.group(0) != "DCGM_FR_OK" and m.group(0) not in out and len(out) < limit:
            out.append(m.group(0))
    return out

"""Driver versions with known node-level failures, and the condition that triggers each.

Stdlib-only data in protocol/ because both sides match against it: the node probe with the
version NVML or /proc reports, the client with GPU Feature Discovery node labels.

Why a table: the seed 000 incident took days because nothing connected "pods Pending on MIG
nodes" to "this exact driver build hangs in nvmlInit". The table is data (easy to extend and
review) plus one `match()` that both the driver check and the device-plugin verdict use.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping


@dataclasses.dataclass(frozen=True)
class KnownIssue:
    versions: tuple[str, ...]
    condition: str            # a name in CONDITIONS
    condition_text: str
    symptom: str
    fixed_in: tuple[str, ...]
    workaround: str
    refs: tuple[str, ...]


def _mig_mixed(gpus: list[Mapping]) -> bool | None:
    """True if MIG-enabled GPUs sit beside full GPUs; None if the layout is unknown."""
    if not gpus:
        return None
    modes = {bool(g.get("mig_mode")) for g in gpus}
    return modes == {True, False}


CONDITIONS = {"mig_mixed": _mig_mixed}

KNOWN_ISSUES: tuple[KnownIssue, ...] = (
    KnownIssue(
        versions=("570.124.06", "570.133.20", "570.148.08", "570.158.01"),
        condition="mig_mixed",
        condition_text="MIG slices mixed with full GPUs on one node",
        symptom=("nvmlInit hangs; the NVIDIA device plugin calls it in every "
                 "GetPreferredAllocation, and kubelet calls that with no timeout, so pod "
                 "admission on the whole node stops (Pending with only a Scheduled event, "
                 "Terminating forever, non-GPU pods too)"),
        fixed_in=("570.172.08", "580.65.06"),
        workaround=("upgrade the driver to 570.172.08 / 580.65.06 or later; until then disable "
                    "MIG on the node (or make every GPU MIG) and restart the device plugin and "
                    "kubelet"),
        refs=("https://github.com/NVIDIA/go-nvml/issues/152",
              "https://github.com/kubernetes/kubernetes/issues/117435",
              "https://github.com/kubernetes/kubernetes/issues/130855"),
    ),
)


@dataclasses.dataclass(frozen=True)
class Match:
    issue: KnownIssue
    driver_version: str
    condition_met: bool | None  # None: unknown (e.g. NVML hung, so no MIG layout)


def match(driver_version: str | None, gpus: Iterable[Mapping] = ()) -> list[Match]:
    """Known issues for this driver version, with whether the node meets the trigger."""
    if not driver_version:
        return []
    gpus = list(gpus)
    out = []
    for issue in KNOWN_ISSUES:
        if driver_version.strip() in issue.versions:
            out.append(Match(issue, driver_version.strip(), CONDITIONS[issue.condition](gpus)))
    return out

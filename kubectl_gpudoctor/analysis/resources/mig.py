"""mig.config_failed: the GPU Operator's MIG manager reports a failed or stuck reconfiguration.

Why: the MIG manager applies the layout named by the node label `nvidia.com/mig.config` and
reports progress in `nvidia.com/mig.config.state` (pending -> success | failed). On failure or
when it never finishes, GPU operands stay paused (`nvidia.com/gpu.deploy.*=paused-for-mig-change`)
and MIG pods stay Pending. How long the label has said `pending` comes from the node's
managedFields: the time its owning manager last wrote it. Pure function; no I/O.
"""
from __future__ import annotations

import datetime as dt
from typing import Any, Mapping

from node_probe.protocol import Finding, catalog

from ..common import age_s, fmt_duration

STATE = "nvidia.com/mig.config.state"
CONFIG = "nvidia.com/mig.config"
PAUSED = "paused-for-mig-change"
STUCK_AFTER_S = 600.0
REFS = ("https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/gpu-operator-mig.html",
        "https://github.com/NVIDIA/mig-parted/pull/484",
        "https://github.com/NVIDIA/mig-parted/issues/9")


def label_written_at(node: Mapping[str, Any], label: str) -> tuple[str | None, str | None]:
    """(time, manager) of the managedFields entry that owns `label`."""
    key = f"f:{label}"
    for mf in (node.get("metadata") or {}).get("managedFields") or ():
        labels = (((mf.get("fieldsV1") or {}).get("f:metadata") or {}).get("f:labels") or {})
        if key in labels:
            return mf.get("time"), mf.get("manager")
    return None, None


def analyze_node(node: Mapping[str, Any], now: dt.datetime,
                 stuck_after_s: float = STUCK_AFTER_S) -> list[Finding]:
    md = node.get("metadata") or {}
    labels = md.get("labels") or {}
    state = labels.get(STATE)
    if state not in ("failed", "pending"):
        return []
    name = md.get("name", "")
    written, manager = label_written_at(node, STATE)
    age = age_s(written, now)
    paused = sorted(k for k, v in labels.items() if k.startswith("nvidia.com/gpu.deploy.")
                    and v == PAUSED)
    ev = {"state": state, "mig_config": labels.get(CONFIG), "state_age_s":
          round(age) if age is not None else None, "written_by": manager,
          "paused_operands": paused}
    if state == "failed":
        sev, title = "critical", (f"MIG reconfiguration to {labels.get(CONFIG)!r} failed"
                                  + (f" {fmt_duration(age)} ago" if age is not None else ""))
    elif age is not None and age >= stuck_after_s:
        sev, title = "warning", (f"MIG reconfiguration to {labels.get(CONFIG)!r} has been "
                                 f"pending for {fmt_duration(age)}")
    else:
        sev, title = "info", f"MIG reconfiguration to {labels.get(CONFIG)!r} in progress"
    if paused:
        title += f"; {len(paused)} GPU operand(s) paused for it"
    return [catalog.make(
        "mig.config_failed", sev, f"node/{name}", title, ev,
        "Read the MIG manager's log on the node (`kubectl -n gpu-operator get pods -o wide "
        "-l app=nvidia-mig-manager`, then `kubectl logs` of the one on " + name + "). Common "
        "causes: processes still using the GPUs (the reset fails), a config name missing "
        "from the MIG manager's ConfigMap, a GPU that needs a reboot "
        "(`kubectl gpu-doctor node " + name + "` shows mig.mode_pending). Re-apply by "
        "re-setting the nvidia.com/mig.config label.", REFS)]


"""NodeConditions the watching agent writes and `nodes` reads: the one contract between them.

Why: the agent (node side, stdlib) marks its own node in node-problem-detector's format, and the
client reads those marks from the node list it already fetches. Both sides must agree on the
condition types (the only ones the admission policy lets the agent touch), on how a finding id
becomes a `reason`, and on how old a heartbeat may be before a node counts as unwatched.

Format (as node-problem-detector writes them): `type` CamelCase, `status` "True" while the
problem lasts and "False" when it is gone, `reason` CamelCase, `message` one bounded line,
`lastHeartbeatTime` refreshed by the agent, `lastTransitionTime` changed only on a flip.
"""
from __future__ import annotations

import re
from typing import Iterable, Mapping

# Every condition type the tool owns starts with this prefix; nothing else is ours.
TYPE_PREFIX = "GpuDoctor"
# The `source.component` of the Events the agent writes on its node (node_probe/watch/writer.py
# sends it; tests/data/captures/k8s-1.35/node-status-writes/event-create.201.json shows it as the
# API server stores it): the client counts them as the tool's own, never another monitor's.
AGENT_COMPONENT = "gpu-doctor-agent"

# problem class (condition type) -> the finding ids that raise it
CLASSES: dict[str, tuple[str, ...]] = {
    "GpuDoctorDevicePluginStuck": ("deviceplugin.blocked_in_nvml", "deviceplugin.rpc_timeout",
                                   "nvml.init_hang"),
    "GpuDoctorDeviceAccessLost": ("cgroup.device_denied", "cgroup.device_rules_rewritten",
                                  "deviceplugin.stale_dev_view", "container.nvidia_eperm",
                                  "runtime.not_wired"),
    "GpuDoctorGpuUnhealthy": ("gpu.health", "gpu.row_remap_pending", "gpu.row_remap_failed",
                              "deviceplugin.unhealthy", "deviceplugin.unhealthy_stale"),
    "GpuDoctorXidErrors": ("gpu.xid",),
    "GpuDoctorKernelHungTask": ("kernel.hung_task",),
    "GpuDoctorMemoryThrash": ("memory.pressure",),
    "GpuDoctorGpuLost": ("gpu.lost",),
    "GpuDoctorFabricNotReady": ("fabric.not_ready",),
    "GpuDoctorIsolationBreach": ("gpu.isolation_breach",),
    # a GPU that runs slow without an Xid (issue 38); the reason names the cause:
    # GpuPcieDowntrained, GpuClocksThrottled, GpuNvlinkDegraded, GpuMemoryDegrading
    "GpuDoctorGpuDegraded": ("gpu.pcie_downtrained", "gpu.clocks_throttled",
                             "gpu.nvlink_degraded", "gpu.memory_degrading"),
}
# the agent's own presence: True while it watches (its heartbeat says when it last looked)
WATCHING_TYPE = "GpuDoctorWatching"
OWNED_TYPES: tuple[str, ...] = (WATCHING_TYPE, *CLASSES)

# The agent refreshes every owned condition's heartbeat at least this often even without a
# transition (node-problem-detector's default heartbeat is 5 min as well). A node whose newest
# GpuDoctor heartbeat is older than STALE_AFTER_S has no working agent.
HEARTBEAT_S = 300
STALE_AFTER_S = 3 * HEARTBEAT_S

MESSAGE_MAX = 1024  # bytes of UTF-8 in a condition message (NPD keeps messages short too)

_CLASS_OF = {fid: ctype for ctype, ids in CLASSES.items() for fid in ids}


def class_of(finding_id: str) -> str | None:
    """The condition type a finding id raises, or None when it is not watched."""
    return _CLASS_OF.get(finding_id)


def reason_of(finding_id: str) -> str:
    """`deviceplugin.blocked_in_nvml` -> `DevicepluginBlockedInNvml` (a valid CamelCase reason)."""
    words = re.split(r"[^A-Za-z0-9]+", finding_id)
    reason = "".join(w[:1].upper() + w[1:] for w in words if w)
    return reason[:128] or "Unknown"


def finding_id_of(reason: str, candidates: Iterable[str] | None = None) -> str | None:
    """The finding id whose reason is `reason`, among the watched ids (or `candidates`)."""
    for fid in (candidates if candidates is not None else _CLASS_OF):
        if reason_of(fid) == reason:
            return fid
    return None


def sanitize_message(text: str, limit: int = MESSAGE_MAX) -> str:
    """One line, printable, at most `limit` bytes of UTF-8 (cut on a character boundary)."""
    one = "".join(ch if ch.isprintable() else " " for ch in str(text))
    one = " ".join(one.split())
    raw = one.encode("utf-8")
    if len(raw) <= limit:
        return one
    return raw[:limit - 3].decode("utf-8", "ignore") + "..."


def quiet_reason(ctype: str) -> str:
    """`reason` of a class that has been False since the agent started: `NoXidErrors`."""
    return "No" + ctype[len(TYPE_PREFIX):]


def cleared_reason(ctype: str) -> str:
    """`reason` of a class that went False after a problem: `XidErrorsCleared` (its message
    says what the problem was and when it was last seen)."""
    return ctype[len(TYPE_PREFIX):] + "Cleared"


def is_owned(condition: Mapping[str, object]) -> bool:
    return str(condition.get("type", "")).startswith(TYPE_PREFIX)

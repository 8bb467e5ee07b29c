"""What other node health monitors already say about the node: their conditions, taints, events.

Why: many clusters already run a GPU health monitor that marks nodes: node-problem-detector
(KernelDeadlock, ReadonlyFilesystem, Frequent*Restart, custom GPU plugins), NVIDIA NVSentinel
(a condition per health check, e.g. GpuXidError), the EKS node monitoring agent
(AcceleratedHardwareReady=False with reasons like NvidiaXID79Error or DCGMError, KernelReady,
NetworkingReady, StorageReady, ContainerRuntimeReady), GKE (XidCriticalError) and AKS GPU health
checks, and device plugins that report health as events. The on-call engineer should see those
verdicts with their source and age next to ours instead of a second detection of the same Xid.
Conditions whose type starts with "GpuDoctor", and Events whose source is the agent's component
(`gpu-doctor-agent`), are our own agent's (protocol/conditions) and are not foreign.

Pure function `foreign_conditions(node, events, now)` over raw API dicts; no I/O.
"""
from __future__ import annotations

import datetime as dt
import re
from typing import Any, Mapping, Sequence

from node_probe.protocol import Finding, catalog
from node_probe.protocol.conditions import AGENT_COMPONENT, is_owned, sanitize_message

from .common import age_s, event_source, event_time, fmt_duration

STANDARD = frozenset({"Ready", "MemoryPressure", "DiskPressure", "PIDPressure",
                      "NetworkUnavailable"})
# condition type -> (who sets it, whether True is the healthy state)
KNOWN: dict[str, tuple[str, bool]] = {
    "AcceleratedHardwareReady": ("EKS node monitoring agent", True),
    "KernelReady": ("EKS node monitoring agent", True),
    "NetworkingReady": ("EKS node monitoring agent", True),
    "StorageReady": ("EKS node monitoring agent", True),
    "ContainerRuntimeReady": ("EKS node monitoring agent", True),
    "XidCriticalError": ("GKE GPU health (node-problem-detector)", False),
    "KernelDeadlock": ("node-problem-detector", False),
    "ReadonlyFilesystem": ("node-problem-detector", False),
    "FrequentKubeletRestart": ("node-problem-detector", False),
    "FrequentDockerRestart": ("node-problem-detector", False),
    "FrequentContainerdRestart": ("node-problem-detector", False),
    "CorruptDockerOverlay2": ("node-problem-detector", False),
    "FrequentUnregisterNetDevice": ("node-problem-detector", False),
}
GPU_WORDS = re.compile(r"gpu|xid|nvlink|nvidia|dcgm|accelerat|nvsentinel|cuda|ecc|fabric",
                       re.I)
MONITOR_SOURCES = re.compile(r"problem-detector|kernel-monitor|nvsentinel|health|monitor|"
                             r"device-plugin|dcgm|gpu", re.I)
MAX_CONDITIONS = 64
MAX_EVENT_GROUPS = 20
MSG = 300
REFS = ("https://kubernetes.io/docs/tasks/debug/debug-cluster/monitor-node-health/",
        "https://docs.aws.amazon.com/eks/latest/userguide/node-health.html",
        "https://github.com/NVIDIA/NVSentinel")


def _source(ctype: str, reason: str, message: str) -> str:
    if ctype in KNOWN:
        return KNOWN[ctype][0]
    text = f"{reason} {message}"
    if "nvsentinel" in text.lower() or ctype.startswith(("Gpu", "SysLogs")):
        return "NVSentinel or another GPU health monitor"
    if "aks" in text.lower():
        return "AKS GPU health"
    return "node-problem-detector or another node monitor"


def _bad(c: Mapping[str, Any]) -> bool:
    ctype, status = str(c.get("type") or ""), str(c.get("status") or "")
    healthy_true = KNOWN[ctype][1] if ctype in KNOWN else ctype.endswith("Ready")
    return status == ("False" if healthy_true else "True") or status == "Unknown"


def _gpu_related(*texts: str) -> bool:
    return any(GPU_WORDS.search(t) for t in texts)


def foreign_conditions(node: Mapping[str, Any], events: Sequence[Mapping[str, Any]],
                       now: dt.datetime) -> list[Finding]:
    name = str((node.get("metadata") or {}).get("name") or "")
    subject = f"node/{name}"   # one finding per condition, taint or event group: own subjects
    out: list[Finding] = []
    conds = [c for c in ((node.get("status") or {}).get("conditions") or ())[:MAX_CONDITIONS]
             if isinstance(c, Mapping)]
    for c in conds:
        ctype = str(c.get("type") or "")[:128]
        if ctype in STANDARD or is_owned(c) or not _bad(c):
            continue
        reason = sanitize_message(str(c.get("reason") or ""), 128)
        message = sanitize_message(str(c.get("message") or ""), MSG)
        gpu = ctype in KNOWN and ctype in ("AcceleratedHardwareReady", "XidCriticalError") \
            or _gpu_related(ctype, reason, message)
        since = age_s(c.get("lastTransitionTime"), now)
        heartbeat = age_s(c.get("lastHeartbeatTime"), now)
        source = _source(ctype, reason, message)
        out.append(catalog.make(
            "node.foreign_condition", "warning" if gpu else "info", f"{subject} condition {ctype}",
            f"{source} says {ctype}={c.get('status')}"
            + (f" ({reason})" if reason else "")
            + (f" for {fmt_duration(since)}" if since is not None else "")
            + (f": {message}" if message else ""),
            {"kind": "condition", "source": source, "type": ctype, "status": c.get("status"),
             "reason": reason, "message": message, "since": c.get("lastTransitionTime"),
             "age_s": None if since is None else round(since),
             "heartbeat_age_s": None if heartbeat is None else round(heartbeat),
             "gpu_related": gpu},
            f"Another monitor already flags this node; read its verdict before acting on ours "
            f"and act on the same cause once (kubectl describe node {name}). A stale condition "
            "(old heartbeat) may outlive the problem: its monitor clears it, not the kubelet.",
            REFS))
    for t in ((node.get("spec") or {}).get("taints") or ())[:MAX_CONDITIONS]:
        if not isinstance(t, Mapping):
            continue
        key = str(t.get("key") or "")[:253]
        if key.startswith("node.kubernetes.io/") or not _gpu_related(key, str(t.get("value") or "")):
            continue
        added = age_s(t.get("timeAdded"), now)
        out.append(catalog.make(
            "node.foreign_condition", "warning", f"{subject} taint {key}",
            f"taint {key}={sanitize_message(str(t.get('value') or ''), 63)}:{t.get('effect')} "
            "set by a GPU health monitor or an operator"
            + (f" {fmt_duration(added)} ago" if added is not None else ""),
            {"kind": "taint", "source": "taint", "key": key, "value": t.get("value"),
             "effect": t.get("effect"), "age_s": None if added is None else round(added),
             "gpu_related": True},
            "Pods without a matching toleration are kept off this node (NoSchedule) or evicted "
            "(NoExecute) until whoever set the taint removes it.", REFS))
    out.extend(_events(subject, name, events, now))
    return out


def _events(subject: str, name: str, events: Sequence[Mapping[str, Any]],
            now: dt.datetime) -> list[Finding]:
    groups: dict[tuple[str, str], dict] = {}
    for e in events:
        obj = e.get("involvedObject") or e.get("regarding") or {}
        if obj.get("kind") != "Node" or (name and obj.get("name") not in (name, None)):
            continue
        src, reason = event_source(e)[:128], str(e.get("reason") or "")[:128]
        msg = str(e.get("message") or "")
        if src in ("kubelet", AGENT_COMPONENT) or not (MONITOR_SOURCES.search(src)
                                                       or _gpu_related(reason, msg)):
            continue
        if e.get("type") != "Warning" and not _gpu_related(reason, msg):
            continue
        g = groups.get((src, reason))
        if g is None:
            if len(groups) >= MAX_EVENT_GROUPS:
                continue
            g = groups[(src, reason)] = {"count": 0, "last": None, "message": ""}
        g["count"] += int(e.get("count") or (e.get("series") or {}).get("count") or 1)
        t = event_time(e)
        if t is not None and (g["last"] is None or t >= g["last"]):
            g["last"], g["message"] = t, sanitize_message(msg, MSG)
    out = []
    for (src, reason), g in groups.items():
        age = None if g["last"] is None else max(0.0, (now - g["last"]).total_seconds())
        out.append(catalog.make(
            "node.foreign_condition", "info", f"{subject} event {src or '?'}/{reason}",
            f"{src or 'a monitor'} reported {reason} x{g['count']}"
            + (f", last {fmt_duration(age)} ago" if age is not None else "")
            + (f": {g['message']}" if g["message"] else ""),
            {"kind": "event", "source": src, "reason": reason, "count": g["count"],
             "last_seen": g["last"].isoformat() if g["last"] else None,
             "age_s": None if age is None else round(age), "message": g["message"],
             "gpu_related": _gpu_related(reason, g["message"])},
            "Events another monitor (or the device plugin) recorded on the node; compare with "
            "this tool's node findings.", REFS))
    return out

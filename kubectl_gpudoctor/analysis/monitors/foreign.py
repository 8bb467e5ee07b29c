"""What other node health monitors already say about the node: their conditions, taints, events.

Why: many clusters already run a GPU health monitor that marks nodes: node-problem-detector
(KernelDeadlock, ReadonlyFilesystem, Frequent*Restart, custom GPU plugins), NVIDIA NVSentinel
(a condition per health check, e.g. GpuXidError), the EKS node monitoring agent
(AcceleratedHardwareReady=False with reasons like NvidiaXID79Error or DCGMError, KernelReady,
NetworkingReady, StorageReady, ContainerRuntimeReady), GKE (XidCriticalError) and AKS GPU health
checks, and device plugins that report health as events. The on-call engineer should see those
verdicts with their source and age next to ours instead of a second detection of the same Xid.
Conditions whose type starts with "GpuDoctor", and Events whose source is the agent's component
(`gpu-doctor-agent`), are our own agent's (protocol/conditions) and are not foreign. What a
monitor encodes is decoded into the cause (`decode`): the Xid code in EKS's `NvidiaXID79Error`
reason, GKE's `{"31":true}` reason and NVSentinel's `ErrorCode:119` message, read in NVIDIA's Xid
catalog (node_probe/protocol/xid_catalog.py, the one the kernel-log reader uses), and EKS's
`DCGMError`, which is the monitor failing, not a GPU.

Pure function `foreign_conditions(node, events, now)` over raw API dicts; no I/O.
"""
from __future__ import annotations

import datetime as dt
import re
from typing import Any, Mapping, Sequence

from node_probe.protocol import Finding, catalog, dcgm_catalog, quote, xid_catalog
from node_probe.protocol.conditions import AGENT_COMPONENT, is_owned, sanitize_message

from ..common import age_s, event_source, event_time, fmt_duration
from ..quoting import word

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


# where monitors put an Xid code: EKS reasons `NvidiaXID79Error` / `NvidiaXID43Warning`
# (eks-node-monitoring-agent pkg/reasons), GKE's XidCriticalError reason `{"31":true}`
# (container-engine-accelerators), NVSentinel's `ErrorCode:119 PCI:...` (syslog health
# monitor, XID conditions only: its SXID conditions carry NVSwitch codes), `XID-79` messages
_XID_REASON = re.compile(r"NvidiaXID([0-9]{1,4})(?:Error|Warning)\b")
_XID_JSON = re.compile(r'"([0-9]{1,4})"\s*:\s*true')
_XID_ERRORCODE = re.compile(r"\bErrorCode:([0-9]{1,4})\b")
_XID_WORD = re.compile(r"\bXID[- ]([0-9]{1,4})\b", re.I)
MAX_XIDS = 8
_BUCKET_RANK = {xid_catalog.REBOOT: 5, xid_catalog.CONTACT_SUPPORT: 4, xid_catalog.RESET_GPU: 3,
                xid_catalog.RESTART_APP: 2, xid_catalog.IGNORE: 1}
# EKS reasons that are not an Xid (the EKS user guide, "Detect node health issues with the EKS
# node monitoring agent"): what they mean and what to do
_EKS_REASONS = {
    "DCGMError": (
        "the agent lost or never got its connection to DCGM's host engine (nv-hostengine, its "
        "dcgm-server pod on hostPort 5555): the monitor's own failure, not a GPU fault, so the "
        "GPUs may be healthy while auto repair replaces the node",
        "check the dcgm-server pod on the node and that the agent reaches localhost:5555 (a CNI "
        "without hostPort support cannot); point the agent at an existing hostengine where one "
        "runs (the GPU Operator's standalone DCGM); then restart the agent pod: it does not "
        "clear DCGMError by itself"),
}


def xid_codes(ctype: str, reason: str, message: str) -> list[int]:
    """The Xid codes a monitor's condition names, in order, each once, at most MAX_XIDS."""
    found: list[int] = []
    sources = [(_XID_REASON, reason), (_XID_JSON, reason), (_XID_WORD, message)]
    # SysLogsXIDError, GpuXidError yes; SysLogsSXIDError (lower-cased it reads "sxid" too) no
    if "xid" in ctype.lower() and not re.search(r"SXID|SXid|Sxid", ctype):
        sources.insert(2, (_XID_ERRORCODE, message))
    for rx, text in sources:
        for m in rx.finditer(text[:MSG * 4]):
            code = int(m.group(1))
            if code not in found and len(found) < MAX_XIDS:
                found.append(code)
    return found


def decode(ctype: str, reason: str, message: str) -> dict | None:
    """What the monitor's encoded words mean: {'headline', 'fix', 'severity', 'xids'} or None."""
    codes = xid_codes(ctype, reason, message)
    if codes:
        infos = sorted((xid_catalog.describe(c) for c in codes),
                       key=lambda x: -_BUCKET_RANK.get(x.bucket, 0))
        worst = infos[0]
        bucket = xid_catalog.BUCKET_TEXT[worst.bucket]
        return {"headline": f"Xid {worst.code} ({worst.meaning}): NVIDIA says "
                            f"{worst.bucket.replace('_', ' ')}",
                "fix": f"Xid {worst.code} ({worst.meaning}): {bucket[0].upper()}{bucket[1:]}. "
                       f"{worst.action}",
                "severity": worst.severity,
                "xids": [{"xid": x.code, "mnemonic": x.mnemonic or None, "meaning": x.meaning,
                          "resolution_bucket": x.bucket,
                          "nvidia_resolution_bucket": x.nvidia_bucket or None}
                         for x in infos]}
    dcgm = dcgm_catalog.names_in(f"{reason} {message}")
    if dcgm:
        return _decode_dcgm(dcgm, message)
    if ctype == "AcceleratedHardwareReady" and reason in _EKS_REASONS:
        what, fix = _EKS_REASONS[reason]
        return {"headline": what, "fix": f"{what[0].upper()}{what[1:]}. Fix: {fix}.",
                "severity": "warning", "xids": []}
    return None


_SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}


def _decode_dcgm(names: list[str], message: str) -> dict:
    """DCGM health-watch codes (NVSentinel's `ErrorCode:DCGM_FR_NVLINK_DOWN ... Recommended
    Action=RESTART_VM`) read in DCGM's own table: ISOLATE codes are critical (drain the GPU),
    MONITOR codes a warning; the monitor's recommended action, when it says one, is shown."""
    infos = sorted((dcgm_catalog.describe(n) for n in names),
                   key=lambda x: -_SEVERITY_RANK[x.severity])
    worst = infos[0]
    am = dcgm_catalog.ACTION_RE.search(message)
    action = am.group(1) if am else None
    said = (f"; the monitor recommends {action} "
            f"({dcgm_catalog.ACTIONS.get(action, 'its own action')})" if action else "")
    what = "DCGM says isolate the GPU (drain it)" if worst.dcgm_severity == "ISOLATE" else \
        "DCGM says watch it" if worst.known else "a DCGM code this tool does not know"
    fix = {"ISOLATE": "Drain the GPU's pods (or the node) and find the cause: nvidia-smi -q, "
                      "the kernel log's Xids, `dcgmi diag -r 2`; reset the GPU or reboot as the "
                      "code asks, and replace the GPU if it repeats.",
           "MONITOR": "Watch it: the GPU still works; act if it repeats or grows."}.get(
        worst.dcgm_severity, f"Look {worst.name} up in DCGM's dcgm_errors.h.")
    return {"headline": f"{worst.name} ({worst.meaning}): {what}{said}",
            "fix": f"{worst.name}: {worst.meaning}. {fix}",
            "severity": worst.severity, "xids": [],
            "dcgm": [{"name": x.name, "code": x.code, "meaning": x.meaning,
                      "dcgm_severity": x.dcgm_severity or None, "known": x.known}
                     for x in infos],
            "recommended_action": action}


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
        meant = decode(ctype, reason, message)
        severity = "warning" if gpu or meant else "info"
        if meant and _SEVERITY_RANK[meant["severity"]] > _SEVERITY_RANK[severity]:
            severity = meant["severity"]
        out.append(catalog.make(
            "node.foreign_condition", severity, f"{subject} condition {ctype}",
            f"{source} says {ctype}={c.get('status')}"
            + (f" ({reason})" if reason else "")
            + (f" for {fmt_duration(since)}" if since is not None else "")
            + (" (its message is quoted)" if message else "")
            + (f" -- {meant['headline']}" if meant else ""),
            {"kind": "condition", "source": source, "type": ctype, "status": c.get("status"),
             "reason": reason, "message": message, "since": c.get("lastTransitionTime"),
             "age_s": None if since is None else round(since),
             "heartbeat_age_s": None if heartbeat is None else round(heartbeat),
             "gpu_related": gpu or bool(meant), "xids": meant["xids"] if meant else [],
             **({"dcgm": meant["dcgm"], "recommended_action": meant["recommended_action"]}
                if meant and "dcgm" in meant else {})},
            (f"{meant['fix']} " if meant else "")
            + f"Another monitor already flags this node; read its verdict before acting on ours "
            f"and act on the same cause once (kubectl describe node {name}). A stale condition "
            "(old heartbeat) may outlive the problem: its monitor clears it, not the kubelet.",
            REFS, quoted=(quote(f"{subject} condition {ctype}", "message", message),)
            if message else ()))
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
        names = dcgm_catalog.names_in(f"{reason} {g['message']}")
        meant = _decode_dcgm(names, g["message"]) if names else None
        out.append(catalog.make(
            "node.foreign_condition", meant["severity"] if meant else "info",
            f"{subject} event {src or '?'}/{reason}",
            f"{word(src, 'a monitor') if src else 'a monitor'} reported "
            f"{word(reason, 'an event')} x{g['count']}"
            + (f", last {fmt_duration(age)} ago" if age is not None else "")
            + (" (its message is quoted)" if g["message"] else "")
            + (f" -- {meant['headline']}" if meant else ""),
            {"kind": "event", "source": src, "reason": reason, "count": g["count"],
             "last_seen": g["last"].isoformat() if g["last"] else None,
             "age_s": None if age is None else round(age), "message": g["message"],
             "gpu_related": _gpu_related(reason, g["message"]),
             **({"dcgm": meant["dcgm"], "recommended_action": meant["recommended_action"]}
                if meant else {})},
            (f"{meant['fix']} " if meant else "")
            + "Events another monitor (or the device plugin) recorded on the node; compare with "
            "this tool's node findings.", REFS,
            quoted=(quote(f"event {word(reason, '?')} from {word(src, '?')} on {subject}",
                          "message", g["message"]),) if g["message"] else ()))
    return out

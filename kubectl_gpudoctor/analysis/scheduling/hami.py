"""HAMi vGPU, API side: the node and pod annotations HAMi's scheduler and device plugin trade.

Why (seed 003): HAMi coordinates its scheduler extender and its device plugin only through
annotations. When one side stops answering, pods sit Pending with "handshake timeout" or
"node has been locked within 5 minutes", or fail admission with "device number not matched",
and nothing in `kubectl describe` says which annotation is wrong. hami_annotations.py
decodes them; this module judges them, node by node:

- `hami.io/node-nvidia-register`: the devices the plugin registered, in every encoding HAMi has
  written: the colon-separated list of `uuid,count,devmem,devcore,type,numa,health` (7 fields,
  HAMi <= 2.4) or with `,index,mode` (9 fields), and the JSON list of DeviceInfo objects
  (`[{"id":..,"count":..,"devmem":..,"devcore":..,"type":..,"numa":..,"mode":..,"health":..}]`,
  Go `omitempty`: a missing `health` is false, a missing `index`/`numa` is 0).
- `hami.io/node-handshake[-<vendor>]`: `Reported <Go time.String()>` (written by the plugin every
  30 s), `Requesting_<2006.01.02 15:04:05>` (the scheduler; newer versions write
  `2006-01-02 15:04:05`), `Deleted_<same>`. A `Requesting_` older than 60 s means the plugin
  did not answer and the scheduler drops the node's devices (then writes `Deleted_`).
- `hami.io/mutex.lock`: `<RFC3339>,<namespace>,<pod>` (older versions: `<RFC3339>` alone). Taken
  for each bind, released by the plugin's Allocate; HAMi takes over a lock after 5 min
  (HAMI_NODELOCK_EXPIRE) or when its owner pod is gone.
- pods: `hami.io/vgpu-devices-to-allocate` (erased container by container as Allocate runs),
  `hami.io/vgpu-devices-allocated`, `hami.io/bind-phase` (allocating/success/failed),
  `hami.io/bind-time` (Unix seconds), and `device number not matched` admission events.

Every finding that changes the cluster prints the exact command and its risk; nothing is run.
Pure functions over raw API dicts (camelCase, as the API server returns them); no I/O.
"""
from __future__ import annotations

import datetime as dt
import re
from typing import Any, Iterable, Mapping, Sequence

from node_probe.protocol import catalog
from node_probe.protocol import Finding, quote

from ..common import ByIdentity, fmt_duration
from ..quantity import count
from .hami_annotations import (ALLOCATED_KEY, BIND_PHASE_KEY, BIND_TIME_KEY, DecodeError,
                               HANDSHAKE_PREFIX, LOCK_KEY, REGISTER_KEY, TO_ALLOCATE_KEY,
                               decode_pod_devices, decode_register, parse_bind_time,
                               parse_handshake, parse_lock, validate_device)


HANDSHAKE_STALE_S = 60.0     # scheduler: Requesting_ + 60 s without a Reported -> node dropped
REPORT_PERIOD_S = 30.0       # plugin: WatchAndRegister every 30 s
LOCK_EXPIRE_S = 300.0        # nodelock.NodeLockTimeout default (HAMI_NODELOCK_EXPIRE)
ALLOCATING_STALE_S = 300.0   # a bind that has not reached Allocate for this long is stuck
GPU_RESOURCE = "nvidia.com/gpu"
LOCKED_EVENT_RE = re.compile(r"(has been locked within|node \S+ is locked|locked)", re.I)

REFS_HANDSHAKE = (
    "https://github.com/Project-HAMi/HAMi/blob/master/docs/develop/protocol.md",
    "https://github.com/Project-HAMi/HAMi/blob/master/pkg/util/util.go",
)
REFS_LOCK = (
    "https://github.com/Project-HAMi/HAMi/issues/1130",
    "https://github.com/Project-HAMi/HAMi/pull/1271",
    "https://github.com/Project-HAMi/HAMi/pull/3047",
    "https://github.com/Project-HAMi/HAMi/pull/3097",
)
REFS_REGISTER = (
    "https://github.com/Project-HAMi/HAMi/blob/master/docs/develop/protocol.md",
    "https://github.com/Project-HAMi/HAMi/blob/master/pkg/device/devices.go",
)
REFS_ALLOC = (
    "https://github.com/Project-HAMi/HAMi/blob/master/pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go",
    "https://github.com/Project-HAMi/HAMi/issues/781",
)


# -- helpers over API dicts -------------------------------------------------------------------

def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return _meta(obj).get("annotations") or {}


def _ref(pod: Mapping[str, Any]) -> str:
    md = _meta(pod)
    return f"{md.get('namespace', '')}/{md.get('name', '')}"


def _age(t: dt.datetime | None, now: dt.datetime) -> float | None:
    return None if t is None else round((now - t).total_seconds(), 1)


def _gpu_request_count(pod: Mapping[str, Any]) -> int:
    """nvidia.com/gpu asked for by the pod's app containers (limits win over requests)."""
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or ():
        res = c.get("resources") or {}
        v = (res.get("limits") or {}).get(GPU_RESOURCE, (res.get("requests") or {}).get(GPU_RESOURCE))
        total += count(v) if v is not None else 0
    return total


def _is_terminal(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _find_plugin_pod(pods: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    for p in pods:
        name = str(_meta(p).get("name", ""))
        images = " ".join(str(c.get("image", "")) for c in (p.get("spec") or {}).get("containers") or ())
        if "device-plugin" in name and ("hami" in name.lower() or "hami" in images.lower()
                                        or "vgpu" in name.lower()):
            return p
    return None


def _plugin_restart(node: str, plugin: Mapping[str, Any] | None) -> str:
    if plugin is not None:
        md = _meta(plugin)
        return f"kubectl -n {md.get('namespace')} delete pod {md.get('name')}"
    return (f"kubectl get pods -A -o wide --field-selector spec.nodeName={node} | grep -i "
            f"device-plugin   # no HAMi device-plugin pod found on {node}: check the DaemonSet's "
            f"nodeSelector (HAMi's chart schedules it on nodes labelled gpu=on)")


PLUGIN_RESTART_RISK = (
    "Risk: while the plugin restarts, pods admitted on this node fail with "
    "UnexpectedAdmissionError and must be recreated; running containers keep their GPUs.")


def _events_for(events: Iterable[Mapping[str, Any]], uid: str, ns: str, name: str) -> list:
    out = []
    for ev in events:
        io = ev.get("involvedObject") or ev.get("regarding") or {}
        if (uid and io.get("uid") == uid) or (io.get("kind", "Pod") == "Pod"
                                             and io.get("name") == name
                                             and io.get("namespace") == ns):
            out.append(ev)
    return out


def _msg(ev: Mapping[str, Any]) -> str:
    return str(ev.get("message") or ev.get("note") or "")


# -- the analysis -----------------------------------------------------------------------------

_HAMI_KEYS = ByIdentity(lambda annos: any(k.startswith("hami.io/") for k in annos))


def _hami_annotated(annos: Mapping[str, Any]) -> bool:
    # a fleet's steady pods share their annotations dict (api/slim.PodCompactor): once each
    return bool(annos) and _HAMI_KEYS(annos)


def analyze_node(node: Mapping[str, Any], pods_on_node: Sequence[Mapping[str, Any]],
                 events: Sequence[Mapping[str, Any]], now: dt.datetime,
                 all_pods_index: Mapping[str, Mapping[str, Any]] | None = None) -> list[Finding]:
    """HAMi findings for one node.

    `pods_on_node`: pods with spec.nodeName == node. `events`: events about those pods and
    about pods that failed to bind to it (FailedScheduling "node X has been locked ..."); any
    superset is fine. `all_pods_index` (optional): "namespace/name" -> pod for the whole
    cluster, so a lock owner that is not bound to this node can be told apart from one that is
    gone; without it such an owner is reported as "not found on this node" (warning).
    """
    if now.tzinfo is None:
        now = now.replace(tzinfo=dt.timezone.utc)
    annos = _annotations(node)
    node_name = str(_meta(node).get("name", ""))
    hami_node = any(k.startswith("hami.io/") for k in annos)
    hami_pods = [p for p in pods_on_node if _hami_annotated(_annotations(p))]
    if not hami_node and not hami_pods:
        return []
    plugin = _find_plugin_pod(pods_on_node)
    findings: list[Finding] = []
    devices = _register_findings(node, node_name, annos, plugin, findings)
    _handshake_findings(node_name, annos, plugin, now, findings)
    _lock_findings(node_name, annos, pods_on_node, events, now, all_pods_index, findings)
    known = {d["id"] for d in devices} if devices is not None else None
    for pod in hami_pods:
        _pod_findings(pod, events, now, known, findings)
    return findings


def _register_findings(node, node_name, annos, plugin, findings) -> list[dict] | None:
    subject = f"node/{node_name}"
    restart = _plugin_restart(node_name, plugin)
    logs = (f"`kubectl -n {_meta(plugin).get('namespace')} logs {_meta(plugin).get('name')}`"
            if plugin is not None else "the device plugin's log")
    fix = (f"Look at why the HAMi device plugin registers this ({logs}), fix its config "
           f"(deviceSplitCount, deviceMemoryScaling, preConfiguredDeviceMemory), then restart it "
           f"so it re-registers: `{restart}`. "
           f"If the encoding is not what your hami-scheduler reads, run the same HAMi version for "
           f"the scheduler and the device plugin. {PLUGIN_RESTART_RISK}")
    if REGISTER_KEY not in annos:
        if any(k.startswith(HANDSHAKE_PREFIX) for k in annos):
            findings.append(catalog.make(
                "hami.register_invalid", "critical", subject,
                "HAMi node handshake present but no hami.io/node-nvidia-register: the scheduler "
                "sees no vGPU devices on this node",
                {"annotation": REGISTER_KEY, "value": None}, fix, REFS_REGISTER))
        return None
    value = annos.get(REGISTER_KEY) or ""
    try:
        devices, encoding = decode_register(value)
    except DecodeError as exc:
        findings.append(catalog.make(
            "hami.register_invalid", "critical", subject,
            f"hami.io/node-nvidia-register cannot be decoded ({exc}); the scheduler drops the "
            "node's devices",
            {"annotation": REGISTER_KEY, "value": value[:500], "error": str(exc)}, fix,
            REFS_REGISTER))
        return []
    alloc = (node.get("status") or {}).get("allocatable") or {}
    ev: dict = {"annotation": REGISTER_KEY, "encoding": encoding, "devices": devices[:16],
                "device_count": len(devices)}
    if GPU_RESOURCE in alloc:
        ev["allocatable_nvidia_gpu"] = count(alloc[GPU_RESOURCE])
        ev["registered_vgpu_slots"] = sum(d["count"] for d in devices if d["health"])
    if not devices:
        findings.append(catalog.make(
            "hami.register_invalid", "critical", subject,
            "hami.io/node-nvidia-register lists no devices: the scheduler sees no vGPUs here",
            ev, fix, REFS_REGISTER))
        return devices
    problems = []
    seen: set[str] = set()
    for d in devices:
        p = validate_device(d)
        if d["id"] in seen:
            p.append("duplicate id")
        seen.add(d["id"])
        if p:
            problems.append({"id": d["id"], "problems": p})
    unhealthy = [d["id"] for d in devices if not d["health"]]
    if problems:
        ev["invalid_devices"] = problems
        ev["unhealthy_devices"] = unhealthy
        findings.append(catalog.make(
            "hami.register_invalid", "critical", subject,
            f"{len(problems)} of {len(devices)} devices in hami.io/node-nvidia-register are "
            f"invalid: {problems[0]['id'] or '(empty id)'}: {problems[0]['problems'][0]}",
            ev, fix, REFS_REGISTER))
    elif unhealthy:
        ev["unhealthy_devices"] = unhealthy
        sev = "critical" if len(unhealthy) == len(devices) else "warning"
        note = (" (JSON encoding: Go omits `health: false`, so a device without `health` is "
                "unhealthy)" if encoding == "json" else "")
        findings.append(catalog.make(
            "hami.register_invalid", sev, subject,
            f"{len(unhealthy)} of {len(devices)} registered devices are unhealthy; the scheduler "
            f"skips them{note}",
            ev, "Check the GPUs' health (`nvidia-smi -q -d HEALTH,ECC`, Xid errors in the "
            f"kernel log: `kubectl gpu-doctor node {node_name}`); the plugin re-registers them "
            f"as healthy once NVML reports them healthy and the plugin is restarted: `"
            f"{_plugin_restart(node_name, plugin)}`. {PLUGIN_RESTART_RISK}", REFS_REGISTER))
    return devices


def _handshake_findings(node_name, annos, plugin, now, findings) -> None:
    restart = _plugin_restart(node_name, plugin)
    for key in sorted(k for k in annos if k.startswith(HANDSHAKE_PREFIX)):
        value = annos.get(key) or ""
        state, t = parse_handshake(value)
        age = _age(t, now)
        ev = {"annotation": key, "value": value, "state": state,
              "time": t.isoformat() if t else None, "age_s": age,
              "stale_after_s": HANDSHAKE_STALE_S, "plugin_pod": _ref(plugin) if plugin else None}
        subject = f"node/{node_name}"
        fix = (f"The HAMi device plugin on {node_name} is not re-registering (it writes "
               f"`Reported <time>` every {REPORT_PERIOD_S:.0f} s). Check its log and restart it: "
               f"`{restart}`. {PLUGIN_RESTART_RISK} If the plugin is healthy and writing, "
               f"compare the clocks of the scheduler's node and {node_name} (NTP).")
        if state == "unknown":
            if value.strip():
                findings.append(catalog.make(
                    "hami.handshake_stale", "warning", subject,
                    f"{key} has an unknown value {value[:60]!r}",
                    ev, fix, REFS_HANDSHAKE))
            continue
        if state in ("Requesting", "Deleted") and t is None:
            findings.append(catalog.make(
                "hami.handshake_stale", "critical", subject,
                f"{key} time cannot be parsed; HAMi treats it as expired and drops the node's "
                "devices", ev, fix, REFS_HANDSHAKE))
            continue
        if age is not None and age < -HANDSHAKE_STALE_S:
            ev["clock_skew_s"] = -age
            findings.append(catalog.make(
                "hami.handshake_stale", "warning", subject,
                f"{key} is {fmt_duration(-age)} in the future: clock skew between the scheduler, "
                f"{node_name} and this machine", ev,
                "Sync the clocks (NTP) of the hami-scheduler's node and this node; HAMi's "
                "60 s handshake window breaks with more than a few seconds of skew.",
                REFS_HANDSHAKE))
            continue
        if state == "Requesting" and age is not None and age > HANDSHAKE_STALE_S:
            findings.append(catalog.make(
                "hami.handshake_stale", "critical", subject,
                f"HAMi handshake stale: the scheduler asked {fmt_duration(age)} ago and the device "
                f"plugin never answered; the node's vGPUs are dropped (pods Pending, "
                f"'handshake' timeouts)", ev, fix, REFS_HANDSHAKE))
        elif state == "Deleted":
            findings.append(catalog.make(
                "hami.handshake_stale", "critical", subject,
                f"HAMi scheduler removed this node's devices {fmt_duration(age)} ago (Deleted_): the "
                f"device plugin stopped answering the handshake", ev, fix, REFS_HANDSHAKE))
        elif state == "Reported" and age is not None and age > 2 * REPORT_PERIOD_S:
            findings.append(catalog.make(
                "hami.handshake_stale", "warning", subject,
                f"HAMi device plugin last reported {fmt_duration(age)} ago (it reports every "
                f"{REPORT_PERIOD_S:.0f} s) and the scheduler has not asked since",
                ev, fix + " Also check that hami-scheduler is running.", REFS_HANDSHAKE))


def _lock_findings(node_name, annos, pods_on_node, events, now, all_pods_index, findings) -> None:
    if LOCK_KEY not in annos:
        return
    value = annos.get(LOCK_KEY) or ""
    subject = f"node/{node_name}"
    cmd = f"kubectl annotate node {node_name} {LOCK_KEY}-"
    mentions = re.compile(rf"(?<![\w.-]){re.escape(node_name)}(?![\w-]|\.\w)") if node_name else None
    blocked = [e for e in events if mentions and mentions.search(_msg(e))
               and LOCKED_EVENT_RE.search(_msg(e))]
    ev: dict = {"annotation": LOCK_KEY, "value": value, "expires_after_s": LOCK_EXPIRE_S,
                "binds_rejected_events": len(blocked)}
    if blocked:
        ev["last_rejection"] = _msg(blocked[-1])[:300]
    risk = ("Risk: if the owner pod is still being allocated (hami.io/bind-phase=allocating and "
            "its containers not created yet), removing the lock lets another pod bind and the "
            "device plugin can hand the owner's devices to the wrong pod (HAMi #3096); run it only "
            "when the owner is gone or finished, or no pod on the node is `allocating`.")
    try:
        t, ns, name = parse_lock(value)
    except DecodeError as exc:
        ev["error"] = str(exc)
        findings.append(catalog.make(
            "hami.lock_stale", "critical", subject,
            f"hami.io/mutex.lock cannot be parsed ({exc}): every HAMi bind to this node fails "
            "until it is removed", ev, f"Remove the lock: `{cmd}`. {risk}", REFS_LOCK))
        return
    age = _age(t, now)
    ev.update(lock_time=t.isoformat(), age_s=age, owner=f"{ns}/{name}" if name else None)
    reasons = []
    owner_state = None
    if name:
        key = f"{ns}/{name}"
        owner = next((p for p in pods_on_node if _ref(p) == key), None)
        if owner is None and all_pods_index is not None:
            owner = all_pods_index.get(key)
        if owner is None:
            owner_state = "gone" if all_pods_index is not None else "not found on this node"
            reasons.append(f"owner pod {key} is {owner_state}")
        else:
            phase = (owner.get("status") or {}).get("phase")
            bind = _annotations(owner).get(BIND_PHASE_KEY)
            owner_state = f"phase={phase}, bind-phase={bind}"
            if _is_terminal(owner):
                reasons.append(f"owner pod {key} is {phase}")
            elif bind in ("success", "failed"):
                reasons.append(f"owner pod {key} finished allocating (bind-phase={bind}) but the "
                               "lock was not released")
            elif _meta(owner).get("deletionTimestamp"):
                reasons.append(f"owner pod {key} is being deleted")
    ev["owner_state"] = owner_state
    if age is not None and age > LOCK_EXPIRE_S:
        reasons.insert(0, f"held for {fmt_duration(age)} (> {LOCK_EXPIRE_S / 60:.0f} min)")
    if not reasons:
        return
    definitely_gone = owner_state == "gone" or any("is Succeeded" in r or "is Failed" in r
                                                   for r in reasons)
    sev = "critical" if blocked or definitely_gone else "warning"
    findings.append(catalog.make(
        "hami.lock_stale", sev, subject,
        f"HAMi node lock is stale: {'; '.join(reasons)}"
        + (f"; {len(blocked)} bind(s) rejected" if blocked else ""),
        ev, f"Remove the lock so the scheduler can bind again: `{cmd}` (newer HAMi takes an "
            f"expired or orphaned lock over on the next bind by itself; a lock that stays is "
            f"held by an older scheduler or a finished pod). {risk}", REFS_LOCK))


def _pod_findings(pod, events, now, known_devices, findings) -> None:
    annos = _annotations(pod)
    md = _meta(pod)
    ref = _ref(pod)
    subject = f"pod/{ref}"
    phase = (pod.get("status") or {}).get("phase")
    bind = annos.get(BIND_PHASE_KEY)
    bind_time = parse_bind_time(annos.get(BIND_TIME_KEY, ""))
    bind_age = _age(bind_time, now)
    ev: dict = {"bind_phase": bind, "bind_time": bind_time.isoformat() if bind_time else None,
                "bind_age_s": bind_age, "phase": phase,
                TO_ALLOCATE_KEY: annos.get(TO_ALLOCATE_KEY),
                ALLOCATED_KEY: annos.get(ALLOCATED_KEY)}
    owners = md.get("ownerReferences") or []
    cmd = f"kubectl -n {md.get('namespace')} delete pod {md.get('name')}"
    risk = ("Risk: the pod's containers restart; " + (
        f"its {owners[0].get('kind')} recreates it and the scheduler allocates again."
        if owners else "it is a bare pod (no owner): it is gone for good, recreate it from its "
        "manifest."))
    fix = (f"Delete the pod so it is scheduled and allocated again: `{cmd}`. {risk} If it "
           f"repeats, run the same HAMi version for hami-scheduler and the device plugin and "
           f"check the plugin's log.")
    reasons = []
    sev = None
    try:
        allocated = decode_pod_devices(annos.get(ALLOCATED_KEY, ""))
        pending = decode_pod_devices(annos.get(TO_ALLOCATE_KEY, ""))
    except DecodeError as exc:
        ev["error"] = str(exc)
        findings.append(catalog.make(
            "hami.allocation_mismatch", "critical", subject,
            "HAMi device annotations cannot be decoded (why is quoted): the device plugin "
            "cannot allocate this pod", ev, fix, REFS_ALLOC,
            # the annotations are the pod's: what the decoder says quotes them (MCP-01)
            quoted=(quote(f"{subject} annotations", "decoding error", exc),)))
        return
    n_alloc = sum(len(c) for c in allocated)
    n_pending = sum(len(c) for c in pending)
    asked = _gpu_request_count(pod)
    ev.update(allocated_devices=n_alloc, pending_devices=n_pending, requested_gpus=asked)
    not_matched = [e for e in _events_for(events, str(md.get("uid") or ""),
                                          str(md.get("namespace") or ""), str(md.get("name") or ""))
                   if "device number not matched" in _msg(e)]
    if not_matched:
        ev["events"] = [f"{e.get('reason')}: {_msg(e)[:200]}" for e in not_matched[-3:]]
        reasons.append("kubelet admission failed with 'device number not matched'")
        sev = "critical"
    if ALLOCATED_KEY in annos and asked and n_alloc and n_alloc != asked:
        reasons.append(f"the scheduler allocated {n_alloc} device(s) but the containers ask for "
                       f"{asked} {GPU_RESOURCE}")
        sev = "critical"
    if known_devices is not None:
        unknown = sorted({d["uuid"] for c in allocated for d in c} - known_devices)
        if unknown:
            ev["unregistered_devices"] = unknown
            reasons.append(f"allocated device(s) not registered on the node: {', '.join(unknown)}")
            sev = "critical"
    if bind == "failed":
        reasons.append("the device plugin's Allocate failed (bind-phase=failed)")
        sev = sev or ("critical" if phase not in ("Running", "Succeeded") else "warning")
    elif bind == "allocating" and bind_age is not None and bind_age > ALLOCATING_STALE_S:
        reasons.append(f"stuck in bind-phase=allocating for {fmt_duration(bind_age)}: kubelet never "
                       "called the plugin's Allocate for it, or Allocate could not find it")
        sev = sev or "warning"
    elif bind == "success" and n_pending:
        reasons.append(f"bind-phase=success but {n_pending} device(s) are still in "
                       f"{TO_ALLOCATE_KEY}")
        sev = sev or "warning"
    if reasons:
        findings.append(catalog.make(
            "hami.allocation_mismatch", sev, subject,
            "HAMi allocation mismatch: " + "; ".join(reasons), ev, fix, REFS_ALLOC))

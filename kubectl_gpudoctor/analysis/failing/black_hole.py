"""node.gpu_black_hole: a Ready, schedulable node that fails or rejects the GPU pods sent to it.

Why: one lost GPU made a Ready node reject 554 pods in 1 h 46 min (pytorch/ci-infra PR #1058):
the NVIDIA device plugin's aligned allocation reads the links of every GPU, so one GPU off the
bus fails GetPreferredAllocation for every GPU pod (k8s-device-plugin #2038, #231), yet the
node stays Ready and keeps advertising its GPUs, so the scheduler keeps sending pods that the
kubelet rejects (UnexpectedAdmissionError, OutOf<resource>) or whose containers cannot start
(the runtime's GPU errors, container_start.py) or exit within seconds. Health monitors watch the
hardware; nothing watches the outcomes. They are in the pods and events `nodes` already lists.

The test, per node, over the last WINDOW_S: at least MIN_FAILED GPU pods failed there, at least
MIN_RATE of the GPU pods sent there failed, the last of them failed (a node that recovered is
not one), and the same controllers' pods elsewhere fail far less (FAR_MORE times less). A failure
whose cause is the node's by its nature (an admission rejection, a GPU start error) counts even
when those controllers have no pods elsewhere to compare with; a pod that merely exits within
seconds counts only against such a comparison (the workload may be broken everywhere). When
every failed pod is one namespace's, and other namespaces' GPU pods started on the node since
the first failure, the node is not the cause (a tenant can break its own pods, or spell the
runtime's GPU errors into them: audit round 5, BH-01). A start failure counts as a GPU cause
only in the frame the runtime gives the NVIDIA hook's own error (container_start.classify,
start_frames.py), never in the container's command the runtime quotes back.

Pods deleted since (the controller replaced them) are seen through the kubelet's events, named
by their node (`source.host`) and grouped under the controller their generated name implies.

Pure functions over raw API dicts; no I/O. `peers` is computed once per run from every pod
(commands/nodes.py) or from the namespaces of the failing controllers (`node X`).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import re
from typing import Any, Iterable, Mapping, Sequence

from node_probe.protocol import Finding, catalog

from ..common import (both_ends, event_source, event_time, fmt_duration, node_is_ready, parse_time,
                      pod_ref)
from ..scheduling.gpu_held import pod_gpu_requests
from .container_start import CAUSES, EVENT_REASONS, KNOWN_KEYS, classify, failures

WINDOW_S = 3600.0     # what the API server keeps of events by default (--event-ttl 1h)
MIN_FAILED = 3
MIN_RATE = 0.5
FAR_MORE = 4.0
MIN_PEERS = 3         # the same controllers' GPU pods elsewhere needed to compare with
QUICK_EXIT_S = 10.0
MAX_SHOWN = 10
ADMISSION_REASONS = ("UnexpectedAdmissionError",)
REFS = ("https://github.com/pytorch/ci-infra/pull/1058",
        "https://github.com/NVIDIA/k8s-device-plugin/issues/2038",
        "https://github.com/NVIDIA/k8s-device-plugin/issues/231")
# generateName's random suffix (k8s.io/apimachinery/pkg/util/rand: consonants and digits
# without look-alikes, 5 characters)
_GENERATED = re.compile(r"^(.+)-[bcdfghjklmnpqrstvwxz2456789]{5}$")
_QUICK = "exited within"
# what a rejection at admission says, in our words: the kubelet passes on the device plugin's
# error (NVIDIA/k8s-device-plugin's GetPreferredAllocation: "... failed to get nvlink state:
# GPU is lost", the NVML error of a GPU off the bus; the kubelet's own "no healthy devices
# present; cannot allocate unhealthy devices"): (key, pattern, words), first match wins
ADMISSION_CAUSES = (
    ("gpu_lost", re.compile(r"\bGPU is lost\b"),
     "the device plugin says a GPU is lost (off the bus, Xid 79)"),
    ("no_healthy_devices", re.compile(r"no healthy devices present|cannot allocate unhealthy "
                                      r"devices"),
     "the device plugin reports no healthy GPU"),
)


def admission_cause(message: str) -> str | None:
    """The key of ADMISSION_CAUSES a rejection's message names, or None."""
    for key, pattern, _ in ADMISSION_CAUSES:
        if pattern.search(message or ""):
            return key
    return None


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One GPU pod sent to a node, as it ended (or goes on)."""

    node: str
    controller: tuple[str, str]   # (namespace, name): the owner, or what the pod name implies
    pod: str
    failed: bool
    at: dt.datetime | None
    reason: str = ""              # UnexpectedAdmissionError, OutOfnvidia.com/gpu, ...
    hard: bool = False            # the node's by its nature (admission, a GPU start cause)
    message: str = ""
    kind: str = ""                # the owner's kind when known


def window() -> dt.timedelta:
    return dt.timedelta(seconds=WINDOW_S)


def controller_of(pod: Mapping[str, Any]) -> tuple[tuple[str, str], str]:
    md = pod.get("metadata") or {}
    ns = str(md.get("namespace") or "")
    for o in md.get("ownerReferences") or ():
        if isinstance(o, Mapping) and o.get("controller"):
            return (ns, str(o.get("name") or "")), str(o.get("kind") or "")
    return (ns, implied_controller(str(md.get("name") or ""))), ""


def implied_controller(pod_name: str) -> str:
    """The controller a pod name implies: generateName's prefix (ReplicaSet, Job and runner
    pods), else the name itself."""
    m = _GENERATED.match(pod_name)
    return m.group(1) if m else pod_name


def _steady(st: Mapping[str, Any]) -> bool:
    """A pod `nodes` kept as a skeleton (slim.PodCompactor): Running, no container status."""
    return st.get("phase") == "Running" and not st.get("containerStatuses")


def _quick_exit(pod: Mapping[str, Any]) -> tuple[str, dt.datetime | None] | None:
    for key in ("containerStatuses", "initContainerStatuses"):
        for cs in (pod.get("status") or {}).get(key) or ():
            state, last = cs.get("state") or {}, cs.get("lastState") or {}
            for t in (state.get("terminated") or {}, last.get("terminated") or {}):
                code = t.get("exitCode")
                if not isinstance(code, int) or code == 0 or t.get("reason") == "Completed":
                    continue
                start, end = parse_time(t.get("startedAt")), parse_time(t.get("finishedAt"))
                if start and end and 0 <= (end - start).total_seconds() <= QUICK_EXIT_S:
                    return (f"{_QUICK} {QUICK_EXIT_S:g}s of starting (exit code {code})", end)
    return None


def attempt(pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]], now: dt.datetime,
            since: dt.datetime) -> Attempt | None:
    """The pod as one attempt to run GPU work on its node since `since`, or None: no GPU, not
    bound, not yet decided (still creating), or outside the window."""
    spec, st, md = pod.get("spec") or {}, pod.get("status") or {}, pod.get("metadata") or {}
    node = spec.get("nodeName")
    if not node or not pod_gpu_requests(pod):
        return None
    ctl, kind = controller_of(pod)
    ref = pod_ref(pod)
    created = parse_time(md.get("creationTimestamp"))
    if _steady(st):  # started and running: a success when it started in the window
        return Attempt(node, ctl, ref, False, created, kind=kind) \
            if created and created >= since else None
    reason, hard, at, message = "", False, None, ""
    if st.get("phase") == "Failed" and (st.get("reason") in ADMISSION_REASONS
                                        or str(st.get("reason") or "").startswith("OutOf")):
        reason, hard, message = str(st.get("reason")), True, str(st.get("message") or "")
        at = parse_time(st.get("startTime")) or created
    if not reason:
        fails = failures(pod, events)
        if fails:
            f = fails[0]
            reason, hard, message = f"{f.reason}: {f.cause.key}", True, f.message
            at = max((t for t in (event_time(e) for e in events) if t), default=None) or now
    if not reason:
        quick = _quick_exit(pod)
        if quick:
            reason, at = quick
    if reason:
        at = at or created
        return Attempt(node, ctl, ref, True, at, reason, hard, both_ends(message, 300), kind) \
            if at and at >= since else None
    if st.get("phase") in ("Running", "Succeeded"):
        started = parse_time(st.get("startTime")) or created
        return Attempt(node, ctl, ref, False, started, kind=kind) \
            if started and started >= since else None
    return None


def event_node(ev: Mapping[str, Any]) -> str | None:
    """The node a kubelet event comes from (`source.host`, else `reportingInstance`)."""
    host = (ev.get("source") or {}).get("host") or ev.get("reportingInstance")
    return host if isinstance(host, str) and host else None


def gone_attempts(events: Iterable[Mapping[str, Any]], known_uids: set | frozenset,
                  since: dt.datetime) -> list[Attempt]:
    """Failed attempts of pods that are gone (not in `known_uids`), from the kubelet's Warning
    events about them: an admission rejection, or a start failure with a GPU cause."""
    by_uid: dict[str, Attempt] = {}
    for e in events:
        if e.get("type") != "Warning" or event_source(e) not in ("kubelet", ""):
            continue
        obj = e.get("involvedObject") or e.get("regarding") or {}
        uid = obj.get("uid")
        if not uid or uid in known_uids or uid in by_uid or obj.get("kind") not in (None, "Pod"):
            continue
        node = event_node(e)
        at = event_time(e)
        if not node or at is None or at < since:
            continue
        r = str(e.get("reason") or "")
        msg = str(e.get("message") or "")
        if r in ADMISSION_REASONS or r.startswith("OutOf"):
            reason = r
        elif r in EVENT_REASONS:
            hit = classify(msg)
            if hit is None:
                continue
            reason = f"{r}: {hit[0].key}"
        else:
            continue
        ns, name = str(obj.get("namespace") or ""), str(obj.get("name") or "")
        by_uid[uid] = Attempt(node, (ns, implied_controller(name)), f"{ns}/{name}", True, at,
                              reason, True, both_ends(msg, 300))
    return list(by_uid.values())


def node_attempts(pods: Iterable[Mapping[str, Any]],
                  events: Mapping[str, Sequence[Mapping[str, Any]]],
                  gone: Sequence[Attempt], now: dt.datetime,
                  failed_only: bool = False) -> list[Attempt]:
    """Every attempt among `pods` (events by pod uid) plus the gone pods' ones. With
    `failed_only`, steady pods are not looked at (they cannot have failed)."""
    since = now - dt.timedelta(seconds=WINDOW_S)
    out = list(gone)
    for p in pods:
        if failed_only and _steady(p.get("status") or {}):
            continue
        uid = (p.get("metadata") or {}).get("uid")
        a = attempt(p, events.get(uid, ()) if uid else (), now, since)
        if a is not None and (a.failed or not failed_only):
            out.append(a)
    return out


Peers = Mapping[tuple[str, str], Mapping[str, tuple[int, int]]]


def peer_table(attempts: Iterable[Attempt], only: set | frozenset | None = None
               ) -> dict[tuple[str, str], dict[str, tuple[int, int]]]:
    """controller -> node -> (GPU pods sent there in the window, failed). `only`: these
    controllers (those failing somewhere); the others are never compared."""
    table: dict[tuple[str, str], dict[str, tuple[int, int]]] = {}
    for a in attempts:
        if only is not None and a.controller not in only:
            continue
        per = table.setdefault(a.controller, {})
        sent, failed = per.get(a.node, (0, 0))
        per[a.node] = (sent + 1, failed + int(a.failed))
    return table


def _namespaces(failed: Sequence[Attempt], ok: Sequence[Attempt]) -> dict:
    """One namespace's failed pods against the other namespaces' GPU pods on the node.

    A fault of the node (a lost GPU, a broken driver or runtime) fails every tenant's GPU pods
    that land there; pods of one namespace that fail while other namespaces' GPU pods start
    on the same node after the first failure are that namespace's doing -- a broken image, or
    a tenant writing the runtime's words into its own pods (audit round 5, BH-01) -- however
    many of them there are."""
    per: dict[str, int] = {}
    for a in failed:
        per[a.controller[0]] = per.get(a.controller[0], 0) + 1
    first = min((a.at for a in failed if a.at), default=None)
    one = next(iter(per)) if len(per) == 1 else None
    others = [a for a in ok if a.controller[0] != one] if one is not None else []
    started = [a for a in others if a.at is None or first is None or a.at >= first]
    top = sorted(per.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_SHOWN]
    return {"namespaces": dict(top), "one_namespace_only": one is not None,
            "others_started": len(started),
            "other_namespaces": {"gpu_pods": len(others), "started_since_first_failure":
                                 len(started)} if one is not None else None}


def analyze(node: Mapping[str, Any], pods_on_node: Sequence[Mapping[str, Any]],
            events: Mapping[str, Sequence[Mapping[str, Any]]], gone: Sequence[Attempt],
            now: dt.datetime, peers: Peers | None) -> list[Finding]:
    """node.gpu_black_hole for one node, or nothing. `events`: by pod uid; `gone`: the failed
    attempts of pods that are gone (gone_attempts); `peers`: peer_table over the whole cluster
    (None: not known, so only the node's own evidence counts, and the finding says so)."""
    name = str((node.get("metadata") or {}).get("name") or "")
    if node_is_ready(node) is not True or (node.get("spec") or {}).get("unschedulable"):
        return []  # nothing is sent there: not a black hole (other findings say why)
    failed = [a for a in node_attempts(pods_on_node, events, (), now, failed_only=True)
              if a.node == name] + [a for a in gone if a.node == name]
    if len(failed) < MIN_FAILED:
        return []  # the common case: steady pods are not even looked at
    ok = [a for a in node_attempts(pods_on_node, events, (), now)
          if not a.failed and a.node == name]
    attempts = failed + ok
    rate = len(failed) / len(attempts)
    last_fail = max((a.at for a in failed if a.at), default=None)
    last_ok = max((a.at for a in ok if a.at), default=None)
    if rate < MIN_RATE or (last_ok and last_fail and last_ok > last_fail):
        return []  # most pods run there, or it has recovered since
    spread = _namespaces(failed, ok)
    if spread["one_namespace_only"] and spread["others_started"]:
        return []  # one tenant's pods fail there while the others' start: theirs, not the node's
    by_ctl: dict[tuple[str, str], list[Attempt]] = {}
    for a in failed:  # grouped in one pass: a node may have thousands of failed pods
        by_ctl.setdefault(a.controller, []).append(a)
    sent_else = failed_else = 0
    rows = []
    for ctl, here in sorted(by_ctl.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        other = [(s, f) for n, (s, f) in ((peers or {}).get(ctl) or {}).items() if n != name]
        s_o, f_o = sum(s for s, _ in other), sum(f for _, f in other)
        sent_else, failed_else = sent_else + s_o, failed_else + f_o
        if len(rows) < MAX_SHOWN:
            kind = next((a.kind for a in here if a.kind), "")
            rows.append({"controller": f"{kind + ' ' if kind else ''}{ctl[0]}/{ctl[1]}",
                         "failed_here": len(here),
                         "elsewhere": None if peers is None else {"pods": s_o, "failed": f_o}})
    compared = peers is not None and sent_else >= MIN_PEERS
    if compared:
        rate_else = failed_else / sent_else
        if rate < FAR_MORE * rate_else:
            return []  # these controllers' pods fail elsewhere too: the workload, not the node
    else:
        hard = [a for a in failed if a.hard]
        if len(hard) < MIN_FAILED or len(hard) / len(attempts) < MIN_RATE:
            return []  # exits within seconds with nothing to compare with: could be the workload
    reasons: dict[str, int] = {}
    for a in failed:  # exit codes apart, one reason per kind of failure
        key = f"{_QUICK} {QUICK_EXIT_S:g}s" if a.reason.startswith(_QUICK) else a.reason
        reasons[key] = reasons.get(key, 0) + 1
    top = sorted(reasons.items(), key=lambda kv: -kv[1])
    first = min((a.at for a in failed if a.at), default=None)
    span = (last_fail - first).total_seconds() if first and last_fail else None
    causes = sorted({a.reason.split(": ", 1)[1] for a in failed if ": " in a.reason
                     and a.reason.split(": ", 1)[1] in KNOWN_KEYS})
    admitted: dict[str, int] = {}   # rejections at admission, by what their message names
    for a in failed:
        key = admission_cause(a.message) if a.reason in ADMISSION_REASONS else None
        if key is not None:
            admitted[key] = admitted.get(key, 0) + 1
    said = max(sorted(admitted), key=lambda k: admitted[k]) if admitted else None
    said_words = next((w for k, _, w in ADMISSION_CAUSES if k == said), "")
    caused_by = sorted({i for c in CAUSES if c.key in causes
                        for i in c.node_ids})
    samples = []
    for a in sorted(failed, key=lambda a: a.at or now, reverse=True):
        if a.message and a.message not in samples:
            samples.append(a.message)
        if len(samples) == 3:
            break
    elsewhere = ("; the same controllers' GPU pods elsewhere: "
                 f"{failed_else} of {sent_else} failed" if compared else
                 "; not compared with other nodes" if peers is None else
                 "; these controllers have too few GPU pods elsewhere to compare")
    return [catalog.make(
        "node.gpu_black_hole", "critical", f"node/{name}",
        f"{len(failed)} of {len(attempts)} GPU pods sent to {name} in the last "
        f"{fmt_duration(WINDOW_S)} failed or were rejected "
        f"({', '.join(f'{n} {r}'.replace('_', ' ') for r, n in top[:3])})"
        + (f"; {admitted[said]} of them: {said_words}" if said else "") + elsewhere,
        {"node": name, "window_s": WINDOW_S, "failed_pods": len(failed),
         "gpu_pods": len(attempts), "failure_rate": round(rate, 2),
         "reasons": dict(top), "first_failure": first.isoformat() if first else None,
         "last_failure": last_fail.isoformat() if last_fail else None,
         "failing_for_s": None if span is None else round(span),
         "controllers": rows, "compared_elsewhere": compared,
         "elsewhere": {"pods": sent_else, "failed": failed_else} if peers is not None else None,
         "messages": samples, "caused_by": caused_by or None,
         "admission_causes": admitted or None,
         "namespaces": spread["namespaces"], "other_namespaces": spread["other_namespaces"],
         # the latest ones, not `pods`: the verdict counts `pods` as held up, and these
         # were rejected (their controllers made new ones)
         "latest_failed": [{"pod": a.pod, "reason": a.reason} for a in
                           sorted(failed, key=lambda a: a.at or now, reverse=True)[:MAX_SHOWN]]},
        f"The node is Ready and schedulable, so the scheduler keeps sending it GPU pods, and "
        f"they fail there. Cordon it now (`kubectl cordon {name}`: running pods stay) so the "
        f"next pods go elsewhere; then find the cause with `kubectl gpu-doctor node {name}` "
        "(a lost GPU, Xid 79, breaks GetPreferredAllocation for every pod with the NVIDIA "
        "device plugin: drain and reset or reboot the node); pods rejected at admission are "
        "never retried, so delete them and let their controllers recreate them elsewhere.",
        REFS)]

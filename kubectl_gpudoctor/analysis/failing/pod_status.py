"""pod.pending_explained / pod.admission_error: why this pod is not running, in one finding.

Why: `kubectl describe pod` shows conditions and events, but the on-call engineer has to know
that "Pending with only Scheduled" means the kubelet never admitted it (seed 000), that
`UnexpectedAdmissionError` means the kubelet's device manager rejected it, and that
`device number not matched` is HAMi's scheduler and device plugin disagreeing (seed 003).

Pure function over the raw Pod and its events; no I/O.
"""
from __future__ import annotations

import datetime as dt
from typing import Any, Mapping, Sequence

from node_probe.protocol import catalog
from node_probe.protocol import Finding, quote

from ..common import event_source, event_time, fmt_duration, gpu_requests, pod_ref
from ..quoting import event_quote as _quote_event, word as _word
from ..stuck.admission import untouched_pending
from ..stuck.wedge import blocking_findings
from .admission_race import REFS as RACE_REFS, explain as explain_race
from .container_start import classify as start_failure
from .plugin_messages import Cause, classify as classify_plugin_error, finding_for

IMAGE_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
ADMISSION_MARKERS = ("UnexpectedAdmissionError", "device number not matched",
                     "Allocate failed", "GetPreferredAllocation", "OutOf")


def _sorted_events(events: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    return sorted(events, key=lambda e: event_time(e) or epoch)


def _ev_brief(e: Mapping[str, Any]) -> dict:
    return {"type": e.get("type"), "reason": e.get("reason"), "from": event_source(e),
            "count": e.get("count") or (e.get("series") or {}).get("count") or 1,
            "message": str(e.get("message") or "")[:300]}


def analyze_pod(pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]],
                now: dt.datetime, stall_threshold_s: float = 120.0,
                fit: Sequence[Finding] | None = None,
                node_findings: Sequence[Finding] = (), *,
                node: Mapping[str, Any] | None = None,
                node_events: Sequence[Mapping[str, Any]] = (),
                node_pods: Sequence[Mapping[str, Any]] = ()) -> list[Finding]:
    """`fit`: what fit_findings.analyze_pending found for an unscheduled GPU pod (it names the case with
    nodes and numbers, so it replaces the scheduler's sentence); None when not computed.
    `node_findings`: the API-side findings about the pod's node; a kubelet whose sync loop is
    known to be blocked makes an untouched pod critical before the stall threshold.
    `node`, `node_events`, `node_pods`: the pod's node, its events and the pods on it, to name
    the admission race behind an UnexpectedAdmissionError (analysis.failing.admission_race)."""
    spec, st = pod.get("spec") or {}, pod.get("status") or {}
    subject = f"pod/{pod_ref(pod)}"
    evs = _sorted_events(events)
    brief = [_ev_brief(e) for e in evs][-8:]
    phase = st.get("phase") or "Pending"
    gpu = gpu_requests(pod)
    base = {"phase": phase, "node": spec.get("nodeName"), "gpu": gpu or None, "events": brief}
    out: list[Finding] = []

    # The kubelet rejected the pod at admission.
    adm_texts = [str(st.get("reason") or ""), str(st.get("message") or "")] + [
        f"{e.get('reason', '')} {e.get('message', '')}" for e in evs
        if e.get("type") == "Warning"]
    hit = next((t for t in adm_texts if any(m in t for m in ADMISSION_MARKERS)), None)
    if hit:
        hami = any("device number not matched" in t for t in adm_texts)
        if st.get("reason") and st.get("message"):
            hit = f"{st.get('reason')}: {st.get('message')}"
        cause = None if hami else next(
            (c for c in (classify_plugin_error(t) for t in adm_texts) if c), None)
        if cause is not None:
            out.append(_plugin_cause_finding(subject, base, st, cause, hit))
            out.append(finding_for(cause, spec.get("nodeName"), hit,
                                                   f"the admission error of {subject}",
                                                   pod=pod_ref(pod)))
            return out
        race = None if hami else explain_race(pod, evs, now, node, node_events, node_pods)
        if race is not None:
            out.append(_race_finding(subject, base, st, race))
            return out
        said = (quote(f"{subject} status", "reason: message", hit)
                if st.get("reason") and st.get("message") else
                next((_quote_event(e, subject) for e in evs
                      if f"{e.get('reason', '')} {e.get('message', '')}" == hit),
                     quote(subject, "status", hit)))
        out.append(catalog.make(
            "pod.admission_error", "critical", subject,
            f"the kubelet rejected the pod at admission ({_word(st.get('reason'))}; its "
            "words are quoted)" if st.get("reason") else
            "the kubelet rejected the pod at admission (its words are quoted)",
            dict(base, reason=st.get("reason"), message=st.get("message")),
            ("HAMi's scheduler annotations and the device plugin disagree about the devices "
             "(stale hami.io/node-handshake or a failed allocation); see hami.* findings for "
             "the node. Delete the pod so its controller recreates it once fixed."
             if hami else
             "The kubelet's device manager refused the pod (the device plugin failed Allocate "
             "or had no healthy device). A pod that failed admission is not retried: delete it "
             "so its controller recreates it, after fixing the node (see the node findings)."),
            ("https://kubernetes.io/docs/concepts/extend-kubernetes/compute-storage-net/device-plugins/",),
            quoted=(said,)))
        return out

    if phase != "Pending":
        return out

    if not spec.get("nodeName"):
        if fit:
            out.extend(fit)
            return out
        sched = [e for e in evs if e.get("reason") == "FailedScheduling"]
        msg = (sched[-1].get("message") if sched else None) or next(
            (c.get("message") for c in st.get("conditions") or ()
             if c.get("type") == "PodScheduled" and c.get("status") == "False"), "")
        out.append(catalog.make(
            "pod.pending_explained", "warning", subject,
            "not scheduled yet" + (" (the scheduler's message is quoted)" if str(msg).strip()
                                   else ": no scheduler event"),
            dict(base, scheduler_message=msg),
            "The scheduler found no node that fits. For GPU pods check `kubectl describe node` "
            "allocatable nvidia.com/* (node.gpu_capacity_mismatch), taints and node selectors.",
            (), quoted=(_quote_event(sched[-1], subject) if sched else
                        quote(f"{subject} condition PodScheduled", "message", msg),)
            if str(msg).strip() else ()))
        return out

    waited = untouched_pending(pod, evs, now)
    if waited is not None:
        stalled = waited >= stall_threshold_s
        blocking = blocking_findings(node_findings, str(spec.get("nodeName") or ""))
        cause = ("kubelet.admission_stalled" if stalled else
                 blocking[0].id if blocking else None)
        resource = next((f.evidence.get("resource") for f in blocking
                         if f.evidence.get("resource")), None)
        out.append(catalog.make(
            "pod.pending_explained", "critical" if cause else "info", subject,
            f"bound to {spec.get('nodeName')} {fmt_duration(waited)} ago but the kubelet has "
            f"not acted on it (only the scheduler's event)"
            + (f"; see {cause}" if cause else "")
            + (f" (admission waits in the device plugin for {', '.join(resource)})"
               if resource and not stalled else ""),
            dict(base, waiting_s=round(waited), caused_by=cause),
            "The kubelet on the node is not admitting pods; the node findings say why "
            "(kubelet.admission_stalled, kubelet.blocked_in_device_plugin).", ()))
        return out

    waiting = []
    for cs in list(st.get("initContainerStatuses") or ()) + list(st.get("containerStatuses") or ()):
        w = (cs.get("state") or {}).get("waiting")
        if w and start_failure(w.get("message")):
            continue  # a GPU start failure with a known cause: pod.gpu_start_failed says it
        if w and w.get("reason") not in (None, "ContainerCreating", "PodInitializing"):
            waiting.append({"container": cs.get("name"), "reason": w.get("reason"),
                            "message": str(w.get("message") or "")[:300]})
    warnings = [e for e in evs if e.get("type") == "Warning"]
    if waiting:
        w = waiting[0]
        image = w["reason"] in IMAGE_REASONS
        out.append(catalog.make(
            "pod.pending_explained", "warning", subject,
            f"container {w['container']} waits: {_word(w['reason'])}"
            + (" (its message is quoted)" if w["message"] else ""),
            dict(base, waiting=waiting),
            ("The image cannot be pulled: check the name/tag, the registry's reachability from "
             "the node and imagePullSecrets." if image else
             "See the container's waiting message and the pod events."), (),
            quoted=(quote(f"{subject} container {w['container']}", "state.waiting.message",
                          w["message"]),) if w["message"] else ()))
    known = next(((e, c) for e in reversed(warnings)
                  for c in (classify_plugin_error(str(e.get("message") or "")),) if c), None)
    if known and not waiting:
        e, cause = known
        text = str(e.get("message") or "")
        out.append(catalog.make(
            "pod.pending_explained", "critical", subject,
            f"{_word(e.get('reason'))}: {cause.what}",
            dict(base, caused_by=cause.finding_id, cause=cause.kind),
            f"Cause: {cause.what}. Fix: {cause.fix}.", cause.refs,
            quoted=(_quote_event(e, subject),)))
        out.append(finding_for(cause, spec.get("nodeName"), text,
                                               f"the {e.get('reason')} event of {subject}",
                                               pod=pod_ref(pod)))
    elif warnings:
        e = warnings[-1]
        out.append(catalog.make(
            "pod.pending_explained", "warning", subject,
            f"has a Warning event {_word(e.get('reason'))} (its message is quoted)",
            base, "See the pod events; the node findings may explain them.", (),
            quoted=(_quote_event(e, subject),)))
    return out


def _race_finding(subject: str, base: dict, st: Mapping[str, Any], race: dict) -> Finding:
    if race["recreated"]:
        after = (f"Nothing to do for the workload: {race['how']}. Delete this Failed pod to "
                 "tidy up (kubectl delete pod; risk: none, it never ran).")
    else:
        after = (f"{race['how'][0].upper()}{race['how'][1:]}: once the node is fixed, recreate "
                 "the pod (kubectl delete pod and apply it again).")
    cleared = {True: f" The node advertises {race['node_allocatable_now']} allocatable "
                     f"{race['resource']} now: the cause has cleared.",
               False: f" The node still advertises {race['node_allocatable_now']} allocatable "
                      f"{race['resource']}: the cause has not cleared (see the node findings).",
               None: ""}[race["cleared_now"]]
    # now versus then: a cause that has cleared is not critical; with the pod already replaced
    # by its controller there is nothing left to do but tidy up (info), a bare pod waits for a
    # person to recreate it (warning)
    severity = "critical" if race["cleared_now"] is not True else (
        "info" if race["recreated"] is True else "warning")
    return catalog.make(
        "pod.admission_error", severity, subject,
        "the kubelet rejected the pod at admission: " + race["race"],
        dict(base, reason=st.get("reason"), message=st.get("message"), admission_race=race),
        f"Cause: {race['race']}. What clears it: {race['clears']}.{cleared} A pod rejected at "
        f"admission is never retried by the kubelet. {after}",
        ("https://kubernetes.io/docs/concepts/extend-kubernetes/compute-storage-net/device-plugins/",
         *RACE_REFS))


def _plugin_cause_finding(subject: str, base: dict, st: Mapping[str, Any],
                          cause: Cause, hit: str) -> Finding:
    """The admission error of a pod whose device plugin failed for a known cause
    (plugin_messages): the cause and its fix, not the kubelet's words again."""
    return catalog.make(
        "pod.admission_error", "critical", subject,
        f"the kubelet rejected the pod at admission: {cause.what}",
        dict(base, reason=st.get("reason"), message=st.get("message"),
             caused_by=cause.finding_id, cause=cause.kind),
        f"Cause: {cause.what}. Fix: {cause.fix}. A pod rejected at admission is never retried: "
        "delete it (its controller recreates it) once the node is fixed; until then a "
        "controller keeps creating pods that fail the same way.",
        ("https://kubernetes.io/docs/concepts/extend-kubernetes/compute-storage-net/device-plugins/",
         *cause.refs))

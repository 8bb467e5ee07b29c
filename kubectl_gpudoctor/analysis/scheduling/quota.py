"""pod.gpu_quota_exhausted: a namespace ResourceQuota on a GPU resource that is used up, for a
Pending pod (quota_findings) and for a pod its controller cannot create at all
(refused_creation, from the controller's `exceeded quota` FailedCreate events).

Why a module of its own: a quota is enforced when a pod is created, not by the scheduler, so
it is a question beside the node fit (fit.py): a used-up quota stops the next pod, and a pod
that was never created has no fit to compute.

Pure functions over raw API dicts; no I/O.
"""
from __future__ import annotations

import datetime as dt
import re
from typing import Any, Mapping, Sequence

from node_probe.protocol import catalog
from node_probe.protocol import Finding

from ..common import pod_ref
from ..quantity import count as qty
from .fit import Fit
from .gpu_held import is_gpu_resource


REF_QUOTA = ("https://kubernetes.io/docs/concepts/policy/resource-quotas/"
             "#resource-quota-for-extended-resources")


# -- ResourceQuota ---------------------------------------------------------------------------

def _quota_keys(resource: str) -> tuple[str, str]:
    return (f"requests.{resource}", resource)


def quota_findings(pod: Mapping[str, Any], fit: Fit, quotas: Sequence[Mapping[str, Any]],
                   quota_events: Sequence[Mapping[str, Any]] = (),
                   now: dt.datetime | None = None) -> list[Finding]:
    """pod.gpu_quota_exhausted: a namespace quota on a requested GPU resource is used up.

    A quota is enforced when a pod is created, so an existing Pending pod already counts in
    `used`; what a used-up quota stops is the next pod: its controller's creates fail with
    `exceeded quota` (FailedCreate events). Warning when such events exist, info otherwise."""
    ns = (pod.get("metadata") or {}).get("namespace", "")
    all_req = dict(fit.requested)
    all_req.update(fit.extender)
    used_up = []
    for q in quotas:
        hard = (q.get("status") or {}).get("hard") or (q.get("spec") or {}).get("hard") or {}
        used = (q.get("status") or {}).get("used") or {}
        for r, n in sorted(all_req.items()):
            for key in _quota_keys(r):
                if key in hard:
                    h, u = qty(hard[key]), qty(used.get(key, 0))
                    if u >= h:
                        used_up.append({"quota": (q.get("metadata") or {}).get("name"),
                                        "resource": key, "hard": h, "used": u,
                                        "this_pod": n})
    if not used_up:
        return []
    blocked = []
    for e in quota_events:
        msg = str(e.get("message") or "")
        if "exceeded quota" in msg and any(u["resource"] in msg for u in used_up):
            obj = e.get("involvedObject") or e.get("regarding") or {}
            blocked.append({"object": f"{obj.get('kind')}/{obj.get('name')}",
                            "count": e.get("count") or 1, "message": " ".join(msg.split())[:300]})
    u = used_up[0]
    subject = f"pod/{pod_ref(pod)}"
    title = (f"namespace {ns}'s quota {u['quota']} is used up: {u['resource']} {u['used']}/"
             f"{u['hard']}" + (f"; {len(blocked)} controller(s) cannot create pods "
                               f"({blocked[0]['object']})" if blocked else
                               "; the next GPU pod here will be refused at creation"))
    return [catalog.make(
        "pod.gpu_quota_exhausted", "warning" if blocked else "info", subject, title,
        {"case": "quota", "namespace": ns, "quotas": used_up[:8], "failed_creates": blocked[:8]},
        f"ResourceQuota is checked when a pod is created: pods over it are refused (their "
        f"controller reports FailedCreate `exceeded quota`), and Pending pods count in `used` "
        f"as much as Running ones. Free quota (delete finished or stuck pods in {ns}: `kubectl "
        f"-n {ns} get pods --field-selector status.phase=Pending`) or ask the cluster admin to "
        f"raise `{u['resource']}` in `kubectl -n {ns} describe quota {u['quota']}`.",
        (REF_QUOTA,))]


# -- a pod its controller cannot create ---------------------------------------------------------

_QUOTA_MSG = re.compile(r"exceeded quota: ([^,]+), requested: (.*?), used: (.*?), "
                        r"limited: (\S+)")


def _kv(text: str) -> dict[str, int]:
    out = {}
    for part in text.split(","):
        k, sep, v = part.strip().partition("=")
        if sep:
            out[k] = qty(v)
    return out


def refused_creation(namespace: str, name: str, quotas: Sequence[Mapping[str, Any]],
                     events: Sequence[Mapping[str, Any]]) -> list[Finding]:
    """pod.gpu_quota_exhausted for a pod that does not exist because a GPU quota refuses its
    creation: a StatefulSet's `trainer-0` is never created, its controller records
    `FailedCreate ... exceeded quota` naming the pod (pure; [] when no such event)."""
    needle = f'pods "{name}"'
    refused, blocked = [], []
    for e in events:
        msg = " ".join(str(e.get("message") or "").split())
        m = _QUOTA_MSG.search(msg) if needle in msg else None
        if not m:
            continue
        req, used, lim = _kv(m.group(2)), _kv(m.group(3)), _kv(m.group(4))
        gpu = [k for k in lim if is_gpu_resource(k[len("requests."):] if
                                                 k.startswith("requests.") else k)]
        if not gpu:
            continue
        obj = e.get("involvedObject") or e.get("regarding") or {}
        blocked.append({"object": f"{obj.get('kind')}/{obj.get('name')}",
                        "count": e.get("count") or 1, "message": msg[:300]})
        for k in gpu:
            refused.append({"quota": m.group(1), "resource": k, "hard": lim[k],
                            "used": used.get(k, 0), "this_pod": req.get(k, 0)})
    if not refused:
        return []
    u = refused[-1]
    now_hard = next(((q.get("status") or {}) for q in quotas
                     if (q.get("metadata") or {}).get("name") == u["quota"]), None)
    if now_hard:  # the quota as it stands now, not as the last refusal saw it
        u = dict(u, hard=qty((now_hard.get("hard") or {}).get(u["resource"], u["hard"])),
                 used=qty((now_hard.get("used") or {}).get(u["resource"], u["used"])))
        refused[-1] = u
    return [catalog.make(
        "pod.gpu_quota_exhausted", "warning", f"pod/{namespace}/{name}",
        f"pod {namespace}/{name} does not exist: {blocked[-1]['object']} cannot create it, "
        f"quota {u['quota']} refuses {u['this_pod']} more {u['resource']} ({u['used']}/"
        f"{u['hard']} used)",
        {"case": "quota", "namespace": namespace, "pod_exists": False,
         "quotas": refused[-4:], "failed_creates": blocked[-8:]},
        f"The pod is not Pending: it was never created, because ResourceQuota {u['quota']} "
        f"in {namespace} has no room for its GPUs (pods count in `used` while Pending too). "
        f"Free quota (delete finished or stuck GPU pods: `kubectl -n {namespace} get pods "
        f"--field-selector status.phase=Pending`) or ask the cluster admin to raise "
        f"`{u['resource']}` (`kubectl -n {namespace} describe quota {u['quota']}`); the "
        f"controller retries by itself.", (REF_QUOTA,))]

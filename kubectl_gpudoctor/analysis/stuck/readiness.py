"""Before creating a debug pod: is the node there to run it, and why did the kubelet refuse it.

Why: on a NotReady node (kubelet down, node unreachable) a debug pod is never admitted. The
client used to wait the whole start timeout and then suggest that admission was wedged, which
sends the on-call engineer after the wrong problem. The node's Ready condition and its Lease are
already read by the API side; when Ready is not True the report says NotReady plainly, with the
condition's own reason and ages, and the debug pod is not created. When the kubelet does run but
refuses the pod at admission (DiskPressure, PIDPressure or MemoryPressure eviction thresholds,
too little allocatable CPU or memory for the pod's small requests), the refusal is a finding
(`probe.pod_not_started`) with the reason and the ways in, not a bare launch error.
"""
from __future__ import annotations

import datetime as dt
from typing import Any, Mapping, Sequence

from node_probe.protocol import Finding, catalog

from ..common import age_s, fmt_duration

REFS = ("https://kubernetes.io/docs/concepts/architecture/nodes/#condition",
        "https://kubernetes.io/docs/concepts/scheduling-eviction/node-pressure-eviction/")
PRESSURES = ("DiskPressure", "PIDPressure", "MemoryPressure")
# kubelet admission rejections of a pod bound by nodeName (status.reason of the Failed pod)
REJECT_HINTS = {
    "DiskPressure": "free disk on the node (image and container garbage collection, "
                    "`crictl rmi --prune`, large logs); the kubelet admits no new pod under "
                    "DiskPressure",
    "PIDPressure": "find the process leaking threads or processes (`ps -eLf | wc -l`, "
                   "pids.current of the pod cgroups); the kubelet admits no new pod under "
                   "PIDPressure",
    "MemoryPressure": "free memory on the node (memory.pressure, memory.overcommit); "
                      "BestEffort and Burstable pods are refused under MemoryPressure",
    "OutOfcpu": "the node's allocatable CPU is fully requested; the debug pod asks for 50m: "
                "free a little CPU request on the node (or use the ways in below)",
    "OutOfmemory": "the node's allocatable memory is fully requested; the debug pod asks for "
                   "128Mi",
    "OutOfpods": "the node runs its maximum number of pods (maxPods)",
}


def _condition(node: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for c in (node.get("status") or {}).get("conditions") or ():
        if c.get("type") == kind:
            return c
    return None


def pressures(node: Mapping[str, Any]) -> list[str]:
    return [p for p in PRESSURES if (_condition(node, p) or {}).get("status") == "True"]


def ssh_way(name: str) -> str:
    """The way onto a node that needs no pod at all."""
    return f"ssh {name} and run `kubectl-gpu_doctor local` (or `python3 -m node_probe`) there"


def not_ready(node: Mapping[str, Any], lease: Mapping[str, Any] | None,
              now: dt.datetime, ways: Sequence[str] | None = None) -> Finding | None:
    """node.not_ready when the node's Ready condition is not True (None when it is).
    `ways`: the ways onto the node without a new pod (default: SSH and `local`)."""
    ready = _condition(node, "Ready")
    if ready is not None and ready.get("status") == "True":
        return None
    name = (node.get("metadata") or {}).get("name", "?")
    ways = list(ways) if ways is not None else [ssh_way(name)]
    status = (ready or {}).get("status") or "missing"
    reason = (ready or {}).get("reason") or ""
    message = " ".join(str((ready or {}).get("message") or "").split())[:300]
    heartbeat = age_s((ready or {}).get("lastHeartbeatTime"), now)
    since = age_s((ready or {}).get("lastTransitionTime"), now)
    renew = age_s(((lease or {}).get("spec") or {}).get("renewTime"), now)
    bits = [f"Ready={status}" + (f" ({reason})" if reason else "")]
    if since is not None:
        bits.append(f"for {fmt_duration(since)}")
    if renew is not None:
        bits.append(f"lease last renewed {fmt_duration(renew)} ago")
    elif lease is None:
        bits.append("no lease read")
    title = (f"node {name} is NotReady ({', '.join(bits)}): node-side checks need a kubelet "
             f"that runs pods, so no debug pod was created")
    evidence = {"ready_status": status, "reason": reason or None, "message": message or None,
                "last_heartbeat_age_s": None if heartbeat is None else round(heartbeat, 1),
                "not_ready_for_s": None if since is None else round(since, 1),
                "lease_renew_age_s": None if renew is None else round(renew, 1),
                "lease_holder": ((lease or {}).get("spec") or {}).get("holderIdentity"),
                "pressure": pressures(node) or None, "ways_in": list(ways)}
    fix = ("The kubelet is not reporting to the API server (stopped, crashed, out of resources, "
           "or the node cannot reach the API server): on the node, `systemctl status kubelet` "
           "and `journalctl -u kubelet --since -15min`; check its network path to the API "
           "server. A renewing lease with Ready not True means the kubelet runs but reports a "
           "problem (see the message). Ways in without a new pod: " + "; ".join(ways) + ".")
    return catalog.make("node.not_ready", "critical", f"node/{name}", title, evidence, fix, REFS)


def rejection(pod: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(reason, message, hint) when the kubelet refused the pod at admission: phase Failed and
    no container ever created. None otherwise."""
    st = pod.get("status") or {}
    if st.get("phase") != "Failed" or st.get("containerStatuses"):
        return None
    reason = str(st.get("reason") or "Failed")
    message = " ".join(str(st.get("message") or "").split())[:300]
    key = next((p for p in PRESSURES if p in message), reason)
    hint = REJECT_HINTS.get(key) or REJECT_HINTS.get(reason) or \
        "read the reason: the kubelet decides admission on the node"
    return reason, message, hint

"""Dynamic Resource Allocation from the API side: claims that never get allocated (and why),
devices the kubelet reports unhealthy in pod status, and kubelet goroutines parked in DRA calls.

Why: since Kubernetes 1.34 (resource.k8s.io/v1) GPUs are handed out through ResourceClaims.
A pod waiting on a claim shows only "cannot allocate all claims" or nothing at all. The reason
is in objects the user rarely reads together: the DeviceClass (missing, or a selector matching
no device), the ResourceSlices (none from the driver on that node, an old pool generation, an
incomplete pool), device taints, and the other claims holding every matching device.

Pure functions over raw API dicts (resource.k8s.io/v1 and v1beta1 shapes); no I/O. CEL selectors
are evaluated for the forms drivers and users write most (`device.driver == "..."`, attribute
comparisons joined by `&&`); anything else counts as "may match" rather than a false verdict.
"""
from __future__ import annotations

import datetime as dt
import re
from typing import Any, Iterable, Mapping, Sequence

from node_probe.protocol import Finding, catalog

from ..common import age_s, events_by_uid, fmt_duration, pod_ref, pod_uid

REFS = ("https://kubernetes.io/docs/concepts/scheduling-eviction/dynamic-resource-allocation/",
        "https://github.com/kubernetes/kubernetes/issues/139016",
        "https://github.com/Project-HAMi/k8s-dra-driver/issues/5")
HEALTH_REFS = ("https://kubernetes.io/docs/concepts/scheduling-eviction/dynamic-resource-allocation/#device-health-monitoring",
               "https://github.com/kubernetes/enhancements/pull/4681",
               "https://github.com/kubernetes/kubernetes/pull/130606")
WEDGE_REFS = ("https://github.com/kubernetes/kubernetes/issues/117146",
              "https://github.com/kubernetes-sigs/dra-example-driver/issues/126")
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
MAX_EXAMPLES = 5


# -- objects -----------------------------------------------------------------------------------

def _name(o: Mapping[str, Any]) -> str:
    return str((o.get("metadata") or {}).get("name") or "")


def _ns(o: Mapping[str, Any]) -> str:
    return str((o.get("metadata") or {}).get("namespace") or "")


def slice_devices(s: Mapping[str, Any]) -> list[dict]:
    """Devices of a slice as {name, attributes, taints} (v1: flat; v1beta1: under `basic`)."""
    out = []
    for d in (s.get("spec") or {}).get("devices") or ():
        body = d.get("basic") or d
        out.append({"name": d.get("name"), "attributes": body.get("attributes") or {},
                    "capacity": body.get("capacity") or {}, "taints": body.get("taints") or []})
    return out


def slice_driver(s: Mapping[str, Any]) -> str:
    return str((s.get("spec") or {}).get("driver") or "")


def slice_pool(s: Mapping[str, Any]) -> tuple[str, str, int, int]:
    """(driver, pool name, generation, resourceSliceCount)."""
    spec = s.get("spec") or {}
    pool = spec.get("pool") or {}
    return (str(spec.get("driver") or ""), str(pool.get("name") or ""),
            int(pool.get("generation") or 0), int(pool.get("resourceSliceCount") or 1))


def slice_serves_node(s: Mapping[str, Any], node: str | None) -> bool:
    spec = s.get("spec") or {}
    if node is None or spec.get("allNodes") or spec.get("nodeSelector"):
        return True
    return spec.get("nodeName") == node


def requests_of(claim: Mapping[str, Any]) -> list[dict]:
    """A claim's requests as {name, class, selectors, count, tolerations, alternatives}:
    v1 `exactly` / `firstAvailable`, v1beta1 fields on the request itself."""
    out = []
    for r in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or ():
        alts = []
        if r.get("exactly"):
            alts = [r["exactly"]]
        elif r.get("firstAvailable"):
            alts = list(r["firstAvailable"])
        else:
            alts = [r]
        out.append({"name": r.get("name"), "alternatives": [
            {"class": a.get("deviceClassName"),
             "selectors": [((sel.get("cel") or {}).get("expression") or "")
                           for sel in a.get("selectors") or ()],
             "count": (int(a.get("count") or 1) if (a.get("allocationMode") or "ExactCount")
                       == "ExactCount" else None),
             "tolerations": a.get("tolerations") or []} for a in alts]})
    return out


def claim_allocated(claim: Mapping[str, Any]) -> bool:
    return bool((claim.get("status") or {}).get("allocation"))


def allocated_devices(claims: Iterable[Mapping[str, Any]]) -> set[tuple[str, str, str]]:
    out = set()
    for c in claims:
        alloc = (c.get("status") or {}).get("allocation") or {}
        for r in (alloc.get("devices") or {}).get("results") or ():
            out.add((str(r.get("driver")), str(r.get("pool")), str(r.get("device"))))
    return out


def pod_claim_names(pod: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    """(pod's claim entry name, ResourceClaim object name or None when not generated yet)."""
    statuses = {s.get("name"): s.get("resourceClaimName")
                for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()}
    out = []
    for rc in (pod.get("spec") or {}).get("resourceClaims") or ():
        out.append((rc.get("name"), rc.get("resourceClaimName") or statuses.get(rc.get("name"))))
    return out


# -- CEL (the common subset) ------------------------------------------------------------------

_DRIVER_EQ = re.compile(r"""^device\.driver\s*==\s*["']([^"']+)["']$""")
_ATTR = re.compile(r"""^device\.attributes\[\s*["']([^"']+)["']\s*\](?:\.(\w+)|\[\s*["']([^"']+)["']\s*\])"""
                   r"""\s*(==|!=)\s*(.+)$""")
_ATTR_BOOL = re.compile(r"""^(!)?device\.attributes\[\s*["']([^"']+)["']\s*\](?:\.(\w+)|\[\s*["']([^"']+)["']\s*\])$""")


def _literal(text: str) -> Any:
    t = text.strip()
    if t[:1] in "\"'" and t[-1:] == t[:1]:
        return t[1:-1]
    if t in ("true", "false"):
        return t == "true"
    try:
        return int(t)
    except ValueError:
        return _Unknown


class _UnknownType:
    pass


_Unknown = _UnknownType()


def _attr_value(device: Mapping[str, Any], driver: str, domain: str, name: str) -> Any:
    attrs = device.get("attributes") or {}
    for key in (f"{domain}/{name}", name if domain == driver else None):
        if key and key in attrs:
            v = attrs[key] or {}
            for kind in ("string", "int", "bool", "version"):
                if kind in v:
                    return v[kind]
    return None


def cel_match(expr: str, device: Mapping[str, Any], driver: str) -> bool | None:
    """True/False for the supported subset; None when the expression cannot be judged here."""
    expr = (expr or "").strip()
    if not expr:
        return True
    if "||" in expr:
        return None
    result: bool | None = True
    for term in (t.strip().strip("()").strip() for t in expr.split("&&")):
        m = _DRIVER_EQ.match(term)
        if m:
            ok: bool | None = m.group(1) == driver
        elif (m := _ATTR.match(term)):
            want = _literal(m.group(5))
            if want is _Unknown:
                return None
            have = _attr_value(device, driver, m.group(1), m.group(2) or m.group(3))
            ok = (have == want) if m.group(4) == "==" else (have != want)
        elif (m := _ATTR_BOOL.match(term)):
            have = _attr_value(device, driver, m.group(2), m.group(3) or m.group(4))
            ok = bool(have) != bool(m.group(1))
        else:
            return None
        if ok is False:
            return False
    return result


def class_drivers(cls: Mapping[str, Any]) -> list[str]:
    out = []
    for sel in (cls.get("spec") or {}).get("selectors") or ():
        for term in ((sel.get("cel") or {}).get("expression") or "").split("&&"):
            m = _DRIVER_EQ.match(term.strip().strip("()").strip())
            if m:
                out.append(m.group(1))
    return out


def _tolerated(taint: Mapping[str, Any], tolerations: Sequence[Mapping[str, Any]]) -> bool:
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if (t.get("operator") or "Equal") == "Exists":
            if not t.get("key") or t.get("key") == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


# -- why a claim is not allocated ---------------------------------------------------------------

def usable_pools(slices: Sequence[Mapping[str, Any]]) -> tuple[dict, list[dict]]:
    """({(driver, pool): newest generation} of complete pools, problems with stale/incomplete
    pools). The scheduler uses only the newest generation of a pool, and only when all of that
    generation's slices (resourceSliceCount) are published."""
    newest: dict[tuple[str, str], int] = {}
    counts: dict[tuple[str, str, int], int] = {}
    want: dict[tuple[str, str, int], int] = {}
    for s in slices:
        drv, pool, gen, n = slice_pool(s)
        newest[(drv, pool)] = max(gen, newest.get((drv, pool), gen))
        counts[(drv, pool, gen)] = counts.get((drv, pool, gen), 0) + 1
        want[(drv, pool, gen)] = n
    usable, problems = {}, []
    for (drv, pool), gen in newest.items():
        stale = sorted({g for (d, p, g) in counts if d == drv and p == pool and g < gen})
        have, need = counts[(drv, pool, gen)], want[(drv, pool, gen)]
        if have < need:
            problems.append({"driver": drv, "pool": pool, "generation": gen,
                             "slices": have, "resource_slice_count": need,
                             "problem": "incomplete"})
        else:
            usable[(drv, pool)] = gen
        if stale:
            problems.append({"driver": drv, "pool": pool, "generation": gen,
                             "stale_generations": stale, "problem": "stale_slices"})
    return usable, problems


def explain_request(alt: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]],
                    slices: Sequence[Mapping[str, Any]], taken: set, node: str | None) -> dict:
    """Why one request alternative cannot be satisfied: {reason, detail, ...evidence}."""
    cls_name = alt.get("class")
    cls = classes.get(cls_name or "")
    if cls is None:
        return {"reason": "device_class_missing",
                "detail": f"DeviceClass {cls_name!r} does not exist"}
    drivers = class_drivers(cls)
    here = [s for s in slices if slice_serves_node(s, node)]
    by_driver = [s for s in here if not drivers or slice_driver(s) in drivers]
    where = f" for node {node}" if node else ""
    if not by_driver:
        return {"reason": "no_resource_slices", "drivers": drivers,
                "detail": f"no ResourceSlice from driver {', '.join(drivers) or '?'}{where}: "
                          "its kubelet plugin is not running or not publishing"}
    usable, pool_problems = usable_pools(by_driver)
    live = [s for s in by_driver if usable.get(slice_pool(s)[:2]) == slice_pool(s)[2]]
    if not live:
        return {"reason": "pool_not_usable", "pools": pool_problems,
                "detail": "the driver's pools are incomplete (not every slice of the newest "
                          "generation is published): the scheduler ignores them"}
    selectors = [(sel.get("cel") or {}).get("expression") or ""
                 for sel in (cls.get("spec") or {}).get("selectors") or ()] + \
        list(alt.get("selectors") or ())
    devices, total, unknown = [], 0, False
    for s in live:
        drv, pool, _, _ = slice_pool(s)
        for d in slice_devices(s):
            total += 1
            verdicts = [cel_match(e, d, drv) for e in selectors]
            if any(v is False for v in verdicts):
                continue
            unknown = unknown or any(v is None for v in verdicts)
            devices.append((drv, pool, d))
    ev = {"drivers": drivers, "devices_published": total, "selectors": selectors,
          "pool_problems": pool_problems}
    if not devices:
        return {**ev, "reason": "selector_matches_nothing",
                "detail": f"the selectors of DeviceClass {cls_name!r}"
                          + (" and the request" if alt.get("selectors") else "")
                          + f" match none of the {total} published device(s)"}
    untainted = [(drv, pool, d) for drv, pool, d in devices
                 if not any(t.get("effect") in BLOCKING_EFFECTS
                            and not _tolerated(t, alt.get("tolerations") or ())
                            for t in d.get("taints") or ())]
    if not untainted:
        taints = sorted({f"{t.get('key')}={t.get('value', '')}:{t.get('effect')}"
                         for _, _, d in devices for t in d.get("taints") or ()})
        return {**ev, "reason": "devices_tainted", "taints": taints,
                "matching_devices": len(devices),
                "detail": f"all {len(devices)} matching device(s) carry taints the claim does "
                          f"not tolerate ({', '.join(taints[:3])})"}
    free = [x for x in untainted if (x[0], x[1], x[2].get("name")) not in taken]
    need = alt.get("count") or 1
    if len(free) < need:
        return {**ev, "reason": "devices_in_use", "matching_devices": len(untainted),
                "free_devices": len(free), "requested": need,
                "detail": f"{len(untainted) - len(free)} of {len(untainted)} matching device(s) "
                          f"are allocated to other claims; {len(free)} free, {need} requested"}
    return {**ev, "reason": "unknown" if unknown else "not_yet_allocated",
            "matching_devices": len(untainted), "free_devices": len(free),
            "detail": (f"{len(free)} device(s) may match (selectors not judged here)" if unknown
                       else f"{len(free)} free matching device(s) exist; the scheduler has not "
                            "allocated yet (see its events)")}


def analyze_claims(pods: Sequence[Mapping[str, Any]], claims: Sequence[Mapping[str, Any]],
                   slices: Sequence[Mapping[str, Any]], classes: Sequence[Mapping[str, Any]],
                   events: Sequence[Mapping[str, Any]], now: dt.datetime) -> list[Finding]:
    """dra.claim_unallocated for Pending pods whose claims are not allocated."""
    by_key = {(_ns(c), _name(c)): c for c in claims}
    cls_by_name = {_name(c): c for c in classes}
    taken = allocated_devices(claims)
    evs = events_by_uid(events)
    out: list[Finding] = []
    for pod in pods:
        if (pod.get("status") or {}).get("phase") not in (None, "Pending"):
            continue
        entries = pod_claim_names(pod)
        if not entries:
            continue
        node = (pod.get("spec") or {}).get("nodeName")
        sched = [e for e in evs.get(pod_uid(pod), ()) if e.get("reason") == "FailedScheduling"]
        last_msg = str(sched[-1].get("message") or "")[:400] if sched else None
        waited = age_s((pod.get("metadata") or {}).get("creationTimestamp"), now)
        for entry, cname in entries:
            claim = by_key.get((_ns(pod), cname or ""))
            ev: dict[str, Any] = {"pod": pod_ref(pod), "claim_entry": entry, "claim": cname,
                                  "node": node, "pending_s": round(waited) if waited else None,
                                  "last_scheduler_message": last_msg}
            if claim is None:
                title = (f"Pod {pod_ref(pod)} waits for ResourceClaim "
                         f"{cname or '(from template ' + entry + ', not created yet)'}, which "
                         "does not exist")
                ev["reason"] = "claim_missing"
                out.append(_claim_finding(pod, title, ev))
                continue
            if claim_allocated(claim):
                continue
            reasons = []
            for req in requests_of(claim):
                for alt in req["alternatives"]:
                    why = explain_request(alt, cls_by_name, slices, taken, node)
                    reasons.append({"request": req["name"], "device_class": alt.get("class"),
                                    **why})
            ev["requests"] = reasons
            blocking = [r for r in reasons if r["reason"] not in ("not_yet_allocated", "unknown")]
            main = (blocking or reasons or [{"detail": "no device requests"}])[0]
            ev["reason"] = main.get("reason")
            title = (f"Pod {pod_ref(pod)} waits {fmt_duration(waited)} on ResourceClaim {cname}"
                     f" (request {main.get('request')}): {main.get('detail')}")
            out.append(_claim_finding(pod, title, ev, severe=bool(blocking)))
    return out


_FIX = {
    "device_class_missing": "Create the DeviceClass (the DRA driver's Helm chart installs it) "
                            "or fix deviceClassName in the claim or its template.",
    "no_resource_slices": "Start the DRA driver's kubelet plugin on the node(s) (its DaemonSet) "
                          "and check its logs; `kubectl get resourceslices "
                          "--field-selector spec.driver=<driver>` must list the node.",
    "pool_not_usable": "The driver publishes a new pool generation but not all of its slices: "
                       "restart its kubelet plugin; stale slices of old generations are ignored "
                       "and can be deleted once the plugin is healthy.",
    "selector_matches_nothing": "Compare the DeviceClass/claim selectors with the device "
                                "attributes in `kubectl get resourceslices -o yaml`.",
    "devices_tainted": "The devices are tainted (DeviceTaintRule or the driver): fix the device, "
                       "remove the taint, or add a toleration to the claim.",
    "devices_in_use": "Every matching device is allocated to other claims: wait, free some "
                      "(delete finished pods/claims), or add capacity.",
}


def _claim_finding(pod, title: str, ev: dict, severe: bool = True) -> Finding:
    fix = _FIX.get(ev.get("reason") or "", "Read the scheduler's FailedScheduling events of the "
                   "pod and the claim's status (`kubectl describe resourceclaim`).")
    if ev.get("reason") == "claim_missing":
        fix = ("The ResourceClaim named by the pod does not exist: create it, or check the "
               "resource claim controller (kube-controller-manager) for templates.")
    return catalog.make("dra.claim_unallocated", "warning" if severe else "info",
                        f"pod/{pod_ref(pod)}", title, ev, fix, REFS)


# -- device health in pod status (KEP-4680) ------------------------------------------------------

def analyze_device_health(pods: Sequence[Mapping[str, Any]]) -> list[Finding]:
    out: list[Finding] = []
    for pod in pods:
        st = pod.get("status") or {}
        for cs in list(st.get("containerStatuses") or ()) + list(st.get("initContainerStatuses") or ()):
            bad = []
            for ars in cs.get("allocatedResourcesStatus") or ():
                for r in ars.get("resources") or ():
                    if r.get("health") == "Unhealthy":
                        bad.append({"resource": ars.get("name"), "device": r.get("resourceID")})
            if not bad:
                continue
            out.append(catalog.make(
                "dra.device_unhealthy", "warning", f"pod/{pod_ref(pod)}/{cs.get('name')}",
                f"{len(bad)} device(s) allocated to container {cs.get('name')} are Unhealthy: "
                + ", ".join(f"{b['device']} ({b['resource']})" for b in bad[:MAX_EXAMPLES]),
                {"pod": pod_ref(pod), "container": cs.get("name"), "unhealthy": bad[:20],
                 "restart_count": cs.get("restartCount"),
                 "node": (pod.get("spec") or {}).get("nodeName")},
                "The kubelet reports the device unhealthy (from the DRA driver's health stream or "
                "the device plugin). Failures of this container are likely the device's: run "
                "`kubectl gpu-doctor node <node>` for gpu.xid / gpu.lost / gpu.health, then "
                "recreate the pod so it gets a healthy device.", HEALTH_REFS))
    return out


# -- kubelet goroutines in DRA calls -------------------------------------------------------------

DRA_FRAMES = (
    "NodePrepareResources", "NodeUnprepareResources",
    "kubelet/cm/dra.(*ManagerImpl).PrepareResources", "kubelet/cm/dra.(*ManagerImpl).prepareResources",
    "kubelet/cm/dra.(*Manager).PrepareResources", "kubelet/cm/dra.(*Manager).prepareResources",
    "kubelet/cm/dra.(*ManagerImpl).UnprepareResources", "kubelet/cm/dra.(*Manager).UnprepareResources",
)


def analyze_goroutines(node_name: str, goroutines: Sequence[Any]) -> list[Finding]:
    """kubelet.blocked_in_dra_plugin from parsed goroutines
    (analysis.stuck.goroutines.parse_dump)."""
    waits = [g for g in goroutines if g.has(DRA_FRAMES)]
    if not waits:
        return []
    from ..stuck.goroutine_dump import func_name

    longest = max((g.wait_minutes or 0) for g in waits)
    calls: dict[str, int] = {}
    for g in waits:
        text = "\n".join(g.frames)
        call = "NodeUnprepareResources" if "Unprepare" in text else "NodePrepareResources"
        calls[call] = calls.get(call, 0) + 1
    evidence = {"goroutines": len(waits), "longest_wait_min": longest, "calls": calls,
                "examples": [{"goroutine": g.id, "state": g.state, "wait_min": g.wait_minutes,
                              "top": [func_name(f) for f in g.frames if "dra" in f.lower()][:3]}
                             for g in waits[:3]]}
    what = ", ".join(f"{n} in {c}" for c, n in sorted(calls.items()))
    if longest >= 1:
        severity, title = "critical", (f"{len(waits)} kubelet goroutine(s) wait in DRA plugin "
                                       f"calls ({what}), the longest for {fmt_duration(longest * 60)}")
    else:
        severity, title = "info", f"{len(waits)} kubelet goroutine(s) in DRA plugin calls ({what}) right now"
    return [catalog.make(
        "kubelet.blocked_in_dra_plugin", severity, f"node/{node_name}", title, evidence,
        "A DRA driver's kubelet plugin does not answer NodePrepareResources/"
        "NodeUnprepareResources: pods using its claims stay ContainerCreating or Terminating. "
        "Run `kubectl gpu-doctor node " + node_name + "` (dra.plugin_unresponsive names the "
        "driver), read its kubelet-plugin pod's logs and restart it.", WEDGE_REFS)]

"""memory.overcommit, API side: pod memory limits that leave the node's own daemons no room.

Why (seed 004): a pod with a 40 GiB limit on a 62 GiB GPU host took nodes down one after
another, while a 20 GiB limit was OOM-killed cleanly inside its cgroup. When what the pods may
use (their limits, plus pods with no limit at all) reaches the node's memory before any cgroup
limit is hit, the kernel reclaims globally: with no swap the only reclaimable memory left is
page cache, including the code pages of kubelet and containerd, which then re-read their own
binaries from disk in a loop. No OOM kill comes, the node goes NotReady, and the evicted pod
does the same to the next node. The kubelet would evict first only if memory were reserved for
the system (`systemReserved`/`kubeReserved`) and its hard eviction threshold were not the late
default (`memory.available<100Mi`). GPU pods make it worse: host memory the NVIDIA driver pins
for them (cudaHostAlloc, UVM) is not charged to their memory cgroup, so a pod can push the node
over while staying under its own limit.

Pure function over the Node, its pods and (optionally) the kubelet's /configz; no I/O.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from node_probe.protocol import catalog
from node_probe.protocol import Finding

from ..common import ByIdentity
from ..quantity import to_float

GiB = 1 << 30
MiB = 1 << 20
MIN_MARGIN_BYTES = 2 * GiB          # kubelet, container runtime, journald, sshd, page cache
MARGIN_FRACTION = 0.10              # ... or 10% of the node's memory, whichever is larger
GPU_POD_LIMIT_FRACTION = 0.5        # seed 004: 40 of 62 GiB died, 20 of 62 GiB was OOM-killed
DEFAULT_EVICTION_HARD = "100Mi"
GPU_PREFIX = "nvidia.com/"

REFS = (
    "https://kubernetes.io/docs/tasks/administer-cluster/reserve-compute-resources/",
    "https://kubernetes.io/docs/concepts/scheduling-eviction/node-pressure-eviction/",
    "https://github.com/Azure/aks-engine/pull/604",
    "https://github.com/kubernetes/kubernetes/issues/31362",
)


def eviction_threshold_bytes(cfg: Mapping[str, Any] | None, capacity: float) -> tuple[float, str]:
    """evictionHard memory.available in bytes (percentages of capacity) and its source text."""
    text = DEFAULT_EVICTION_HARD
    if cfg and isinstance(cfg.get("evictionHard"), Mapping) and \
            cfg["evictionHard"].get("memory.available"):
        text = str(cfg["evictionHard"]["memory.available"])
    if text.endswith("%"):
        try:
            return capacity * float(text[:-1]) / 100.0, text
        except ValueError:
            pass
    q = to_float(text)
    return (q if q is not None else to_float(DEFAULT_EVICTION_HARD)), text


def _reserved_memory(cfg: Mapping[str, Any] | None) -> dict[str, float] | None:
    if cfg is None:
        return None
    out = {}
    for key in ("systemReserved", "kubeReserved"):
        v = (cfg.get(key) or {}).get("memory") if isinstance(cfg.get(key), Mapping) else None
        q = to_float(v)
        if q:
            out[key] = q
    return out


def _unwrap(cfg: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    if isinstance(cfg, Mapping) and isinstance(cfg.get("kubeletconfig"), Mapping):
        return cfg["kubeletconfig"]
    return cfg


def pod_memory_limit(pod: Mapping[str, Any]) -> float | None:
    """The pod's effective memory limit (max of init containers vs. the sum of app containers,
    plus pod overhead), None if any container that runs alongside the others has no limit."""
    spec = pod.get("spec") or {}
    if "initContainers" in spec or "overhead" in spec:
        return _memory_limit(spec.get("containers"), spec.get("initContainers"),
                             spec.get("overhead"))
    return _limit_of(spec.get("containers"))


def _memory_limit(containers: Any, init_containers: Any, overhead: Any) -> float | None:
    def lim(c):
        return to_float(((c.get("resources") or {}).get("limits") or {}).get("memory"))

    apps = [lim(c) for c in containers or ()]
    # restartable init containers (sidecars) run alongside the app containers
    sidecars = [lim(c) for c in init_containers or () if c.get("restartPolicy") == "Always"]
    inits = [lim(c) for c in init_containers or () if c.get("restartPolicy") != "Always"]
    if any(v is None for v in apps + sidecars) or not apps:
        return None
    total = sum(apps) + sum(sidecars)
    if inits:
        if any(v is None for v in inits):
            return None
        total = max(total, max(inits) + sum(sidecars))
    return total + (to_float(((overhead or {}).get("memory"))) or 0.0)


# skeleton pods share their containers list (api/slim.PodCompactor)
_limit_of = ByIdentity(lambda containers: _memory_limit(containers, None, None))


def _uses_gpu(pod: Mapping[str, Any]) -> bool:
    for c in ((pod.get("spec") or {}).get("containers") or ()):
        res = c.get("resources") or {}
        for part in ("limits", "requests"):
            if any(k.startswith(GPU_PREFIX) for k in (res.get(part) or {})):
                return True
    return False


def _ref(pod: Mapping[str, Any]) -> str:
    md = pod.get("metadata") or {}
    return f"{md.get('namespace', '')}/{md.get('name', '')}"


def _gib(b: float | None) -> float | None:
    return None if b is None else round(b / GiB, 2)


class Tally:
    """What memory.overcommit reads of a node's pods, added up pod by pod: the sum and count of
    the memory limits, the five largest, and the pods without one (the first 20 and their
    count). `nodes` folds each pod into its node's tally as the pod list is read, then drops
    the pod (analysis/resources/podfold.py); `node X` tallies its pods here. The same numbers either
    way."""

    __slots__ = ("total", "limited", "top", "unbounded", "unbounded_count", "_seen")
    SHOWN_TOP, SHOWN_UNBOUNDED = 5, 20

    def __init__(self) -> None:
        self.total = 0.0
        self.limited = 0
        self.top: list[tuple[float, int, str, bool]] = []  # (-limit, order, pod, gpu)
        self.unbounded: list[str] = []
        self.unbounded_count = 0
        self._seen = 0

    def add(self, p: Mapping[str, Any]) -> None:
        if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return
        lim = pod_memory_limit(p)
        if lim is None:
            self.unbounded_count += 1
            if len(self.unbounded) < self.SHOWN_UNBOUNDED:
                self.unbounded.append(_ref(p))
            return
        self.total += lim
        self.limited += 1
        self._seen += 1
        top = self.top
        if len(top) < self.SHOWN_TOP or -lim < top[-1][0]:
            # names and GPU use only for the few pods the evidence shows; ties keep list order
            top.append((-lim, self._seen, _ref(p), _uses_gpu(p)))
            top.sort()
            del top[self.SHOWN_TOP:]


def analyze_node(node: Mapping[str, Any], pods_on_node: Sequence[Mapping[str, Any]],
                 kubelet_config: Mapping[str, Any] | None,
                 tally: Tally | None = None) -> list[Finding]:
    """memory.overcommit for one node. `kubelet_config` is the KubeletConfiguration from
    /configz (wrapped `{"kubeletconfig": {...}}` or not), None if it could not be read; then the
    reservation is inferred from capacity - allocatable. `tally`: the node's pods already
    added up (then `pods_on_node` is not read)."""
    md = node.get("metadata") or {}
    name = str(md.get("name", ""))
    status = node.get("status") or {}
    capacity = to_float((status.get("capacity") or {}).get("memory"))
    allocatable = to_float((status.get("allocatable") or {}).get("memory"))
    if not capacity:
        return []
    cfg = _unwrap(kubelet_config)
    evict_b, evict_text = eviction_threshold_bytes(cfg, capacity)
    reserved_cfg = _reserved_memory(cfg)
    reserved_b = capacity - allocatable if allocatable else 0.0
    margin = max(MIN_MARGIN_BYTES, MARGIN_FRACTION * capacity)
    if reserved_cfg is not None:
        no_reserved = not reserved_cfg
    else:  # no configz: allocatable = capacity - reserved - eviction threshold
        no_reserved = reserved_b <= evict_b + 64 * MiB
    late_eviction = evict_b < margin

    if tally is None:
        tally = Tally()
        for p in pods_on_node:
            tally.add(p)
    total = tally.total
    top = [(-neg, ref, gpu) for neg, _, ref, gpu in tally.top]

    ev = {"capacity_gib": _gib(capacity), "allocatable_gib": _gib(allocatable),
          "reserved_gib": _gib(reserved_b), "system_reserved_memory": (
              _gib(reserved_cfg.get("systemReserved")) if reserved_cfg else None),
          "kube_reserved_memory": _gib(reserved_cfg.get("kubeReserved")) if reserved_cfg else None,
          "kubelet_config_read": cfg is not None, "eviction_hard_memory_available": evict_text,
          "eviction_hard_gib": _gib(evict_b), "safe_margin_gib": _gib(margin),
          "sum_limits_gib": _gib(total), "left_if_all_at_limit_gib": _gib(capacity - total),
          "pods_without_memory_limit": list(tally.unbounded),
          "pods_without_memory_limit_count": tally.unbounded_count,
          "largest_limits": [{"pod": r, "limit_gib": _gib(l), "gpu": g} for l, r, g in top]}
    protection = []
    if no_reserved:
        protection.append("no systemReserved/kubeReserved memory")
    if late_eviction:
        protection.append(f"eviction only at memory.available<{evict_text}")
    unprotected = no_reserved and late_eviction

    reasons = []
    worst = top[0] if top else None
    single = False
    if worst is not None:
        lim, ref, gpu = worst
        if capacity - lim < margin:
            reasons.append(f"pod {ref} may use {_gib(lim)} GiB of the node's {_gib(capacity)} GiB, "
                           f"leaving {_gib(capacity - lim)} GiB (< {_gib(margin)} GiB) for the system")
            single = True
        elif gpu and lim >= GPU_POD_LIMIT_FRACTION * capacity:
            reasons.append(f"GPU pod {ref} may use {_gib(lim)} GiB of {_gib(capacity)} GiB "
                           f"(>= {GPU_POD_LIMIT_FRACTION:.0%}); host memory the GPU driver pins for "
                           "it is not charged to its cgroup")
            single = True
    if not single and tally.limited and capacity - total < margin:
        reasons.append(f"the memory limits of {tally.limited} pods add up to {_gib(total)} GiB, "
                       f"leaving {_gib(capacity - total)} GiB (< {_gib(margin)} GiB) for the system")
    if tally.unbounded_count and unprotected:
        reasons.append(f"{tally.unbounded_count} pod(s) have no memory limit at all")
    if not reasons:
        return []
    if single:
        sev = "critical" if unprotected else "warning"
    elif capacity - total < margin:
        sev = "warning"
    else:
        sev = "info"   # only unbounded pods on an unprotected node
    title = "Memory overcommit: " + "; ".join(reasons)
    if protection:
        title += " (" + ", ".join(protection) + ")"
    ev["unprotected"] = unprotected
    remediation = (
        "Lower the memory limit of the largest pods so each leaves the node at least "
        f"{_gib(margin)} GiB (the container is then OOM-killed inside its cgroup instead of "
        "starving kubelet and containerd); set limits on pods that have none (a LimitRange in "
        "their namespace). On the node's kubelet, reserve memory for the system and evict "
        "earlier, e.g. in the KubeletConfiguration: `systemReserved: {memory: 2Gi}`, "
        "`kubeReserved: {memory: 1Gi}`, `evictionHard: {memory.available: \"5%\"}` "
        "(restart kubelet; allocatable shrinks, so pods that no longer fit are not scheduled "
        "there: roll it node by node). For the node that is already thrashing: "
        "`kubectl cordon " + name + "` first so the evicted pod does not take the next node "
        "down the same way (risk: no new pods on it until `kubectl uncordon " + name + "`).")
    return [catalog.make("memory.overcommit", sev, f"node/{name}", title, ev, remediation, REFS)]

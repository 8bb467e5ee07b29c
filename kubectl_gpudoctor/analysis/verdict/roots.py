"""Which finding is the root cause: the causal graph and the ranking rules, as data.

Why a table: which finding explains which is knowledge about GPU nodes, not code. Three tables
say it, and a new finding family joins the ranking by adding rows, not branches:

- CHAINS: known causal chains, cause first. Only neighbours that are BOTH present are linked (a
  chain never bridges a missing link); a shortcut where a middle link is often unseen is a
  chain of its own.
- OUTRANKS: (specific, generic ids): when both are present the specific finding is the root
  and the generic one its symptom -- the scheduler that rejected the pod (Kueue, HAMi, Volcano,
  KAI) over "its GPUs fit, but...", a lost GPU over its Xid, a GPU start that fails for a node
  reason over the black hole it makes.
- INSTANCE_ORDER: among several findings of one id, which one speaks for it (the fall off the
  bus over the failed probe that follows it), by an evidence field's value, first wins.

The findings' own causal edges (`caused_by`, `caused` in their evidence) are added to these.
The root is the finding nothing else present explains; among several, the one that explains
the most, then the most severe. Pure.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from node_probe.protocol import Finding, Severity
from node_probe.protocol.catalog import CATALOG

from .model import ev

CHAINS: tuple[tuple[str, ...], ...] = (
    ("driver.known_bad", "nvml.init_hang", "deviceplugin.blocked_in_nvml",
     "deviceplugin.rpc_timeout", "kubelet.blocked_in_device_plugin",
     "kubelet.admission_stalled", "probe.pod_not_started"),
    ("driver.known_bad", "deviceplugin.blocked_in_nvml"),
    ("driver.known_bad", "kubelet.blocked_in_device_plugin"),
    ("nvml.init_hang", "kubelet.blocked_in_device_plugin"),
    ("deviceplugin.blocked_in_nvml", "kubelet.blocked_in_device_plugin"),
    ("deviceplugin.blocked_in_nvml", "kubelet.admission_stalled"),
    ("kubelet.blocked_in_device_plugin", "probe.pod_not_started"),
    ("kubelet.admission_stalled", "pod.pending_explained"),
    ("kubelet.cpu_manager_static", "cgroup.device_rules_rewritten", "cgroup.device_denied",
     "container.nvidia_eperm", "cuda.call_failed"),
    ("deviceplugin.no_device_specs", "cgroup.device_rules_rewritten"),
    ("deviceplugin.no_device_specs", "cgroup.device_denied"),
    ("cgroup.dev_char_symlinks_missing", "cgroup.device_rules_rewritten"),
    ("cgroup.dev_char_symlinks_missing", "cgroup.device_denied"),
    ("cgroup.device_rules_rewritten", "container.nvidia_eperm"),
    ("cgroup.device_denied", "cuda.call_failed"),
    ("memory.overcommit", "memory.pressure", "node.not_ready", "probe.pod_not_started"),
    ("node.not_ready", "pod.gpu_placement_excluded"),
    ("node.not_ready", "probe.pod_not_started"),
    ("deviceplugin.missing", "node.gpu_capacity_mismatch", "pod.gpu_devices_missing"),
    ("deviceplugin.unhealthy", "node.gpu_capacity_mismatch"),
    ("gpu.lost", "node.gpu_capacity_mismatch"),
    ("gpu.xid", "node.gpu_capacity_mismatch"),
    ("dra.plugin_unresponsive", "kubelet.blocked_in_dra_plugin",
     "kubelet.admission_stalled"),
    ("runtime.handler_missing", "pod.admission_error"),
    ("mig.config_failed", "mig.mode_pending"),
    # a node that fails every GPU pod sent to it, and what makes it so (issue 32); the causes a
    # runtime's message names are in the findings' own `caused_by`
    ("gpu.lost", "node.gpu_black_hole"),
    ("gpu.xid", "node.gpu_black_hole"),
    ("deviceplugin.unhealthy", "node.gpu_black_hole"),
)

# (the specific finding, the generic ones it outranks when both are present)
OUTRANKS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # the scheduler or queue that holds a Pending pod, over the fit's "its GPUs fit, but ..."
    ("kueue.not_admitted", ("pod.pending_explained",)),
    ("hami.filter_failed", ("pod.pending_explained",)),
    ("volcano.podgroup_pending", ("pod.pending_explained",)),
    ("kai.podgroup_unschedulable", ("pod.pending_explained",)),
    # a GPU gone from the bus over the Xid and driver lines that report it
    ("gpu.lost", ("gpu.xid", "gpu.driver_error")),
    # the runtime's named cause of a failed GPU start over the black hole and the waiting pod
    ("pod.gpu_start_failed", ("node.gpu_black_hole", "pod.pending_explained")),
)

# id -> (evidence field, its values from the most specific): which finding of several speaks
INSTANCE_ORDER: dict[str, tuple[str, tuple[str, ...]]] = {
    "gpu.driver_error": ("kind", ("off_the_bus", "gpu_lost", "reset_required", "gsp_heartbeat",
                                  "gsp_rpc_timeout", "init_failed")),
}

# findings that are the tool's own trouble reaching the node, never the cause when another is
LAST_RESORT = frozenset({"probe.pod_not_started"})


def ids_in(value: Any) -> list[str]:
    """Finding ids named in an evidence value (a list of ids, or one id); others ignored."""
    items = value if isinstance(value, (list, tuple)) else [value]
    return [x for x in items[:50] if isinstance(x, str) and x in CATALOG]


def edges(present: set[str], findings: Sequence[Finding]) -> dict[str, set[str]]:
    """a -> {b}: a explains b, among the ids present."""
    out: dict[str, set[str]] = {i: set() for i in present}
    for f in findings:
        e = ev(f)
        for cause in ids_in(e.get("caused_by")):
            if cause in present and cause != f.id:
                out[cause].add(f.id)
        for effect in ids_in(e.get("caused")):
            if effect in present and effect != f.id:
                out[f.id].add(effect)
    for chain in CHAINS:
        for a, b in zip(chain, chain[1:]):
            if a in present and b in present:
                out[a].add(b)
    for specific, generic in OUTRANKS:
        if specific in present:
            for g in generic:
                if g in present and g != specific:
                    out[specific].add(g)
    return out


def reach(root: str, graph: Mapping[str, set[str]]) -> list[str]:
    """Ids reachable from root, each once, ordered by its longest distance from root."""
    depth = {root: 0}
    for _ in range(len(graph)):  # Bellman-Ford style relaxation, bounded by the node count
        changed = False
        for a in list(depth):
            for b in graph.get(a, ()):
                if b != root and depth.get(b, -1) < depth[a] + 1 <= len(graph):
                    depth[b] = depth[a] + 1
                    changed = True
        if not changed:
            break
    return sorted(depth, key=lambda i: (depth[i], i))


def _instance_rank(f: Finding) -> int:
    field, order = INSTANCE_ORDER.get(f.id, ("", ()))
    value = ev(f).get(field) if field else None
    return len(order) - order.index(value) if isinstance(value, str) and value in order else 0


def _seen_now(f: Finding) -> bool:
    """Seen by this run, not a mark the watching agent left on the node (that is evidence
    from then): at equal severity, the finding seen now speaks for its id."""
    return ev(f).get("source") != "gpu-doctor agent"


def best_of_each(findings: Sequence[Finding]) -> dict[str, Finding]:
    """The finding that speaks for each id: the most severe, then the most specific instance
    (INSTANCE_ORDER), then the one seen now, then the last reported."""
    out: dict[str, Finding] = {}
    for f in sorted(findings, key=lambda f: (f.severity.rank, _instance_rank(f), _seen_now(f))):
        out[f.id] = f
    return out


def unconfirmed(f: Finding) -> bool:
    """A finding that names a possible cause whose trigger it could not see: a known-bad
    driver on a node where the MIG layout could not be read and NVML did not hang (`could not
    tell whether it applies`). It is the likely cause, never the root cause the headline
    asserts."""
    if f.id != "driver.known_bad":
        return False
    e = ev(f)
    return e.get("trigger_present") is not True and e.get("nvml_status") != "hang"


def choose(findings: Sequence[Finding]) -> tuple[str, list[str], dict[str, Finding],
                                                  set[str], dict[str, set[str]]]:
    """(root id, chain, the finding of each id, the unconfirmed ids, the graph) for findings
    of which at least one is a warning or worse."""
    present = {f.id for f in findings}
    graph = edges(present, findings)
    bad = {f.id for f in findings if f.severity.rank >= Severity.WARNING.rank}
    # an info finding takes part only as the cause of a problem (overcommit -> pressure)
    linked = {i for i in present if i in bad or graph[i] & bad}
    explained = {b for a in linked for b in graph[a] if a != b}
    best = best_of_each(findings)
    maybe = {i for i in linked if unconfirmed(best[i])}
    sure = linked - maybe
    sure_explained = {b for a in sure for b in graph.get(a, ()) if a != b}
    roots = [i for i in sure if i not in sure_explained] or \
        [i for i in linked if i not in explained] or sorted(bad)
    sub = {k: v & linked for k, v in graph.items() if k in linked}

    def weight(i: str) -> tuple:
        return (len(reach(i, sub)), best[i].severity.rank, i not in LAST_RESORT, i)

    root = max(roots, key=weight)
    return root, reach(root, sub), best, maybe, graph

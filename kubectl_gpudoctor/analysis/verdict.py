"""The verdict of one target: the root cause, what it costs, and what to do, in that order.

Why: a report lists findings one by one, but an on-call engineer needs the answer first: which
finding is the cause and which are its symptoms, how many pods it holds up, and the commands
to run now. `decide()` links the findings by the causal edges they carry themselves
(`caused_by`, `caused` in their evidence) and by the chains we know (CHAINS below), picks the
cause nothing else explains, and builds the actions from our own templates (ACTIONS) filled
only with names validated as Kubernetes validates them (the target's node, pod, namespace),
shell-quoted. Nothing a node, tenant, agent or bundle can write is ever put into a command or
trusted as a remedy: evidence only contributes counts and version numbers that match a strict
pattern, and the rest of the words are ours.

Pure: findings and the target in, a frozen Verdict out; no I/O. A target with no warning or
critical finding gets an all-clear Verdict (severity "ok", no root cause, no actions) rather
than None, so the report, bots reading `verdict` in the JSON and the fleet view always find one
object per target; `decide()` never returns None.
"""
from __future__ import annotations

import dataclasses
import re
import shlex
from typing import Any, Mapping, Sequence

from node_probe.protocol import Finding, Severity
from node_probe.protocol.catalog import CATALOG
from node_probe.protocol.known_drivers import KNOWN_ISSUES

from ..params import name_problem

STAGES = ("stop", "fix", "confirm")
MAX_FINDINGS = 2000      # findings looked at (a report is bounded; a replayed bundle may not be)
MAX_POD_ENTRIES = 10000  # pod entries counted from evidence lists
_VERSION = re.compile(r"\d{1,4}(\.\d{1,4}){1,3}")

# Known causal chains, cause first. Only neighbours in a chain that are BOTH present are linked
# (a chain never bridges a missing link: memory.overcommit does not explain a NotReady node
# without memory.pressure between them); where a middle link is often unseen from one side
# (the node-side NVML findings when no debug pod could run), the shortcut is a chain of its own.
CHAINS: tuple[tuple[str, ...], ...] = (
    ("driver.known_bad", "nvml.init_hang", "deviceplugin.blocked_in_nvml",
     "deviceplugin.rpc_timeout", "kubelet.blocked_in_device_plugin",
     "kubelet.admission_stalled", "probe.pod_not_started"),
    ("driver.known_bad", "deviceplugin.blocked_in_nvml"),
    ("driver.known_bad", "kubelet.blocked_in_device_plugin"),
    ("nvml.init_hang", "kubelet.blocked_in_device_plugin"),
    ("deviceplugin.blocked_in_nvml", "kubelet.blocked_in_device_plugin"),
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
    ("gpu.xid", "gpu.lost", "node.gpu_capacity_mismatch"),
    ("dra.plugin_unresponsive", "kubelet.blocked_in_dra_plugin",
     "kubelet.admission_stalled"),
    ("runtime.handler_missing", "pod.admission_error"),
    ("mig.config_failed", "mig.mode_pending"),
    # a node that fails every GPU pod sent to it, and what makes it so (issue 32); the causes a
    # runtime's message names are in the findings' own `caused_by`
    ("gpu.xid", "gpu.lost", "node.gpu_black_hole"),
    ("deviceplugin.unhealthy", "node.gpu_black_hole"),
)

# What the last link of a chain means for the workload, most telling first.
EFFECTS: tuple[tuple[str, str], ...] = (
    ("node.gpu_black_hole", "the node fails the GPU pods sent to it"),
    ("kubelet.admission_stalled", "the kubelet admits no pod"),
    ("kubelet.blocked_in_device_plugin", "the kubelet is blocked in the device plugin"),
    ("node.not_ready", "the node is NotReady"),
    ("cuda.call_failed", "CUDA and NVML calls fail in the container"),
    ("container.nvidia_eperm", "opening /dev/nvidia* fails with EPERM"),
    ("cgroup.device_denied", "the container's device cgroup denies its GPUs"),
    ("kubelet.blocked_in_dra_plugin", "the kubelet is blocked in a DRA plugin"),
    ("pod.gpu_devices_missing", "pods find too few allocatable GPUs"),
)


@dataclasses.dataclass(frozen=True)
class Action:
    """One step: `stage` stop (the bleeding), fix (the cause) or confirm (the next look).
    `command` is None for a step no single command does (a driver upgrade)."""

    stage: str
    text: str
    command: str | None
    risk: str

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise ValueError(f"action stage must be one of {STAGES}, not {self.stage!r}")

    def to_dict(self) -> dict:
        return {"stage": self.stage, "text": self.text, "command": self.command,
                "risk": self.risk}


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The answer for one target. `root_cause` and `chain` are finding ids (cause first);
    `impact` counts the pods held up (`pods`, `gpu_pods`, `non_gpu_pods`)."""

    headline: str
    root_cause: str | None
    subject: str
    severity: str
    impact: Mapping[str, Any]
    actions: tuple[Action, ...] = ()
    chain: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"headline": self.headline, "root_cause": self.root_cause,
                "subject": self.subject, "severity": self.severity,
                "impact": dict(self.impact), "actions": [a.to_dict() for a in self.actions],
                "chain": list(self.chain)}


# -- the target: only validated names reach a command ------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Names:
    kind: str
    node: str | None
    pod: str | None
    namespace: str | None

    @property
    def label(self) -> str:
        if self.kind == "pod" and self.pod:
            return f"pod {self.namespace}/{self.pod}" if self.namespace else f"pod {self.pod}"
        if self.node:
            return f"node {self.node}"
        return "this host" if self.kind == "local" else "the target"


def _valid(kind: str, value: Any) -> str | None:
    return value if isinstance(value, str) and name_problem(kind, value) is None else None


def _names(target: Mapping[str, Any]) -> _Names:
    kind = str(target.get("kind") or "")
    node = _valid("node", target.get("node"))
    pod = namespace = None
    if kind == "pod":
        ns, _, name = str(target.get("name") or "").rpartition("/")
        pod, namespace = _valid("pod", name), _valid("namespace", ns)
        if pod is None:
            namespace = None
    elif kind == "node" and node is None:
        node = _valid("node", target.get("name"))
    return _Names(kind, node, pod, namespace)


def _q(name: str) -> str:
    return shlex.quote(name)


# -- the causal graph --------------------------------------------------------------------------

def _ids(value: Any) -> list[str]:
    """Finding ids named in an evidence value (a list of ids, or one id); others ignored."""
    items = value if isinstance(value, (list, tuple)) else [value]
    return [x for x in items[:50] if isinstance(x, str) and x in CATALOG]


def _edges(present: set[str], findings: Sequence[Finding]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {i: set() for i in present}
    for f in findings:
        ev = f.evidence if isinstance(f.evidence, Mapping) else {}
        for cause in _ids(ev.get("caused_by")):
            if cause in present and cause != f.id:
                out[cause].add(f.id)
        for effect in _ids(ev.get("caused")):
            if effect in present and effect != f.id:
                out[f.id].add(effect)
    for chain in CHAINS:
        for a, b in zip(chain, chain[1:]):
            if a in present and b in present:
                out[a].add(b)
    return out


def _reach(root: str, edges: Mapping[str, set[str]]) -> list[str]:
    """Ids reachable from root, each once, ordered by its longest distance from root."""
    depth = {root: 0}
    for _ in range(len(edges)):  # Bellman-Ford style relaxation, bounded by the node count
        changed = False
        for a in list(depth):
            for b in edges.get(a, ()):
                if b != root and depth.get(b, -1) < depth[a] + 1 <= len(edges):
                    depth[b] = depth[a] + 1
                    changed = True
        if not changed:
            break
    return sorted(depth, key=lambda i: (depth[i], i))


def _rank(f: Finding) -> int:
    return f.severity.rank


# -- impact ------------------------------------------------------------------------------------

def _impact(findings: Sequence[Finding], names: _Names, ids_in_chain: set[str]) -> dict:
    pods: dict[str, bool] = {}
    non_gpu_said = 0
    counted = 0
    for f in findings:
        if f.id not in ids_in_chain:
            continue
        ev = f.evidence if isinstance(f.evidence, Mapping) else {}
        for key in ("pods", "pods_waiting"):
            entries = ev.get(key)
            if not isinstance(entries, (list, tuple)):
                continue
            for e in entries:
                counted += 1
                if counted > MAX_POD_ENTRIES:
                    break
                if isinstance(e, Mapping) and isinstance(e.get("pod"), str):
                    pods[e["pod"]] = pods.get(e["pod"], False) or bool(e.get("gpu"))
        n = ev.get("non_gpu_pods_affected")
        if isinstance(n, int) and not isinstance(n, bool) and 0 <= n:
            non_gpu_said = max(non_gpu_said, n)
    gpu = sum(1 for v in pods.values() if v)
    non_gpu = max(len(pods) - gpu, non_gpu_said)
    if not pods and names.kind == "pod" and any(i.startswith("pod.") for i in ids_in_chain):
        gpu = 1  # the pod findings are about the target pod, a GPU pod
    return {"pods": gpu + non_gpu, "gpu_pods": gpu, "non_gpu_pods": non_gpu}


# -- headline and actions ----------------------------------------------------------------------

def _driver(findings: Sequence[Finding]) -> str | None:
    for f in findings:
        if f.id == "driver.known_bad" and isinstance(f.evidence, Mapping):
            v = f.evidence.get("driver_version")
            if isinstance(v, str) and _VERSION.fullmatch(v):
                return v
    return None


def _known_issue(version: str | None):
    return next((k for k in KNOWN_ISSUES if version in k.versions), None)


def _headline(root: Finding, chain: Sequence[str], names: _Names, impact: Mapping,
              findings: Sequence[Finding]) -> str:
    if root.id == "driver.known_bad":
        version = _driver(findings)
        issue = _known_issue(version)
        cause = f"known-bad NVIDIA driver{' ' + version if version else ''}"
        cause += (f" ({issue.condition_text.removesuffix(' on one node')})" if issue else "")
        if {"kubelet.blocked_in_device_plugin", "kubelet.admission_stalled"} & set(chain) \
                or "deviceplugin.blocked_in_nvml" in chain:
            cause += " hangs the device plugin in NVML"
    else:
        cause = CATALOG.get(root.id, root.id)
        word = cause.split(" ", 1)[0]
        cause = cause if word[1:] != word[1:].lower() else cause[0].lower() + cause[1:]
    effect = next((text for i, text in EFFECTS if i in chain and i != root.id), None)
    head = f"{cause}{', so ' + effect if effect else ''} on {names.label}"
    if impact.get("pods"):
        head += (f": {impact['pods']} pod{'s' if impact['pods'] != 1 else ''} stuck"
                 f" ({impact['gpu_pods']} GPU, {impact['non_gpu_pods']} non-GPU)")
    first = head.split(" ", 1)[0]
    return head if first[1:] != first[1:].lower() else head[0].upper() + head[1:]


def _gd(names: _Names, *extra: str) -> str | None:
    """The `kubectl gpu-doctor` command that looks at this target again."""
    if names.kind == "pod" and names.pod:
        ns = f" -n {_q(names.namespace)}" if names.namespace else ""
        return f"kubectl gpu-doctor pod {_q(names.pod)}{ns}" + "".join(" " + e for e in extra)
    if names.node:
        return f"kubectl gpu-doctor node {_q(names.node)}" + "".join(" " + e for e in extra)
    return None


def _cordon(names: _Names) -> Action | None:
    if not names.node:
        return None
    return Action("stop", f"cordon {names.node}: no new pod is scheduled there",
                  f"kubectl cordon {_q(names.node)}",
                  "none for running pods; the node's free GPUs go unused until uncordoned")


def _plugin_restart(names: _Names) -> Action | None:
    if not names.node:
        return None
    return Action(
        "stop", "restart the device plugin pod on the node: the stuck kubelet call returns",
        f"kubectl delete pod -A --field-selector spec.nodeName={_q(names.node)} "
        f"-l app.kubernetes.io/name=nvidia-device-plugin",
        "low: releases admission only until the next GPU pod hangs it again (the GPU "
        "Operator labels its plugin app=nvidia-device-plugin-daemonset)")


# the fix of a root cause no chain template covers, in our words (no command: it depends on
# the workload); the page has the rest
FIXES = {
    "pod.gpu_never_fits": "ask for at most what one node offers (GPUs per pod, the MIG "
                          "profile or resource name the nodes advertise), or add such a node",
    "pod.gpu_devices_missing": "bring the missing GPUs back: the device plugin on the big "
                               "nodes is gone or reports devices Unhealthy",
    "pod.gpu_held_by_others": "free GPUs: other pods hold them (finished jobs, idle "
                              "notebooks), or lower the request",
    "pod.gpu_placement_excluded": "let the pod reach the nodes that have room: tolerations, "
                                  "node selector and affinity, or uncordon",
    "pod.gpu_quota_exhausted": "raise the namespace's GPU ResourceQuota or free quota",
    "deviceplugin.missing": "deploy the NVIDIA device plugin (or the GPU Operator) on the node",
    "runtime.handler_missing": "configure the nvidia runtime handler in containerd/CRI-O on "
                               "the node (nvidia-ctk runtime configure) and restart the runtime",
    "pod.gpu_start_failed": "fix the node fault the runtime's message names (the finding "
                            "says which, and the node check that proves it), then delete the "
                            "pod so its controller recreates it",
    "node.gpu_black_hole": "find why the node fails GPU pods (a lost GPU, the device plugin, "
                           "the runtime): `kubectl gpu-doctor node` runs the node-side checks; "
                           "then delete the pods it rejected so their controllers recreate them",
}


def _explain(root_id: str) -> Action | None:
    """`explain ID` only for ids of our catalog: an id a node made up has no page, and a
    suggested command must never carry text from outside the tool."""
    if root_id not in CATALOG:
        return None
    return Action("fix", "read the cause and the fix of the root cause",
                  f"kubectl gpu-doctor explain {root_id}", "none (reads the page)")


def _confirm(names: _Names, findings_ids: set[str]) -> list[Action]:
    out = []
    if "probe.pod_not_started" in findings_ids:
        out.append(Action(
            "confirm", "the node-side checks need a way in that skips pod admission: on the "
            "node (ssh), run",
            "kubectl-gpu_doctor local", "none (read-only checks, a short eBPF trace)"))
        out.append(Action(
            "confirm", "so the next wedge is reachable by exec, install the standing agent "
            "(its pod cannot start on a node that already admits nothing)",
            "kubectl gpu-doctor agent install",
            "a privileged DaemonSet pod on every GPU node"))
    cmd = _gd(names)
    if cmd:
        out.append(Action("confirm", "after the fix, check again", cmd, "none (read-only)"))
    return out


def _actions(root: Finding, chain: Sequence[str], names: _Names,
             findings: Sequence[Finding]) -> tuple[Action, ...]:
    ids = {f.id for f in findings}
    acts: list[Action | None] = []
    wedge = {"kubelet.admission_stalled", "kubelet.blocked_in_device_plugin",
             "deviceplugin.blocked_in_nvml", "nvml.init_hang"} & set(chain)
    if "node.gpu_black_hole" in chain and root.id not in ("driver.known_bad",) and not wedge:
        # stop the bleeding first: the scheduler keeps sending it pods while it is schedulable
        acts.append(_cordon(names))
        if root.id in FIXES:
            acts.append(Action("fix", FIXES[root.id], None, "depends on the change; read "
                               f"`kubectl gpu-doctor explain {root.id}` first"))
        acts.append(_explain(root.id))
    elif root.id == "driver.known_bad" or wedge:
        acts += [_cordon(names),
                 _plugin_restart(names) if "kubelet.blocked_in_device_plugin" in chain
                 or "deviceplugin.blocked_in_nvml" in chain else None]
        issue = _known_issue(_driver(findings))
        if issue is not None:
            acts.append(Action(
                "fix", f"upgrade the NVIDIA driver to {' / '.join(issue.fixed_in)} or later "
                f"(until then: {issue.workaround.split('; until then ', 1)[-1]})", None,
                "drain first: GPU pods on the node restart"))
        else:
            acts.append(_explain(root.id))
    elif {"cgroup.device_rules_rewritten", "cgroup.device_denied",
          "container.nvidia_eperm"} & set(chain):
        acts.append(Action(
            "fix", "make the NVIDIA device plugin pass device specs (PASS_DEVICE_SPECS=true, "
            "Helm/GPU Operator: devicePlugin env), or use CDI; on systemd-driver nodes "
            "create the /dev/char links", None,
            "the plugin pods restart; running GPU pods keep their devices"))
        if names.kind == "pod" and names.pod and names.namespace:
            acts.append(Action(
                "fix", "then recreate the pod so its device rules are built again",
                f"kubectl delete pod {_q(names.pod)} -n {_q(names.namespace)}",
                "the pod restarts (a bare pod is gone: recreate it from its manifest)"))
        else:
            acts.append(Action("fix", "then recreate the affected GPU pods (their device "
                               "rules are only rebuilt on a new container)", None,
                               "the pods restart"))
    elif root.id in ("node.not_ready", "memory.pressure", "memory.overcommit"):
        acts.append(_cordon(names))
        if names.node:
            acts.append(Action("fix", "see why the kubelet stopped reporting (conditions, "
                               "events); on the node: journalctl -u kubelet",
                               f"kubectl describe node {_q(names.node)}", "none (read-only)"))
        acts.append(_explain(root.id))
    else:
        if root.id in FIXES:
            acts.append(Action("fix", FIXES[root.id], None, "depends on the change; read "
                               f"`kubectl gpu-doctor explain {root.id}` first"))  # FIXES: ours
        acts.append(_explain(root.id))
    acts += _confirm(names, ids)
    order = {s: i for i, s in enumerate(STAGES)}
    return tuple(sorted((a for a in acts if a is not None), key=lambda a: order[a.stage]))


# -- the decision ------------------------------------------------------------------------------

def decide(findings: Sequence[Finding], target: Mapping[str, Any], *,
           complete: bool = True) -> Verdict:
    """The verdict for `target` from its findings. Never None: an all-clear verdict when no
    finding is a warning or critical (and says so when the run was incomplete)."""
    findings = [f for f in list(findings)[:MAX_FINDINGS] if isinstance(f, Finding)]
    names = _names(target)
    problems = [f for f in findings if f.severity.rank >= Severity.WARNING.rank]
    if not problems:
        head = (f"No problem found on {names.label}" if complete else
                f"No problem found in what could be checked on {names.label}: the run is "
                f"incomplete")
        return Verdict(head, None, names.label, Severity.OK.value if complete
                       else Severity.INFO.value,
                       {"pods": 0, "gpu_pods": 0, "non_gpu_pods": 0})
    present = {f.id for f in findings}
    edges = _edges(present, findings)
    bad = {f.id for f in problems}
    # an info finding takes part only as the cause of a problem (overcommit -> pressure)
    linked = {i for i in present if i in bad or edges[i] & bad}
    explained = {b for a in linked for b in edges[a] if a != b}
    roots = [i for i in linked if i not in explained] or sorted(bad)
    best = {f.id: f for f in sorted(findings, key=_rank)}  # the worst finding of each id

    def weight(i: str) -> tuple:
        reach = _reach(i, {k: v & linked for k, v in edges.items() if k in linked})
        return (len(reach), best[i].severity.rank, i not in ("probe.pod_not_started",), i)

    root_id = max(roots, key=weight)
    chain = _reach(root_id, {k: v & linked for k, v in edges.items() if k in linked})
    root = best[root_id]
    impact = _impact(findings, names, set(chain))
    severity = max((best[i].severity for i in chain), key=lambda s: s.rank).value
    return Verdict(_headline(root, chain, names, impact, findings), root_id, names.label,
                   severity, impact, _actions(root, chain, names, findings), tuple(chain))

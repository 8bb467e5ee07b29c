"""The verdict of one target: the root cause, what it costs, and what to do, in that order.

Why: a report lists findings one by one, but an on-call engineer needs the answer first: which
finding is the cause and which are its symptoms, how many pods it holds up, and the commands
to run now. `decide()` links the findings by the causal edges they carry themselves
(`caused_by`, `caused` in their evidence) and by the chains we know (CHAINS below), picks the
cause nothing else explains, and words the headline from that finding's own specific sentence
(its numbers and names: the plugin, the monitor and its condition, the GPUs asked and offered),
the subject named once. A cause that is only likely (a known-bad driver whose trigger could not
be seen) is said to be likely; a cause that has cleared (a pod rejected at admission whose
node is fine now and whose controller replaced it) says it cleared, at the severity it leaves.

Actions are steps a person recognises -- mitigate (stop the bleeding), fix (the cause), verify
(look again), prevent (the next time) -- each a command on the real object where one command
does it: the device plugin's own pod resolved from the API (analysis/plugin_pods.py), the
Failed pod, the node to cordon or drain with the flags that work. A finding's page (`explain`)
is a reference, never an action. Commands are built from our templates filled only with names
validated as Kubernetes validates them, shell-quoted. Nothing a node, tenant, agent or bundle
can write is ever put into a command or trusted as a remedy: evidence contributes counts,
version numbers and names that match a strict pattern; a finding's title reaches only the
headline, which every renderer escapes.

Pure: findings, the target and the names the command resolved (`context`) in, a frozen
Verdict out; no I/O. A target with no warning or critical finding gets an all-clear Verdict
(severity "ok", no root cause, no actions) rather than None -- or, when a cause was seen and
has cleared, that cause with severity "info" -- so the report, bots reading `verdict` in the
JSON and the fleet view always find one object per target; `decide()` never returns None.
"""
from __future__ import annotations

import dataclasses
import re
import shlex
from typing import Any, Mapping, Sequence

from node_probe.protocol import Finding, Severity
from node_probe.protocol.catalog import CATALOG
from node_probe.protocol.duration import human
from node_probe.protocol.known_drivers import KNOWN_ISSUES

from ..params import name_problem

# the steps of a verdict, in order (`step` in JSON); `stage` keeps the names JSON readers had
# before (stop / fix / confirm) so bots keyed on them read the same actions
STEPS = ("mitigate", "fix", "verify", "prevent")
LEGACY_STAGE = {"mitigate": "stop", "fix": "fix", "verify": "confirm", "prevent": "confirm"}
_FROM_LEGACY = {"stop": "mitigate", "confirm": "verify"}
STAGES = STEPS  # the order actions come in
MAX_FINDINGS = 2000      # findings looked at (a report is bounded; a replayed bundle may not be)
MAX_POD_ENTRIES = 10000  # pod entries counted from evidence lists
MAX_HEADLINE = 400
_VERSION = re.compile(r"\d{1,4}(\.\d{1,4}){1,3}")
_RESOURCE = re.compile(r"[a-z0-9.-]{1,63}/[A-Za-z0-9._-]{1,63}")
_NVML_FUNC = re.compile(r"nvml[A-Za-z0-9_]{1,40}")
_PID = re.compile(r"[0-9]{1,9}")

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

# What the last link of a chain means for the workload, most telling first; the words that
# show a headline already says it (then it is not said twice).
EFFECTS: tuple[tuple[str, str, str], ...] = (
    ("node.gpu_black_hole", "the node fails the GPU pods sent to it", "fails"),
    ("kubelet.admission_stalled", "the kubelet admits no pod", "admit"),
    ("kubelet.blocked_in_device_plugin", "the kubelet admits no pod", "admit"),
    ("node.not_ready", "the node is NotReady", "notready"),
    ("cuda.call_failed", "CUDA and NVML calls fail in the container", "cuda"),
    ("container.nvidia_eperm", "opening /dev/nvidia* fails with EPERM", "eperm"),
    ("cgroup.device_denied", "the container's device cgroup denies its GPUs", "denies"),
    ("kubelet.blocked_in_dra_plugin", "the kubelet is blocked in a DRA plugin", "dra plugin"),
    ("pod.gpu_devices_missing", "pods find too few allocatable GPUs", "too few"),
)
WEDGE = frozenset({"kubelet.admission_stalled", "kubelet.blocked_in_device_plugin",
                   "deviceplugin.blocked_in_nvml", "deviceplugin.rpc_timeout",
                   "nvml.init_hang"})
# a GPU gone or failing hard: the node's GPU work has to move off it
GPU_DOWN = frozenset({"gpu.lost", "gpu.row_remap_failed"})
# other health monitors' words for a GPU that fell off the bus or failed hard (node.foreign_condition)
_GPU_DOWN_WORDS = re.compile(r"xid ?79|xid79|fell off the bus|gpu ?lost|"
                             r"acceleratedhardwareready|xidcriticalerror", re.I)


@dataclasses.dataclass(frozen=True)
class Action:
    """One step: `step` mitigate (stop the bleeding), fix (the cause), verify (look again) or
    prevent (the next time). `command` is None for a step no single command does (a driver
    upgrade). The legacy stage names (stop, confirm) are accepted and mapped."""

    step: str
    text: str
    command: str | None
    risk: str

    def __post_init__(self) -> None:
        step = _FROM_LEGACY.get(self.step, self.step)
        if step not in STEPS:
            raise ValueError(f"action step must be one of {STEPS}, not {self.step!r}")
        object.__setattr__(self, "step", step)

    @property
    def stage(self) -> str:
        """The step under the name JSON readers had before (stop, fix, confirm)."""
        return LEGACY_STAGE[self.step]

    def to_dict(self) -> dict:
        return {"stage": self.stage, "step": self.step, "text": self.text,
                "command": self.command, "risk": self.risk}


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The answer for one target. `root_cause` and `chain` are finding ids (cause first);
    `impact` counts the pods held up (`pods`, `gpu_pods`, `non_gpu_pods`); `cleared`: the
    root cause was seen and is gone now; `page`: the `explain` command of the root cause (a
    reference, not an action)."""

    headline: str
    root_cause: str | None
    subject: str
    severity: str
    impact: Mapping[str, Any]
    actions: tuple[Action, ...] = ()
    chain: tuple[str, ...] = ()
    cleared: bool = False
    page: str | None = None

    def to_dict(self) -> dict:
        return {"headline": self.headline, "root_cause": self.root_cause,
                "subject": self.subject, "severity": self.severity,
                "impact": dict(self.impact), "actions": [a.to_dict() for a in self.actions],
                "chain": list(self.chain), "cleared": self.cleared, "page": self.page}


# -- the target: only validated names reach a command ------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Names:
    kind: str
    node: str | None
    pod: str | None
    namespace: str | None
    plugin_pods: tuple[dict, ...] = ()

    @property
    def label(self) -> str:
        if self.kind == "pod" and self.pod:
            return f"pod {self.namespace}/{self.pod}" if self.namespace else f"pod {self.pod}"
        if self.node:
            return f"node {self.node}"
        return "this host" if self.kind == "local" else "the target"


def _valid(kind: str, value: Any) -> str | None:
    return value if isinstance(value, str) and name_problem(kind, value) is None else None


def _plugin_pods(context: Mapping[str, Any] | None) -> tuple[dict, ...]:
    out = []
    for p in list((context or {}).get("plugin_pods") or ())[:20]:
        if not isinstance(p, Mapping):
            continue
        ns, name = _valid("namespace", p.get("namespace")), _valid("pod", p.get("name"))
        if ns and name:
            uid = p.get("uid") if isinstance(p.get("uid"), str) else ""
            how = p.get("how") if isinstance(p.get("how"), str) else ""
            out.append({"namespace": ns, "name": name, "uid": uid[:64], "how": how[:80]})
    return tuple(out)


def _names(target: Mapping[str, Any], context: Mapping[str, Any] | None = None) -> _Names:
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
    return _Names(kind, node, pod, namespace, _plugin_pods(context))


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


def _ev(f: Finding) -> Mapping[str, Any]:
    return f.evidence if isinstance(f.evidence, Mapping) else {}


# -- likely and cleared --------------------------------------------------------------------------

def unconfirmed(f: Finding) -> bool:
    """A finding that names a possible cause whose trigger it could not see: a known-bad
    driver on a node where the MIG layout could not be read and NVML did not hang (`could not
    tell whether it applies`). It is the likely cause, never the root cause the headline
    asserts."""
    if f.id != "driver.known_bad":
        return False
    ev = _ev(f)
    return ev.get("trigger_present") is not True and ev.get("nvml_status") != "hang"


def _from_labels(f: Finding) -> bool:
    """A cause read from the node's labels only, not seen on the node (the headline says
    `Likely`)."""
    return _ev(f).get("confirmed_on_node") is False


def _cleared(f: Finding) -> str | None:
    """What says the cause `f` is gone now, or None when it holds (or it is not known)."""
    ev = _ev(f)
    race = ev.get("admission_race")
    if f.id == "pod.admission_error" and isinstance(race, Mapping) and \
            race.get("cleared_now") is True:
        alloc = race.get("node_allocatable_now")
        res = race.get("resource")
        node_ok = (f"the node advertises {alloc} allocatable {res}"
                   if isinstance(alloc, int) and isinstance(res, str)
                   and _RESOURCE.fullmatch(res) else "the node has its GPUs back")
        owner = race.get("controller") if isinstance(race.get("controller"), Mapping) else {}
        kind, name = owner.get("kind"), _valid("pod", owner.get("name"))
        if race.get("recreated") is True and isinstance(kind, str) and kind.isalpha() and name:
            return f"cleared since: {node_ok} and its {kind} {name} has replaced the pod"
        return f"cleared since: {node_ok}"
    if f.id == "agent.problem_seen" and ev.get("status") == "False":
        return "cleared since"
    return None


# -- impact ------------------------------------------------------------------------------------

def _impact(findings: Sequence[Finding], names: _Names, ids_in_chain: set[str]) -> dict:
    pods: dict[str, bool] = {}
    non_gpu_said = 0
    counted = 0
    for f in findings:
        if f.id not in ids_in_chain:
            continue
        ev = _ev(f)
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


def _impact_words(impact: Mapping[str, Any], names: _Names) -> str:
    n, gpu, other = impact.get("pods") or 0, impact.get("gpu_pods") or 0, \
        impact.get("non_gpu_pods") or 0
    if not n or (names.kind == "pod" and n <= 1):
        return ""  # a pod's own finding: the headline is about it already
    s = "s" if n != 1 else ""
    if not other:
        return f"{n} GPU pod{s} stuck"
    if not gpu:
        return f"{n} pod{s} without GPUs stuck"
    return f"{n} pods stuck ({gpu} with GPUs, {other} without)"


# -- headline ----------------------------------------------------------------------------------

def _driver(findings: Sequence[Finding]) -> str | None:
    for f in findings:
        if f.id == "driver.known_bad":
            v = _ev(f).get("driver_version")
            if isinstance(v, str) and _VERSION.fullmatch(v):
                return v
    for f in findings:  # the node probe's plugin finding carries the driver it matched
        if f.id == "deviceplugin.blocked_in_nvml":
            for m in _ev(f).get("known_bad_driver") or ():
                v = m.get("driver_version") if isinstance(m, Mapping) else None
                if isinstance(v, str) and _VERSION.fullmatch(v):
                    return v
    return None


def _known_issue(version: str | None):
    return next((k for k in KNOWN_ISSUES if version in k.versions), None)


def _known_bad_words(findings: Sequence[Finding]) -> str | None:
    version = _driver(findings)
    if version is None:
        return None
    issue = _known_issue(version)
    cond = f" ({issue.condition_text.removesuffix(' on one node')})" if issue else ""
    return f"known-bad NVIDIA driver {version}{cond}"


def _resources(ev: Mapping[str, Any]) -> list[str]:
    raw = next((v if isinstance(v, (list, tuple)) else [v]
                for v in (ev.get("resources"), ev.get("resource")) if v), [])
    return [r for r in list(raw)[:8] if isinstance(r, str) and _RESOURCE.fullmatch(r)]


def plugin_pod_for(names: _Names, findings: Sequence[Finding]) -> dict | None:
    """The device plugin's pod: the one whose uid the node probe saw serving the stuck plugin
    socket, else the first the API side recognised by its install's labels."""
    if not names.plugin_pods:
        return None
    uids = {str(_ev(f).get("pod_uid")) for f in findings
            if f.id.startswith("deviceplugin.") and _ev(f).get("pod_uid")}
    return next((p for p in names.plugin_pods if p["uid"] and p["uid"] in uids),
                names.plugin_pods[0])


def _plugin_words(root: Finding, names: _Names, findings: Sequence[Finding]) -> str:
    """`the nvidia.com/gpu device plugin (pod gpu-operator/nvidia-device-plugin-x7k2p, pid
    8865)`: the plugin named by what it serves and where it runs."""
    ev = _ev(root)
    res = _resources(ev)
    where = []
    pod = plugin_pod_for(names, findings)
    if pod:
        where.append(f"pod {pod['namespace']}/{pod['name']}")
    if isinstance(ev.get("pid"), int) or _PID.fullmatch(str(ev.get("pid") or "")):
        where.append(f"pid {ev['pid']}")
    return (f"the {', '.join(res) + ' ' if res else ''}device plugin"
            + (f" ({', '.join(where)})" if where else ""))


def _cause(root: Finding, chain: Sequence[str], names: _Names, findings: Sequence[Finding],
           likely: str | None) -> str:
    """The root finding's own sentence: its numbers and names, the subject once."""
    ev = _ev(root)
    mark = _agent_mark(root)
    if mark:
        return mark
    if root.id == "driver.known_bad":
        words = _known_bad_words(findings) or "a known-bad NVIDIA driver"
        cause = words[0].upper() + words[1:]
        if {"kubelet.blocked_in_device_plugin", "kubelet.admission_stalled",
                "deviceplugin.blocked_in_nvml"} & set(chain):
            cause += " hangs the device plugin in NVML"
        if unconfirmed(root) or _from_labels(root):
            cause = "Likely: " + cause[:1].lower() + cause[1:]
        return cause
    if root.id == "deviceplugin.blocked_in_nvml":
        threads = ev.get("threads") if isinstance(ev.get("threads"), list) else []
        func = next((t.get("func") for t in threads if isinstance(t, Mapping)
                     and isinstance(t.get("func"), str) and _NVML_FUNC.fullmatch(t["func"])),
                    "nvmlInit")
        plugin = _plugin_words(root, names, findings)
        return f"{plugin[0].upper()}{plugin[1:]} is stuck in {func}"
    if root.id == "kubelet.blocked_in_device_plugin":
        return _kubelet_blocked(root, names, findings)
    if root.id == "node.not_ready":
        # the title's own words up to what it means for the probe (said by the report)
        return _title(root).split("): node-side checks", 1)[0] + (
            ")" if "): node-side checks" in _title(root) else "")
    title = _title(root)
    if root.id.startswith("pod.") and names.kind == "pod" and names.pod:
        low = title[:1].lower() + title[1:]
        if low.startswith(("asks ", "waits ", "is ", "has ", "was ", "never ")):
            who = f"{names.namespace}/{names.pod}" if names.namespace else names.pod
            return f"Pod {who} {low}"
        if low.startswith("the kubelet rejected the pod"):
            who = f"{names.namespace}/{names.pod}" if names.namespace else names.pod
            return "The kubelet rejected pod " + who + low[len("the kubelet rejected the pod"):]
    return title


def _kubelet_blocked(root: Finding, names: _Names, findings: Sequence[Finding]) -> str:
    """`The kubelet waits 10m in the nvidia.com/gpu device plugin's GetPreferredAllocation
    (pod gpu-operator/nvidia-device-plugin-daemonset-x7k2p)`: the goroutine dump's numbers."""
    ev = _ev(root)
    calls = ev.get("calls") if isinstance(ev.get("calls"), Mapping) else {}
    call = next((c for c in calls if isinstance(c, str) and re.fullmatch(r"[A-Za-z]{1,40}", c)),
                None)
    mins = ev.get("longest_wait_min")
    res = _resources(ev)
    pod = plugin_pod_for(names, findings)
    plugin = (f"the {', '.join(res) + ' ' if res else ''}device plugin's "
              f"{call or 'RPC'}" + (f" (pod {pod['namespace']}/{pod['name']})" if pod else ""))
    if isinstance(mins, int) and not isinstance(mins, bool) and mins >= 1:
        return f"The kubelet has waited for {human(mins * 60)} in {plugin}"
    return f"The kubelet is inside {plugin}"


def _agent_mark(f: Finding) -> str | None:
    """A problem the watching agent marked on the node (its NodeCondition, read from the node
    object): the agent's own message and how long ago it set the mark -- evidence from then,
    not a look now."""
    ev = _ev(f)
    if ev.get("source") != "gpu-doctor agent" or not isinstance(ev.get("condition"), str):
        return None
    # the condition's message is quoted by the finding, never the headline (MCP-01): whoever
    # can patch nodes/status can write it; the headline says what the id means
    what = CATALOG.get(f.id, f.id)
    since = ev.get("since_s")
    when = (f"marked by the watching agent {human(since)} ago" if isinstance(since, (int, float))
            and not isinstance(since, bool) else "marked by the watching agent")
    return f"{_cap(what)} ({when})"


def _cap(s: str) -> str:
    """A sentence's first letter up, unless its first word is a name (`nvidia.com/gpu`)."""
    first = s.split(" ", 1)[0]
    return s[:1].upper() + s[1:] if first.isalpha() else s


def _title(f: Finding) -> str:
    t = " ".join(str(f.title).split())[:300]
    if t.lower().startswith("likely root cause: "):
        t = "Likely: " + t[len("likely root cause: "):]
    return _cap(t) if t else f.id


def _headline(root: Finding, chain: Sequence[str], names: _Names, impact: Mapping,
              findings: Sequence[Finding], likely: str | None, cleared: str | None) -> str:
    cause = _cause(root, chain, names, findings, likely)
    flat = re.sub(r"[^a-z0-9 ]", "", cause.lower())
    effect = next((text for i, text, says in EFFECTS if i in chain and i != root.id
                   and says not in flat), None)
    if effect and effect.startswith("the kubelet ") and cause.startswith("The kubelet "):
        effect = "it " + effect[len("the kubelet "):]
    head = cause + (f", so {effect}" if effect else "")
    stuck = "" if cleared else _impact_words(impact, names)
    if stuck:
        head += f": {stuck}"
    if likely:
        head += f"; likely cause: {likely}"
    if cleared:
        head += f"; {cleared}"
    return head[:MAX_HEADLINE]


# -- actions -----------------------------------------------------------------------------------

def _gd(names: _Names, *extra: str) -> str | None:
    """The `kubectl gpu-doctor` command that looks at this target again."""
    if names.kind == "pod" and names.pod:
        ns = f" -n {_q(names.namespace)}" if names.namespace else ""
        return f"kubectl gpu-doctor pod {_q(names.pod)}{ns}" + "".join(" " + e for e in extra)
    if names.node:
        return f"kubectl gpu-doctor node {_q(names.node)}" + "".join(" " + e for e in extra)
    return None


def cordon(names: _Names) -> Action | None:
    """Stop new pods landing on the node (the fleet view's cordon action uses it too)."""
    if not names.node:
        return None
    return Action("mitigate", f"keep new pods off {names.node}",
                  f"kubectl cordon {_q(names.node)}",
                  "none for running pods; its free GPUs stay idle until uncordoned")


def drain(names: _Names) -> Action | None:
    """Move the pods off: the flags a GPU node needs (its DaemonSet pods stay, emptyDir data of
    evicted pods is lost), bounded so a node that never lets go does not hold the shell."""
    if not names.node:
        return None
    return Action("mitigate", f"move the workload off {names.node}",
                  f"kubectl drain {_q(names.node)} --ignore-daemonsets "
                  f"--delete-emptydir-data --timeout=10m",
                  "every pod on the node restarts elsewhere (PodDisruptionBudgets are honoured, "
                  "so it may wait); emptyDir data of the evicted pods is lost; fails on bare "
                  "pods (no controller) unless --force is added, which deletes them")


def _plugin_restart(names: _Names, findings: Sequence[Finding]) -> Action | None:
    if not names.node:
        return None
    risk = "low: running GPU pods keep their GPUs; it may hang again until the cause is fixed"
    pod = plugin_pod_for(names, findings)
    if pod:
        return Action("mitigate", "restart the device plugin; its DaemonSet recreates it",
                      f"kubectl delete pod -n {_q(pod['namespace'])} {_q(pod['name'])}", risk)
    return Action(
        "mitigate", "restart the device plugin: find its pod here and delete it (no pod "
                    "matched a known install's labels; on Bottlerocket and EKS Auto Mode it is "
                    "a host service)",
        f"kubectl get pods -A -o wide --field-selector spec.nodeName={_q(names.node)}", risk)


def _ssh_local(names: _Names) -> Action | None:
    if not names.node:
        return None
    return Action("verify", "confirm on the node itself, where no pod can start",
                  f"ssh {_q(names.node)} sudo kubectl-gpu_doctor local",
                  "none (read-only; a 5 s eBPF trace)")


# the fix of a root cause in our words (no command where it depends on the workload or node)
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
    "gpu.xid": "act on the Xid's resolution (the finding names NVIDIA's bucket per code): "
               "restart the application, reset the GPU, or drain and replace it",
    "gpu.health": "drain the node and reset or replace the GPU NVML reports unhealthy",
    "deviceplugin.unhealthy_stale": "restart the device plugin so it re-advertises the GPUs "
                                    "NVML reports healthy",
    "fabric.not_ready": "start nv-fabricmanager on the node (systemctl start "
                        "nvidia-fabricmanager) at the driver's exact version",
    "persistence.off": "enable persistence mode (nvidia-persistenced) on the node",
    "hami.handshake_stale": "restart HAMi's device plugin on the node so it renews its "
                            "handshake",
    "hami.lock_stale": "remove the stale hami.io/mutex.lock annotation from the node once its "
                       "owner is gone",
    "pod.gpu_start_failed": "fix the node fault the runtime's message names (the finding "
                            "says which, and the node check that proves it), then delete the "
                            "pod so its controller recreates it",
    "node.gpu_black_hole": "find why the node fails GPU pods (a lost GPU, the device plugin, "
                           "the runtime): `kubectl gpu-doctor node` runs the node-side checks; "
                           "then delete the pods it rejected so their controllers recreate them",
}
_RESET = ("reset the GPU on the node once nothing uses it (`nvidia-smi -r -i <bus id>`), or "
          "reboot the node; replace the GPU if it fails again")


def _known_fix(findings: Sequence[Finding], likely: bool) -> Action | None:
    issue = _known_issue(_driver(findings))
    if issue is None:
        return None
    until = issue.workaround.split("; until then ", 1)[-1]
    until = until.removesuffix(" and restart the device plugin and kubelet")
    return Action("fix", f"upgrade the NVIDIA driver to {' / '.join(issue.fixed_in)} or later"
                         f"{' (the likely cause)' if likely else ''}; until then {until}", None,
                  "drain first: its GPU pods restart")


def _foreign_gpu_down(f: Finding) -> bool:
    ev = _ev(f)
    text = " ".join(str(ev.get(k) or "") for k in ("type", "reason", "message"))
    return bool(ev.get("gpu_related")) and bool(_GPU_DOWN_WORDS.search(text)) and \
        ev.get("kind") == "condition"


def _actions(root: Finding, chain: Sequence[str], names: _Names,
             findings: Sequence[Finding], likely: str | None, cleared: str | None
             ) -> tuple[Action, ...]:
    ids = {f.id for f in findings}
    acts: list[Action | None] = []
    wedge = WEDGE & set(chain)
    if cleared and root.id == "pod.admission_error":
        race = _ev(root).get("admission_race") or {}
        if names.kind == "pod" and names.pod and names.namespace:
            acts.append(Action(
                "fix", "nothing to do for the workload; tidy up the Failed pod (a pod "
                       "rejected at admission is never retried)" if race.get("recreated")
                else "recreate the pod from its manifest (nothing recreates a bare pod), "
                     "then delete the Failed one",
                f"kubectl delete pod {_q(names.pod)} -n {_q(names.namespace)}",
                "none: it never ran" if race.get("recreated") else
                "the pod is gone until it is created again"))
    elif "node.gpu_black_hole" in chain and not wedge and root.id not in GPU_DOWN \
            and root.id != "driver.known_bad":
        # stop the bleeding first: the scheduler keeps sending it pods while it is schedulable
        acts.append(cordon(names))
        if root.id in FIXES:
            acts.append(Action("fix", FIXES[root.id], None,
                               "depends on the change; the finding's page says more"))
    elif root.id == "driver.known_bad" or wedge:
        acts += [cordon(names),
                 _plugin_restart(names, findings) if {"kubelet.blocked_in_device_plugin",
                                                      "deviceplugin.blocked_in_nvml",
                                                      "deviceplugin.rpc_timeout",
                                                      "kubelet.admission_stalled"} & set(chain)
                 else None,
                 _known_fix(findings, likely=bool(likely) or unconfirmed(root))]
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
    elif root.id in GPU_DOWN or (root.id == "node.foreign_condition"
                                 and _foreign_gpu_down(root)):
        acts += [cordon(names), drain(names),
                 Action("fix", _RESET, None, "the GPU's processes are killed by the reset; a "
                                             "reboot restarts every pod on the node")]
    elif root.id in ("node.not_ready", "memory.pressure", "memory.overcommit"):
        acts.append(cordon(names))
        if names.node:
            acts.append(Action("fix", "find why the kubelet stopped reporting: the node's "
                               "conditions and events here, `journalctl -u kubelet` on the node",
                               f"kubectl describe node {_q(names.node)}", "none (read-only)"))
    elif root.id == "node.foreign_condition":
        ev = _ev(root)
        source = ev.get("source") if isinstance(ev.get("source"), str) else "the monitor"
        acts.append(Action("fix", f"act on {source}'s verdict (this tool did not see the "
                                  f"fault itself); its condition clears when that monitor sees "
                                  f"the node healthy", None,
                           "depends on the fault; the monitor's documentation says what it "
                           "means"))
    elif root.id in FIXES:
        acts.append(Action("fix", FIXES[root.id], None,
                           "depends on the change; the finding's page says more"))
    if "probe.pod_not_started" in ids and not cleared:
        acts.append(_ssh_local(names))
    cmd = _gd(names)
    if cmd and not (cleared and root.id == "pod.admission_error"):
        acts.append(Action("verify", "after the fix", cmd, "none (read-only)"))
    if "probe.pod_not_started" in ids and not cleared:
        acts.append(Action(
            "prevent", "install the standing agent before the next wedge: exec reaches a "
                       "node that admits no pod",
            "kubectl gpu-doctor agent install",
            "a privileged DaemonSet pod on every GPU node"))
    order = {s: i for i, s in enumerate(STEPS)}
    return tuple(sorted((a for a in acts if a is not None), key=lambda a: order[a.step]))


def _page(root_id: str) -> str | None:
    """`explain ID` only for ids of our catalog: an id a node made up has no page, and a
    suggested command must never carry text from outside the tool."""
    return f"kubectl gpu-doctor explain {root_id}" if root_id in CATALOG else None


# -- the decision ------------------------------------------------------------------------------

# info findings that say why checks could not look, in the all-clear headline's words
BLIND = (("node.not_kubernetes", "not a Kubernetes node"),
         ("nvml.unavailable", "no NVIDIA driver seen"),
         ("kubelet.goroutines_unavailable", "no kubelet goroutine dump"))


def decide(findings: Sequence[Finding], target: Mapping[str, Any], *,
           complete: bool = True, context: Mapping[str, Any] | None = None,
           could_not_look: int = 0) -> Verdict:
    """The verdict for `target` from its findings. Never None: an all-clear verdict when no
    finding is a warning or critical -- "No problem found" only when every check looked
    (`could_not_look`: how many could not), else "Nothing found in what could be checked"
    and why. `context`: what the command resolved from the API for the actions
    (`plugin_pods`: the node's device plugin pods, analysis/plugin_pods.candidates)."""
    findings = [f for f in list(findings)[:MAX_FINDINGS] if isinstance(f, Finding)]
    names = _names(target, context)
    problems = [f for f in findings if f.severity.rank >= Severity.WARNING.rank]
    if not problems:
        gone = next((f for f in findings if _cleared(f)), None)
        if gone is not None:  # seen, and cleared since: said at the severity it leaves
            why = _cleared(gone)
            return Verdict(_headline(gone, (gone.id,), names, {}, findings, None, why),
                           gone.id, names.label, Severity.INFO.value,
                           {"pods": 0, "gpu_pods": 0, "non_gpu_pods": 0},
                           _actions(gone, (gone.id,), names, findings, None, why),
                           (gone.id,), True, _page(gone.id))
        if complete and not could_not_look:
            return Verdict(f"No problem found on {names.label}", None, names.label,
                           Severity.OK.value, {"pods": 0, "gpu_pods": 0, "non_gpu_pods": 0})
        why = [words for fid, words in BLIND if fid in {f.id for f in findings}]
        n = could_not_look
        head = (f"Nothing found in what could be checked on {names.label}"
                + ("" if complete else ": the run is incomplete")
                + (f"; {n} check{'s' if n != 1 else ''} could not look" if n else "")
                + (f" ({', '.join(why)})" if why else ""))
        return Verdict(head, None, names.label, Severity.INFO.value,
                       {"pods": 0, "gpu_pods": 0, "non_gpu_pods": 0})
    present = {f.id for f in findings}
    edges = _edges(present, findings)
    bad = {f.id for f in problems}
    # an info finding takes part only as the cause of a problem (overcommit -> pressure)
    linked = {i for i in present if i in bad or edges[i] & bad}
    explained = {b for a in linked for b in edges[a] if a != b}
    best = {f.id: f for f in sorted(findings, key=_rank)}  # the worst finding of each id
    # a cause that could not be confirmed is the likely cause, not the root: the root is what
    # it would explain (when anything else is there)
    maybe = {i for i in linked if unconfirmed(best[i])}
    sure = linked - maybe
    roots = [i for i in sure if i not in _explained_by(sure, edges)] or \
        [i for i in linked if i not in explained] or sorted(bad)

    def weight(i: str) -> tuple:
        reach = _reach(i, {k: v & linked for k, v in edges.items() if k in linked})
        return (len(reach), best[i].severity.rank, i not in ("probe.pod_not_started",), i)

    root_id = max(roots, key=weight)
    chain = _reach(root_id, {k: v & linked for k, v in edges.items() if k in linked})
    root = best[root_id]
    likely = None
    if root_id not in maybe and any(root_id in edges[m] for m in maybe):
        likely = _known_bad_words(findings)
    impact = _impact(findings, names, set(chain))
    severity = max((best[i].severity for i in chain), key=lambda s: s.rank).value
    cleared = _cleared(root)
    return Verdict(_headline(root, chain, names, impact, findings, likely, cleared), root_id,
                   names.label, severity, impact,
                   _actions(root, chain, names, findings, likely, cleared), tuple(chain),
                   bool(cleared), _page(root_id))


def _explained_by(ids: set[str], edges: Mapping[str, set[str]]) -> set[str]:
    return {b for a in ids for b in edges.get(a, ()) if a != b}

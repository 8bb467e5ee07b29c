"""The verdict's objects (Verdict, Action) and the target's names, validated before any command.

Why apart: the root choice, the headline and the actions all speak about the same target and
build the same objects; keeping them here lets each of those modules be read alone. Only names
that pass Kubernetes' own validation (params.name_problem) ever reach a command; everything
else a finding carries stays evidence.
"""
from __future__ import annotations

import dataclasses
import shlex
from typing import Any, Mapping

from node_probe.protocol import Finding

from ...params import name_problem

# the steps of a verdict, in order (`step` in JSON): mitigate (stop the bleeding), look (read
# what the fix needs, read-only), fix (the cause), verify (look again after the fix), prevent
# (the next time). `stage` keeps the names JSON readers had before (stop / fix / confirm) so
# bots keyed on them read the same actions; a look is read-only, as a confirm step was.
STEPS = ("mitigate", "look", "fix", "verify", "prevent")
LEGACY_STAGE = {"mitigate": "stop", "look": "confirm", "fix": "fix", "verify": "confirm",
                "prevent": "confirm"}
_FROM_LEGACY = {"stop": "mitigate", "confirm": "verify"}
STAGES = STEPS  # the order actions come in


@dataclasses.dataclass(frozen=True)
class Action:
    """One step: `step` mitigate, look, fix, verify or prevent. `command` is None for a step no
    single command does (a driver upgrade). The legacy stage names (stop, confirm) are accepted
    and mapped."""

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


@dataclasses.dataclass(frozen=True)
class Names:
    """The target, by validated names only. `host_only`: `local` on a host that is not a
    Kubernetes node (no kubectl command applies to it). `pod_running`: the target pod is
    Running with every container ready (context from `pod Y`)."""
    kind: str
    node: str | None
    pod: str | None
    namespace: str | None
    plugin_pods: tuple[dict, ...] = ()
    host_only: bool = False
    pod_running: bool = False

    @property
    def label(self) -> str:
        if self.kind == "pod" and self.pod:
            return f"pod {self.namespace}/{self.pod}" if self.namespace else f"pod {self.pod}"
        if self.node:
            return f"node {self.node}"
        return "this host" if self.kind == "local" else "the target"

    @property
    def who(self) -> str:
        """The pod as `ns/name` (the pod target only)."""
        return f"{self.namespace}/{self.pod}" if self.namespace else str(self.pod)

    @property
    def kube_node(self) -> str | None:
        """The node name kubectl commands may act on: none for a host outside Kubernetes."""
        return None if self.host_only else self.node


def valid(kind: str, value: Any) -> str | None:
    return value if isinstance(value, str) and name_problem(kind, value) is None else None


def _plugin_pods(context: Mapping[str, Any] | None) -> tuple[dict, ...]:
    out = []
    for p in list((context or {}).get("plugin_pods") or ())[:20]:
        if not isinstance(p, Mapping):
            continue
        ns, name = valid("namespace", p.get("namespace")), valid("pod", p.get("name"))
        if ns and name:
            uid = p.get("uid") if isinstance(p.get("uid"), str) else ""
            how = p.get("how") if isinstance(p.get("how"), str) else ""
            out.append({"namespace": ns, "name": name, "uid": uid[:64], "how": how[:80]})
    return tuple(out)


def names_of(target: Mapping[str, Any], context: Mapping[str, Any] | None = None,
             findings: tuple[Finding, ...] | list[Finding] = ()) -> Names:
    kind = str(target.get("kind") or "")
    node = valid("node", target.get("node"))
    pod = namespace = None
    if kind == "pod":
        ns, _, name = str(target.get("name") or "").rpartition("/")
        pod, namespace = valid("pod", name), valid("namespace", ns)
        if pod is None:
            namespace = None
    elif kind == "node" and node is None:
        node = valid("node", target.get("name"))
    host_only = kind == "local" and any(f.id == "node.not_kubernetes" for f in findings)
    running = (context or {}).get("pod_running") is True
    return Names(kind, node, pod, namespace, _plugin_pods(context), host_only, running)


def q(name: str) -> str:
    return shlex.quote(name)


def ev(f: Finding) -> Mapping[str, Any]:
    return f.evidence if isinstance(f.evidence, Mapping) else {}

"""The verdict of one target: the root cause, what it costs, and what to do, in that order.

Why: a report lists findings one by one, but an on-call engineer needs the answer first: which
finding is the cause and which are its symptoms, how many pods it holds up, and the commands
to run now. `decide()` links the findings, picks the most specific cause nothing else explains,
words the headline from that finding's own evidence and takes the actions from its own fix.
One job per module:

- roots.py: the ranking, as data. CHAINS (known causal chains), OUTRANKS (the specific finding
  over the generic one: the scheduler that rejected a pod over "its GPUs fit", a lost GPU over
  its Xid), INSTANCE_ORDER (which of several findings of one id speaks). A new finding family
  joins with a row: `("slow.gpu_throttled", ("pod.running_slow",))` in OUTRANKS makes it the
  root over the generic finding whenever both are present.
- headline.py: the root finding's own sentence, the subject named once, the impact; likely and
  cleared causes said so; the pod first when `pod Y` is Running and only its node is sick.
- actions.py: PLANS, an ordered rule list from the root to its steps (mitigate, look, fix,
  verify, prevent) as commands on the real objects.
- model.py: Verdict, Action, and the target's validated names.

Pure: findings, the target and the names the command resolved (`context`: `plugin_pods`, the
node's device plugin pods; `pod_running`, the target pod Running and ready) in, a frozen
Verdict out; no I/O. A target with no warning or critical finding gets an all-clear Verdict
(severity "ok", no root cause, no actions) rather than None -- or, when a cause was seen and
has cleared, that cause with severity "info" -- so the report, bots reading `verdict` in the
JSON and the fleet view always find one object per target; `decide()` never returns None.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from node_probe.protocol import Finding, Severity
from node_probe.protocol.catalog import CATALOG

from .actions import FIXES, GPU_DOWN, WEDGE, actions, cordon, drain  # noqa: F401
from .headline import (EFFECTS, MAX_HEADLINE, MAX_POD_ENTRIES, cleared,  # noqa: F401
                       headline, impact, known_bad_words, plugin_pod_for, pod_first)
from .model import LEGACY_STAGE, STAGES, STEPS, Action, Names, Verdict, names_of  # noqa: F401
from .roots import CHAINS, INSTANCE_ORDER, OUTRANKS, choose, unconfirmed  # noqa: F401
from ..slow import lead as slow_lead

MAX_FINDINGS = 2000      # findings looked at (a report is bounded; a replayed bundle may not be)

# info findings that say why checks could not look, in the all-clear headline's words
BLIND = (("node.not_kubernetes", "not a Kubernetes node"),
         ("nvml.unavailable", "no NVIDIA driver seen"),
         ("kubelet.goroutines_unavailable", "no kubelet goroutine dump"))

_NONE = {"pods": 0, "gpu_pods": 0, "non_gpu_pods": 0}


def page(root_id: str) -> str | None:
    """`explain ID` only for ids of our catalog: an id a node made up has no page, and a
    suggested command must never carry text from outside the tool."""
    return f"kubectl gpu-doctor explain {root_id}" if root_id in CATALOG else None


def decide(findings: Sequence[Finding], target: Mapping[str, Any], *,
           complete: bool = True, context: Mapping[str, Any] | None = None,
           could_not_look: int = 0) -> Verdict:
    """The verdict for `target` from its findings. Never None: an all-clear verdict when no
    finding is a warning or critical -- "No problem found" only when every check looked
    (`could_not_look`: how many could not), else "Nothing found in what could be checked"
    and why. `context`: what the command resolved from the API for the actions
    (`plugin_pods`: the node's device plugin pods, analysis/plugin_pods.candidates;
    `pod_running`: the target pod is Running and ready)."""
    findings = [f for f in list(findings)[:MAX_FINDINGS] if isinstance(f, Finding)]
    names = names_of(target, context, findings)
    ctx = context or {}
    lead = slow_lead.pod_lead(findings, target, ctx.get("pod_phase") or (
        "Running" if ctx.get("pod_running") else None),
        looked=complete and bool(ctx.get("slow_looked")))
    if lead is not None:   # a Running pod: is it slow, and why (analysis/slow)
        return Verdict(lead.headline, lead.root_cause, names.label, lead.severity,
                       {"pods": 1, "gpu_pods": 1, "non_gpu_pods": 0},
                       tuple(Action(*a) for a in lead.actions), lead.chain, False,
                       page(lead.root_cause) if lead.root_cause else None)
    problems = [f for f in findings if f.severity.rank >= Severity.WARNING.rank]
    if not problems:
        gone = next((f for f in findings if cleared(f)), None)
        if gone is not None:  # seen, and cleared since: said at the severity it leaves
            why = cleared(gone)
            return Verdict(headline(gone, (gone.id,), names, {}, findings, None, why),
                           gone.id, names.label, Severity.INFO.value, dict(_NONE),
                           actions(gone, (gone.id,), names, findings, None, why),
                           (gone.id,), True, page(gone.id))
        if complete and not could_not_look:
            return Verdict(f"No problem found on {names.label}", None, names.label,
                           Severity.OK.value, dict(_NONE))
        why = [words for fid, words in BLIND if fid in {f.id for f in findings}]
        n = could_not_look
        head = (f"Nothing found in what could be checked on {names.label}"
                + ("" if complete else ": the run is incomplete")
                + (f"; {n} check{'s' if n != 1 else ''} could not look" if n else "")
                + (f" ({', '.join(why)})" if why else ""))
        return Verdict(head, None, names.label, Severity.INFO.value, dict(_NONE))
    root_id, chain, best, maybe, graph = choose(findings)
    root = best[root_id]
    likely = None
    if root_id not in maybe and any(root_id in graph[m] for m in maybe):
        likely = known_bad_words(findings)
    imp = impact(findings, names, set(chain))
    severity = max((best[i].severity for i in chain), key=lambda s: s.rank).value
    gone = cleared(root)
    head = pod_first(names, findings, headline(root, chain, names, imp, findings, likely, gone))
    return Verdict(head, root_id, names.label, severity, imp,
                   actions(root, chain, names, findings, likely, gone), tuple(chain),
                   bool(gone), page(root_id))

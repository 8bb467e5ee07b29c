"""The scheduler's GPU-independent rules that keep a pod off a node: TaintToleration, NodeAffinity
and nodeSelector, NodeUnschedulable; and what keeps a node from having room whatever the pod
tolerates (NotReady, cordoned, a kubelet that admits nothing).

Why a module of its own: the fit (fit.py) asks it of every node that has the GPUs, and the
`job` and black-hole views ask it of one node (placement_failures); each rule comes with what
would lift it, worded for the node it names.

Pure functions over raw API dicts; no I/O.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence


NOSCHED_EFFECTS = ("NoSchedule", "NoExecute")
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"


# -- placement: the scheduler's TaintToleration, NodeAffinity, NodeUnschedulable --------------

def _tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    for t in tolerations:
        eff = t.get("effect") or ""
        if eff and eff != taint.get("effect"):
            continue
        key = t.get("key") or ""
        op = t.get("operator") or "Equal"
        if key and key != taint.get("key"):
            continue
        if not key and op != "Exists":
            continue
        if op == "Exists" or (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _taint_str(t: Mapping[str, Any]) -> str:
    v = t.get("value")
    return f"{t.get('key')}{'=' + str(v) if v else ''}:{t.get('effect')}"


def _shown(vals: list, most: int = 5) -> str:
    """A selector's value list as evidence: the first few (a pod may list thousands)."""
    more = f", ... {len(vals) - most} more" if len(vals) > most else ""
    return "[" + ", ".join(repr(str(v)[:80]) for v in vals[:most]) + more + "]"


def _expr_matches(labels: Mapping[str, str], e: Mapping[str, Any]) -> tuple[bool, str]:
    key, op, vals = str(e.get("key") or ""), e.get("operator"), list(e.get("values") or ())
    have = labels.get(key)
    has = key in labels
    shown = f"node has {key}={have}" if has else f"node has no label {key}"
    if op == "In":
        ok = has and have in vals
    elif op == "NotIn":
        ok = not has or have not in vals
    elif op == "Exists":
        ok = has
    elif op == "DoesNotExist":
        ok = not has
    elif op in ("Gt", "Lt"):
        try:
            a, b = int(str(have)), int(str(vals[0]))
            ok = has and (a > b if op == "Gt" else a < b)
        except (ValueError, IndexError):
            ok = False
    else:
        ok = False
    want = f"{key} {op}" + (f" {_shown(vals)}" if op in ("In", "NotIn", "Gt", "Lt") else "")
    return ok, f"{want} ({shown})"


def _field_matches(node_name: str, e: Mapping[str, Any]) -> tuple[bool, str]:
    key, op, vals = e.get("key"), e.get("operator"), list(e.get("values") or ())
    if key != "metadata.name":
        return False, f"field {key} is not supported"
    ok = (node_name in vals) if op == "In" else (node_name not in vals) if op == "NotIn" \
        else False
    return ok, f"metadata.name {op} {_shown(vals)}"


def _term_failure(node_name: str, labels: Mapping[str, str],
                  term: Mapping[str, Any]) -> str | None:
    """None if the nodeSelectorTerm matches the node, else why not."""
    exprs, fields = term.get("matchExpressions") or (), term.get("matchFields") or ()
    if not exprs and not fields:
        return "empty term (matches no node)"
    for e in exprs:
        ok, why = _expr_matches(labels, e)
        if not ok:
            return why
    for e in fields:
        ok, why = _field_matches(node_name, e)
        if not ok:
            return why
    return None


def placement_failures(pod: Mapping[str, Any], node: Mapping[str, Any]) -> list[str]:
    """Every GPU-independent scheduler rule that keeps this pod off this node (empty: none)."""
    return [rule for rule, _ in placement_rules(pod, node)]


def _toleration_for(t: Mapping[str, Any]) -> str:
    if t.get("value"):
        return (f"{{key: {t.get('key')}, operator: Equal, value: {t.get('value')}, "
                f"effect: {t.get('effect')}}}")
    return f"{{key: {t.get('key')}, operator: Exists, effect: {t.get('effect')}}}"


def placement_rules(pod: Mapping[str, Any], node: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(rule that excludes the node, what would lift it) pairs."""
    spec, nspec = pod.get("spec") or {}, node.get("spec") or {}
    md = node.get("metadata") or {}
    name, labels = str(md.get("name") or ""), md.get("labels") or {}
    tol = list(spec.get("tolerations") or ())
    out: list[tuple[str, str]] = []
    uncordon = f"`kubectl uncordon {name}` if the cordon is not deliberate (drain, repair)"
    repair = f"repair the node (`kubectl gpu-doctor node {name}`)"
    taints = [t for t in nspec.get("taints") or () if t.get("effect") in NOSCHED_EFFECTS]
    keys = {t.get("key") for t in taints}
    if nspec.get("unschedulable") and UNSCHEDULABLE_TAINT not in keys and not _tolerates(
            tol, {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}):
        out.append(("cordoned (spec.unschedulable)", uncordon))
    ready = next((c.get("status") for c in (node.get("status") or {}).get("conditions") or ()
                  if c.get("type") == "Ready"), None)
    if ready not in (None, "True") and not keys & {NOT_READY_TAINT, UNREACHABLE_TAINT}:
        # the node lifecycle controller taints such nodes within seconds; until it does
        # the node is NotReady all the same
        taint_key = NOT_READY_TAINT if ready == "False" else UNREACHABLE_TAINT
        if not _tolerates(tol, {"key": taint_key, "effect": "NoSchedule"}):
            out.append((f"NotReady (Ready={ready})", repair))
    for t in taints:
        if not _tolerates(tol, t):
            key = t.get("key")
            what = {UNSCHEDULABLE_TAINT: " (cordoned)", NOT_READY_TAINT: " (NotReady)",
                    UNREACHABLE_TAINT: " (NotReady: unreachable)"}.get(key, "")
            hint = uncordon if key == UNSCHEDULABLE_TAINT else repair if key in (
                NOT_READY_TAINT, UNREACHABLE_TAINT) else (
                f"add the toleration `{_toleration_for(t)}` to the pod template (if the "
                f"taint's owner agrees: it reserves the node)")
            out.append((f"taint {_taint_str(t)} not tolerated{what}", hint))
    for k, v in (spec.get("nodeSelector") or {}).items():
        if labels.get(k) != v:
            have = f"node has {k}={labels[k]}" if k in labels else f"node has no label {k}"
            out.append((f"nodeSelector {k}={v} ({have})",
                        f"nodeSelector {k}: {labels[k]} to target it" if k in labels else
                        f"drop nodeSelector {k} or label the node (`kubectl label node {name} "
                        f"{k}={v}`)"))
    req = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
           .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if req is not None:
        terms = list(req.get("nodeSelectorTerms") or ())
        fails = [_term_failure(name, labels, t) for t in terms]
        hint = "change the pod's required nodeAffinity to match the node's labels"
        if not terms:
            out.append(("required nodeAffinity has no nodeSelectorTerms (matches no node)",
                        hint))
        elif all(f is not None for f in fails):
            if len(fails) == 1:
                out.append((f"required nodeAffinity {fails[0]}", hint))
            else:
                out.append((f"required nodeAffinity: none of {len(fails)} terms match ("
                            + "; ".join(f"term {i + 1}: {f}" for i, f in enumerate(fails[:3]))
                            + ")", hint))
    return out


def no_room(node: Mapping[str, Any], placed: Sequence[tuple[str, str]],
            admits_nothing: Mapping[str, str]) -> list[tuple[str, str]]:
    """What keeps a node from having room whatever the pod tolerates: a NotReady kubelet runs
    no new pod, a cordoned node is being emptied, a kubelet that admits nothing leaves every
    new pod Pending. Only the reasons `placed` (the scheduler's rules) did not already name."""
    md = node.get("metadata") or {}
    name = str(md.get("name") or "")
    said = " ".join(r for r, _ in placed)
    repair = f"repair the node (`kubectl gpu-doctor node {name}`)"
    out: list[tuple[str, str]] = []
    ready = next((c.get("status") for c in (node.get("status") or {}).get("conditions") or ()
                  if c.get("type") == "Ready"), None)
    if ready not in (None, "True") and "NotReady" not in said:
        out.append((f"NotReady (Ready={ready}): its kubelet runs no new pod", repair))
    if (node.get("spec") or {}).get("unschedulable") and "cordoned" not in said:
        out.append(("cordoned (spec.unschedulable)",
                    f"`kubectl uncordon {name}` if the cordon is not deliberate (drain, repair)"))
    if name in admits_nothing and ready in (None, "True"):
        out.append((f"its kubelet admits no pod ({admits_nothing[name]})", repair))
    return out

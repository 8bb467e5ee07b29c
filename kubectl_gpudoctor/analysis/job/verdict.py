"""The answer for a job: the node (or rank) that differs, with the evidence and the action
that fits, or "no node differs" -- in the shape of `node`'s verdict (analysis/verdict.py).

Why here and not in analysis/verdict.py: that verdict follows one target's causal chain; a
job's is a comparison (which of 64 nodes is not like the others), and it reuses the node's
own verdict for the headline of the node it names.
"""
from __future__ import annotations

import shlex
from typing import Any, Mapping, Sequence

from node_probe.protocol import Finding, Severity
from node_probe.protocol.catalog import CATALOG

from ...params import name_problem
from .. import verdict as node_verdict
from ..verdict import Action, Verdict
from .nodes import Comparison

FIT_IDS = ("pod.gpu_devices_missing", "pod.gpu_never_fits", "pod.gpu_held_by_others",
           "pod.gpu_placement_excluded", "pod.gpu_quota_exhausted")
RANK_IDS = ("job.rank_crashloop", "pod.admission_error", *FIT_IDS, "pod.pending_explained",
            "job.rank_restarts", "job.rank_replaced", "job.rank_late_start")
NO_IMPACT = {"pods": 0, "gpu_pods": 0, "non_gpu_pods": 0}


def _q(s: str) -> str:
    return shlex.quote(s)


def _ok(kind: str, value) -> bool:
    """A name the API server would accept: only such names go into a suggested command
    (names come from the cluster: a pod's nodeName is whatever was written there)."""
    return isinstance(value, str) and name_problem(kind, value) is None


def _cmd(ok: bool, text: str) -> str | None:
    return text if ok else None


def _page(fid: str | None) -> str | None:
    """The `explain` command of a finding id (as the node verdict's `page`)."""
    return f"kubectl gpu-doctor explain {fid}" if fid in CATALOG else None


def _again(job: Mapping[str, Any]) -> str:
    if job.get("selector"):
        return f"kubectl gpu-doctor job -l {_q(job['selector'])} -n {_q(job['namespace'])}"
    kind = f" --kind {_q(job['kind'])}" if job.get("kind_flag") else ""
    return f"kubectl gpu-doctor job {_q(job['name'])} -n {_q(job['namespace'])}{kind}"


def _node_verdict(node: str, findings: Sequence[Finding]) -> Verdict:
    """The node's own verdict, from what its checks found (an `ok` finding says a check
    looked and found nothing: never a cause, so it is left out)."""
    return node_verdict.decide([f for f in findings if f.severity is not Severity.OK],
                               {"kind": "node", "name": node, "node": node})


def _odd_node(job: Mapping[str, Any], c: Comparison, node_findings: Mapping[str, Sequence],
              job_fs: Sequence[Finding]) -> Verdict:
    name = c.odd[0]
    fs = list(node_findings.get(name, ())) + [f for f in job_fs if f.subject == f"node/{name}"]
    nv = _node_verdict(name, fs)
    v = next(x for x in c.views if x.name == name)
    others = len(c.views) - 1
    more = f" (and {len(c.odd) - 1} more node{'s' if len(c.odd) > 2 else ''})" \
        if len(c.odd) > 1 else ""
    if name in c.not_waiting and (not nv.root_cause or nv.root_cause == "job.node_differs"):
        why = ("its GPUs do not wait in the collective where the others' do "
               "(gpu.collective_spin): the job likely waits for it")
    elif nv.root_cause and nv.root_cause not in ("job.node_differs",):
        why = nv.headline
        for prefix in (f"Node {name} ", f"node {name} "):
            if why.startswith(prefix):
                why = "it " + why[len(prefix):]
    elif c.gpus_usual is not None and v.gpus is not None and v.gpus < c.gpus_usual:
        why = f"{v.gpus} allocatable GPUs where the other nodes have {c.gpus_usual}"
    else:
        why = "its findings differ from its siblings'"
    head = (f"Node {name} differs from the job's other {others} node"
            f"{'s' if others != 1 else ''}{more}: {why}")
    ns, sel = job["namespace"], job.get("pod_selector")
    good = _ok("node", name)
    gone = "job.node_missing" in v.problems  # no node to cordon or to look at
    acts = [] if gone else [
        Action("mitigate", f"keep the job's pods off {name}",
               _cmd(good, f"kubectl cordon {_q(name)}"),
               "none for running pods; its free GPUs stay idle until uncordoned")]
    if sel:
        acts.append(Action(
            "fix", f"restart the job's ranks on {name} from the job's checkpoint (the "
                   f"controller re-creates them on another node)",
            _cmd(good, f"kubectl delete pod -n {_q(ns)} -l {_q(sel)} --field-selector "
                       f"spec.nodeName={_q(name)}"),
            "those ranks lose their in-memory state; the job resumes from its last "
            "checkpoint (a Job's backoffLimit counts the deletions as failures)"))
    acts += [a for a in nv.actions if a.step == "fix" and a.command][:1]
    if not gone:
        acts.append(Action("verify", f"the evidence on {name}",
                           _cmd(good, f"kubectl gpu-doctor node {_q(name)}"),
                           "none (read-only)"))
    acts.append(Action("verify", "compare the job's nodes again", _again(job),
                       "none (read-only)"))
    root = nv.root_cause or ("job.node_fewer_gpus" if v.gpus is not None and
                             c.gpus_usual is not None and v.gpus < c.gpus_usual
                             else "job.node_differs")
    sev = v.worst if v.worst in ("critical", "warning") else "warning"
    chain = tuple(dict.fromkeys(("job.node_differs", root, *nv.chain)))
    return Verdict(head[:node_verdict.MAX_HEADLINE], root, f"node {name}", sev,
                   {"pods": len(v.pods), "gpu_pods": len(v.pods), "non_gpu_pods": 0},
                   tuple(acts), chain, False, _page(root))


def _odd_rank(job: Mapping[str, Any], f: Finding, total: int) -> Verdict:
    ev = f.evidence
    pod = str(ev.get("pod") or f.subject.removeprefix("pod/"))
    ns, _, name = pod.partition("/")
    if f.id in ("pod.pending_explained", "pod.admission_error", *FIT_IDS):
        pv = node_verdict.decide([f], {"kind": "pod", "name": pod,
                                       "node": ev.get("node")})
        head = f"Rank {pod} of the job is not running: {pv.headline}"
        return Verdict(head[:node_verdict.MAX_HEADLINE], pv.root_cause, f"pod {pod}",
                       pv.severity, pv.impact, pv.actions, pv.chain, False, pv.page)
    head = f"Rank {ev.get('rank')} differs from the job's other {total - 1}: {f.title}"
    good = _ok("namespace", ns) and _ok("pod", name)
    acts = [Action("verify", f"why {pod} exits",
                   _cmd(good, f"kubectl logs -n {_q(ns)} {_q(name)} --previous"),
                   "none (read-only)"),
            Action("fix", f"replace the pod {pod} (its controller re-creates it)",
                   _cmd(good, f"kubectl delete pod -n {_q(ns)} {_q(name)}"),
                   "the rank loses its in-memory state; the job resumes from its last "
                   "checkpoint")]
    if _ok("node", ev.get("node")):
        acts.append(Action("verify", "the node it ran on",
                           f"kubectl gpu-doctor node {_q(str(ev['node']))}", "none (read-only)"))
    acts.append(Action("verify", "compare the job's nodes again", _again(job),
                       "none (read-only)"))
    return Verdict(head[:node_verdict.MAX_HEADLINE], f.id, f"pod {pod}", f.severity.value,
                   {"pods": 1, "gpu_pods": 1, "non_gpu_pods": 0}, tuple(acts), (f.id,),
                   False, _page(f.id))


def decide(job: Mapping[str, Any], c: Comparison, node_findings: Mapping[str, Sequence],
           rank_fs: Sequence[Finding], job_fs: Sequence[Finding], *, pods: int,
           probed: bool, complete: bool = True) -> Verdict:
    """`job`: {kind, name, namespace, selector (of -l), pod_selector, kind_flag}; `c`: the
    node comparison; `rank_fs`: the ranks' findings; `job_fs`: the comparison's findings."""
    label = job.get("label") or job.get("name") or "the job"
    if not c.views and not pods:
        return Verdict(f"{label} has no pods", None, label, Severity.INFO.value, NO_IMPACT,
                       (Action("verify", "the job's own status and events",
                               _describe(job), "none (read-only)"),))
    if c.odd and not c.shared:
        return _odd_node(job, c, node_findings, job_fs)
    problems = [f for f in rank_fs if f.severity.rank >= Severity.WARNING.rank]
    for fid in RANK_IDS:
        hits = [f for f in problems if f.id == fid]
        # a rank that differs: one or a few, not most of them (that is the job)
        if hits and (len(hits) * 2 <= pods or pods <= 2):
            return _odd_rank(job, sorted(hits, key=lambda f: -f.severity.rank)[0], pods)
    if c.shared and c.baseline:
        any_node = next(v.name for v in c.views if v.problems == c.baseline)
        nv = _node_verdict(any_node, node_findings.get(any_node, ()))
        head = (f"{sum(1 for v in c.views if v.problems == c.baseline)} of {len(c.views)} "
                f"nodes show the same problem ({', '.join(c.baseline[:3])}): not one node, "
                f"the cause is shared; on {any_node}: {nv.headline}")
        return Verdict(head[:node_verdict.MAX_HEADLINE], nv.root_cause, label, nv.severity,
                       nv.impact, nv.actions, nv.chain, False, nv.page)
    if problems:  # most ranks fail alike
        f = problems[0]
        head = (f"No node differs, and {len([x for x in problems if x.id == f.id])} of {pods} "
                f"ranks show {f.id}: the cause is likely in the job")
        return Verdict(head[:node_verdict.MAX_HEADLINE], f.id, label, f.severity.value,
                       NO_IMPACT, _job_actions(job, probed), (f.id,), False,
                       _page(f.id))
    sev = Severity.OK.value if complete else Severity.INFO.value
    head = (f"No node differs among the {len(c.views)} node{'s' if len(c.views) != 1 else ''}"
            f" of {label}: the cause is likely in the job"
            + ("" if probed else " (API side only; --probe compares the nodes' GPUs too)")
            + ("" if complete else "; the run is incomplete"))
    return Verdict(head[:node_verdict.MAX_HEADLINE], None, label, sev, NO_IMPACT,
                   _job_actions(job, probed))


def _describe(job: Mapping[str, Any]) -> str:
    if job.get("selector"):
        return (f"kubectl get pods -n {_q(job['namespace'])} -l {_q(job['selector'])} "
                f"-o wide")
    return f"kubectl describe {_q(job.get('resource') or 'job')} {_q(job['name'])} " \
           f"-n {_q(job['namespace'])}"


def _job_actions(job: Mapping[str, Any], probed: bool) -> tuple[Action, ...]:
    acts = [Action("verify", "the job's own status, events and logs", _describe(job),
                   "none (read-only)")]
    if not probed:
        acts.append(Action("verify", "compare the node side too (GPU hang signature, Xid, "
                                     "links, throttling)", _again(job) + " --probe",
                           "reads the nodes through the agent or short-lived debug pods"))
    return tuple(acts)

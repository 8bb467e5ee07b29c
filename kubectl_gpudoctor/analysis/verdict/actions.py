"""The verdict's actions: the root finding's own fix, as commands on the real objects.

Why apart: what to do is decided from the root cause and nothing else, by an ordered list of
rules (PLANS, first match wins), each a few lines: the fault is the node's (a lost GPU, a
driver/library mismatch, a GPU start that fails for a node reason) -> cordon, drain, then its
fix; a stuck device plugin -> cordon and restart its own pod; a queue that holds a pod -> look
at that queue, then raise or free it. Every plan is steps a person recognises -- mitigate (stop
the bleeding), look (read what the fix needs; read-only), fix (the cause), verify (look again,
only after a mitigate or fix above it), prevent (the next time) -- each a command where one
command does it. A finding's page (`explain`) is a reference, never an action.

Commands are built from our templates filled only with names validated as Kubernetes validates
them, shell-quoted. Nothing a node, tenant, agent or bundle can write is put into a command or
trusted as a remedy: a fix is chosen by an evidence field's value from our own tables
(container_start.CAUSES, the Xid buckets), never taken from a finding's text. In `local` on a
host that is not a Kubernetes node no kubectl command is offered: the steps are for the host;
offline (files captured on another machine) the verify step is to capture again there.
Pure.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Callable, Mapping, Sequence

from node_probe.protocol import Finding

from ..failing import container_start
from ..slow import lead as slow_lead
from .headline import known_issue, driver, plugin_pod_for
from .model import CAPTURES, RUN_AGAIN, STEPS, Action, Names, ev, q, valid
from .roots import unconfirmed

WEDGE = frozenset({"kubelet.admission_stalled", "kubelet.blocked_in_device_plugin",
                   "deviceplugin.blocked_in_nvml", "deviceplugin.rpc_timeout",
                   "nvml.init_hang"})
# a GPU gone or failing hard: the node's GPU work has to move off it
GPU_DOWN = frozenset({"gpu.lost", "gpu.row_remap_failed"})
# other health monitors' words for a GPU that fell off the bus or failed hard (node.foreign_condition)
_GPU_DOWN_WORDS = re.compile(r"xid ?79|xid79|fell off the bus|gpu ?lost|"
                             r"acceleratedhardwareready|xidcriticalerror", re.I)
# Xid resolution buckets (node_probe.protocol.xid_catalog) whose fix takes the GPU or the node
# away from its pods: the node is cordoned and drained first
_DRAIN_BUCKETS = {"reset_gpu": "reset", "reboot": "reboot", "contact_support": "replace"}
_RESET = ("reset the GPU on the node once nothing uses it (`nvidia-smi -r -i <bus id>`), or "
          "reboot the node; replace the GPU if it fails again")
_REBOOT = "reboot the node (a GPU that fell off the bus comes back only with a reboot); " \
          "replace the GPU if it falls off again"
_REPLACE = "have the GPU or the board inspected and replaced (NVIDIA / the system vendor)"
_HOST_FIX = {"reset": _RESET.replace("on the node ", "").replace("reboot the node", "reboot "
                                                                              "this host"),
             "reboot": "reboot this host; replace the GPU if it falls off the bus again",
             "replace": _REPLACE}
_ANY = "depends on the change"
# what a root's fix risks, where it is known
FIX_RISK = {
    "pod.gpu_never_fits": "the pod is created again with the new request",
    "pod.gpu_devices_missing": "the plugin pods restart; running GPU pods keep their GPUs",
    "pod.gpu_held_by_others": "the pods you stop lose their unsaved work",
    "pod.gpu_placement_excluded": "the pod may land on nodes it was kept off on purpose",
    "pod.gpu_quota_exhausted": "the namespace may use more GPUs",
    "deviceplugin.missing": "none for running pods",
    "runtime.handler_missing": "restarting the runtime restarts no container; new ones wait",
    "deviceplugin.unhealthy_stale": "low: running GPU pods keep their GPUs",
    "persistence.off": "none for running pods",
    "hami.handshake_stale": "low: running GPU pods keep their GPUs",
    "hami.filter_failed": "a smaller share may not be enough for the workload",
    "fabric.not_ready": "none for running pods; multi-GPU jobs start once it runs",
}

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
    "hami.filter_failed": "lower the pod's nvidia.com/gpumem or gpucores, free the GPUs that "
                          "hold them, or repair the nodes whose GPUs are unhealthy or cordoned",
    "driver.version_mismatch": "reboot the node so the kernel module and the driver libraries "
                               "are one version again (or stop everything using the GPU and "
                               "reload the nvidia modules)",
    "nvml.unavailable": "install the NVIDIA driver's user-space libraries on the node (with "
                        "the GPU Operator its driver pod must be Running there), or point the "
                        "toolkit at the driver root",
    "probe.driver_not_seen": "bring the NVIDIA driver back on the node (`nvidia-smi` there; "
                             "with the GPU Operator its driver pod must be Running)",
    "deviceplugin.unhealthy": "drain the node and reset or replace the GPU the device plugin "
                              "reports Unhealthy (gpu.xid and gpu.health name it)",
    "mig.config_failed": "stop what holds the GPUs, fix the MIG config name, or drain and "
                         "reboot when a reset is not possible; then set nvidia.com/mig.config "
                         "again to re-apply",
    "dra.plugin_unresponsive": "restart the DRA driver's kubelet-plugin pod on the node; the "
                               "kubelet retries Prepare once it answers",
    "kernel.hung_task": "drain the node and reboot it when the hung task is in the NVIDIA "
                        "driver; remove the memory or disk pressure when it waits on reclaim "
                        "or IO",
    "node.gpu_black_hole": "find why the node fails GPU pods (a lost GPU, the device plugin, "
                           "the runtime): `kubectl gpu-doctor node` runs the node-side checks; "
                           "then delete the pods it rejected so their controllers recreate them",
}
FIXES.update(slow_lead.NODE_FIXES)   # issue 38: a slow GPU's fix when a node is the target
# roots whose fault is the node's and whose fix takes its GPU work away: cordon and drain first
NODE_DOWN = frozenset({"driver.version_mismatch", "gpu.health", "deviceplugin.unhealthy",
                       "kernel.hung_task"})


# -- building blocks ---------------------------------------------------------------------------

def gd(names: Names, *extra: str) -> str | None:
    """The command that looks at this target again."""
    if names.kind == "pod" and names.pod:
        ns = f" -n {q(names.namespace)}" if names.namespace else ""
        return f"kubectl gpu-doctor pod {q(names.pod)}{ns}" + "".join(" " + e for e in extra)
    if names.offline:
        return None    # another machine's files: capture_again() says how to look again
    if names.host_only:
        return "sudo kubectl-gpu_doctor local"
    if names.node:
        return f"kubectl gpu-doctor node {q(names.node)}" + "".join(" " + e for e in extra)
    return None


def capture_again(names: Names) -> Action:
    """Offline: the evidence came from another machine; after the fix, capture the same files
    there and read them again (the commands are our templates, by the flags `local` got)."""
    cmds = [CAPTURES[k] for k in names.offline]
    again = " ".join(RUN_AGAIN[k] for k in names.offline)
    return Action("verify", f"capture again after the fix, on the machine the files come "
                            f"from, then read them with `kubectl-gpu_doctor local {again}`",
                  " && ".join(cmds), "none (read-only)")


def cordon(names: Names) -> Action | None:
    """Stop new pods landing on the node (the fleet view's cordon action uses it too)."""
    if not names.kube_node:
        return None
    return Action("mitigate", f"keep new pods off {names.node}",
                  f"kubectl cordon {q(names.node)}",
                  "none for running pods; its free GPUs stay idle until uncordoned")


def drain(names: Names) -> Action | None:
    """Move the pods off: the flags a GPU node needs (its DaemonSet pods stay, emptyDir data of
    evicted pods is lost), bounded so a node that never lets go does not hold the shell. On a
    host outside Kubernetes: stop its GPU work (no command does that for every host)."""
    if names.host_only:
        return Action("mitigate", f"stop the GPU workloads on {names.here} (or move them to "
                                  "another)", None, "they stop; unsaved work is lost")
    if not names.node:
        return None
    return Action("mitigate", f"move the workload off {names.node}",
                  f"kubectl drain {q(names.node)} --ignore-daemonsets "
                  f"--delete-emptydir-data --timeout=10m",
                  "every pod on the node restarts elsewhere (PodDisruptionBudgets are honoured, "
                  "so it may wait); emptyDir data of the evicted pods is lost; fails on bare "
                  "pods (no controller) unless --force is added, which deletes them")


def _plugin_restart(names: Names, findings: Sequence[Finding]) -> Action | None:
    if not names.kube_node:
        return None
    risk = "low: running GPU pods keep their GPUs; it may hang again until the cause is fixed"
    pod = plugin_pod_for(names, findings)
    if pod:
        return Action("mitigate", "restart the device plugin; its DaemonSet recreates it",
                      f"kubectl delete pod -n {q(pod['namespace'])} {q(pod['name'])}", risk)
    return Action(
        "mitigate", "restart the device plugin: find its pod here and delete it (no pod "
                    "matched a known install's labels; on Bottlerocket and EKS Auto Mode it is "
                    "a host service)",
        f"kubectl get pods -A -o wide --field-selector spec.nodeName={q(names.node)}", risk)


def _ssh_local(names: Names) -> Action | None:
    if not names.kube_node:
        return None
    return Action("look", "look on the node itself, where no pod can start",
                  f"ssh {q(names.node)} sudo kubectl-gpu_doctor local",
                  "none (read-only; a 5 s eBPF trace)")


def _known_fix(findings: Sequence[Finding], likely: bool) -> Action | None:
    issue = known_issue(driver(findings))
    if issue is None:
        return None
    until = issue.workaround.split("; until then ", 1)[-1]
    until = until.removesuffix(" and restart the device plugin and kubelet")
    return Action("fix", f"upgrade the NVIDIA driver to {' / '.join(issue.fixed_in)} or later"
                         f"{' (the likely cause)' if likely else ''}; until then {until}", None,
                  "drain first: its GPU pods restart")


def _delete_pod(names: Names, text: str, risk: str) -> Action | None:
    if names.kind == "pod" and names.pod and names.namespace:
        return Action("fix", text, f"kubectl delete pod {q(names.pod)} -n {q(names.namespace)}",
                      risk)
    return None


def _down(names: Names, how: str) -> list[Action | None]:
    """Cordon, drain, then reset / reboot / replace."""
    fix = _HOST_FIX[how].replace("this host", names.here) if names.host_only else {"reset": _RESET, "reboot": _REBOOT,
                                                   "replace": _REPLACE}[how]
    return [cordon(names), drain(names),
            Action("fix", fix, None, "the GPU's processes are killed by the reset; a reboot "
                                     "restarts every pod on the node")]


# -- the plans, one per kind of root ------------------------------------------------------------

Plan = Callable[[Finding, Sequence[str], Names, Sequence[Finding], str | None], list]


def _admission_cleared(root, chain, names, findings, likely):
    race = ev(root).get("admission_race") or {}
    recreated = isinstance(race, Mapping) and race.get("recreated")
    return [_delete_pod(
        names, "nothing to do for the workload; tidy up the Failed pod (a pod rejected at "
               "admission is never retried)" if recreated else
        "recreate the pod from its manifest (nothing recreates a bare pod), then delete the "
        "Failed one",
        "none: it never ran" if recreated else "the pod is gone until it is created again")]


def _start_failed(root, chain, names, findings, likely):
    """A GPU container the runtime cannot start: the cause's own fix (container_start)."""
    e = ev(root)
    cause = next((c for c in container_start.CAUSES if c.key == e.get("cause")), None)
    if cause is None:
        return [Action("fix", FIXES["node.gpu_black_hole"], None, _ANY)]
    how = container_start.NODE_ACTION.get(cause.key, "")
    acts: list = []
    if how:
        acts.append(cordon(names))
    if how == "drain":
        acts.append(drain(names))
    acts.append(Action("fix", cause.fix, None,
                       "a reboot restarts every pod on the node" if how == "drain" else
                       "GPU containers that start during the change may fail again"))
    again = "then recreate the pod so it starts again on the fixed node"
    acts.append(_delete_pod(names, again, "the pod restarts (a bare pod is gone: recreate it "
                                          "from its manifest)")
                or Action("fix", "then delete the GPU pods that failed to start so their "
                                 "controllers recreate them", None, "the pods restart"))
    return acts


def _xid(root, chain, names, findings, likely):
    """An Xid or a driver error line: by NVIDIA's resolution bucket in the evidence."""
    bucket = ev(root).get("resolution_bucket")
    how = _DRAIN_BUCKETS.get(bucket) if isinstance(bucket, str) else None
    if how:
        return _down(names, how)
    if bucket == "restart_app":
        return [Action("fix", "restart the application that got the Xid (the GPU itself is "
                              "fine); if it repeats, look at the application and its inputs",
                       None, "the application restarts")]
    return [Action("fix", "act on the Xid's resolution (the finding names NVIDIA's bucket per "
                          "code)", None, _ANY)]


def _wedge(root, chain, names, findings, likely):
    acts = [cordon(names)]
    if WEDGE & set(chain):  # a plugin that is not stuck is not restarted
        acts.append(_plugin_restart(names, findings))
    known = _known_fix(findings, likely=bool(likely) or unconfirmed(root))
    if known:
        acts.append(known)
    elif root.id != "driver.known_bad":
        acts.append(Action(
            "fix", "find why NVML hangs on the node (a known-bad driver, the MIG layout, a "
                   "GPU fallen off the bus: gpu.xid, kernel.hung_task); until it is fixed, "
                   "restart the device plugin and the kubelet (`systemctl restart kubelet`) "
                   "to release the pods stuck in admission", None,
            "running pods keep running; pods in admission are evaluated again"))
    return acts


def _cgroup(root, chain, names, findings, likely):
    return [Action(
        "fix", "make the NVIDIA device plugin pass device specs (PASS_DEVICE_SPECS=true, "
        "Helm/GPU Operator: devicePlugin env), or use CDI; on systemd-driver nodes create the "
        "/dev/char links", None, "the plugin pods restart; running GPU pods keep their devices"),
        _delete_pod(names, "then recreate the pod so its device rules are built again",
                    "the pod restarts (a bare pod is gone: recreate it from its manifest)")
        or Action("fix", "then recreate the affected GPU pods (their device rules are only "
                         "rebuilt on a new container)", None, "the pods restart")]


def _not_ready(root, chain, names, findings, likely):
    acts: list = [cordon(names)]
    if names.kube_node:
        acts.append(Action("look", "why the kubelet stopped reporting: the node's conditions "
                                   "and events here, `journalctl -u kubelet` on the node",
                           f"kubectl describe node {q(names.node)}", "none (read-only)"))
    return acts


def _foreign(root, chain, names, findings, likely):
    if _foreign_gpu_down(root):
        return _down(names, "reset")
    e = ev(root)
    source = e.get("source") if isinstance(e.get("source"), str) else "the monitor"
    return [Action("fix", f"act on {source}'s verdict (this tool did not see the fault "
                          f"itself); its condition clears when that monitor sees the node "
                          f"healthy", None,
                   "depends on the fault; the monitor's documentation says what it means")]


def _kueue(root, chain, names, findings, likely):
    e = ev(root)
    cq = valid("node", e.get("cluster_queue"))  # a ClusterQueue name is a DNS subdomain
    wl = valid("pod", e.get("workload"))
    acts: list = []
    if names.namespace:
        acts.append(Action("look", "Kueue's view of the pod's Workload (why it waits, its "
                                   "position)",
                           f"kubectl describe workload -n {q(names.namespace)} {q(wl)}" if wl
                           else f"kubectl get workloads -n {q(names.namespace)}",
                           "none (read-only)"))
    if cq:
        acts.append(Action("look", f"ClusterQueue {cq}: its quota, what is reserved, by whom",
                           f"kubectl get clusterqueue {q(cq)} -o yaml", "none (read-only)"))
    holders = []
    quota = e.get("quota")
    for r in list(quota.values())[:8] if isinstance(quota, Mapping) else ():
        held = r.get("held_by") if isinstance(r, Mapping) else None
        for h in held[:10] if isinstance(held, (list, tuple)) else ():
            w = h.get("workload") if isinstance(h, Mapping) else None
            if isinstance(w, str) and len(w) <= 200 and w.replace(" ", "").replace(
                    "/", "").replace("-", "").replace(".", "").isalnum():
                holders.append(w)
    who = f" ({', '.join(holders[:3])})" if holders else ""
    acts.append(Action("fix", f"raise {'ClusterQueue ' + cq if cq else 'the ClusterQueue'}'s "
                              f"nominalQuota (or let it borrow in its cohort), or wait for or "
                              f"stop a workload that holds its quota{who}",
                       f"kubectl edit clusterqueue {q(cq)}" if cq else None,
                       "more quota lets more workloads run at once; stopping a holder ends "
                       "its work"))
    return acts


def _queue_plan(resource: str, what: str, fix: str) -> Plan:
    """A scheduler queue that holds the pod (Volcano's, KAI's): look at the queue the finding
    names (`queue`), then the fix in our words."""
    def plan(root, chain, names, findings, likely):
        queue = valid("node", ev(root).get("queue"))
        acts: list = []
        if queue:
            acts.append(Action("look", f"queue {queue}: {what}",
                               f"kubectl get {resource} {q(queue)} -o yaml", "none (read-only)"))
        acts.append(Action("fix", fix, None, _ANY))
        return acts
    return plan


_volcano = _queue_plan(
    "queues.scheduling.volcano.sh", "its capability and what is allocated",
    "raise the queue's capability for the GPU resource or free what is allocated in it; for a "
    "gang that cannot be placed, free GPUs on the nodes or lower minMember")
_kai = _queue_plan(
    "queues.scheduling.run.ai", "its quota and limit",
    "free or raise the queue's quota and limit, or let the workload be preemptible")


def _fixed_text(root, chain, names, findings, likely):
    acts: list = []
    if root.id in NODE_DOWN:
        acts += [cordon(names), drain(names)]
    acts.append(Action("fix", FIXES[root.id], None,
                       "a reboot restarts every pod on the node" if root.id in NODE_DOWN
                       else FIX_RISK.get(root.id, _ANY)))
    return acts


def _black_hole(root, chain, names, findings, likely):
    """Stop the bleeding first: the scheduler keeps sending it pods while it is schedulable.
    A black hole whose failures the runtime named (its `reasons`, `CrashLoopBackOff:
    driver_library_mismatch`) gets that cause's own fix."""
    if root.id == "node.gpu_black_hole":
        reasons = ev(root).get("reasons")
        counts: dict[str, int] = {}
        for k, n in (reasons.items() if isinstance(reasons, Mapping) else ()):
            key = k.split(": ", 1)[-1] if isinstance(k, str) else ""
            if key in container_start.KNOWN_KEYS and isinstance(n, int):
                counts[key] = counts.get(key, 0) + n
        if counts:
            top = max(sorted(counts), key=lambda k: counts[k])
            plan = _start_failed(_with_cause(root, top), chain, names, findings, likely)
            return [a for a in plan if a is None or a.step != "mitigate"] + [
                cordon(names), drain(names) if container_start.NODE_ACTION.get(top) == "drain"
                else None]
        # rejections at admission whose messages name a lost GPU (audit round 5, N9: 42 of 42
        # said "GPU is lost" and the fix step was "find why the node fails GPU pods")
        said = ev(root).get("admission_causes")
        if isinstance(said, Mapping) and said.get("gpu_lost"):
            return _down(names, "reboot")
    return [cordon(names)] + (_fixed_text(root, chain, names, findings, likely)
                              if root.id in FIXES else [])


def _with_cause(f: Finding, key: str) -> Finding:
    return dataclasses.replace(f, evidence={**ev(f), "cause": key})


def _gpu_down(root, chain, names, findings, likely):
    return _down(names, "reboot" if root.id == "gpu.lost" else "reset")


def _foreign_gpu_down(f: Finding) -> bool:
    e = ev(f)
    text = " ".join(str(e.get(k) or "") for k in ("type", "reason", "message"))
    return bool(e.get("gpu_related")) and bool(_GPU_DOWN_WORDS.search(text)) and \
        e.get("kind") == "condition"


_CGROUP = {"cgroup.device_rules_rewritten", "cgroup.device_denied", "container.nvidia_eperm"}

# (when, plan): the first rule whose test holds for (root, chain) makes the plan
PLANS: tuple[tuple[Callable[[Finding, Sequence[str]], bool], Plan], ...] = (
    (lambda r, c: r.id in GPU_DOWN, _gpu_down),
    (lambda r, c: r.id in ("gpu.xid", "gpu.driver_error"), _xid),
    (lambda r, c: r.id == "pod.gpu_start_failed", _start_failed),
    (lambda r, c: r.id == "driver.known_bad" or bool(WEDGE & set(c)), _wedge),
    (lambda r, c: bool(_CGROUP & set(c)), _cgroup),
    (lambda r, c: r.id in ("node.not_ready", "memory.pressure", "memory.overcommit"),
     _not_ready),
    (lambda r, c: r.id == "node.foreign_condition", _foreign),
    (lambda r, c: r.id == "kueue.not_admitted", _kueue),
    (lambda r, c: r.id == "volcano.podgroup_pending", _volcano),
    (lambda r, c: r.id == "kai.podgroup_unschedulable", _kai),
    (lambda r, c: "node.gpu_black_hole" in c, _black_hole),
    (lambda r, c: r.id in FIXES, _fixed_text),
)


def actions(root: Finding, chain: Sequence[str], names: Names, findings: Sequence[Finding],
            likely: str | None, gone: str | None) -> tuple[Action, ...]:
    ids = {f.id for f in findings}
    if gone and root.id == "pod.admission_error":
        acts = _admission_cleared(root, chain, names, findings, likely)
    else:
        plan = next((p for when, p in PLANS if when(root, chain)), None)
        acts = list(plan(root, chain, names, findings, likely)) if plan else []
    stuck = "probe.pod_not_started" in ids and not gone
    if stuck:
        acts.append(_ssh_local(names))
    acted = any(a is not None and a.step in ("mitigate", "fix") for a in acts)
    cmd = gd(names)
    if names.offline and acted:
        acts.append(capture_again(names))
    elif cmd and acted and not (gone and root.id == "pod.admission_error"):
        acts.append(Action("verify", "after the fix", cmd, "none (read-only)"))
    elif cmd and not acts and root.severity.rank >= 2:
        acts.append(Action("look", "the findings and their evidence, in full", cmd +
                           " --details", "none (read-only)"))
    if stuck:
        acts.append(Action(
            "prevent", "install the standing agent before the next wedge: exec reaches a "
                       "node that admits no pod",
            "kubectl gpu-doctor agent install",
            "a privileged DaemonSet pod on every GPU node"))
    order = {s: i for i, s in enumerate(STEPS)}
    return tuple(sorted((a for a in acts if a is not None), key=lambda a: order[a.step]))

"""The verdict's headline: the root finding's own sentence, what it costs, the subject once.

Why apart: the words are the part a tired person reads first, and the part most easily wrong:
the headline says only what the root finding's evidence says (its numbers and names: the
plugin, the monitor and its condition, the GPUs asked and offered, the ClusterQueue), a likely
cause is said to be likely and a cleared one cleared. It never pastes an event's or a
container's message: those are evidence, quoted in the findings. Pure.
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

from node_probe.protocol import Finding
from node_probe.protocol.catalog import CATALOG
from node_probe.protocol.duration import human
from node_probe.protocol.known_drivers import KNOWN_ISSUES

from .model import Names, ev, valid
from .roots import unconfirmed

MAX_HEADLINE = 400
MAX_POD_ENTRIES = 10000  # pod entries counted from evidence lists
_VERSION = re.compile(r"\d{1,4}(\.\d{1,4}){1,3}")
RESOURCE = re.compile(r"[a-z0-9.-]{1,63}/[A-Za-z0-9._-]{1,63}")
_NVML_FUNC = re.compile(r"nvml[A-Za-z0-9_]{1,40}")
_PID = re.compile(r"[0-9]{1,9}")

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


# -- likely and cleared --------------------------------------------------------------------------

def from_labels(f: Finding) -> bool:
    """A cause read from the node's labels only, not seen on the node (`Likely`)."""
    return ev(f).get("confirmed_on_node") is False


def cleared(f: Finding) -> str | None:
    """What says the cause `f` is gone now, or None when it holds (or it is not known)."""
    e = ev(f)
    race = e.get("admission_race")
    if f.id == "pod.admission_error" and isinstance(race, Mapping) and \
            race.get("cleared_now") is True:
        alloc = race.get("node_allocatable_now")
        res = race.get("resource")
        node_ok = (f"the node advertises {alloc} allocatable {res}"
                   if isinstance(alloc, int) and isinstance(res, str)
                   and RESOURCE.fullmatch(res) else "the node has its GPUs back")
        owner = race.get("controller") if isinstance(race.get("controller"), Mapping) else {}
        kind, name = owner.get("kind"), valid("pod", owner.get("name"))
        if race.get("recreated") is True and isinstance(kind, str) and kind.isalpha() and name:
            return f"cleared since: {node_ok} and its {kind} {name} has replaced the pod"
        return f"cleared since: {node_ok}"
    if f.id == "agent.problem_seen" and e.get("status") == "False":
        return "cleared since"
    return None


# -- impact ------------------------------------------------------------------------------------

def impact(findings: Sequence[Finding], names: Names, ids_in_chain: set[str]) -> dict:
    pods: dict[str, bool] = {}
    non_gpu_said = 0
    counted = 0
    for f in findings:
        if f.id not in ids_in_chain:
            continue
        e = ev(f)
        for key in ("pods", "pods_waiting"):
            entries = e.get(key)
            if not isinstance(entries, (list, tuple)):
                continue
            for x in entries:
                counted += 1
                if counted > MAX_POD_ENTRIES:
                    break
                if isinstance(x, Mapping) and isinstance(x.get("pod"), str):
                    pods[x["pod"]] = pods.get(x["pod"], False) or bool(x.get("gpu"))
        n = e.get("non_gpu_pods_affected")
        if isinstance(n, int) and not isinstance(n, bool) and 0 <= n:
            non_gpu_said = max(non_gpu_said, n)
    gpu = sum(1 for v in pods.values() if v)
    non_gpu = max(len(pods) - gpu, non_gpu_said)
    if not pods and names.kind == "pod" and any(i.startswith("pod.") for i in ids_in_chain):
        gpu = 1  # the pod findings are about the target pod, a GPU pod
    return {"pods": gpu + non_gpu, "gpu_pods": gpu, "non_gpu_pods": non_gpu}


def impact_words(imp: Mapping[str, Any], names: Names) -> str:
    n, gpu, other = imp.get("pods") or 0, imp.get("gpu_pods") or 0, imp.get("non_gpu_pods") or 0
    if not n or (names.kind == "pod" and n <= 1):
        return ""  # a pod's own finding: the headline is about it already
    s = "s" if n != 1 else ""
    if not other:
        return f"{n} GPU pod{s} stuck"
    if not gpu:
        return f"{n} pod{s} without GPUs stuck"
    return f"{n} pods stuck ({gpu} with GPUs, {other} without)"


# -- the driver --------------------------------------------------------------------------------

def driver(findings: Sequence[Finding]) -> str | None:
    for f in findings:
        if f.id == "driver.known_bad":
            v = ev(f).get("driver_version")
            if isinstance(v, str) and _VERSION.fullmatch(v):
                return v
    for f in findings:  # the node probe's plugin finding carries the driver it matched
        if f.id == "deviceplugin.blocked_in_nvml":
            for m in ev(f).get("known_bad_driver") or ():
                v = m.get("driver_version") if isinstance(m, Mapping) else None
                if isinstance(v, str) and _VERSION.fullmatch(v):
                    return v
    return None


def known_issue(version: str | None):
    return next((k for k in KNOWN_ISSUES if version in k.versions), None)


def known_bad_words(findings: Sequence[Finding]) -> str | None:
    version = driver(findings)
    if version is None:
        return None
    issue = known_issue(version)
    cond = f" ({issue.condition_text.removesuffix(' on one node')})" if issue else ""
    return f"known-bad NVIDIA driver {version}{cond}"


# -- the plugin --------------------------------------------------------------------------------

def resources(e: Mapping[str, Any]) -> list[str]:
    raw = next((v if isinstance(v, (list, tuple)) else [v]
                for v in (e.get("resources"), e.get("resource")) if v), [])
    return [r for r in list(raw)[:8] if isinstance(r, str) and RESOURCE.fullmatch(r)]


def plugin_pod_for(names: Names, findings: Sequence[Finding]) -> dict | None:
    """The device plugin's pod: the one whose uid the node probe saw serving the stuck plugin
    socket, else the first the API side recognised by its install's labels."""
    if not names.plugin_pods:
        return None
    uids = {str(ev(f).get("pod_uid")) for f in findings
            if f.id.startswith("deviceplugin.") and ev(f).get("pod_uid")}
    return next((p for p in names.plugin_pods if p["uid"] and p["uid"] in uids),
                names.plugin_pods[0])


def _plugin_words(root: Finding, names: Names, findings: Sequence[Finding]) -> str:
    """`the nvidia.com/gpu device plugin (pod gpu-operator/nvidia-device-plugin-x7k2p, pid
    8865)`: the plugin named by what it serves and where it runs."""
    e = ev(root)
    res = resources(e)
    where = []
    pod = plugin_pod_for(names, findings)
    if pod:
        where.append(f"pod {pod['namespace']}/{pod['name']}")
    if isinstance(e.get("pid"), int) or _PID.fullmatch(str(e.get("pid") or "")):
        where.append(f"pid {e['pid']}")
    return (f"the {', '.join(res) + ' ' if res else ''}device plugin"
            + (f" ({', '.join(where)})" if where else ""))


def _kubelet_blocked(root: Finding, names: Names, findings: Sequence[Finding]) -> str:
    """`The kubelet waits 10m in the nvidia.com/gpu device plugin's GetPreferredAllocation
    (pod gpu-operator/nvidia-device-plugin-daemonset-x7k2p)`: the goroutine dump's numbers."""
    e = ev(root)
    calls = e.get("calls") if isinstance(e.get("calls"), Mapping) else {}
    call = next((c for c in calls if isinstance(c, str) and re.fullmatch(r"[A-Za-z]{1,40}", c)),
                None)
    mins = e.get("longest_wait_min")
    res = resources(e)
    pod = plugin_pod_for(names, findings)
    plugin = (f"the {', '.join(res) + ' ' if res else ''}device plugin's "
              f"{call or 'RPC'}" + (f" (pod {pod['namespace']}/{pod['name']})" if pod else ""))
    if isinstance(mins, int) and not isinstance(mins, bool) and mins >= 1:
        return f"The kubelet has waited for {human(mins * 60)} in {plugin}"
    return f"The kubelet is inside {plugin}"


def agent_mark(f: Finding) -> str | None:
    """A problem the watching agent marked on the node (its NodeCondition, read from the node
    object): what its finding id means and how long ago it set the mark -- evidence from then,
    not a look now. Its message is quoted by the finding, not worded here."""
    e = ev(f)
    if e.get("source") != "gpu-doctor agent" or not isinstance(e.get("condition"), str):
        return None
    # the condition's message is quoted by the finding, never the headline (MCP-01): whoever
    # can patch nodes/status can write it; the headline says what the id means
    what = CATALOG.get(f.id, f.id)
    since = e.get("since_s")
    when = (f"marked by the watching agent {human(since)} ago" if isinstance(since, (int, float))
            and not isinstance(since, bool) else "marked by the watching agent")
    return f"{cap(what)} ({when})"


def cap(s: str) -> str:
    """A sentence's first letter up, unless its first word is a name (`nvidia.com/gpu`)."""
    first = s.split(" ", 1)[0]
    return s[:1].upper() + s[1:] if first.isalpha() else s


def title(f: Finding) -> str:
    t = " ".join(str(f.title).split())[:300]
    if t.lower().startswith("likely root cause: "):
        t = "Likely: " + t[len("likely root cause: "):]
    return cap(t) if t else f.id


# a pod finding's title about "it" / "the pod", with the pod named instead (the pod target)
_POD_SUBJECT = (
    ("kueue has not admitted it", "Kueue has not admitted pod {who}"),
    ("the hami scheduler found no node with a gpu that fits",
     "The HAMi scheduler found no node with a GPU that fits pod {who}"),
    ("the kubelet rejected the pod", "The kubelet rejected pod {who}"),
    ("its ", "Pod {who}'s "),
    ("the gpus fit on", "Pod {who}'s GPUs fit on"),
    ("not scheduled ", "Pod {who} is not scheduled "),
    ("waiting for the scheduler", "Pod {who} is waiting for the scheduler"),
)


def cause(root: Finding, chain: Sequence[str], names: Names, findings: Sequence[Finding],
          likely: str | None) -> str:
    """The root finding's own sentence: its numbers and names, the subject once."""
    e = ev(root)
    mark = agent_mark(root)
    if mark:
        return mark
    if root.id == "driver.known_bad":
        words = known_bad_words(findings) or "a known-bad NVIDIA driver"
        out = words[0].upper() + words[1:]
        if {"kubelet.blocked_in_device_plugin", "kubelet.admission_stalled",
                "deviceplugin.blocked_in_nvml"} & set(chain):
            out += " hangs the device plugin in NVML"
        if unconfirmed(root) or from_labels(root):
            out = "Likely: " + out[:1].lower() + out[1:]
        return out
    if root.id == "deviceplugin.blocked_in_nvml":
        threads = e.get("threads") if isinstance(e.get("threads"), list) else []
        func = next((t.get("func") for t in threads if isinstance(t, Mapping)
                     and isinstance(t.get("func"), str) and _NVML_FUNC.fullmatch(t["func"])),
                    "nvmlInit")
        plugin = _plugin_words(root, names, findings)
        return f"{plugin[0].upper()}{plugin[1:]} is stuck in {func}"
    if root.id == "kubelet.blocked_in_device_plugin":
        return _kubelet_blocked(root, names, findings)
    t = title(root)
    if root.id == "node.not_ready":
        # the title's own words up to what it means for the probe (said by the report)
        return t.split("): node-side checks", 1)[0] + (")" if "): node-side checks" in t else "")
    if names.kind == "pod" and names.pod and ev(root).get("pod", names.who) == names.who:
        low = t[:1].lower() + t[1:]
        if low.startswith(("asks ", "waits ", "is ", "has ", "was ", "never ")):
            return f"Pod {names.who} {low}"
        for start, said in _POD_SUBJECT:
            if low.lower().startswith(start):
                return said.format(who=names.who) + low[len(start):]
    return t


def headline(root: Finding, chain: Sequence[str], names: Names, imp: Mapping,
             findings: Sequence[Finding], likely: str | None, gone: str | None) -> str:
    said = cause(root, chain, names, findings, likely)
    flat = re.sub(r"[^a-z0-9 ]", "", said.lower())
    effect = next((text for i, text, says in EFFECTS if i in chain and i != root.id
                   and says not in flat), None)
    if effect and effect.startswith("the kubelet ") and said.startswith("The kubelet "):
        effect = "it " + effect[len("the kubelet "):]
    head = said + (f", so {effect}" if effect else "")
    stuck = "" if gone else impact_words(imp, names)
    pods = ev(root).get("pods")
    named = [p.get("pod") for p in (pods if isinstance(pods, (list, tuple)) else ())[:2]
             if isinstance(p, Mapping)]
    if stuck and imp.get("pods") == 1 and len(named) == 1 and str(named[0]) in said:
        stuck = ""  # the one pod stuck is the one the cause names
    if stuck:
        head += f": {stuck}"
    if likely:
        head += f"; likely cause: {likely}"
    if gone:
        head += f"; {gone}"
    return head[:MAX_HEADLINE]


def pod_first(names: Names, findings: Sequence[Finding], head: str) -> str:
    """`pod Y` on a pod that is Running and ready, whose findings are all about its node: the
    pod is fine first, then the node's trouble."""
    if names.kind != "pod" or not names.pod_running or not names.pod:
        return head
    mine = f"pod/{names.who}"
    if any(f.subject == mine and f.severity.rank >= 2 for f in findings):
        return head
    where = f"its node {names.node}" if names.node else "its node"
    return (f"Pod {names.who} is Running and ready, not hit so far; {where}: "
            f"{head[:1].lower() + head[1:] if head[:1].isalpha() and head[1:2].islower() else head}"
            )[:MAX_HEADLINE]

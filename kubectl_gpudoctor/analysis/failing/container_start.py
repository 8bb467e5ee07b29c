"""pod.gpu_start_failed: a GPU container the runtime could not create or start, named from the
runtime's own message, with the node-side check that proves the cause.

Why: a GPU pod in CreateContainerError, RunContainerError, StartError or CrashLoopBackOff shows
one long line such as "failed to create containerd task: failed to create shim task: OCI runtime
create failed: runc create failed: unable to start container process: error during container
init: error running prestart hook #0: exit status 1, stdout: , stderr: Auto-detected mode as
'legacy'\\nnvidia-container-cli: initialization error: nvml error: driver/library version
mismatch: unknown". The cause is the NVIDIA Container Toolkit's words near the end (its hook,
`nvidia-container-cli`, or its CDI injection), or the runtime's (a handler it does not have).
Each cause is a known node fault with a node-side check that proves it (driver.version_mismatch
for a mismatch, persistence.off for a driver RPC timeout...): `classify` names it, `analyze_pod`
makes the finding for `pod Y`, and black_hole.py counts the same causes per node for `nodes`.

The message is tenant-reachable text (a container's own output can reach a terminated
message): it is only matched against fixed patterns and quoted, cut, as evidence; the cause,
fix and commands are ours. Pure; no I/O.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterable, Mapping, Sequence

from node_probe.protocol import Finding, catalog

from ..common import both_ends, event_source, gpu_requests, pod_ref
from .start_frames import hook_stderr, runtime_text

MAX_MESSAGE = 400
# container states whose message is the runtime's (waiting reasons) or the failed start's
WAITING_REASONS = ("CreateContainerError", "RunContainerError", "CrashLoopBackOff",
                   "StartError", "CreateContainerConfigError")
TERMINATED_REASONS = ("StartError", "ContainerCannotRun")
# kubelet events that carry the runtime's error for a container or the pod sandbox
EVENT_REASONS = ("Failed", "FailedCreatePodSandBox")

# the hook's own error: a line of its stderr (start_frames.hook_stderr), never the command a
# runtime quotes back (audit round 5, BH-01)
_CLI = r"(?m:^)nvidia-container-cli(?:\.real)?: "


@dataclasses.dataclass(frozen=True)
class Cause:
    """One cause the runtime's message names. `node_ids`: the node-side findings that prove
    it; `check`: the probe check that looks (`node X` runs it)."""

    key: str
    pattern: re.Pattern
    what: str          # the cause, for the title ("...: <what>")
    fix: str           # the fix, in our words
    check: str
    node_ids: tuple[str, ...]
    refs: tuple[str, ...]

    def describe(self, m: re.Match) -> str:
        return self.what.format(*[g or "" for g in m.groups()])


REF_HOOK = "https://github.com/NVIDIA/libnvidia-container/blob/main/src/driver.c"
CAUSES: tuple[Cause, ...] = (
    Cause("driver_library_mismatch",
          re.compile(_CLI + r"initialization error: nvml error: driver/library version mismatch"),
          "the NVIDIA kernel module and the driver libraries on the node are different versions",
          "a driver upgrade replaced the libraries but the old kernel module is still loaded: "
          "drain the node and reboot it (or reload the nvidia kernel modules)",
          "driver", ("driver.version_mismatch",),
          ("https://github.com/NVIDIA/k8s-device-plugin/issues/1431",
           "https://github.com/NVIDIA/nvidia-container-toolkit/issues/394", REF_HOOK)),
    Cause("driver_rpc_timeout",
          re.compile(_CLI + r"initialization error: driver (?:rpc )?error: timed out"),
          "the NVIDIA driver took longer to initialise than the toolkit's 10 s RPC deadline "
          "(no persistence daemon keeps it initialised)",
          "run nvidia-persistenced on the node (or enable persistence mode: nvidia-smi -pm 1) "
          "so the driver stays initialised between containers",
          "persistence", ("persistence.off",),
          ("https://github.com/NVIDIA/nvidia-container-toolkit/issues/202",
           "https://github.com/NVIDIA/nvidia-docker/issues/1648",
           "https://github.com/NVIDIA/libnvidia-container/blob/main/src/rpc.c")),
    Cause("nvcgo_rpc_timeout",
          re.compile(_CLI + r"initialization error: nvcgo rpc error: timed out"),
          "the toolkit's cgroup helper did not start within its 10 s RPC deadline (a node "
          "under CPU or IO pressure, many GPU containers starting at once)",
          "find what loads the node (CPU, IO, memory pressure) and start fewer GPU containers "
          "at once; the deadline is fixed in libnvidia-container",
          "memory", ("memory.pressure",),
          ("https://github.com/NVIDIA/nvidia-container-toolkit/issues/2102",)),
    Cause("driver_not_loaded",
          re.compile(_CLI + r"initialization error: nvml error: driver not loaded"),
          "the NVIDIA kernel module is not loaded on the node",
          "load the driver on the node (with the GPU Operator: its driver pod must be Running "
          "there; after a kernel upgrade the module must be rebuilt)",
          "nvml", ("nvml.init_error", "nvml.unavailable"),
          ("https://github.com/NVIDIA/nvidia-container-toolkit/issues/1269",
           "https://github.com/NVIDIA/nvidia-docker/issues/1393", REF_HOOK)),
    Cause("gpu_lost",
          re.compile(_CLI + r"initialization error: nvml error: GPU is lost"),
          "a GPU on the node fell off the bus (NVML: GPU is lost)",
          "cordon and drain the node, then reset or reboot it; if it returns, replace the GPU",
          "gpu_lost", ("gpu.lost", "gpu.xid"),
          ("https://github.com/NVIDIA/k8s-device-plugin/issues/2038", REF_HOOK)),
    Cause("nvml_error",
          re.compile(_CLI + r"initialization error: nvml error: ([^:\n\"\\]{1,80})"),
          "NVML fails on the node ({0})",
          "see the node's NVML and driver state",
          "nvml", ("nvml.init_error",),
          ("https://github.com/NVIDIA/gpu-operator/issues/443", REF_HOOK)),
    Cause("driver_library_missing",
          re.compile(_CLI + r"initialization error: load library failed: "
                     r"(libnvidia-ml\.so[.0-9]*)"),
          "the toolkit finds no NVIDIA driver library ({0}) where it looks on the node",
          "install the driver, or point the toolkit at the driver root "
          "(NVIDIA_DRIVER_ROOT, the GPU Operator's driver.root)",
          "nvml", ("nvml.unavailable",),
          ("https://github.com/NVIDIA/nvidia-container-toolkit/issues/1269",)),
    Cause("cuda_requirement",
          re.compile(_CLI + r"requirement error: unsatisfied condition: (cuda ?>= ?[0-9.]+)"),
          "the image needs a newer driver than the node's ({0})",
          "run it where the driver is new enough (the image's NVIDIA_REQUIRE_CUDA), upgrade "
          "the node's driver, or use an image built for an older CUDA",
          "nvml", ("nvml.inventory",),
          ("https://github.com/NVIDIA/nvidia-docker/issues/1442",)),
    Cause("cdi_unresolvable",
          re.compile(r"unresolvable CDI devices:? ([^:\n\"\\]{1,200})"),
          "no CDI spec on the node defines the devices the pod was given ({0})",
          "regenerate the CDI spec on the node (`nvidia-ctk cdi generate`, or restart the "
          "toolkit pod) after a driver or MIG change",
          "runtime_cdi", ("cdi.spec_version_mismatch", "cdi.unresolvable_devices"),
          ("https://github.com/NVIDIA/nvidia-container-toolkit/issues/1239",
           "https://github.com/gpustack/gpustack/issues/4130")),
    Cause("runtime_handler_missing",
          re.compile(r'no runtime for "([^"]{1,63})" is configured|'
                     r"failed to find runtime handler (\S{1,63}) from runtime list"),
          "the node's container runtime has no {0}{1} handler",
          "configure the handler (`nvidia-ctk runtime configure`, then restart the runtime; "
          "with the GPU Operator its toolkit pod does it and must run on the node)",
          "runtime_cdi", ("runtime.handler_missing",),
          ("https://github.com/NVIDIA/gpu-operator/issues/413",)),
    Cause("device_eperm",
          re.compile(r"(?:failed to add device rules|devices\.allow|BPF_CGROUP_DEVICE|"
                     r"/dev/nvidia[a-z0-9-]*)[^\n]{0,200}?operation not permitted"),
          "the runtime may not give the container its NVIDIA devices (EPERM on the device "
          "cgroup)",
          "see the node's device cgroup findings; the runtime or its hook lacks the right to "
          "write device rules (nested or rootless runtimes need the toolkit's no-cgroups mode)",
          "cgroup.devices", ("cgroup.device_denied", "container.nvidia_eperm"),
          ("https://github.com/NVIDIA/nvidia-docker/issues/1441",
           "https://github.com/NVIDIA/nvidia-container-toolkit/issues/678")),
    # a hook the CDI spec (or the runtime's hook config) names, not on this node: the device
    # plugin and `nvidia-ctk cdi generate` write /usr/bin/nvidia-ctk or /usr/bin/nvidia-cdi-hook
    # by default; Talos installs them under /usr/local/bin (siderolabs/talos#13021), a distro
    # package may lack nvidia-cdi-hook (void-linux/void-packages#55062)
    Cause("cdi_hook_missing",
          re.compile(r"(?:fork/exec |exec: \")(/?(?:[A-Za-z0-9._+-]{1,64}/){0,12}"
                     r"(?:nvidia-cdi-hook|nvidia-ctk|nvidia-container-runtime-hook|"
                     r"nvidia-container-toolkit))\"?: (?:no such file or directory|"
                     r"executable file not found in \$PATH)"),
          "the container's NVIDIA hook {0} is not on the node: the CDI spec (or the runtime's "
          "hook configuration) names a path where no such program is",
          "regenerate the CDI spec with the hook's real path on this node (`nvidia-ctk cdi "
          "generate --nvidia-cdi-hook-path=<the path of nvidia-cdi-hook on the node>`; with "
          "the GPU Operator or the device plugin set NVIDIA_CDI_HOOK_PATH, e.g. "
          "/usr/local/bin/nvidia-cdi-hook on Talos), or install the toolkit's program at the "
          "path the spec names",
          "runtime_cdi", (),
          ("https://github.com/siderolabs/talos/issues/13021",
           "https://github.com/void-linux/void-packages/issues/55062",
           "https://github.com/NVIDIA/nvidia-container-toolkit/blob/main/cmd/nvidia-ctk/README.md")),
    # the hook ran and failed: runc's "error running createContainer hook #N: exit status N",
    # crun's "error executing hook `/usr/bin/nvidia-ctk` (exit code: N)"
    Cause("cdi_hook_failed",
          re.compile(r"(?=[\s\S]{0,4000}nvidia)"  # an NVIDIA hook's (its words name it)
                     r"(?:error running )?(createContainer|createRuntime|startContainer) hook #([0-9]{1,3}):? exit status ([0-9]{1,3})|"
                     r"error executing hook `/?(?:[A-Za-z0-9._+-]{1,64}/){0,12}"
                     r"(nvidia-ctk|nvidia-cdi-hook|nvidia-container-runtime-hook)` "
                     r"\(exit code: ([0-9]{1,3})\)"),
          # groups: runc's stage, hook number, exit status; crun's hook program, exit code
          "an NVIDIA container hook failed while the runtime created the container "
          "({0}{3} hook, exit status {2}{4})",
          "read the hook's error in the message (quoted in the finding); update the NVIDIA "
          "Container Toolkit on the node and regenerate its CDI spec (`nvidia-ctk cdi "
          "generate`); a hook that fails on a read-only path of the pod (toolkit 1.20.0's "
          "application-profile hook on a read-only /etc/nvidia) needs the toolkit's fix or "
          "that mount moved",
          "runtime_cdi", (),
          ("https://github.com/NVIDIA/nvidia-container-toolkit/issues/2026",
           "https://github.com/NVIDIA/nvidia-container-toolkit/issues/143")),
)
KNOWN_KEYS = frozenset(c.key for c in CAUSES)
# what the node needs while a cause is fixed: "drain" (its GPU work must move: a reboot, a lost
# GPU), "cordon" (each new GPU pod sent there fails the same way), "" (the fix keeps pods
# running, or the fault is the pod's own: an image that needs a newer driver)
NODE_ACTION = {"driver_library_mismatch": "drain", "driver_not_loaded": "drain",
               "gpu_lost": "drain", "nvml_error": "drain", "driver_library_missing": "cordon",
               "cdi_unresolvable": "cordon", "runtime_handler_missing": "cordon",
               "cdi_hook_missing": "cordon", "cdi_hook_failed": "cordon",
               "device_eperm": "cordon", "driver_rpc_timeout": "", "nvcgo_rpc_timeout": "",
               "cuda_requirement": ""}
# causes that are the node's, not the pod's: one GPU pod failing so makes the node sick
NODE_CAUSES = frozenset(k for k in KNOWN_KEYS if k != "cuda_requirement")


def classify(message: Any) -> tuple[Cause, str] | None:
    """(the cause the runtime's message names, its description), or None when it names none
    we know. The first cause in CAUSES that matches wins (the specific before the general)."""
    if not isinstance(message, str) or not message:
        return None
    text = runtime_text(message[:8192])
    hook = hook_stderr(text)
    for cause in CAUSES:
        m = cause.pattern.search(hook if cause.pattern.pattern.startswith(_CLI) else text)
        if m:
            return cause, cause.describe(m)
    return None


@dataclasses.dataclass(frozen=True)
class Failure:
    """One failed start of one container (or the pod's sandbox)."""

    container: str | None
    reason: str          # CreateContainerError, StartError, Failed (event) ...
    message: str
    cause: Cause
    description: str
    restarts: int = 0
    from_event: bool = False


def _statuses(pod: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    st = pod.get("status") or {}
    for key in ("initContainerStatuses", "containerStatuses"):
        for cs in st.get(key) or ():
            if isinstance(cs, Mapping):
                yield cs


def failures(pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]] = ()) -> list[Failure]:
    """The classified start failures of a pod: from its container statuses (waiting,
    terminated and last terminated state), else from the kubelet's Warning events about it."""
    out: list[Failure] = []
    seen: set[str] = set()
    for cs in _statuses(pod):
        state, last = cs.get("state") or {}, cs.get("lastState") or {}
        cands = []
        w = state.get("waiting") or {}
        if w.get("reason") in WAITING_REASONS:
            cands.append((w.get("reason"), w.get("message")))
        for t in (state.get("terminated") or {}, last.get("terminated") or {}):
            if t.get("reason") in TERMINATED_REASONS:
                cands.append((w.get("reason") or t.get("reason"), t.get("message")))
        for reason, msg in cands:
            hit = classify(msg)
            if hit and cs.get("name") not in seen:
                seen.add(str(cs.get("name")))
                out.append(Failure(cs.get("name"), str(reason),
                                   both_ends(str(msg), MAX_MESSAGE), hit[0], hit[1],
                                   int(cs.get("restartCount") or 0)))
    if out:
        return out
    for e in events:
        if e.get("type") != "Warning" or e.get("reason") not in EVENT_REASONS:
            continue
        if event_source(e) not in ("kubelet", ""):
            continue
        hit = classify(e.get("message"))
        if hit:
            out.append(Failure(None, str(e.get("reason")),
                               both_ends(str(e.get("message")), MAX_MESSAGE),
                               hit[0], hit[1], from_event=True))
            break
    return out


def analyze_pod(pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]] = ()
                ) -> list[Finding]:
    """pod.gpu_start_failed for a pod whose containers fail to start for a cause we know
    (one finding per cause). A pod that asks for no GPU gets one only when the message is
    the NVIDIA toolkit's own (the runtime ran the GPU hook for it anyway)."""
    fails = failures(pod, events)
    if not fails:
        return []
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    ref = pod_ref(pod)
    gpu = gpu_requests(pod)
    out: list[Finding] = []
    by_cause: dict[str, list[Failure]] = {}
    for f in fails:
        by_cause.setdefault(f.cause.key, []).append(f)
    for key, fs in by_cause.items():
        f = fs[0]
        c = f.cause
        containers = sorted({x.container for x in fs if x.container})
        where = f" on {node}" if node else ""
        who = (f"container {', '.join(containers)}" if containers else "the pod's sandbox"
               if f.reason == "FailedCreatePodSandBox" else "its containers")
        confirm = (f" `kubectl gpu-doctor node {node}` runs the node-side check ({c.check})"
                   + (f" that proves it: {', '.join(c.node_ids)}." if c.node_ids else ".")
                   if node else "")
        out.append(catalog.make(
            "pod.gpu_start_failed", "critical", f"pod/{ref}",
            f"{who} cannot start{where}: {f.description}",
            {"pod": ref, "node": node or None, "containers": containers or None,
             "reason": f.reason, "cause": c.key, "message": f.message,
             "from_event": f.from_event, "restarts": max(x.restarts for x in fs),
             "gpu": gpu or None, "node_check": c.check, "caused_by": list(c.node_ids)},
            f"Cause: {f.description}. Fix: {c.fix}.{confirm} Then delete the pod so its "
            "controller recreates it (a container that cannot start is retried with back-off, "
            "a pod rejected at admission never).",
            c.refs))
    return out


MAX_NODE_PODS = 2000   # pods of one node looked at
MAX_NAMED = 10         # failing pods named per cause


def analyze_node(node_name: str, pods: Sequence[Mapping[str, Any]],
                 events: Mapping[str, Sequence[Mapping[str, Any]]] | Sequence = ()
                 ) -> list[Finding]:
    """pod.gpu_start_failed about the node, from its first GPU pod that cannot start for a
    node reason (NODE_CAUSES: a driver/library mismatch after an upgrade, a missing library, a
    CDI or runtime fault): one finding per cause, naming the pods, so `node X` and `nodes` say
    the node is sick before every pod there fails (issue 36). `events`: by pod uid, or a list
    (then matched by the pod's uid)."""
    if isinstance(events, Mapping):
        by_uid = events
    else:
        by_uid = {}
        for e in list(events)[:50000]:
            uid = (e.get("involvedObject") or {}).get("uid") if isinstance(e, Mapping) else None
            if uid:
                by_uid.setdefault(uid, []).append(e)
    hits: dict[str, list[tuple[Mapping[str, Any], Failure]]] = {}
    for pod in list(pods)[:MAX_NODE_PODS]:
        if ((pod.get("status") or {}).get("phase")) in ("Succeeded", "Failed"):
            continue
        uid = (pod.get("metadata") or {}).get("uid") or ""
        for f in failures(pod, by_uid.get(uid) or ()):  # a steady pod ends here, cheaply
            if f.cause.key in NODE_CAUSES and gpu_requests(pod):
                hits.setdefault(f.cause.key, []).append((pod, f))
                break
    out = []
    for key, got in hits.items():
        pod, f = got[0]
        c = f.cause
        refs = [pod_ref(p) for p, _ in got]
        more = f" ({len(refs)} GPU pods fail so)" if len(refs) > 1 else ""
        action = NODE_ACTION.get(key, "")
        out.append(catalog.make(
            "pod.gpu_start_failed", "critical" if action else "warning", f"node/{node_name}",
            f"GPU pod {refs[0]} cannot start on {node_name}{more}: {f.description}",
            {"node": node_name, "cause": key, "reason": f.reason, "message": f.message,
             "from_event": f.from_event,
             "pods": [{"pod": r, "gpu": True} for r in refs[:MAX_NAMED]],
             "pods_failing": len(refs), "node_action": action or None,
             "node_check": c.check, "caused_by": list(c.node_ids)},
            f"Cause: {f.description}. Fix: {c.fix}. Every new GPU pod sent to {node_name} "
            f"fails the same way until then"
            + (": cordon it first" if action else "")
            + f". `kubectl gpu-doctor node {node_name}` runs the node-side check ({c.check})"
            + (f" that proves it: {', '.join(c.node_ids)}" if c.node_ids else "")
            + ". Then delete the failed pods so their controllers recreate them.",
            c.refs))
    return out

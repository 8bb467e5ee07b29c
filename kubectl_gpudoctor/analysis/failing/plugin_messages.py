"""What a GPU device plugin's or DRA driver's error, as the kubelet reports it, means for the node.

Why: an on-call engineer meets these strings in `kubectl describe pod` (UnexpectedAdmissionError,
FailedPrepareDynamicResources) or in a crash-looping plugin pod, and echoing them back tells
nothing new. Each has an established cause in the threads where users met it:

- `GetPreferredAllocation ... nvml: GPU is lost` / `... GPU lost from the bus`: one GPU fell off
  the bus; the NVIDIA plugin builds the topology of ALL GPUs on every GetPreferredAllocation, so
  every GPU pod on the node is refused until the lost GPU is gone (reboot). k8s-device-plugin
  #231, #2038, kubernetes #97131. The kubelet's wording is "device plugin
  GetPreferredAllocation rpc failed with err: %v" (pkg/kubelet/cm/devicemanager/manager.go)
  inside "Allocate failed due to %v, which is unexpected" (pkg/kubelet/cm/admission/errors.go);
  the plugin's "error getting list of preferred allocation devices: %v"
  (internal/plugin/server.go) and "unable to get device link information: %w"
  (internal/rm/nvml_manager.go).
- `error calling nvml.Init` (vendor/github.com/NVIDIA/go-gpuallocator/gpuallocator/device.go)
  from a plugin that is otherwise running: its NVML broke after it started (a driver change
  under it); restarting the plugin pod cleared it (k8s-device-plugin #1223, #1397).
- `driver/library version mismatch` (NVML's NVML_ERROR_LIB_RM_VERSION_MISMATCH text, also
  `nvidia-container-cli: initialization error: nvml error: driver/library version mismatch`) on
  the plugin itself: the user-space driver was upgraded while the old kernel module stays
  loaded; a reboot (or reloading the nvidia modules) fixed it (k8s-device-plugin #221, #1431,
  gpu-operator #898).
- `DRA driver <name> is not registered` (kubelet pkg/kubelet/cm/dra, the error of
  PrepareDynamicResources, event reason FailedPrepareDynamicResources) and the older "plugin
  name <name> not found in the list of registered DRA plugins": no kubelet plugin of that DRA
  driver is registered on the node (its kubelet-plugin pod is not running there, or has not
  registered yet): dra-driver-nvidia-gpu #814, kubernetes #131957.
- `NodePrepareResources: rpc error: code = DeadlineExceeded` (the kubelet's deadline on the DRA
  driver's kubelet plugin): the plugin did not finish preparing the claim's devices in time;
  the prepare is blocked, typically by a host process that still holds the GPU the driver must
  rebind (vfio passthrough), or a hung driver call: dra-driver-nvidia-gpu #1218.
- `requested device <name> is already allocated to different claim <uid>` (the driver's own
  prepare checkpoint): a stale PrepareResources retry re-took the device for a claim that was
  already torn down, so every later claim on the node is refused: dra-driver-nvidia-gpu #1162.

Container-start messages of the `nvidia-container-cli` family on a user's GPU container are
another module's (the container-start classifier); here they count only on the GPU plugin's own
pod, where they say the node's driver is broken.

Pure functions over text and raw API dicts; no I/O.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping, Sequence

from node_probe.protocol import Finding, catalog
from node_probe.protocol.conditions import sanitize_message

from ..common import pod_ref

MAX_TEXT = 4096


@dataclasses.dataclass(frozen=True)
class Cause:
    kind: str               # gpu_lost | nvml_broken | version_mismatch | dra_not_registered |
    #                         dra_prepare_timeout | dra_device_held_by_stale_claim
    finding_id: str
    what: str               # the cause, in words
    fix: str                # what fixed it where users met it
    refs: tuple[str, ...]
    driver: str | None = None   # the DRA driver's name (dra_not_registered)


_GPU_LOST = re.compile(r"GPU is lost|GPU lost from the bus|ERROR_GPU_IS_LOST", re.I)
_MISMATCH = re.compile(r"driver/library version mismatch|ERROR_LIB_RM_VERSION_MISMATCH", re.I)
_NVML = re.compile(r"error calling nvml\.Init|failed to initialize NVML|nvml init failed", re.I)
_DRA = re.compile(r"DRA driver (\S{1,253}) is not registered|plugin name (\S{1,253}) not found in "
                  r"the list of registered DRA plugins")

REFS_LOST = ("https://github.com/NVIDIA/k8s-device-plugin/issues/231",
             "https://github.com/NVIDIA/k8s-device-plugin/issues/2038",
             "https://github.com/kubernetes/kubernetes/issues/97131")
REFS_NVML = ("https://github.com/NVIDIA/k8s-device-plugin/issues/1223",
             "https://github.com/NVIDIA/k8s-device-plugin/issues/1397")
REFS_MISMATCH = ("https://github.com/NVIDIA/k8s-device-plugin/issues/221",
                 "https://github.com/NVIDIA/k8s-device-plugin/issues/1431",
                 "https://github.com/NVIDIA/gpu-operator/issues/898")
REFS_DRA = ("https://github.com/kubernetes-sigs/dra-driver-nvidia-gpu/issues/814",
            "https://github.com/kubernetes/kubernetes/issues/131957")
_DRA_DEADLINE = re.compile(r"NodePrepareResources\S{0,40} rpc error: code = DeadlineExceeded")
_DRA_STALE = re.compile(r"requested device (\S{1,253}) is already allocated to different claim "
                        r"([0-9a-f-]{1,64})")
REFS_DRA_DEADLINE = ("https://github.com/kubernetes-sigs/dra-driver-nvidia-gpu/pull/1218",)
REFS_DRA_STALE = ("https://github.com/kubernetes-sigs/dra-driver-nvidia-gpu/issues/1162",)


def classify(text: str) -> Cause | None:
    """The established cause behind a plugin/kubelet error text, or None."""
    t = str(text or "")[:MAX_TEXT]
    if _GPU_LOST.search(t):
        return Cause("gpu_lost", "gpu.lost",
                     "a GPU on the node is lost (it fell off the bus): the device plugin cannot "
                     "enumerate it, and its GetPreferredAllocation fails for every GPU pod",
                     "drain the node and reboot it (a lost GPU comes back only after a reboot; "
                     "nvidia-smi says \"Reboot the system to recover this GPU\"); check the "
                     "node's kernel log for Xid 79, and replace the GPU if it repeats",
                     REFS_LOST)
    if _MISMATCH.search(t):
        return Cause("version_mismatch", "driver.version_mismatch",
                     "the NVIDIA user-space driver was upgraded without reloading the kernel "
                     "module: NVML refuses to start (driver/library version mismatch)",
                     "drain the node and reboot it (or unload and reload the nvidia kernel "
                     "modules), so that the loaded module matches the installed libraries",
                     REFS_MISMATCH)
    if _NVML.search(t):
        return Cause("nvml_broken", "nvml.init_error",
                     "the running device plugin's NVML stopped working (nvml.Init fails in its "
                     "process), so it refuses every allocation; it does not recover by itself",
                     "restart the device plugin pod on the node (kubectl delete pod on the "
                     "nvidia-device-plugin pod; its DaemonSet recreates it); if it fails again, "
                     "run `kubectl gpu-doctor node <node>` for the driver's state",
                     REFS_NVML)
    m = _DRA.search(t)
    if m:
        drv = m.group(1) or m.group(2)
        return Cause("dra_not_registered", "dra.driver_not_registered",
                     f"no kubelet plugin of the DRA driver {drv} is registered on the node: its "
                     "kubelet-plugin pod is not running there or has not registered yet",
                     f"check the {drv} kubelet-plugin pod on the node (kubectl get pods -A -o "
                     "wide --field-selector spec.nodeName=<node>): start it there (node "
                     "selector, tolerations, the feature enabled in the driver's chart) and "
                     "let it register; the pod starts once it has",
                     REFS_DRA, drv)
    if _DRA_DEADLINE.search(t):
        return Cause("dra_prepare_timeout", "dra.plugin_unresponsive",
                     "the DRA driver's kubelet plugin did not finish preparing the claim's "
                     "devices (NodePrepareResources) before the kubelet's deadline: its prepare "
                     "is blocked, typically by a host process that still holds the GPU the "
                     "driver must switch to another driver (vfio), or by a hung driver call",
                     "on the node, find which process holds the GPU's /dev/nvidia* device and "
                     "stop it; read the log of the DRA driver's kubelet-plugin pod; the kubelet "
                     "retries the prepare by itself once the plugin can finish it",
                     REFS_DRA_DEADLINE)
    m = _DRA_STALE.search(t)
    if m:
        return Cause("dra_device_held_by_stale_claim", "dra.prepare_failed",
                     f"the DRA driver's prepare checkpoint still gives {m.group(1)} to claim "
                     f"{m.group(2)}, which is gone: a stale prepare retry re-took the device "
                     "after the claim was unprepared, so every later claim for it on this node "
                     "is refused",
                     "update the DRA driver to a release with the fix; until then remove the "
                     "stale entry: delete what still references that claim, then restart the "
                     "driver's kubelet-plugin pod on the node so it rebuilds its checkpoint",
                     REFS_DRA_STALE)
    return None


def finding_for(cause: Cause, node: str | None, text: str, where: str,
                pod: str | None = None) -> Finding:
    """One finding for the node (or, without a node, the pod) naming the cause."""
    subject = f"node/{node}" if node else (f"pod/{pod}" if pod else "cluster")
    msg = sanitize_message(text, 300)
    return catalog.make(
        cause.finding_id, "critical", subject,
        f"{cause.what[0].upper()}{cause.what[1:]}"
        + (f" (node {node})" if node else ""),
        {"kind": cause.kind, "seen_in": where, "message": msg, "pod": pod, "node": node,
         "dra_driver": cause.driver, "reported_by": "the kubelet / the plugin, through the "
                                                   "API server"},
        f"Cause: {cause.what}. Fix: {cause.fix}.",
        cause.refs)


PLUGIN_NAMES = ("nvidia-device-plugin", "device-plugin", "gpu-kubelet-plugin", "dra-driver",
                "nvidia-operator-validator",
                "kubelet-plugin")


def _is_gpu_plugin(pod: Mapping[str, Any]) -> bool:
    name = str((pod.get("metadata") or {}).get("name") or "")
    return any(n in name for n in PLUGIN_NAMES)


def plugin_pod_messages(pod: Mapping[str, Any]) -> list[str]:
    """The messages a plugin pod's containers carry: waiting and last-terminated."""
    out = []
    for cs in list((pod.get("status") or {}).get("initContainerStatuses") or ()) + \
            list((pod.get("status") or {}).get("containerStatuses") or ()):
        for part in ("state", "lastState"):
            st = cs.get(part) or {}
            for k in ("waiting", "terminated"):
                m = (st.get(k) or {}).get("message")
                if m:
                    out.append(str(m)[:MAX_TEXT])
    return out


def analyze_plugin_pods(node: str, pods: Sequence[Mapping[str, Any]]) -> list[Finding]:
    """GPU plugin pods on the node whose containers fail with a known driver cause."""
    out: dict[str, Finding] = {}
    for p in pods:
        if not _is_gpu_plugin(p):
            continue
        for text in plugin_pod_messages(p):
            cause = classify(text)
            if cause and cause.finding_id not in out:
                out[cause.finding_id] = finding_for(cause, node, text,
                                                    f"the plugin pod {pod_ref(p)}",
                                                    pod=pod_ref(p))
    return list(out.values())

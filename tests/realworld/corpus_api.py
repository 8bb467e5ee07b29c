"""What the API server shows: pod status, pod events, a GPU plugin pod's container status and
node conditions written by other monitors, quoted exactly from the threads.

Fed through the fake API server (test_api_feed.py) and read by `pod Y`'s and `node X`'s
API-side analyses. `context` carries the fields around the quoted message (event reason, pod
status reason, the plugin pod's container state, the condition's type/status/reason).
"""
from tests.realworld.artifact import Artifact

DP = "https://github.com/NVIDIA/k8s-device-plugin/issues/"

ARTIFACTS = [
    Artifact(
        "kubernetes#97131-gpu-lost-status", "https://github.com/kubernetes/kubernetes/issues/97131",
        "Pod Allocate failed due to device plugin GetPreferredAllocation rpc failed with err: rpc error: code = Unknown desc = Unable to retrieve list of available devices: error creating nvml.Device 5: nvml: GPU is lost, which is unexpected",
        "pod_status", "one GPU of the node is lost; the plugin's preferred allocation fails for every "
        "pod", "reboot the node (the lost GPU)", "gpu.lost", "critical", "reboot",
        {"reason": "UnexpectedAdmissionError", "phase": "Failed"}),
    Artifact(
        "k8s-device-plugin#231-gpu-lost-event", DP + "231",
        "Pod Allocate failed due to device plugin GetPreferredAllocation rpc failed with err: rpc error: code = Unknown desc = Unable to retrieve list of available devices: error creating nvml.Device 3: nvml: GPU is lost, which is unexpected",
        "event", "a single crashed GPU makes the other GPUs of the node unallocatable; Failed pods "
        "pile up (12k)", "reboot the node to recover the GPU", "gpu.lost", "critical", "reboot",
        {"reason": "UnexpectedAdmissionError", "phase": "Failed"}),
    Artifact(
        "k8s-device-plugin#1223-nvml-init-status", DP + "1223",
        "Pod was rejected: Allocate failed due to device plugin GetPreferredAllocation; unable to get device link information: error calling nvml.Init",
        "pod_status", "the running plugin's NVML init fails on every GetPreferredAllocation; "
        "5000 pods failed in an hour", "restarting that device-plugin pod fixed it",
        "nvml.init_error", "critical", "restart",
        {"reason": "UnexpectedAdmissionError", "phase": "Failed"}),
    Artifact(
        "k8s-device-plugin#1397-nvml-init-event", DP + "1397",
        "Allocate failed due to device plugin GetPreferredAllocation rpc failed with err: rpc error: code = Unknown desc = error getting list of preferred allocation devices: unable to get device link information: error calling nvml.Init: Unknown Error, which is unexpected",
        "event", "the plugin's NVML does not initialise in its process after the upgrade",
        "restart the plugin (same class as #1223)", "nvml.init_error", "critical", "restart",
        {"reason": "UnexpectedAdmissionError", "phase": "Failed"}),
    Artifact(
        "k8s-device-plugin#2038-lost-gpu-links", DP + "2038",
        "Allocate failed due to device plugin GetPreferredAllocation rpc failed\nwith err: rpc error: code = Unknown desc = error getting list of preferred allocation devices:\nunable to get device link information: ...",
        "event", "a GPU fell off the bus (Xid 79); link discovery over all GPUs fails, so every "
        "GPU pod on the node is rejected", "(PR #2039) fall back to an unaligned allocation; "
        "reboot to recover the GPU", "pod.admission_error", "critical", "refused",
        {"reason": "UnexpectedAdmissionError", "phase": "Failed"}),
    Artifact(
        "hami#71-allocate-eof", "https://github.com/Project-HAMi/HAMi/issues/71",
        "Allocate failed due to rpc error: code = Unavailable desc = error reading from server: EOF, which is unexpected",
        "event", "the device plugin dropped the connection during Allocate (it crashed or "
        "restarted)", "none reported", "pod.admission_error", "critical", "plugin",
        {"reason": "UnexpectedAdmissionError", "phase": "Failed"}),
    Artifact(
        "volcano-devices#17-gpu-id", "https://github.com/volcano-sh/devices/issues/17",
        "Allocate failed due to rpc error: code = Unknown desc = failed to find gpu id, which is unexpected",
        "event", "a GPU was hidden or failed, its index changed, and the scheduler's ids no longer "
        "match the plugin's", "volcano#2215", "pod.admission_error", "critical", "plugin",
        {"reason": "UnexpectedAdmissionError", "phase": "Failed"}),
    Artifact(
        "dra-driver-nvidia-gpu#814-not-registered",
        "https://github.com/kubernetes-sigs/dra-driver-nvidia-gpu/issues/814",
        "Failed to prepare dynamic resources: prepare dynamic resources: DRA driver compute-domain.nvidia.com is not registered",
        "event", "the ComputeDomain kubelet plugin is not registered on the node, so the pods "
        "cannot prepare their claims", "run the driver's kubelet plugin on the node",
        "dra.driver_not_registered", "critical", "kubelet-plugin",
        {"reason": "FailedPrepareDynamicResources", "phase": "Pending"}),
    Artifact(
        "kubernetes#131957-dra-not-found",
        "https://github.com/kubernetes/kubernetes/issues/131957",
        "Failed to prepare dynamic resources: failed to get gRPC client for driver dra-1411.k8s.io: plugin name dra-1411.k8s.io not found in the list of registered DRA plugins",
        "event", "no DRA driver of that name runs on the node (older kubelet wording)",
        "deploy the driver on the node (or delete the pod)", "dra.driver_not_registered",
        "critical", "kubelet-plugin",
        {"reason": "FailedPrepareDynamicResources", "phase": "Pending"}),
    Artifact(
        "k8s-device-plugin#1431-plugin-mismatch", DP + "1431",
        "failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: error during container init: error running prestart hook #0: exit status 1, stdout: , stderr: Auto-detected mode as 'legacy'\nnvidia-container-cli: initialization error: nvml error: driver/library version mismatch: unknown",
        "pod_status", "the device plugin pod fails at boot with a driver/library mismatch: the "
        "driver on disk is newer than the loaded module", "reboot the node",
        "driver.version_mismatch", "critical", "reboot",
        {"plugin_pod": "nvidia-device-plugin-daemonset-x7k2p", "reason": "StartError"}),
    Artifact(
        "gpu-operator#898-validator-mismatch", "https://github.com/NVIDIA/gpu-operator/issues/898",
        "failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: error during container init: error running hook #0: error running hook: exit status 1, stdout: , stderr: Auto-detected mode as 'legacy'\nnvidia-container-cli: initialization error: nvml error: driver/library version mismatch: unknown",
        "pod_status", "the GPU Operator's validator crash-loops on a driver/library mismatch after "
        "a driver upgrade", "reboot the node so the new module loads",
        "driver.version_mismatch", "critical", "reboot",
        {"plugin_pod": "nvidia-operator-validator-gbdf8", "reason": "StartError"}),
    Artifact(
        "nvsentinel#1270-condition-xid119",
        "https://github.com/NVIDIA/NVSentinel/pull/1270",
        "ErrorCode:119 PCI:0002:00:00 GPU_UUID:GPU-22222222-2222-2222-2222-222222222222 kernel: [16450076.435595] NVRM: Xid (PCI:0002:00:00): 119, pid=1582259, name=nvc:[driver], Timeout after 6s of waiting for RPC response from GPU1 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20802a02 0x8). Recommended Action=COMPONENT_RESET;",
        "node_condition", "NVSentinel's syslog monitor marks the node with the GSP timeout it read "
        "(Xid 119: the GPU System Processor stopped answering)",
        "NVSentinel's remediation (component reset)", "node.foreign_condition", "critical",
        "drain",
        {"type": "SysLogsXIDError", "status": "True", "reason": "SysLogsXIDErrorIsNotHealthy"}),
    Artifact(
        "steam-headless#249-no-healthy-devices",
        "https://github.com/Steam-Headless/docker-steam-headless/pull/249",
        "no healthy devices present; cannot allocate unhealthy devices nvidia.com/gpu",
        "event", "the GPU's display engine wedged (Xid 16) and the device plugin marked it "
        "unhealthy, so the kubelet refused every other GPU pod on the node",
        "fix the display configuration; a host reboot cleared the GPU", "pod.admission_error",
        "critical", "xid", {"reason": "UnexpectedAdmissionError", "phase": "Failed"}),
    Artifact(
        "dra-driver-nvidia-gpu#1218-prepare-deadline",
        "https://github.com/kubernetes-sigs/dra-driver-nvidia-gpu/pull/1218",
        "Failed to prepare dynamic resources: prepare dynamic resources: NodePrepareResources: rpc error: code = DeadlineExceeded desc = context deadline exceeded",
        "event", "the kubelet plugin's prepare of a passthrough GPU blocks: a host process still "
        "holds the GPU the driver must switch to vfio-pci", "stop the process holding the GPU",
        "dra.plugin_unresponsive", "critical", "holds",
        {"reason": "FailedPrepareDynamicResources", "phase": "Pending"}),
    Artifact(
        "dra-driver-nvidia-gpu#1162-stale-claim",
        "https://github.com/kubernetes-sigs/dra-driver-nvidia-gpu/issues/1162",
        "requested device channel-0 is already allocated to different claim 4914da61-1a20-42b3-bf26-981025df4289",
        "event", "a stale ComputeDomain PrepareResources retry succeeded after the claim was "
        "unprepared and left channel-0 allocated to the old claim in the plugin's checkpoint",
        "a driver fix; restart the kubelet plugin to rebuild its checkpoint", "dra.prepare_failed",
        "critical", "checkpoint", {"reason": "FailedPrepareDynamicResources", "phase": "Pending"}),
]

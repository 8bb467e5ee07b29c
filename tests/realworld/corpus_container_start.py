"""Real container-start failures of GPU pods: the runtime's message (containerd, CRI-O, the NVIDIA
Container Toolkit's prestart hook and CDI injection) as public threads quote it, with the cause
the thread established. Fed to `pod Y` through the fake API server by
tests/realworld/test_container_start_corpus.py: as the container's status (channel
`pod_status`) or as the kubelet's Warning event (channel `runtime_message`).

`context`: for `pod_status`, the container state that carries the message (`state`: waiting or
terminated, its `reason`); for `runtime_message`, the event's `reason`. A quote from Docker's
CLI is the same runc/hook error the kubelet reports (the hook's stderr is identical); it is
marked `"from": "docker"`.
"""
from __future__ import annotations

from .artifact import Artifact

ARTIFACTS = [
    Artifact(
        key="k8s-device-plugin#1431-driver-library-mismatch",
        source="https://github.com/NVIDIA/k8s-device-plugin/issues/1431",
        quote=("failed to create containerd task: failed to create shim task: OCI runtime "
               "create failed: runc create failed: unable to start container process: error "
               "during container init: error running prestart hook #0: exit status 1, stdout: "
               ", stderr: Auto-detected mode as 'legacy'\nnvidia-container-cli: initialization "
               "error: nvml error: driver/library version mismatch: unknown"),
        channel="pod_status",
        diagnosis="On first boot the loaded kernel module and the driver libraries differed; "
                  "after a reboot the mismatch was gone and the GPUs registered.",
        fix="reboot the node",
        expect_id="pod.gpu_start_failed", expect_severity="critical", cause_word="kernel module",
        context={"state": "terminated", "reason": "StartError",
                 "waiting": "CrashLoopBackOff"}),
    Artifact(
        key="gpustack#4130-cdi-unresolvable",
        source="https://github.com/gpustack/gpustack/issues/4130",
        quote=("Error: failed to create containerd task: failed to create shim task: OCI "
               "runtime create failed: could not apply required modification to OCI "
               "specification: error modifying OCI spec: failed to inject CDI devices: "
               "unresolvable CDI devices management.nvidia.com/gpu=0: unknown"),
        channel="runtime_message",
        diagnosis="No CDI spec on the node defined management.nvidia.com/gpu=0 (the GPU "
                  "Operator's spec lacked it).",
        fix="nvidia-ctk cdi generate --vendor management.nvidia.com --output "
            "/var/run/cdi/management.nvidia.com-gpu.yaml, then recreate the pod",
        expect_id="pod.gpu_start_failed", expect_severity="critical", cause_word="regenerate",
        context={"reason": "Failed"}),
    Artifact(
        key="nvidia-container-toolkit#1239-cdi-uuid-missing",
        source="https://github.com/NVIDIA/nvidia-container-toolkit/issues/1239",
        quote=("Error: failed to create containerd task: failed to create shim task: OCI "
               "runtime create failed: could not apply required modification to OCI "
               "specification: error modifying OCI spec: failed to inject CDI devices: "
               "unresolvable CDI devices management.nvidia.com/gpu=GPU-e78e68c0-4e6a-737e-"
               "f9cc-4223fe50aead"),
        channel="runtime_message",
        diagnosis="The generated CDI spec on the node held only `all`, not the GPU's UUID the "
                  "device plugin handed out; a manual `nvidia-ctk cdi generate` listed it.",
        fix="regenerate the CDI spec",
        expect_id="pod.gpu_start_failed", expect_severity="critical", cause_word="regenerate",
        context={"reason": "Failed"}),
    Artifact(
        key="gpu-operator#413-no-runtime-for-nvidia",
        source="https://github.com/NVIDIA/gpu-operator/issues/413",
        quote=('Failed to create pod sandbox: rpc error: code = Unknown desc = failed to get '
               'sandbox runtime: no runtime for "nvidia" is configured'),
        channel="runtime_message",
        diagnosis="The nvidia runtime handler is not in containerd's config until the GPU "
                  "Operator's driver and toolkit containers have set it up (3-4 minutes).",
        fix="wait for the toolkit (or make it run on the node); the errors then stop",
        expect_id="pod.gpu_start_failed", expect_severity="critical", cause_word="handler",
        context={"reason": "FailedCreatePodSandBox"}),
    Artifact(
        key="nvidia-container-toolkit#202-driver-rpc-timeout",
        source="https://github.com/NVIDIA/nvidia-container-toolkit/issues/202",
        quote=("docker: Error response from daemon: failed to create shim task: OCI runtime "
               "create failed: runc create failed: unable to start container process: error "
               "during container init: error running hook #0: error running hook: exit status "
               "1, stdout: , stderr: Auto-detected mode as 'legacy'\nnvidia-container-cli: "
               "initialization error: driver rpc error: timed out: unknown."),
        channel="runtime_message",
        diagnosis="The GPUs were not in persistence mode; with `nvidia-smi -pm 1` it worked "
                  "(the maintainer recommends nvidia-persistenced).",
        fix="nvidia-persistenced, or nvidia-smi -pm 1",
        expect_id="pod.gpu_start_failed", expect_severity="critical", cause_word="persistence",
        context={"reason": "Failed", "from": "docker"}),
    Artifact(
        key="nvidia-docker#1442-cuda-requirement",
        source="https://github.com/NVIDIA/nvidia-docker/issues/1442",
        quote=("docker: Error response from daemon: OCI runtime create failed: "
               "container_linux.go:370: starting container process caused: process_linux.go:"
               "459: container init caused: Running hook #0:: error running hook: exit status "
               "1, stdout: , stderr: nvidia-container-cli: requirement error: unsatisfied "
               "condition: cuda>=11.0, please update your driver to a newer version, or use an "
               "earlier cuda container: unknown."),
        channel="pod_status",
        diagnosis="A CUDA 11 image cannot run on a host driver older than 450.",
        fix="upgrade the driver, or use an image for an older CUDA",
        expect_id="pod.gpu_start_failed", expect_severity="critical", cause_word="newer driver",
        context={"state": "waiting", "reason": "RunContainerError", "from": "docker"}),
    Artifact(
        key="nvidia-container-toolkit#2102-nvcgo-rpc-timeout",
        source="https://github.com/NVIDIA/nvidia-container-toolkit/issues/2102",
        quote="nvidia-container-cli: initialization error: nvcgo rpc error: timed out",
        channel="pod_status",
        diagnosis="libnvidia-container's hard-coded 10 s RPC timeout: on a node under CPU/IO "
                  "pressure (a burst of GPU containers starting) starting the nvcgo helper "
                  "takes longer.",
        fix="none reported (the timeout is not configurable)",
        expect_id="pod.gpu_start_failed", expect_severity="critical", cause_word="pressure",
        context={"state": "waiting", "reason": "CreateContainerError"}),
    # issue 40.5: a hook the CDI spec names that is not on the node, and a hook that fails
    Artifact(
        key="talos#13021-cdi-hook-nvidia-ctk-missing",
        source="https://github.com/siderolabs/talos/issues/13021",
        quote=("error running createContainer hook #0: fork/exec /usr/bin/nvidia-ctk: no such "
               "file or directory"),
        channel="runtime_message",
        diagnosis="The device plugin's CDI spec names its hooks at /usr/bin/nvidia-ctk (its "
                  "default); Talos installs the toolkit under /usr/local/bin, and the hooks "
                  "run on the host.",
        fix="NVIDIA_CDI_HOOK_PATH=/usr/local/bin/nvidia-cdi-hook in the GPU Operator's values "
            "(siderolabs/docs#449), later /usr/bin symlinks (siderolabs/talos#13022)",
        expect_id="pod.gpu_start_failed", expect_severity="critical",
        cause_word="--nvidia-cdi-hook-path", context={"reason": "Failed"}),
    Artifact(
        key="void-packages#55062-nvidia-cdi-hook-missing",
        source="https://github.com/void-linux/void-packages/issues/55062",
        quote=("Error: runc: runc create failed: unable to start container process: error "
               "during container init: error running hook #0: fork/exec "
               "/usr/bin/nvidia-cdi-hook: no such file or directory: OCI runtime attempted to "
               "invoke a command that was not found"),
        channel="pod_status",
        diagnosis="The distribution's toolkit package did not build nvidia-cdi-hook, which the "
                  "generated CDI spec names (split out of nvidia-ctk in toolkit 1.16).",
        fix="rebuild the package with cmd/nvidia-cdi-hook",
        expect_id="pod.gpu_start_failed", expect_severity="critical",
        cause_word="not on the node",
        context={"state": "waiting", "reason": "RunContainerError", "from": "podman"}),
    Artifact(
        key="nvidia-container-toolkit#2026-createcontainer-hook-fails",
        source="https://github.com/NVIDIA/nvidia-container-toolkit/issues/2026",
        quote=("createContainer hook #6: exit status 1, stderr:\nfailed to create application "
               "profiles directory:\nmkdirat etc/nvidia/nvidia-application-profiles-rc.d: "
               "read-only file system"),
        channel="pod_status",
        diagnosis="Toolkit 1.20.0's update-application-profile CDI hook aborts container "
                  "creation when /etc/nvidia is a read-only mount in the container.",
        fix="a toolkit with the fix, or 1.19.x",
        expect_id="pod.gpu_start_failed", expect_severity="critical", cause_word="hook failed",
        context={"state": "waiting", "reason": "CreateContainerError"}),
]

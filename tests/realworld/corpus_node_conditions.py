"""Node conditions other GPU monitors write: the EKS node monitoring agent, GKE's device plugin,
NVSentinel. Quoted exactly from the source (the condition's message; its type, status and
reason in `context`, from the same source) and put on a node in the fake API server; `node X`
must say what the monitor means, not only echo it (kubectl_gpudoctor/analysis/monitors/foreign.py).
"""
from tests.realworld.artifact import Artifact

EKS = {"type": "AcceleratedHardwareReady", "status": "False"}
DCGM_ERROR = ("failed to initialize DCGM: Error connecting to nv-hostengine: Host engine "
              "connection invalid/disconnected")

ARTIFACTS = [
    Artifact(
        "eks-nma-xid79-condition",
        "https://github.com/aaithal/eks-node-monitoring-agent/blob/deab993346247c0686af65379bea344027e51732/monitors/nvidia/dcgm/dcgm_policies_test.go",
        "detected XID-79 on the instance, review kernel logs for additional information.",
        "node_condition", "the EKS agent's condition for Xid 79 (the agent's own test pins the "
        "message): a GPU fell off the bus; EKS auto repair replaces the node",
        "replace or reboot the node", "node.foreign_condition", "critical", "fallen",
        dict(EKS, reason="NvidiaXID79Error")),
    Artifact(
        "containers-roadmap#2555-dcgmerror", "https://github.com/aws/containers-roadmap/issues/2555",
        DCGM_ERROR,
        "node_condition", "the agent cannot connect to a DCGM host engine while the GPU Operator "
        "runs its own DCGM: the node is marked unhealthy and replaced, the GPUs are fine",
        "(PR #205) point the agent at the existing hostengine", "node.foreign_condition",
        "warning", "GPU Operator", dict(EKS, reason="DCGMError")),
    Artifact(
        "eks-nma#266-dcgmerror-sticky", "https://github.com/aws/eks-node-monitoring-agent/issues/266",
        DCGM_ERROR,
        "node_condition", "a boot-time race with the driver: the first DCGM connection failed, "
        "and the agent never clears DCGMError after later successes",
        "deleting the agent pod on the node cleared it", "node.foreign_condition", "warning",
        "restart the agent", dict(EKS, reason="DCGMError")),
    Artifact(
        "eks-nma#243-dcgmerror-hostport", "https://github.com/aws/eks-node-monitoring-agent/issues/243",
        "failed to initialize DCGM: error connecting to nv-hostengine:\n"
        "    Host engine connection invalid/disconnected",
        "node_condition", "the CNI has no hostPort support, so the agent never reaches the "
        "dcgm-server pod's host engine; the host engine and the GPUs are healthy",
        "(PR #244) run dcgm-server with hostNetwork", "node.foreign_condition", "warning",
        "hostPort", dict(EKS, reason="DCGMError")),
    Artifact(
        "amazon-eks-ami#2497-dcgmerror-g6f", "https://github.com/awslabs/amazon-eks-ami/issues/2497",
        DCGM_ERROR,
        "node_condition", "on a g6f node the agent cannot reach DCGM; pods run normally: a "
        "monitoring-agent problem, not the AMI's or the GPU's", "addressed in the agent",
        "node.foreign_condition", "warning", "not a GPU fault", dict(EKS, reason="DCGMError")),
    Artifact(
        "gke-cea#497-xid31-condition",
        "https://github.com/GoogleCloudPlatform/container-engine-accelerators/pull/497",
        "6e43a052-e544-467b-a972-63d7cd2ce80a",
        "node_condition", "GKE's device plugin records the Xid codes it saw in the reason; here "
        "Xid 31 from an illegal-memory-access demo program (an application fault)",
        "restart the application (the condition stays until the VM restarts)",
        "node.foreign_condition", "warning", "page fault",
        {"type": "XidCriticalError", "status": "True", "reason": '{"31":true}'}),
]

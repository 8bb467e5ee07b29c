"""A node's GPU capacity against its allocatable, as `kubectl describe node` showed it in the
thread; fed as the node's status through the fake API server (capacity and allocatable in
`context`, from the quote)."""
from tests.realworld.artifact import Artifact

XID94_DESCRIBE = (
    "Capacity:\n"
    "  cpu:                        128\n"
    "  ephemeral-storage:          7441183616Ki\n"
    "  hugepages-1Gi:              0\n"
    "  hugepages-2Mi:              8448Mi\n"
    "  memory:                     2113276288Ki\n"
    "  nvidia.com/gpu:             8\n"
    "  pods:                       110\n"
    "Allocatable:\n"
    "  cpu:                        128\n"
    "  ephemeral-storage:          6857794809152\n"
    "  hugepages-1Gi:              0\n"
    "  hugepages-2Mi:              8448Mi\n"
    "  memory:                     2062682496Ki\n"
    "  nvidia.com/gpu:             7       <=========== here\n"
    "  pods:                       110")

ARTIFACTS = [
    Artifact(
        "k8s-device-plugin#1014-7-of-8", "https://github.com/NVIDIA/k8s-device-plugin/issues/1014",
        XID94_DESCRIBE, "node_status", "the plugin marked one H100 unhealthy on an Xid 94 "
        "(contained ECC error) and never marks it healthy again", "DP_DISABLE_HEALTHCHECKS=94, "
        "or restart the plugin once the GPU is fine", "node.gpu_capacity_mismatch", "warning",
        "restarting", {"capacity": 8, "allocatable": 7}),
    Artifact(
        "gpu-operator#1065-7-of-8", "https://github.com/NVIDIA/gpu-operator/issues/1065",
        XID94_DESCRIBE, "node_status", "the operator's device plugin keeps a GPU unhealthy after "
        "an Xid 94; the GPU resource is not recovered", "DP_DISABLE_HEALTHCHECKS=94 (Xid 94 is an "
        "application error); restart the plugin", "node.gpu_capacity_mismatch", "warning",
        "Unhealthy", {"capacity": 8, "allocatable": 7}),
]

"""The standing agent's manifests: its Namespace, the ResourceQuota for its priority class and the
DaemonSet, generated here so --image and the release digest pin apply (and printable with
`agent install --dry-run -o yaml` for GitOps).

Why: the flagship incident wedges the kubelet's pod admission, so a new debug pod never starts
exactly when node-side evidence matters most; exec into an agent pod that was already running
still works. What the agent may do is exactly what the debug pod may do: its pod spec comes
from the same builder (reach/podspec.node_pod_spec), plus what a daemon needs to stay put --
`system-node-critical` priority so node pressure does not evict it, restartPolicy Always, every
taint tolerated. It runs only in the tool's own namespace; exec into it is root on the node.
"""
from __future__ import annotations

from typing import Mapping

from node_probe.protocol.version import __version__

from .. import errors
from . import probens
from . import podspec


AGENT_NAME = "gpu-doctor-agent"
DEFAULT_NAMESPACE = "gpu-doctor"
COMPONENT_LABEL = "app.kubernetes.io/component"
COMPONENT = "agent"
VERSION_LABEL = "app.kubernetes.io/version"
MANAGED_BY = ("app.kubernetes.io/managed-by", "kubectl-gpu-doctor")
SELECTOR = {podspec.APP_LABEL: podspec.APP_NAME, COMPONENT_LABEL: COMPONENT}
LABEL_SELECTOR = ",".join(f"{k}={v}" for k, v in SELECTOR.items())
IDLE_COMMAND = ("python3", "-m", "node_probe", "agent-idle")
PRIORITY_CLASS = "system-node-critical"


# The agent only sleeps; the probe it runs on request shares its limits (the debug pod's).
IDLE_REQUESTS = {"cpu": "5m", "memory": "32Mi"}
INSTALL_COMMAND = "kubectl gpu-doctor agent install"
DS_PATH = "/apis/apps/v1/namespaces/{ns}/daemonsets"
QUOTA_NAME = "gpu-doctor-agent-critical-pods"
# One agent pod per node, and Kubernetes supports clusters of up to 5,000 nodes; the DaemonSet's
# RollingUpdate (maxUnavailable, no surge) deletes a node's old pod before it creates the new
# one, so the agent never needs more. Who may use the class in the namespace is not the quota's
# job: the admission policy (reach/admission.py) admits it only on the pods the DaemonSet
# controller makes for gpu-doctor-agent.
QUOTA_PODS = 5000


def default_image() -> str:
    return podspec.DEFAULT_IMAGE


def namespace_manifest(namespace: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": namespace, "labels": {
                "app.kubernetes.io/part-of": podspec.APP_NAME,
                # the client runs probes only in namespaces with this label (probens.py)
                probens.LABEL: probens.LABEL_VALUE,
                # the agent is privileged (hostPID, host / mounted), like the debug pod
                "pod-security.kubernetes.io/enforce": "privileged",
                "pod-security.kubernetes.io/warn": "privileged",
                "pod-security.kubernetes.io/audit": "privileged"}}}


def quota_manifest(namespace: str) -> dict:
    """Clusters that limit critical priority classes to kube-system by default (the
    ResourceQuota admission `limitedResources` setup, e.g. GKE) admit `system-node-critical`
    pods elsewhere only where a quota covers that class; one agent pod per node fits in it
    (QUOTA_PODS)."""
    return {"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": QUOTA_NAME, "namespace": namespace,
                         "labels": {**SELECTOR, MANAGED_BY[0]: MANAGED_BY[1]}},
            "spec": {"hard": {"pods": str(QUOTA_PODS)},
                     "scopeSelector": {"matchExpressions": [{
                         "operator": "In", "scopeName": "PriorityClass",
                         "values": [PRIORITY_CLASS]}]}}}


def daemonset(namespace: str, image: str, node_selector: Mapping[str, str] | None = None
              ) -> dict:
    labels = {**SELECTOR, VERSION_LABEL: __version__, MANAGED_BY[0]: MANAGED_BY[1]}
    spec = podspec.node_pod_spec(image, IDLE_COMMAND, requests=IDLE_REQUESTS)
    spec.update({"priorityClassName": PRIORITY_CLASS, "restartPolicy": "Always",
                 "terminationGracePeriodSeconds": 5})
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": AGENT_NAME, "namespace": namespace, "labels": labels,
                     "annotations": {"gpu-doctor/purpose":
                                     "idle until `kubectl gpu-doctor node X` execs the "
                                     "read-only node probe in it"}},
        "spec": {
            "selector": {"matchLabels": dict(SELECTOR)},
            "updateStrategy": {"type": "RollingUpdate",
                               "rollingUpdate": {"maxUnavailable": "10%"}},
            "template": {"metadata": {"labels": labels,
                                      "annotations": {"gpu-doctor/image": image}},
                         "spec": spec},
        },
    }


def manifests(namespace: str, image: str, node_selector: Mapping[str, str] | None = None
              ) -> list[dict]:
    """Everything `agent install` creates, in order (printable for GitOps)."""
    return [namespace_manifest(namespace), quota_manifest(namespace),
            daemonset(namespace, image, node_selector)]


def parse_selector(text: str | None) -> dict[str, str]:
    """`k=v,k2=v2` (equality only: a DaemonSet's nodeSelector has nothing else)."""
    out: dict[str, str] = {}
    for term in filter(None, (t.strip() for t in (text or "").split(","))):
        k, sep, v = term.partition("=")
        if not sep or not k.strip() or "!" in k:
            raise errors.UsageError(f"--node-selector takes key=value[,key=value]: {term!r}")
        out[k.strip()] = v.strip()
    return out



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

import dataclasses
from typing import Mapping

from node_probe.protocol.version import __version__

from .. import errors
from . import agent_policy, probens
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
WATCH_COMMAND = ("python3", "-m", "node_probe", "agent-watch", "--host-root", "/host")
EVIDENCE_DIR = "/var/lib/gpu-doctor/evidence"   # node_probe/watch/ring.py DEFAULT_RING
SA_TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# watching: a pass every interval (measured: 46 MiB RSS, < 1 % of one CPU at 30 s)
WATCH_REQUESTS = {"cpu": "10m", "memory": "64Mi"}
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


@dataclasses.dataclass(frozen=True)
class Watch:
    """The agent's watch mode: `agent-watch` every `interval_s`, metrics on `metrics_port`."""

    interval_s: float = 30.0
    metrics_port: int = 0


def watch_command(w: Watch) -> list[str]:
    cmd = [*WATCH_COMMAND, "--interval", f"{w.interval_s:g}s", "--evidence-dir", EVIDENCE_DIR]
    if w.metrics_port:
        cmd += ["--metrics-port", str(w.metrics_port)]
    return cmd


def _add_watch(spec: dict, w: Watch) -> None:
    """What watching adds to the idle agent's spec: its own ServiceAccount's token (projected,
    bound to the pod and so to its node, rotated by the kubelet) with the cluster CA, the node
    name from the downward API, the evidence ring's host directory, and the metrics port."""
    spec["serviceAccountName"] = agent_policy.SA_NAME
    spec["volumes"] = [*spec["volumes"],
                       {"name": "agent-token", "projected": {"sources": [
                           {"serviceAccountToken": {"path": "token",
                                                    "expirationSeconds": 3600}},
                           {"configMap": {"name": "kube-root-ca.crt",
                                          "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}},
                       {"name": "evidence", "hostPath": {"path": EVIDENCE_DIR,
                                                         "type": "DirectoryOrCreate"}}]
    c = spec["containers"][0]
    c["volumeMounts"] = [*c["volumeMounts"],
                         {"name": "agent-token", "mountPath": SA_TOKEN_DIR, "readOnly": True},
                         {"name": "evidence", "mountPath": EVIDENCE_DIR, "readOnly": False}]
    c["env"] = [*c["env"], {"name": "NODE_NAME",
                            "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
    if w.metrics_port:
        c["ports"] = [{"name": "metrics", "containerPort": w.metrics_port, "protocol": "TCP"}]
        # the metrics port binds the pod's own IP, not 0.0.0.0 (security round 4, M-01)
        c["env"].append({"name": "POD_IP",
                         "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})


METRICS_POLICY = "gpu-doctor-agent-metrics"
SCRAPER_LABEL = "gpu-doctor.io/metrics-scraper"


def metrics_network_policy(namespace: str, port: int) -> dict:
    """Who may reach the agent's metrics port: pods in namespaces labelled
    gpu-doctor.io/metrics-scraper=true (label your Prometheus' namespace). The endpoint is plain
    HTTP as node-exporter's, node-problem-detector's and dcgm-exporter's are; this policy is
    what keeps its problem series (pod names of an isolation breach, PCI ids) from every other
    pod. Enforced by the cluster's network plugin (docs/agent.md, "Metrics")."""
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": METRICS_POLICY, "namespace": namespace,
                         "labels": {**SELECTOR, MANAGED_BY[0]: MANAGED_BY[1]}},
            "spec": {"podSelector": {"matchLabels": dict(SELECTOR)},
                     "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {
                         SCRAPER_LABEL: "true"}}}],
                                  "ports": [{"protocol": "TCP", "port": port}]}]}}


def daemonset(namespace: str, image: str, node_selector: Mapping[str, str] | None = None,
              watch: Watch | None = None) -> dict:
    labels = {**SELECTOR, VERSION_LABEL: __version__, MANAGED_BY[0]: MANAGED_BY[1]}
    if watch is None:
        spec = podspec.node_pod_spec(image, IDLE_COMMAND, requests=IDLE_REQUESTS)
    else:
        spec = podspec.node_pod_spec(image, watch_command(watch), requests=WATCH_REQUESTS)
        _add_watch(spec, watch)
    # watching, the agent's last act on SIGTERM is to mark GpuDoctorWatching False (up to 6 s)
    spec.update({"priorityClassName": PRIORITY_CLASS, "restartPolicy": "Always",
                 "terminationGracePeriodSeconds": 10 if watch else 5})
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": AGENT_NAME, "namespace": namespace, "labels": labels,
                     "annotations": {"gpu-doctor/purpose": PURPOSE_WATCH if watch else
                                     PURPOSE_IDLE}},
        "spec": {
            "selector": {"matchLabels": dict(SELECTOR)},
            "updateStrategy": {"type": "RollingUpdate",
                               "rollingUpdate": {"maxUnavailable": "10%"}},
            "template": {"metadata": {"labels": labels,
                                      "annotations": {"gpu-doctor/image": image}},
                         "spec": spec},
        },
    }


PURPOSE_IDLE = ("idle until `kubectl gpu-doctor node X` execs the read-only node probe in it")
PURPOSE_WATCH = ("watches its node: GpuDoctor* NodeConditions and Events, evidence bundles; "
                 "`kubectl gpu-doctor node X` also execs the read-only node probe in it")


def is_watching(ds: Mapping) -> bool:
    """Does this (installed) DaemonSet run the agent in watch mode?"""
    cs = (((ds.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers")
    return bool(cs) and "agent-watch" in (cs[0].get("command") or ())


def manifests(namespace: str, image: str, node_selector: Mapping[str, str] | None = None,
              watch: Watch | None = None) -> list[dict]:
    """Everything `agent install` creates, in order (printable for GitOps). Watching adds
    the agent's own identity: ServiceAccount, RBAC and the admission policies that keep it to
    its own node (reach/agent_policy.py)."""
    ident = agent_policy.manifests(namespace, {**SELECTOR, MANAGED_BY[0]: MANAGED_BY[1]}) \
        if watch else []
    if watch and watch.metrics_port:
        ident.append(metrics_network_policy(namespace, watch.metrics_port))
    return [namespace_manifest(namespace), quota_manifest(namespace), *ident,
            daemonset(namespace, image, node_selector, watch)]


def parse_selector(text: str | None) -> dict[str, str]:
    """`k=v,k2=v2` (equality only: a DaemonSet's nodeSelector has nothing else)."""
    out: dict[str, str] = {}
    for term in filter(None, (t.strip() for t in (text or "").split(","))):
        k, sep, v = term.partition("=")
        if not sep or not k.strip() or "!" in k:
            raise errors.UsageError(f"--node-selector takes key=value[,key=value]: {term!r}")
        out[k.strip()] = v.strip()
    return out



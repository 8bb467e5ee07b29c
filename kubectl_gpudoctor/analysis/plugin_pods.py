"""Which pod on a node is its GPU device plugin: the real object a restart command must name.

Why: "restart the device plugin" is the stopgap of the seed-000 wedge, and the command has to
delete the pod that exists. Each install labels that pod differently, so a fixed label selector
deletes nothing on most clusters (`app.kubernetes.io/name=nvidia-device-plugin` matches no pod
of the GPU Operator, the most common install). The labels each project puts on its plugin's pod
template, as its manifests write them:

| install | label | source |
|---|---|---|
| NVIDIA GPU Operator | `app=nvidia-device-plugin-daemonset` | NVIDIA/gpu-operator `assets/state-device-plugin/0500_daemonset.yaml` |
| NVIDIA device plugin Helm chart (EKS AL2023's documented install) | `app.kubernetes.io/name=nvidia-device-plugin` | NVIDIA/k8s-device-plugin `deployments/helm/nvidia-device-plugin/templates/_helpers.tpl` (templateLabels) |
| NVIDIA static manifest (what eksctl applies) | `name=nvidia-device-plugin-ds` | NVIDIA/k8s-device-plugin `deployments/static/nvidia-device-plugin.yml` |
| GKE | `k8s-app=nvidia-gpu-device-plugin` | GoogleCloudPlatform/container-engine-accelerators `cmd/nvidia_gpu/device-plugin.yaml` |
| HAMi | `app.kubernetes.io/component=hami-device-plugin` | Project-HAMi/HAMi `charts/hami/templates/device-plugin/daemonsetnvidia.yaml` |

(EKS Bottlerocket and EKS Auto Mode run the plugin on the host, not in a pod: nothing matches,
and the verdict says how to find it instead.) A pod whose uid the node probe saw serving the
plugin socket (its cgroup names the pod) is the surest answer and comes first; then a pod with
one of the labels above; then a DaemonSet pod whose name says device-plugin. Pure: the node's
pods in, small dicts out (namespace, name, uid, how it was recognised); the verdict validates
the names again before they reach a command.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

# (label key, value, the install it means)
LABELS: tuple[tuple[str, str, str], ...] = (
    ("app", "nvidia-device-plugin-daemonset", "GPU Operator"),
    ("app.kubernetes.io/name", "nvidia-device-plugin", "NVIDIA device plugin Helm chart"),
    ("name", "nvidia-device-plugin-ds", "NVIDIA device plugin static manifest"),
    ("k8s-app", "nvidia-gpu-device-plugin", "GKE"),
    ("app.kubernetes.io/component", "hami-device-plugin", "HAMi"),
)
MAX_PODS = 5000  # a node runs at most a few hundred; bounded anyway


def _entry(pod: Mapping[str, Any], how: str) -> dict:
    md = pod.get("metadata") or {}
    return {"namespace": str(md.get("namespace") or ""), "name": str(md.get("name") or ""),
            "uid": str(md.get("uid") or ""), "how": how}


def _finished(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def candidates(pods: Iterable[Mapping[str, Any]], uids: Sequence[str] = ()) -> list[dict]:
    """The device plugin pods among `pods` (the node's), best first: the pod whose uid the node
    probe saw serving a plugin socket (`uids`), then by label, then by DaemonSet and name."""
    wanted = [u for u in uids if isinstance(u, str) and u]
    by_uid: dict[str, dict] = {}
    labelled, named = [], []
    for i, p in enumerate(pods):
        if i >= MAX_PODS:
            break
        if not isinstance(p, Mapping) or _finished(p):
            continue
        md = p.get("metadata") or {}
        uid = str(md.get("uid") or "")
        if uid and uid in wanted:
            by_uid[uid] = _entry(p, "serves the plugin socket (seen by the node probe)")
            continue
        labels = md.get("labels") if isinstance(md.get("labels"), Mapping) else {}
        hit = next((what for k, v, what in LABELS if labels.get(k) == v), None)
        if hit:
            labelled.append(_entry(p, f"label of the {hit}"))
            continue
        owners = md.get("ownerReferences") or ()
        ds = any(isinstance(o, Mapping) and o.get("kind") == "DaemonSet" for o in owners)
        name = str(md.get("name") or "")
        if ds and "device-plugin" in name and "mps" not in name:
            named.append(_entry(p, "a DaemonSet pod named device-plugin"))
    return [by_uid[u] for u in wanted if u in by_uid] + labelled + named

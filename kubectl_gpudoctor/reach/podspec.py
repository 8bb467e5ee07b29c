"""The one pod spec builder for everything the tool runs on a node: the debug pod and the agent.

Why one builder: the admission policy admits exactly what this produces, and the debug pod and
the agent must not drift apart in what they may do (hostPID, host / read-only at /host, no
service-account token, resource limits). Labels and the default (digest-pinned) image live here.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence


from .. import build_info


DEFAULT_IMAGE_REPO = build_info.DEFAULT_IMAGE_REPO
DEFAULT_IMAGE = build_info.DEFAULT_PROBE_IMAGE.reference  # digest-pinned in release builds
APP_LABEL = "app.kubernetes.io/name"
APP_NAME = "gpu-doctor"
CONTAINER = "probe"


# host path -> (mount path, read only). The probe reads the host under /host; BCC needs the
# host's kernel modules and headers at their own paths, tracefs under /sys/kernel/debug.
HOST_MOUNTS = (
    ("host-root", "/", "/host", True),
    ("modules", "/lib/modules", "/lib/modules", True),
    ("usr-src", "/usr/src", "/usr/src", True),
    ("cgroup", "/sys/fs/cgroup", "/sys/fs/cgroup", False),  # the v2 access test joins cgroups
    ("dev", "/dev", "/dev", False),
    ("debugfs", "/sys/kernel/debug", "/sys/kernel/debug", False),
)


def label_value(text: str) -> str:
    """A valid label value (<= 63 chars, alnum at both ends) from a node name."""
    v = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in text)[:63]
    return v.strip("-_.") or "node"


def probe_args(timeout_s: float, trace_s: float, node: str,
               focus_pods: Sequence[str] = (), extra: Sequence[str] = ()) -> list[str]:
    args = ["python3", "-m", "node_probe", "-o", "jsonl", "--host-root", "/host",
            "--timeout", f"{timeout_s:g}", "--trace-seconds", f"{trace_s:g}",
            "--target-name", node]
    for uid in focus_pods:
        args += ["--focus-pod", uid]
    return args + list(extra)


def node_pod_spec(image: str, command: Sequence[str], *,
                  requests: Mapping[str, str] | None = None,
                  propagation: str | None = None) -> dict:
    """The privileged part every gpu-doctor pod on a node shares (the debug pod and the agent's
    DaemonSet template): the host PID namespace (not its network), host / read-only at /host, BCC's
    mounts, every taint tolerated, no service-account token, bounded resources. One builder,
    so the agent never gets more than the debug pod has.

    No mount propagation on the host root by default: it needs the host's / to be a shared or
    slave mount, and where it is private the runtime refuses the container (containerd:
    `path "/" is mounted on "/" but it is not a shared or slave mount`). A run of seconds sees
    the host's mounts as they are when it starts, which is all the probe reads."""
    volumes, mounts = [], []
    for name, host_path, mount_path, ro in HOST_MOUNTS:
        volumes.append({"name": name, "hostPath": {"path": host_path}})
        m = {"name": name, "mountPath": mount_path, "readOnly": ro}
        if name == "host-root" and propagation:
            m["mountPropagation"] = propagation
        mounts.append(m)
    return {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostPID": True,
        # No check needs the host's network namespace: plugin and pod-resources sockets are
        # reached by path, other processes' sockets through /proc/PID/net (hostPID).
        "hostNetwork": False,
        "dnsPolicy": "ClusterFirst",
        "tolerations": [{"operator": "Exists"}],
        "containers": [{
            "name": CONTAINER,
            "image": image,
            "imagePullPolicy": "IfNotPresent",
            "command": list(command),
            "securityContext": {"privileged": True, "runAsUser": 0},
            "resources": {"requests": dict(requests or {"cpu": "50m", "memory": "128Mi"}),
                          "limits": {"cpu": "1", "memory": "384Mi"}},
            "volumeMounts": mounts,
            "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
        }],
        "volumes": volumes,
    }


def strip_none(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: strip_none(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [strip_none(v) for v in obj]
    return obj



"""kubelet.config: the running kubelet's configuration, read through /api/v1/nodes/X/proxy/configz.

Why: several GPU failures depend on kubelet settings nobody remembers setting:
cpuManagerPolicy static rewrites device cgroups (seed 001), the cgroup driver decides how
device rules survive a daemon-reload, and reserved memory/eviction thresholds decide whether a
pod limit can starve kubelet and containerd (seed 004). /configz shows the config in effect,
not the file on disk. The memory analysis gets the dict returned here.

Pure functions over the configz JSON; no I/O.
"""
from __future__ import annotations

from typing import Any, Mapping

from node_probe.protocol import catalog
from node_probe.protocol import Finding

KEYS = ("cpuManagerPolicy", "cgroupDriver", "topologyManagerPolicy", "topologyManagerScope",
        "memoryManagerPolicy", "systemReserved", "kubeReserved", "reservedMemory",
        "evictionHard", "evictionSoft", "enforceNodeAllocatable", "systemReservedCgroup",
        "kubeReservedCgroup", "maxPods", "featureGates", "enableDebuggingHandlers",
        "enableProfilingHandler")


def extract(configz: Mapping[str, Any] | None) -> dict | None:
    """The KubeletConfiguration dict from a /configz answer ({"kubeletconfig": {...}})."""
    if not isinstance(configz, Mapping):
        return None
    cfg = configz.get("kubeletconfig", configz.get("componentconfig", configz))
    return dict(cfg) if isinstance(cfg, Mapping) else None


def analyze(node_name: str, cfg: Mapping[str, Any] | None) -> list[Finding]:
    if not cfg:
        return []
    ev = {k: cfg.get(k) for k in KEYS if cfg.get(k) not in (None, {}, [])}
    ev.setdefault("cpuManagerPolicy", cfg.get("cpuManagerPolicy") or "none")
    reserved = bool(cfg.get("systemReserved") or cfg.get("kubeReserved")
                    or cfg.get("reservedMemory"))
    ev["memory_reserved_for_system"] = reserved
    bits = [f"cpuManagerPolicy={ev['cpuManagerPolicy']}",
            f"cgroupDriver={cfg.get('cgroupDriver') or '?'}",
            "system/kube reserved set" if reserved else "no system/kube reserved memory"]
    return [catalog.make("kubelet.config", "info", f"node/{node_name}",
                         "kubelet config in effect: " + ", ".join(bits), ev, "",
                         ("https://kubernetes.io/docs/reference/config-api/kubelet-config.v1beta1/",))]

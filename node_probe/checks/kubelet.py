"""kubelet settings that break GPU containers, and whether the NVIDIA plugin guards against them.

Why (seed 001): with cpuManagerPolicy: static the kubelet updates each container's cgroup ~10 s
after start; the runtime then rewrites the device allow-list from the container spec, which
lacks the /dev/nvidia* nodes nvidia-container-runtime added behind its back, and CUDA fails with
"NVML: Unknown Error". The fix is on the plugin side: pass device specs in Allocate
(--pass-device-specs / PASS_DEVICE_SPECS=true) so the nodes are in the spec. The systemd cgroup
driver plus `systemctl daemon-reload` does the same damage. This check reads the kubelet config
(node_probe.host.kubeletconfig), publishes "kubelet.config", and checks the running NVIDIA plugin's
flags, allowed environment keys and config file.
"""
from __future__ import annotations

import re
from pathlib import Path

from node_probe.protocol import catalog
from node_probe.host import hostfs, kubeletconfig, procfs
from ..deviceplugin import discovery
from node_probe.engine.context import Skipped
from node_probe.engine.facts import KUBELET_CONFIG
from node_probe.engine.registry import check

REFS_001 = ("https://github.com/NVIDIA/nvidia-container-toolkit/issues/48",
            "https://github.com/NVIDIA/k8s-device-plugin#setting-other-helm-chart-values",
            "https://kubernetes.io/docs/tasks/administer-cluster/cpu-management-policies/")
_PASS_RE = re.compile(r"^\s*passDeviceSpecs\s*:\s*(\S+)", re.M)
_TRUE = ("1", "true", "t", "yes")


def _truthy(v: str | None) -> bool | None:
    if v is None:
        return None
    return v.strip().strip("\"'").lower() in _TRUE


def nvidia_plugins(kubelet_dir: Path, proc: Path) -> list[dict]:
    """Running NVIDIA device plugin processes: the owners of plugin sockets for nvidia.com/*
    resources. A process is never taken for the plugin by its name: any tenant can name a
    process `nvidia-device-plugin`."""
    found: dict[int, dict] = {}
    for t in discovery.discover(kubelet_dir, proc):
        if t.pid and ((t.resource or "").startswith("nvidia.com/") or "nvidia" in t.comm):
            found.setdefault(t.pid, {"pid": t.pid, "comm": t.comm, "sockets": [],
                                     "resources": [], "pod_uid": t.pod_uid})
            found[t.pid]["sockets"].append(t.socket)
            if t.resource:
                found[t.pid]["resources"].append(t.resource)
    return sorted(found.values(), key=lambda d: d["pid"])


def device_specs_setting(pid: int, proc: Path) -> dict:
    """Whether the plugin passes device specs, and where that was read from."""
    argv = procfs.read_cmdline(pid, proc)
    env = procfs.read_environ(pid, proc)
    flag = None
    for a in argv:
        if a == "--pass-device-specs":
            flag = True
        elif a.startswith("--pass-device-specs="):
            flag = _truthy(a.split("=", 1)[1])
    env_v = _truthy(env.get("PASS_DEVICE_SPECS"))
    cfg_path = kubeletconfig.flag_value(argv, "--config-file") or env.get("CONFIG_FILE")
    cfg_v = None
    if cfg_path:
        # inside the plugin's root: its absolute symlinks resolve there, not in ours
        text = hostfs.read_text(proc / str(pid) / "root", cfg_path)
        m = _PASS_RE.search(text) if text is not None else None
        cfg_v = _truthy(m.group(1)) if m else None
    # the plugin's precedence: flag, then environment, then config file
    effective = next((v for v in (flag, env_v, cfg_v) if v is not None), False)
    return {"pass_device_specs": effective, "flag": flag, "env_PASS_DEVICE_SPECS":
            env.get("PASS_DEVICE_SPECS"), "config_file": cfg_path,
            "config_passDeviceSpecs": cfg_v, "cmdline": argv}


@check("kubelet", title="kubelet config: CPU manager, cgroup driver, plugin device specs",
       timeout_s=5.0, provides=(KUBELET_CONFIG,))
def kubelet_check(ctx):
    opts = ctx.options
    proc = opts.proc_root
    here = kubeletconfig.presence(opts.kubelet_path, proc, opts.host_root)
    if not here["kubelet"] and not (opts.kubelet_path / "config.yaml").is_file():
        ctx.skip(f"not a Kubernetes node: no kubelet process, no "
                 f"{opts.kubelet_path}/device-plugins/kubelet.sock, no kubelet config")
    fact = kubeletconfig.load(opts.host_root, opts.kubelet_path, proc)
    ctx.publish(KUBELET_CONFIG, fact)
    if fact.get("error"):
        ctx.log("warning", f"kubelet config: {fact['error']}", check="kubelet")
    policy = str(fact.get("cpuManagerPolicy") or "none").lower()
    driver = str(fact.get("cgroupDriver") or "").lower()
    plugins = nvidia_plugins(opts.kubelet_path, proc)
    without = []
    for pl in plugins:
        setting = device_specs_setting(pl["pid"], proc)
        if setting["pass_device_specs"]:
            continue
        without.append(pl)
        risky = policy == "static" or driver == "systemd"
        why = []
        if policy == "static":
            why.append("cpuManagerPolicy is static")
        if driver == "systemd":
            why.append("the cgroup driver is systemd (a `systemctl daemon-reload` resets "
                       "device rules)")
        name = ", ".join(pl["resources"]) or pl["comm"]
        yield catalog.make(
            "deviceplugin.no_device_specs", "warning" if risky else "info",
            f"{name} plugin (pid {pl['pid']})",
            f"The NVIDIA device plugin (pid {pl['pid']}) does not pass device specs"
            + (f" while {' and '.join(why)}" if why else ""),
            {"pid": pl["pid"], "comm": pl["comm"], "sockets": pl["sockets"],
             "resources": pl["resources"], "pod_uid": pl["pod_uid"], **setting,
             "cpuManagerPolicy": policy, "cgroupDriver": driver or None,
             "kubelet_config": fact.get("path")},
            "Without device specs in Allocate, the container spec does not list /dev/nvidia*; "
            "when the kubelet (static CPU manager) or systemd later rewrites the container's "
            "device cgroup from the spec, GPU access is lost ('NVML: Unknown Error'). Run the "
            "plugin with --pass-device-specs=true (env PASS_DEVICE_SPECS=true; Helm: "
            "--set passDeviceSpecs=true; the GPU Operator sets it by default) and recreate GPU "
            "pods.", REFS_001)
    if fact.get("error") and fact.get("cpuManagerPolicy") is None:
        return Skipped(f"kubelet config not read ({fact['error']}): cpuManagerPolicy and "
                       "cgroupDriver unknown, no CPU-manager verdict")
    if policy == "static":
        sev = "warning" if without else "info"
        title = ("kubelet runs cpuManagerPolicy static and the NVIDIA plugin does not pass "
                 "device specs: GPU containers lose their devices after start"
                 if without else
                 "kubelet runs cpuManagerPolicy static" + (
                     " (the NVIDIA plugin passes device specs, which protects GPU containers)"
                     if plugins else " (no NVIDIA device plugin process found)"))
        yield catalog.make(
            "kubelet.cpu_manager_static", sev, "node", title,
            {"cpuManagerPolicy": fact.get("cpuManagerPolicy"), "config": fact.get("path"),
             "config_source": fact.get("source"), "kubelet_pid": fact.get("pid"),
             "flags": fact.get("flags"), "cgroupDriver": fact.get("cgroupDriver"),
             "reservedSystemCPUs": fact.get("reservedSystemCPUs"),
             "nvidia_plugins_without_device_specs": [p["pid"] for p in without],
             "nvidia_plugins": [p["pid"] for p in plugins]},
            ("Make the NVIDIA device plugin pass device specs (--pass-device-specs=true / "
             "PASS_DEVICE_SPECS=true) and recreate GPU pods. Changing cpuManagerPolicy instead "
             "needs the kubelet's cpu_manager_state removed and a kubelet restart on a drained "
             "node." if without else
             "Nothing to do while the plugin passes device specs; keep it that way when "
             "upgrading the plugin or its Helm values."), REFS_001)

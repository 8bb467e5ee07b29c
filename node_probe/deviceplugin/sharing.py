"""GPU sharing as the NVIDIA device plugin is configured vs what it advertises to the kubelet.

Why: time-slicing and MPS are configured in the plugin's config file (`--config-file` /
`$CONFIG_FILE`, a ConfigMap the GPU Operator's config-manager writes to /config/config.yaml):
`sharing.timeSlicing` or `sharing.mps` with `resources: [{name, replicas, rename}]` and
`renameByDefault` (advertise `<name>.shared`). The plugin reads it only when it starts, so an
edited ConfigMap, a wrong node label selecting another config, or a crash-looping config
manager leave the node advertising something else: `nvidia.com/gpu` with one device per GPU
while users were told to request `nvidia.com/gpu.shared`, or N x replicas devices that are not
shared any more. MPS sharing also needs the MPS control daemon (nvidia-cuda-mps-control) on
the node; without it the shared devices cannot run CUDA work.

Reads the file inside the plugin's own root (/proc/PID/root), bounded; YAML through the
kubelet config reader (no PyYAML in the probe), JSON too.
"""
from __future__ import annotations

import json
from pathlib import Path

from node_probe.host import hostfs, kubeletconfig, procfs
from node_probe.protocol import catalog

CONFIG_CAP = 1 << 16
STRATEGIES = ("timeSlicing", "mps")
MPS_COMMS = ("nvidia-cuda-mps",)    # nvidia-cuda-mps-control / -server (comm is 15 chars)
MAX_PROCS = 100_000
REFS = ("https://github.com/NVIDIA/k8s-device-plugin#shared-access-to-gpus",
        "https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/gpu-sharing.html")


def read_config(pid: int, proc: Path) -> tuple[str | None, dict | None, str | None]:
    """(config path, parsed config, error) of the plugin process `pid`; path None when it
    runs without a config file."""
    argv = procfs.read_cmdline(pid, proc)
    env = procfs.read_environ(pid, proc)
    path = kubeletconfig.flag_value(argv, "--config-file") or env.get("CONFIG_FILE")
    if not path:
        return None, None, None
    text = hostfs.read_text(proc / str(pid) / "root", path, CONFIG_CAP)
    if text is None:
        return path, None, f"cannot read {path} in the plugin's root"
    try:
        doc = json.loads(text) if text.lstrip().startswith("{") else kubeletconfig.parse_yaml(text)
    except (ValueError, kubeletconfig.YamlError) as exc:
        return path, None, f"cannot parse {path}: {exc}"
    except RecursionError:
        return path, None, f"cannot parse {path}: nested deeper than the parser's limit"
    return path, doc if isinstance(doc, dict) else None, None


def plan(cfg: dict) -> dict | None:
    """{"strategy", "rename_by_default", "resources": [{"name", "advertised_as",
    "replicas"}]} of the config's sharing section; None when it shares nothing."""
    sharing = cfg.get("sharing") if isinstance(cfg.get("sharing"), dict) else {}
    for strategy in STRATEGIES:
        sec = sharing.get(strategy)
        if not isinstance(sec, dict) or not isinstance(sec.get("resources"), list):
            continue
        by_default = sec.get("renameByDefault") is True
        out = []
        for r in sec["resources"][:64]:
            if not isinstance(r, dict) or not isinstance(r.get("name"), str):
                continue
            name = r["name"]
            rename = r.get("rename") if isinstance(r.get("rename"), str) else None
            if rename and "/" not in rename:
                rename = name.split("/", 1)[0] + "/" + rename
            replicas = r.get("replicas") if isinstance(r.get("replicas"), int) else 1
            out.append({"name": name, "replicas": replicas,
                        "advertised_as": rename or (name + ".shared" if by_default else name)})
        if out:
            return {"strategy": strategy, "rename_by_default": by_default, "resources": out}
    return None


def _base(dev_id: str) -> str:
    return dev_id.partition("::")[0]


def mps_daemon_pids(proc: Path) -> list[int]:
    out = []
    for n, pid in enumerate(procfs.pids(proc)):
        if n >= MAX_PROCS:
            break
        if procfs.read_comm(pid, proc).startswith(MPS_COMMS):
            out.append(pid)
    return out


def judge(resource: str | None, device_ids: list[str], pid: int, proc: Path):
    """Findings for one NVIDIA plugin process advertising `device_ids` as `resource`."""
    path, cfg, err = read_config(pid, proc)
    if path is None or cfg is None:
        return
    p = plan(cfg)
    gpus = sorted({_base(d) for d in device_ids})
    shared_ids = any("::" in d for d in device_ids)
    ev = {"plugin_pid": pid, "config_file": path, "advertised_resource": resource,
          "advertised_devices": len(device_ids), "gpus": len(gpus), "sharing": p}
    problems = []
    if p is None:
        if shared_ids:
            problems.append("the config shares nothing, yet the plugin advertises replicated "
                            "devices (GPU-...::N): it runs an older config")
    else:
        entry = next((r for r in p["resources"] if r["advertised_as"] == resource), None)
        by_name = next((r for r in p["resources"]
                        if resource in (r["name"], r["name"] + ".shared")), None)
        if entry is None and by_name is not None:
            entry = by_name
            problems.append(f"the config advertises {by_name['name']} as "
                            f"{by_name['advertised_as']}, but the node gets {resource}")
        if entry is not None and device_ids:
            want = len(gpus) * entry["replicas"]
            if len(device_ids) != want:
                problems.append(f"{entry['replicas']} replicas x {len(gpus)} GPU(s) = {want} "
                                f"devices expected, {len(device_ids)} advertised")
            ev["expected_devices"] = want
        if p["strategy"] == "mps" and entry is not None:
            ev["mps_control_daemon_pids"] = mps_daemon_pids(proc)
            if not ev["mps_control_daemon_pids"]:
                yield catalog.make(
                    "sharing.mps_daemon_missing", "critical", f"pid {pid} ({resource})",
                    f"{resource} is shared with MPS but no MPS control daemon "
                    "(nvidia-cuda-mps-control) runs on the node", ev,
                    "Pods given these devices cannot run CUDA work until the daemon runs. "
                    "With the GPU Operator or the plugin's Helm chart, check the "
                    "nvidia-device-plugin-mps-control-daemon pods on this node (kubectl get "
                    "pods -A -o wide | grep mps-control-daemon) and their logs; the node needs "
                    "the label nvidia.com/mps.capable=true for the daemon to be scheduled.",
                    REFS)
    if problems:
        ev["problems"] = problems
        yield catalog.make(
            "sharing.misconfigured", "warning", f"pid {pid} ({resource})",
            f"GPU sharing config and what the node advertises disagree: {problems[0]}", ev,
            "The plugin reads its config only at start: restart the device plugin pod on this "
            "node (kubectl delete pod of the nvidia-device-plugin daemonset here) so it "
            "advertises what the config says, and check the node's "
            "nvidia.com/device-plugin.config label selects the intended config. Risk: while it "
            "restarts the node's GPUs are not advertised; running pods keep theirs. Tell users "
            "the resource name the node will advertise (nvidia.com/gpu or "
            "nvidia.com/gpu.shared).",
            REFS)

"""A GPU container whose runtime never gave it the NVIDIA devices: runtime.not_wired.

Why: a denied NVIDIA device looks the same in the device cgroup whether something took it away
(a rewrite: seed 001) or nobody ever put it there. The second is a node whose runtime is not
wired for GPUs: no nvidia runtime handler as the default (nvidia-container-runtime's hook adds
the devices), no CDI, and a device plugin that lists GPUs only in NVIDIA_VISIBLE_DEVICES with no
device specs. Then the container's OCI spec (config.json, what the runtime applies and
re-applies) holds no NVIDIA device, no allow rule for one and no NVIDIA hook, and "recreate the
pod" or "find the rewriter" are wrong fixes. A rewrite is claimed only when the spec shows the
devices were there first; this module decides the other case and says how to wire the runtime.
"""
from __future__ import annotations

from pathlib import Path

from node_probe.host import containers, layout, nvidia_devices, runtime_config
from node_probe.protocol import Finding, catalog

REFS = ("https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html",
        "https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/cdi-support.html",
        "https://github.com/NVIDIA/k8s-device-plugin#configuration-option-details")
MAX_RULES_SHOWN = 16


def _spec_holds(meta: dict, d: nvidia_devices.Device) -> bool:
    for s in meta.get("spec_devices") or ():
        if s.get("path") == d.path or (s.get("major"), s.get("minor")) == (d.major, d.minor):
            return True
    for r in meta.get("spec_device_rules") or ():
        if r.get("allow") and r.get("type") in ("c", "a", None) \
                and r.get("major") in (None, -1, d.major) and r.get("minor") in (None, -1, d.minor):
            return True
    return False


def never_wired(c: containers.Container, exp: nvidia_devices.Expectation) -> bool:
    """The container's runtime spec is known and never held any NVIDIA device it should have
    (no device entry, no allow rule, no NVIDIA hook), and the plugin gave no device specs."""
    meta = c.meta
    if "spec_devices" not in meta and "spec_device_rules" not in meta:
        return False          # no spec read: cannot tell a rewrite from never-wired
    if meta.get("spec_nvidia_hook") or c.alloc_devices:
        return False
    return not any(_spec_holds(meta, d) for d in exp.devices)


def _wiring(host_root: Path, proc: Path) -> dict:
    rt = layout.runtime(host_root, proc)
    cfgs = [x for x in (runtime_config.containerd(host_root, proc),
                        runtime_config.crio(host_root, proc)) if x is not None]
    cfg = next((x for x in cfgs if x.runtime == rt.name), cfgs[0] if cfgs else None)
    specs = [s.path for s in runtime_config.cdi_specs(host_root) if s.is_nvidia]
    return {"runtime": cfg.runtime if cfg else rt.name,
            "runtime_config_files": list(cfg.files) if cfg else [],
            "runtime_handlers": sorted(cfg.handlers) if cfg else [],
            "nvidia_handlers": cfg.nvidia_handlers if cfg else [],
            "default_handler": cfg.default_handler if cfg else None,
            "cdi_enabled": cfg.cdi_enabled if cfg else None, "nvidia_cdi_specs": specs}


def finding(c: containers.Container, exp: nvidia_devices.Expectation, denied, host_root: Path,
            proc: Path, passes_specs: bool | None) -> Finding:
    w = _wiring(host_root, proc)
    paths = ", ".join(d.path for d in denied)
    rt = w["runtime"] or "the container runtime"
    missing = []
    if not (w["default_handler"] or "").startswith("nvidia"):
        missing.append(f"{rt}'s default handler is {w['default_handler'] or 'runc'}"
                       + (f" (nvidia handlers configured but not used by default: "
                          f"{', '.join(w['nvidia_handlers'])})" if w["nvidia_handlers"]
                          else ", with no nvidia handler"))
    if not w["nvidia_cdi_specs"] or w["cdi_enabled"] is False:
        missing.append("no CDI" + (" (CDI is disabled in the runtime)" if w["cdi_enabled"]
                                   is False else " specs for NVIDIA devices"))
    if passes_specs is not True:
        missing.append("the device plugin passes no device specs (GPUs only in "
                       "NVIDIA_VISIBLE_DEVICES)")
    evidence = {
        "pod_uid": c.ref.pod_uid, "namespace": c.meta.get("namespace"), "pod": c.meta.get("pod"),
        "container": c.meta.get("container"), "container_id": c.ref.container_id,
        "gpu_source": c.gpu_source, "gpu_ids": list(c.gpu_ids),
        "denied": [d.to_dict() for d in denied],
        "spec": c.meta.get("bundle_config"),
        "spec_device_rules": (c.meta.get("spec_device_rules") or [])[:MAX_RULES_SHOWN],
        "spec_devices": (c.meta.get("spec_devices") or [])[:MAX_RULES_SHOWN],
        "allocate_device_specs": c.alloc_devices, "plugin_passes_device_specs": passes_specs,
        **w, "missing": missing}
    return catalog.make(
        "runtime.not_wired", "critical", c.subject,
        f"Container {c.container_label} in pod {c.pod_label} was never given its GPU: its "
        f"runtime spec holds none of {paths} (the runtime is not wired for NVIDIA GPUs)",
        evidence,
        "Cause: " + "; ".join(missing or ["nothing added the NVIDIA devices to the container"])
        + ". Fix: wire the runtime for GPUs, one of: make the NVIDIA runtime the default "
        f"(`nvidia-ctk runtime configure --runtime={'crio' if rt == 'cri-o' else 'containerd'} "
        "--set-as-default`, restart the runtime; with the GPU Operator the toolkit daemonset "
        "does it) or give GPU pods `runtimeClassName: nvidia`; or use CDI (`nvidia-ctk cdi "
        "generate --output=/var/run/cdi/nvidia.yaml`, enable_cdi in containerd, device plugin "
        "`--device-list-strategy=cdi-annotations` or `cdi-cri`); or have the device plugin pass "
        "device specs (`--pass-device-specs=true`). Then recreate the pod: recreating it "
        "without wiring the runtime gives the same result.", REFS)

"""Container runtime and CDI wiring: an `nvidia` runtime handler (or CDI) in containerd/CRI-O,
and CDI specs that name the driver version that is loaded.

Why: pods with `runtimeClassName: nvidia` fail to start ("no runtime for \"nvidia\" is
configured") when the runtime config lacks the handler (a containerd config rewritten by a node
image upgrade, the toolkit's drop-in not imported). CDI specs are generated once for the driver
of that moment: after a driver upgrade they still name the old libraries, and containers fail
to start (missing files) or get mismatched libraries ("driver/library version mismatch").
"""
from __future__ import annotations

from node_probe.checks import _gpufacts
from node_probe.checks.nvml import kernel_module_version
from node_probe.engine.registry import check
from node_probe.host import hostfs, layout, runtime_config
from node_probe.protocol import catalog

RUNTIME_REFS = ("https://github.com/NVIDIA/gpu-operator/issues/413",
                "https://github.com/NVIDIA/gpu-operator/issues/730",
                "https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html")
CDI_REFS = ("https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/cdi-support.html",
            "https://github.com/NVIDIA/nvidia-container-toolkit/issues/856",
            "https://github.com/NVIDIA/nvidia-container-toolkit/issues/1239")
MAX_MISSING_SHOWN = 10


@check("runtime_cdi", title="Container runtime nvidia handler and CDI specs vs the loaded driver",
       timeout_s=14.0, uses=(_gpufacts.NVML,))
def runtime_cdi_check(ctx):
    root = ctx.options.host_root
    drv = layout.driver_root(root, ctx.options.proc_root)   # the same answer nvml uses
    if not drv.present:
        ctx.skip(f"no NVIDIA driver under {root} (looked in {', '.join(drv.tried)}: "
                 f"{drv.how}): no GPU wiring to judge")
    specs = [s for s in runtime_config.cdi_specs(root) if s.is_nvidia]
    cfgs = [c for c in (runtime_config.containerd(root, ctx.options.proc_root),
                        runtime_config.crio(root, ctx.options.proc_root)) if c is not None]
    for cfg in cfgs:
        for err in cfg.errors:
            ctx.log("warning", f"runtime config not parsed: {err}", check="runtime_cdi")
        if cfg.nvidia_handlers or (cfg.default_handler or "").startswith("nvidia"):
            continue
        if cfg.errors and not cfg.handlers:
            continue  # could not read it: said so in the log, no verdict
        cdi_path = bool(specs) and cfg.cdi_enabled is not False
        # GKE's own device plugin mounts the devices and libraries of its driver installer
        # in Allocate: no NVIDIA runtime or CDI is needed there
        gke = drv.root == layout.GKE_DRIVER_ROOT
        yield catalog.make(
            "runtime.handler_missing", "info" if cdi_path or gke else "warning", "node",
            f"{cfg.runtime} has no nvidia runtime handler (handlers: "
            f"{', '.join(sorted(cfg.handlers)) or 'none'}): pods with runtimeClassName: "
            "nvidia fail with 'no runtime for \"nvidia\" is configured'"
            + (" (GKE's device plugin injects GPUs itself)" if gke else "" if cdi_path
               else ", and without CDI no pod gets GPUs injected"),
            {**cfg.to_dict(), "nvidia_cdi_specs": [s.path for s in specs]},
            "Configure the runtime with the NVIDIA Container Toolkit (`nvidia-ctk runtime "
            f"configure --runtime={'crio' if cfg.runtime == 'cri-o' else 'containerd'}` then "
            "restart the runtime; with the GPU Operator the toolkit daemonset does it and "
            "must run on this node). If the toolkit writes a drop-in, the main config must "
            "import it (`imports = [...]`).", RUNTIME_REFS)

    if not specs:
        return
    nv, why = _gpufacts.nvml(ctx, want_s=10.0)
    loaded = (nv or {}).get("driver_version") if why is None else None
    loaded = loaded or kernel_module_version(root)
    if not loaded:
        return
    for spec in specs:
        other = [v for v in spec.driver_versions if v != loaded]
        if not other:
            continue
        missing = [p for p in spec.host_paths if runtime_config.driver_version_of_path(p)
                   and hostfs.resolve(root, p) is None]
        yield catalog.make(
            "cdi.spec_version_mismatch", "critical" if missing else "warning", spec.path,
            f"CDI spec {spec.path} ({spec.kind}) names driver {', '.join(other)} files but "
            f"driver {loaded} is loaded"
            + (f"; {len(missing)} of its host paths no longer exist, so containers given "
               "these devices fail to start" if missing else ""),
            {"spec": spec.path, "kind": spec.kind, "spec_driver_versions": list(spec.driver_versions),
             "loaded_driver_version": loaded, "host_paths": len(spec.host_paths),
             "missing_host_paths": missing[:MAX_MISSING_SHOWN], "missing_count": len(missing)},
            "Regenerate the spec for the loaded driver (`nvidia-ctk cdi generate "
            f"--output={spec.path}`, or restart nvidia-cdi-refresh.service; with the GPU "
            "Operator restart the toolkit daemonset pod on this node), then recreate the "
            "affected pods.", CDI_REFS)

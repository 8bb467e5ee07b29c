"""Driver versions: known-bad builds under this node's conditions, and kernel/library mismatch.

Why separate from the NVML check: these verdicts must also work when NVML itself hangs or
fails. The version then comes from the library's file name and from
proc/driver/nvidia/version, and a hang on a known-bad build is the strongest evidence of all.
"""
from __future__ import annotations

from node_probe.protocol import catalog
from node_probe.protocol import known_drivers
from node_probe.engine.context import Skipped
from node_probe.engine.facts import NVML
from node_probe.engine.registry import check


@check("driver", title="Driver version: known-bad builds, kernel module vs library",
       timeout_s=14.0, needs=(NVML,))
def driver_check(ctx):
    nv = ctx.fact(NVML, timeout=ctx.budget(13.0), default=None)
    if nv is None:
        return Skipped("the nvml check published no driver facts: no driver version to judge")
    lib_v = nv.library_version
    kmod_v = nv.kernel_module_version
    nvml_v = nv.driver_version if nv.status == "ok" else None
    user_v = nvml_v or lib_v
    if not (user_v or kmod_v):
        root = ctx.options.host_root
        return Skipped(f"no NVIDIA driver version under {root}: no proc/driver/nvidia/version, "
                       + (f"and the library {nv.library} carries none" if nv.library else
                          "no libnvidia-ml.so.1") + f" (NVML {nv.status})")
    if kmod_v and user_v and kmod_v != user_v:
        yield catalog.make(
            "driver.version_mismatch", "critical", "node",
            f"Kernel module {kmod_v} but user-space driver library {user_v}",
            {"kernel_module_version": kmod_v, "library_version": user_v,
             "library": nv.library},
            "A driver upgrade replaced the libraries but the old kernel module is still "
            "loaded. Drain the node and reboot it (or unload and reload the nvidia modules) so "
            "both are the same version.",
            ("https://docs.nvidia.com/deploy/nvml-api/group__nvmlDeviceEnumvs.html",))

    version = user_v or kmod_v
    for m in known_drivers.match(version, nv.gpu_records()):
        issue = m.issue
        hung = nv.status == "hang"
        if m.condition_met or hung:
            severity = "critical"
            why = ("and NVML init hangs on this node right now" if hung and not m.condition_met
                   else f"and this node has {issue.condition_text}")
        elif m.condition_met is None:
            severity = "warning"
            why = f"(trigger: {issue.condition_text}; could not tell whether it applies)"
        else:
            severity = "info"
            why = f"(trigger {issue.condition_text!r} not present now)"
        yield catalog.make(
            "driver.known_bad", severity, "node",
            f"Driver {m.driver_version} has a known failure {why}",
            {"driver_version": m.driver_version, "trigger": issue.condition_text,
             "trigger_present": m.condition_met, "nvml_status": nv.status,
             "symptom": issue.symptom, "fixed_in": list(issue.fixed_in)},
            issue.workaround, issue.refs)

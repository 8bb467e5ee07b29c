"""Where things are on this node, as every other check sees it: the report's first answer.

Why: when a check says "no kubelet socket" or "no NVIDIA driver", the user needs to know where
the probe looked and why there. This check asks the resolvers of host.layout (the same cached
answers the other checks use) and reports each decision with how it was made, in one
`phase: layout` progress record and an info log line per question. It judges nothing.
"""
from __future__ import annotations

from node_probe.engine.registry import check
from node_probe.host import kubeletconfig, layout


@check("layout", title="Where things are: kubelet dir, container runtime, NVIDIA driver, cgroups",
       timeout_s=5.0)
def layout_check(ctx):
    opts = ctx.options
    kdir = layout.kubelet_dir(opts.host_root, opts.proc_root, opts.kubelet_dir)
    rt = layout.runtime(opts.host_root, opts.proc_root)
    drv = layout.driver_root(opts.host_root, opts.proc_root, kdir.path)
    cfg = kubeletconfig.load(opts.host_root, kdir.path, opts.proc_root)
    cg = layout.resolve_cgroups(opts.cgroup_dir, cfg)
    said = {"kubelet_dir": kdir.to_dict(), "runtime": rt.to_dict(),
            "driver_root": drv.to_dict(), "cgroups": cg.to_dict()}
    ctx.progress(phase="layout", check="layout", **said)
    ctx.log("info", f"kubelet dir {kdir.path}: {kdir.how}", check="layout")
    ctx.log("info", f"container runtime {rt.name or 'unknown'}"
                    + (f" (state {rt.state_dir})" if rt.state_dir else "") + f": {rt.how}",
            check="layout")
    ctx.log("info", "NVIDIA driver root "
                    + ("unknown" if drv.root is None else "/" + drv.root) + f": {drv.how}",
            check="layout")
    ctx.log("info", f"cgroups: {cg.how}" + (f", driver {cg.driver}" if cg.driver else ""),
            check="layout")
    return None

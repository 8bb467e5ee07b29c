"""DRA on the node: which kubelet plugins are registered, and do the DRA ones answer.

Why: with Dynamic Resource Allocation the GPU driver's kubelet plugin prepares every claim before
a container starts. If it hangs or died with its socket left behind, the kubelet's
NodePrepareResources calls time out and pods stay ContainerCreating; the API shows only
"FailedPrepareDynamicResources". The probe asks each registration socket `GetInfo` and each DRA
endpoint a gRPC health check, each with a short deadline (read-only; never Prepare/Unprepare).
"""
from __future__ import annotations

import time

from node_probe.engine.registry import check
from node_probe.host import dra_plugins
from node_probe.protocol import catalog

DEADLINE_S = 2.0
TOTAL_S = 9.0   # all sockets together, inside the check's 12 s
REFS = ("https://kubernetes.io/docs/concepts/scheduling-eviction/dynamic-resource-allocation/",
        "https://github.com/kubernetes-sigs/dra-example-driver/issues/126",
        "https://github.com/kubernetes/kubernetes/issues/131957")


@check("dra_node", title="kubelet DRA plugins: registration and endpoint answer", timeout_s=12.0)
def dra_node_check(ctx):
    kdir = ctx.options.kubelet_path
    if not (kdir / "plugins_registry").is_dir():
        ctx.skip(f"no {kdir}/plugins_registry: no kubelet plugin registrations to ask")
    socks = dra_plugins.registration_sockets(kdir)
    plugins = []
    stop_at = time.monotonic() + TOTAL_S
    for sock in socks:
        if time.monotonic() + DEADLINE_S > stop_at:
            plugins.append({"registration_socket": sock.name,
                            "get_info": {"status": "not_probed", "reason": "check time budget"}})
            continue
        deadline = ctx.budget(DEADLINE_S, reserve=1.0)
        info = dra_plugins.get_info(sock, deadline)
        row = {"registration_socket": sock.name, "get_info": info.to_dict()}
        if info.status == "ok":
            row.update(info.value)
        plugins.append(row)
        if info.status != "ok":
            yield catalog.make(
                "dra.plugin_unresponsive", "critical" if info.status in ("timeout", "unavailable")
                else "warning", f"plugin {sock.name}",
                f"Plugin registration socket {sock.name} did not answer GetInfo "
                f"({info.status} after {info.duration_s:.1f}s)",
                {"registration_socket": str(sock), "rpc": "GetInfo", **info.to_dict(),
                 "deadline_s": round(deadline, 2)},
                "The plugin behind this socket is hung, stopped or gone with its socket left "
                "behind. The kubelet cannot (re)register it, and if it is a DRA driver, pods "
                "using its claims stay ContainerCreating. Check the driver's kubelet-plugin pod "
                "on this node (`kubectl -n <ns> get pods -o wide --field-selector "
                "spec.nodeName=<node>`), its logs, and restart it.", REFS)
            continue
        if info.value.get("type") != "DRAPlugin":
            continue
        ep = dra_plugins.endpoint_path(info.value.get("endpoint") or "", ctx.options.host_root,
                                       kdir)
        deadline = ctx.budget(DEADLINE_S, reserve=1.0)
        h = (dra_plugins.health(ep, deadline) if ep is not None else dra_plugins.Call(
            "unavailable", 0.0, detail="no socket at the endpoint inside the host root"))
        row["endpoint_call"] = h.to_dict()
        if h.status == "ok":
            row["endpoint_health"] = h.value
        if not h.answered or (h.status == "ok" and h.value == "NOT_SERVING"):
            yield catalog.make(
                "dra.plugin_unresponsive", "critical", f"dra/{info.value.get('name')}",
                f"DRA driver {info.value.get('name')} is registered but its endpoint "
                f"{info.value.get('endpoint')} does not answer ({h.status}"
                + (f" {h.value}" if h.status == "ok" else f" after {h.duration_s:.1f}s")
                + "): NodePrepareResources for its claims will fail or hang",
                {"driver": info.value.get("name"), "endpoint": info.value.get("endpoint"),
                 "registration_socket": str(sock), "rpc": "grpc.health.v1.Health/Check",
                 **h.to_dict(), "health": h.value if h.status == "ok" else None,
                 "deadline_s": round(deadline, 2),
                 "supported_versions": info.value.get("supported_versions")},
                "Look at the driver's kubelet-plugin pod on this node (logs, restarts) and "
                "restart it; pods waiting on its claims show FailedPrepareDynamicResources "
                "events. The kubelet retries Prepare once the plugin answers again.", REFS)
    dra = [p for p in plugins if p.get("type") == "DRAPlugin"]
    # sockets serving under plugins/<name>/ that no registration names: the kubelet does not
    # know them ("not found in the list of registered DRA plugins")
    endpoints = {str(dra_plugins.endpoint_path(p.get("endpoint") or "", ctx.options.host_root,
                                               kdir)) for p in plugins if p.get("endpoint")}
    unregistered = [str(s.relative_to(kdir)) for s in dra_plugins.plugin_sockets(kdir)
                    if str(s) not in endpoints]
    if not plugins and not unregistered:
        return
    yield catalog.make(
        "dra.plugins", "info", "node",
        f"{len(plugins)} kubelet plugin registration(s), {len(dra)} DRA driver(s)"
        + (": " + ", ".join(p.get("name") or "?" for p in dra) if dra else "")
        + (f"; {len(unregistered)} plugin socket(s) no registration names" if unregistered
           else ""),
        {"plugins": plugins, "plugins_registry": str(kdir / "plugins_registry"),
         "unregistered_sockets": unregistered})

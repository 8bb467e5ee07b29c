"""Slow GPUs: the degradations that raise no Xid, judged on this node (issue 38).

Why: a GPU at PCIe Gen2, held down by heat or power, with an NVLink down, or a pod whose CPUs
sit on the other socket, runs slow and says nothing. This check gathers what the judges of
node_probe/checks/slow need -- the NVML child's GPU records (the `nvml` fact), the sysfs link
chain and NUMA node of each GPU (host.pcie_links), the pods holding each GPU and their cpusets
(the `containers` fact, from pod-resources), the kubelet's topology manager policy -- and
hands them over; the verdicts are theirs, shared with the offline parsers and the agent.
"""
from __future__ import annotations

from node_probe.checks import _gpufacts
from node_probe.checks.slow import judge, placement
from node_probe.engine.facts import CONTAINERS, KUBELET_CONFIG, PODRESOURCES
from node_probe.engine.registry import check
from node_probe.host import numa, pcie_links

CONTAINERS_WAIT_S = 3.0


def gpu_links(root, gpus: list[dict]) -> tuple[dict, dict]:
    """({bdf: link record} for every GPU and the bridges above it, {uuid: numa node})."""
    links: dict[str, dict] = {}
    nodes: dict[str, int | None] = {}
    cache: dict = {}
    for g in gpus:
        bdf = judge.norm_bdf(g.get("pci_bus_id"))
        if not bdf:
            continue
        chain = pcie_links.chain(root, bdf, cache)
        for rec in chain:
            links.setdefault(rec["bdf"], rec)
        nodes[str(g.get("uuid"))] = chain[0]["numa_node"] if chain else None
    return links, nodes


def holders(found) -> tuple[dict[str, list[str]], dict[str, list[dict]], list[dict]]:
    """From the containers fact: {GPU uuid: ["ns/pod"]}, {GPU uuid: [{pod, containers,
    pids}]} and the placements (pod, container, cpus, gpus) for the NUMA judge."""
    by_gpu: dict[str, dict[str, dict]] = {}
    places = []
    for c in found.gpu if found is not None else ():
        uuids = sorted({str(i).split("::")[0] for i in c.gpu_ids if str(i).startswith("GPU-")})
        for u in uuids:
            row = by_gpu.setdefault(u, {}).setdefault(
                c.pod_label, {"pod": c.pod_label, "containers": [], "pids": []})
            row["containers"].append(c.container_label)
            row["pids"].extend(c.pids)
        cpus = numa.cpuset(_cpuset_dir(c))
        if uuids and cpus:
            places.append({"pod": c.pod_label, "container": c.container_label, "cpus": cpus,
                           "gpus": uuids})
    names = {u: sorted(rows) for u, rows in by_gpu.items()}
    return names, {u: list(rows.values()) for u, rows in by_gpu.items()}, places


MAX_ROWS = 10000


def podres_holders(rows) -> dict[str, list[dict]]:
    """{GPU uuid: [{pod, containers, pids: []}]} from the kubelet's pod-resources rows (device
    ids: GPU UUIDs, `UUID::n` replicas): the pods holding each GPU when the container list
    (cgroups) is not there. Bounded."""
    out: dict[str, dict[str, dict]] = {}
    for r in list(rows or ())[:MAX_ROWS]:
        pod = f"{str(r.get('namespace') or '?')[:253]}/{str(r.get('pod') or '?')[:253]}"
        for d in list(r.get("device_ids") or ())[:64]:
            u = str(d).split("::")[0]
            if not u.startswith("GPU-"):
                continue
            row = out.setdefault(u, {}).setdefault(pod, {"pod": pod, "containers": [],
                                                         "pids": []})
            c = str(r.get("container") or "")[:253]
            if c and c not in row["containers"]:
                row["containers"].append(c)
    return {u: list(v.values()) for u, v in out.items()}


def _cpuset_dir(c):
    """The container's cgroup in the cpuset controller: the same directory on cgroup v2; the
    cpuset hierarchy's twin of its devices directory on v1."""
    p = c.cgroup_path
    if c.cgroup_version == 1:
        parts = list(p.parts)
        if "devices" in parts:
            parts[parts.index("devices")] = "cpuset"
            return type(p)(*parts)
    return p


@check("gpu.slow", title="Slow GPUs: PCIe link, clocks, NVLink, memory health, placement",
       timeout_s=15.0, needs=(_gpufacts.NVML,), uses=(CONTAINERS, KUBELET_CONFIG, PODRESOURCES))
def slow_check(ctx):
    nv = _gpufacts.nvml_or_skip(ctx)
    root = ctx.options.host_root
    gpus = [dict(g) for g in nv.get("gpus") or () if not g.get("lost")]
    links, nodes = gpu_links(root, gpus)
    for g in gpus:
        g["numa_node"] = nodes.get(str(g.get("uuid")))
    found = ctx.fact(CONTAINERS, timeout=min(CONTAINERS_WAIT_S, ctx.budget(CONTAINERS_WAIT_S)),
                     default=None)
    names, pods, places = holders(found)
    rows = ctx.fact(PODRESOURCES, timeout=min(1.0, ctx.budget(1.0)), default=None)
    for u, held in podres_holders(rows).items():   # pods the container list did not name
        if u not in names:
            names[u] = sorted(h["pod"] for h in held)
            pods[u] = held
    if found is None:
        ctx.log("info", "the container list did not come: the NUMA placement was not judged"
                + ("" if rows is not None else " and findings name no pods"), check="gpu.slow")
    yield from judge.judge_gpus(gpus, links, names)
    if places:
        kcfg = ctx.fact(KUBELET_CONFIG, timeout=min(1.0, ctx.budget(1.0)), default=None) or {}
        yield from placement.judge_numa(places, gpus, numa.cpu_nodes(root), kcfg)
    for g in gpus:
        yield from placement.judge_sharing(g, pods.get(str(g.get("uuid")), []))

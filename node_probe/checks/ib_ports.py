"""InfiniBand/RoCE ports that are not ACTIVE where the node's other ports are.

Why: NCCL's inter-node traffic runs over the node's RDMA ports; with one port down, the ranks
behind it cannot reach their peers and the whole job waits in a collective (every other GPU
then shows gpu.collective_spin). A port that is DOWN while its siblings on the same node are
ACTIVE is the node's odd one out, and in `job --probe` the node that has it is the job's.
A node whose ports are all down is said too: a warning for InfiniBand ports (an HCA is there
for the fabric), info for Ethernet (RoCE) ports, which nodes that do not use RDMA often leave
uncabled. A node without /sys/class/infiniband has no RDMA driver loaded: skipped, not ok.
"""
from __future__ import annotations

from node_probe.engine.registry import check
from node_probe.host import ib_ports
from node_probe.protocol import catalog

FID = "net.ib_port_down"
ACTIVE = (4, 5)          # IB_PORT_ACTIVE, IB_PORT_ACTIVE_DEFER (include/rdma/ib_verbs.h)
REFS = ("https://www.kernel.org/doc/Documentation/ABI/stable/sysfs-class-infiniband",
        "https://github.com/torvalds/linux/blob/master/drivers/infiniband/core/sysfs.c")
PHYS_WORDS = {2: "no link partner (cable, transceiver or the switch port)",
              3: "disabled (administratively, or by the port's firmware)",
              6: "recovering from link errors"}


def _active(p: dict) -> bool:
    return p.get("state_code") in ACTIVE or str(p.get("state") or "").upper().startswith("ACTIVE")


def judge(ps: list[dict]) -> list:
    """Findings for the ports of one node (records of host.ib_ports)."""
    up = [p for p in ps if _active(p)]
    down = [p for p in ps if not _active(p)]
    out = []
    for p in down:
        name = f"{p['device']} port {p['port']}"
        phys = p.get("phys_state_code")
        why = PHYS_WORDS.get(phys, "")
        state = f"{p.get('state_code')}: {p.get('state')}" if p.get("state") else "unreadable"
        pstate = f"{phys}: {p.get('phys_state')}" if p.get("phys_state") else "unreadable"
        # none ACTIVE: an InfiniBand HCA is there for the fabric (warning); an Ethernet (RoCE)
        # port nobody cabled is common on nodes that do not use RDMA (info)
        ib = str(p.get("link_layer") or "").lower() == "infiniband"
        sev = "warning" if up or ib else "info"
        sib = (f"; {len(up)} sibling port(s) ACTIVE ({', '.join(sorted({x['device'] for x in up})[:4])})"
               if up else "; no port of this node is ACTIVE (not cabled, or the fabric is down)")
        out.append(catalog.make(
            FID, sev, f"ib/{p['device']}/{p['port']}",
            f"RDMA {name} ({p.get('link_layer') or 'link layer unknown'}) is {p.get('state') or '?'}, "
            f"physically {p.get('phys_state') or '?'}" + (f": {why}" if why else "") + sib,
            {"device": p["device"], "port": p["port"], "state": state, "phys_state": pstate,
             "rate": p.get("rate"), "link_layer": p.get("link_layer"),
             "siblings_active": [f"{x['device']}/{x['port']}" for x in up[:16]],
             "ports": len(ps)},
            f"Check the cable and the switch port of {name} (`ibstat {p['device']} {p['port']}`"
            f", `ibstatus`, `ip link` for RoCE); a job whose ranks use it waits in a "
            f"collective until it is back: cordon the node and restart the job from its "
            f"checkpoint.", REFS))
    return out


@check("ib_ports", title="InfiniBand/RoCE ports: not ACTIVE where siblings are", timeout_s=5.0)
def ib_ports_check(ctx):
    ps = ib_ports.ports(ctx.options.host_root)
    if ps is None:
        ctx.skip("no /sys/class/infiniband: no RDMA (InfiniBand/RoCE) driver loaded on this node")
    if not ps:
        ctx.skip("/sys/class/infiniband has no device with ports")
    ctx.progress(message=f"RDMA ports: {sum(_active(p) for p in ps)} of {len(ps)} ACTIVE",
                 ports=ps[:64])
    yield from judge(ps)

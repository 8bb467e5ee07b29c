"""ib_ports end to end: a real probe process reading a sysfs tree under a temp host root.

The file texts are the kernel's own (drivers/infiniband/core/sysfs.c: state_show
"%d: %s" over "DOWN"/"INIT"/"ARMED"/"ACTIVE"; phys_state_show "%u: %s" over phys_state_to_str
"Sleep", "Polling", "Disabled", "PortConfigurationTraining", "LinkUp", ...; rate_show
"%d%s Gb/sec (%dX%s)"; link_layer "InfiniBand"/"Ethernet"), and their meaning is
Documentation/ABI/stable/sysfs-class-infiniband's: "state: (RO) Port state (DOWN, INIT, ARMED,
ACTIVE or ACTIVE_DEFER)", "phys_state: (RO) Port physical state (Sleep, Polling, LinkUp, etc)".
https://github.com/torvalds/linux/blob/master/Documentation/ABI/stable/sysfs-class-infiniband
"""
from tests.probe_run import run_probe

from node_probe.host import ib_ports

ONLY = ("--only", "ib_ports", "--trace-seconds", "0")
UP = ("4: ACTIVE\n", "5: LinkUp\n", "400 Gb/sec (4X NDR)\n", "InfiniBand\n")
DISABLED = ("1: DOWN\n", "3: Disabled\n", "10 Gb/sec (4X SDR)\n", "InfiniBand\n")
POLLING = ("1: DOWN\n", "2: Polling\n", "10 Gb/sec (4X SDR)\n", "Ethernet\n")


def host(tmp_path, ports):
    root = tmp_path / "host"
    (root / "sys/class").mkdir(parents=True)
    for dev, port, (state, phys, rate, layer) in ports:
        d = root / "sys/class/infiniband" / dev / "ports" / str(port)
        d.mkdir(parents=True)
        for name, text in (("state", state), ("phys_state", phys), ("rate", rate),
                           ("link_layer", layer)):
            (d / name).write_text(text)
    return root


def _check(run):
    [c] = [c for c in run.summary["checks"] if c["id"] == "ib_ports"]
    return c


def test_a_port_down_where_its_siblings_are_active_is_named(tmp_path):
    root = host(tmp_path, [(f"mlx5_{i}", 1, UP) for i in range(7)]
                + [("mlx5_7", 1, DISABLED)])
    run = run_probe("--host-root", str(root), *ONLY)
    [f] = run.findings("net.ib_port_down")
    assert f["severity"] == "warning" and f["subject"] == "ib/mlx5_7/1"
    assert f["evidence"]["state"] == "1: DOWN" and f["evidence"]["phys_state"] == "3: Disabled"
    assert len(f["evidence"]["siblings_active"]) == 7
    assert "is DOWN, physically Disabled" in f["title"]


def test_all_active_is_ok_with_no_warning(tmp_path):
    root = host(tmp_path, [(f"mlx5_{i}", 1, UP) for i in range(8)])
    run = run_probe("--host-root", str(root), *ONLY)
    assert run.findings("net.ib_port_down") == []
    assert _check(run)["status"] == "ok"


def test_a_node_without_rdma_is_skipped_not_ok(tmp_path):
    root = tmp_path / "host"
    (root / "sys/class").mkdir(parents=True)
    run = run_probe("--host-root", str(root), *ONLY)
    c = _check(run)
    assert c["status"] == "skipped" and "/sys/class/infiniband" in c["reason"]


def test_every_port_down_is_said_softly_and_roce_polling_reads():
    ps = [{"device": "mlx5_0", "port": 1, "state": "DOWN", "state_code": 1,
           "phys_state": "Polling", "phys_state_code": 2, "rate": None,
           "link_layer": "Ethernet"}]
    from node_probe.checks import ib_ports as chk
    [f] = chk.judge(ps)
    assert f.severity.value == "info" and "no link partner" in f.title   # RoCE: maybe unused
    [f] = chk.judge([{**ps[0], "link_layer": "InfiniBand"}])
    assert f.severity.value == "warning"   # an IB HCA with no port up: cut off the fabric
    assert ib_ports.parse_coded("2: Polling\n") == (2, "Polling")
    assert ib_ports.parse_coded("4: ACTIVE\n") == (4, "ACTIVE")
    assert ib_ports.parse_coded(None) == (None, None)

"""host.pcie_links on sysfs trees: the strings are the kernel's own.

current_link_speed/max_link_speed are printed by pci_speed_string() in drivers/pci/probe.c
("2.5 GT/s PCIe" ... "64.0 GT/s PCIe", and "Unknown" for a link whose speed is not known,
https://github.com/torvalds/linux/blob/master/drivers/pci/probe.c); kernels 5.6 and earlier
wrote "2.5 GT/s", "5 GT/s", "8 GT/s", "16 GT/s" (NCCL's kvDictPciGen keeps both spellings,
https://github.com/NVIDIA/nccl/blob/master/src/graph/topo.cc). numa_node is -1 on a machine
without NUMA information (Documentation/ABI/testing/sysfs-bus-pci).
"""
import os

import pytest

from node_probe.checks.slow import pcie
from node_probe.host import numa, pcie_links
from tests.slow.test_probe_slow import make_chain


@pytest.mark.parametrize("text,gts,gen", [
    ("2.5 GT/s PCIe\n", 2.5, 1), ("5.0 GT/s PCIe\n", 5.0, 2), ("8.0 GT/s PCIe\n", 8.0, 3),
    ("16.0 GT/s PCIe\n", 16.0, 4), ("32.0 GT/s PCIe\n", 32.0, 5), ("64.0 GT/s PCIe\n", 64.0, 6),
    ("5 GT/s\n", 5.0, 2), ("8 GT/s\n", 8.0, 3), ("Unknown\n", None, None), ("", None, None)])
def test_speed_strings(text, gts, gen):
    assert pcie_links.speed_gts(text) == gts
    assert pcie.gen_of(gts) == gen


def test_chain_walks_the_bridges_and_reads_numa(tmp_path):
    root = tmp_path / "host"
    make_chain(root, [("0000:16:01.0", "32.0 GT/s PCIe", 16, "32.0 GT/s PCIe", 16, 0),
                      ("0000:17:00.0", "2.5 GT/s PCIe", 16, "32.0 GT/s PCIe", 16, 1)])
    recs = pcie_links.chain(root, "0000:17:00.0")
    assert [r["bdf"] for r in recs] == ["0000:17:00.0", "0000:16:01.0"]
    assert recs[0] == {"bdf": "0000:17:00.0", "speed_cur_gts": 2.5, "width_cur": 16,
                       "speed_max_gts": 32.0, "width_max": 16, "upstream": "0000:16:01.0",
                       "numa_node": 1}
    assert recs[1]["upstream"] is None


def test_unknown_numa_and_missing_device(tmp_path):
    root = tmp_path / "host"
    make_chain(root, [("0000:3b:00.0", "Unknown", 0, "16.0 GT/s PCIe", 16, -1)])
    [r] = pcie_links.chain(root, "0000:3b:00.0")
    assert r["numa_node"] is None and r["speed_cur_gts"] is None
    assert pcie_links.chain(root, "0000:99:00.0") == []
    assert pcie_links.link(root, "../../etc") is None


def test_a_symlink_leaving_the_host_root_is_not_followed(tmp_path):
    root = tmp_path / "host"
    outside = tmp_path / "outside" / "0000:3b:00.0"
    outside.mkdir(parents=True)
    (outside / "current_link_speed").write_text("2.5 GT/s PCIe\n")
    d = root / "sys/bus/pci/devices"
    d.mkdir(parents=True)
    os.symlink(str(outside), d / "0000:3b:00.0")   # absolute: resolved inside the root
    assert pcie_links.link(root, "0000:3b:00.0") is None


def test_cpu_nodes_and_cpulist(tmp_path):
    root = tmp_path / "host"
    for n, cpus in ((0, "0-3,8-11"), (1, "4-7,12-15")):
        p = root / f"sys/devices/system/node/node{n}"
        p.mkdir(parents=True)
        (p / "cpulist").write_text(cpus + "\n")
    nodes = numa.cpu_nodes(root)
    assert nodes[9] == 0 and nodes[12] == 1 and len(nodes) == 16
    assert numa.parse_cpulist("0-2,x,5") == [0, 1, 2, 5]
    assert len(numa.parse_cpulist("0-999999999")) == numa.MAX_CPUS

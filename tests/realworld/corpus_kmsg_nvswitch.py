"""NVSwitch SXid lines, as HGX nodes logged them: the switch driver's Xids.

Quoted exactly from the source; fed as /dev/kmsg records and as a pasted file
(test_kmsg_feed.py). The format and the classes are in node_probe/host/sxid.py.
"""
from tests.realworld.artifact import Artifact

ARTIFACTS = [
    Artifact(
        "gpud#338-sxid12028", "https://github.com/leptonai/gpud/pull/338",
        "kern  :err   : 2025-01-25T10:34:54,859532+00:00 nvidia-nvswitch1: SXid (PCI:0000:84:00.0): 12028, Data {0x000001c0, 0x00bd5c8a, 0x00000500, 0x00000064, 0x00000000, 0x40008000, 0x5a001100, 0x00000000, 0x00000000}",
        "kmsg", "SXid 12028, egress non-posted PRIV error: the NVLink traffic through the port "
        "stalls and CUDA jobs abort with Xid 45 (GPUd, from NVIDIA's Fabric Manager guide)",
        "restart the system to reset the GPUs and NVSwitches", "nvswitch.sxid", "critical",
        "reboot"),
]

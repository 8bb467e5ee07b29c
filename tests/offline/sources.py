"""Where each file of tests/data/offline comes from and what its source established.

Real captures, saved verbatim (the telegraf and gpud files are other projects' own test data,
captured from the named GPUs; the lspci one is gzipped as found, to keep the repo small):
"""
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "data" / "offline"
TELEGRAF = ("https://github.com/influxdata/telegraf/blob/b27263146617cefe16c0b300107b58b111a7fa57/"
            "plugins/inputs/nvidia_smi/testdata/")

SOURCES = {
    # AWS g5 A10G, driver 5xx, `nvidia-smi -q -x`: idle (gpu_util 0 %, clocks reason GpuIdle
    # Active), link Gen1 of Gen4 and x8 of x16 (the VM reports a x16 max on a x8 link)
    "nvsmi-x-a10g.xml": TELEGRAF + "a10g.xml",
    # GeForce RTX 3080, v13 schema (clocks_event_reasons): busy at 65 %, Gen4 x16 of Gen4 x16,
    # no reason active: a healthy busy GPU
    "nvsmi-x-rtx-3080-v13.xml": TELEGRAF + "rtx-3080-v13.xml",
    # GeForce RTX 3090, v12: idle (GpuIdle), Gen1 of Gen4, power limit 200 W of default 350 W
    "nvsmi-x-rtx-3090-v12.xml": TELEGRAF + "rtx-3090-v12.xml",
    # A100-SXM4-80GB with MIG enabled: gpu_util N/A (MIG), Gen4 x16, volatile ECC counters 0
    "nvsmi-x-a100-sxm4-v12.xml": TELEGRAF + "a100-sxm4-v12.xml",
    # AWS g4dn Tesla T4: idle, two processes (one graphics G, one compute C), Gen3 x8 of x16,
    # pending_retirement No
    "nvsmi-x-tesla-t4.xml": TELEGRAF + "tesla-t4.xml",
    # An HGX H100 node's `lspci -vvv` (8 x GH100 [10de:2330] at 32GT/s x16 "(ok)"; PEX890xx
    # switch ports and NVMe links below their capability "(downgraded)"; CESta RxErr+ BadTLP+
    # on the GPUs): leptonai/gpud's own capture
    "lspci-vvv-h100-hgx.txt.gz": ("https://github.com/leptonai/gpud/blob/"
                                  "4a8de33a3f02e207f39e9023d67125592d599731/pkg/pci/testdata/"
                                  "lspci-vvv"),
    # `nvidia-smi nvlink --status` of an 8 x A100-SXM4-80GB node: 12 links each, all at 25 GB/s
    "nvlink-status-a100.txt": ("https://github.com/leptonai/gpud/blob/"
                               "4a8de33a3f02e207f39e9023d67125592d599731/components/accelerator/"
                               "nvidia/fabric-manager/testdata/nvidia-smi.nvlink.status.a100"),
    # NVIDIA A10 (pass-through VM), driver 550.127.05, `nvidia-smi -q` text: idle (Idle
    # Active, 0 %), Gen1 of Gen4, x16, no process. Quoted from a Go test fixture (package
    # nvidia_smi, `NormalQueryOutput`) found by code search; its index entry names no
    # repository. Only its unedited `NormalQueryOutput` is used (the fixture's other variants
    # were edited by hand and are not).
    "nvsmi-q-a10-idle.txt": "code search: Go fixture `package nvidia_smi`, var NormalQueryOutput",
}

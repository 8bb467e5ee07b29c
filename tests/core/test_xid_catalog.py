"""Xid lines read by NVIDIA's Xid catalog: resolution bucket per code, one finding per GPU and code.

The kernel lines are the driver's own words, as logged on real nodes:
- 119: "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76
  (GSP_RM_CONTROL) ..." (format string of NV_ERROR_LOG(GSP_RPC_TIMEOUT, ...) in
  NVIDIA/open-gpu-kernel-modules src/nvidia/src/kernel/gpu/gsp/kernel_gsp.c; the same line is
  quoted in NVIDIA/NVSentinel's syslog-health-monitor tests and GPU Operator reports)
- 94/95: "Contained: CE User Channel (0x9). RST: No, D-RST: No" / "Uncontained: LTC TAG
  (0x2,0x0). RST: Yes, D-RST: No" (comment above the error-containment logger in
  open-gpu-kernel-modules)
- 63: "Row Remapper: New row marked for remapping, reset gpu to activate."
- 79: "GPU has fallen off the bus."
- 154: "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)" (NVIDIA's
  Xid catalog, trigger condition of Xid 154)
Buckets: https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html
"""
from node_probe.checks import kmsg
from node_probe.host import xid
from tests.probe_run import run_probe

BUS = "0000:19:00"
UUID = "GPU-aeab3757-56a6-7e30-3f7c-1f322454bde2"
GSP = (f"NVRM: Xid (PCI:{BUS}): 119, pid=452531, name=cache_mgr_main, Timeout after 6s of "
       "waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) "
       "(0x20809004 0x608).")
LINES = [
    f"NVRM: GPU at PCI:{BUS}: {UUID}",
    "NVRM: Xid (PCI:0000:01:00): 94, pid=7062, Contained: CE User Channel (0x9). RST: No, D-RST: No",
    "NVRM: Xid (PCI:0000:01:00): 95, pid=7062, Uncontained: LTC TAG (0x2,0x0). RST: Yes, D-RST: No",
    "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.",
    "NVRM: Xid (PCI:0000:86:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:03:00): 149, pid='<unknown>', name=<unknown>, NETIR_LINK_DOWN",
    "NVRM: Xid (PCI:0000:03:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
]


def by_key(findings):
    """(pci, code) -> the GPU's finding, for every code the finding carries."""
    return {(f.evidence["pci"], c["xid"]): f for f in findings if f.id == "gpu.xid"
            for c in f.evidence["codes"]}


def code(f, xid_code):
    return next(c for c in f.evidence["codes"] if c["xid"] == xid_code)


def test_each_xid_gets_nvidias_resolution_bucket():
    records = [(10.0 + i, line) for i, line in enumerate(LINES)] + [(50.0, GSP)]
    got = by_key(kmsg.analyze(records, now_s=100.0, now_wall=1_700_000_100.0))
    bucket = {k: code(f, k[1])["resolution_bucket"] for k, f in got.items()}
    assert bucket == {
        ("0000:01:00", 94): "restart_app", ("0000:01:00", 95): "reset_gpu",
        ("0000:10:1c", 63): "ignore", ("0000:86:00", 79): "reboot",
        ("0000:03:00", 149): "reset_gpu", ("0000:03:00", 154): "reboot",
        (BUS, 119): "reset_gpu"}
    sev = {k[1]: code(f, k[1])["severity"] for k, f in got.items()}
    assert sev == {94: "warning", 95: "critical", 63: "info", 79: "critical", 149: "critical",
                   154: "critical", 119: "critical"}
    # one finding per GPU, its severity the worst code's
    assert got[("0000:01:00", 94)] is got[("0000:01:00", 95)]
    assert got[("0000:01:00", 94)].severity.value == "critical"
    assert got[("0000:01:00", 94)].evidence["xid"] == 95
    gsp = got[(BUS, 119)]
    assert gsp.evidence["mnemonic"] == "GSP_RPC_TIMEOUT"
    assert gsp.evidence["nvidia_resolution_bucket"] == "RESET_GPU"
    assert gsp.evidence["gpu_uuid"] == UUID          # from the driver's "GPU at PCI" line
    assert UUID in gsp.title and "reset gpu" in gsp.title
    assert gsp.evidence["last_seen"] == "2023-11-14T22:14:10Z"   # wall time of boot + 50 s
    assert got[("0000:86:00", 79)].evidence["nvidia_resolution_bucket"] == "RESTART_BM"
    assert code(got[("0000:03:00", 149)], 149)["mnemonic"] == "NVLINK_NETIR_ERROR"
    assert got[("0000:03:00", 154)].remediation.startswith("Drain the node and reboot")


def test_a_flood_of_thousands_is_one_finding_per_gpu_and_code():
    flood = [(100.0 + i * 0.5, GSP) for i in range(5000)]
    flood += [(99.0, "NVRM: Xid (PCI:0000:3b:00): 13, pid=48211, name=python3, Graphics "
                     "Exception: ESR 0x504648=0x102000e 0x504650=0x0")]
    got = by_key(kmsg.analyze(flood, now_s=3000.0))
    assert set(got) == {(BUS, 119), ("0000:3b:00", 13)}
    g = got[(BUS, 119)].evidence
    assert g["count"] == 5000
    assert (g["first_s_since_boot"], g["last_s_since_boot"]) == (100.0, 100.0 + 4999 * 0.5)
    assert g["pids"] == ["452531 (cache_mgr_main)"]
    assert "5000 times" in got[(BUS, 119)].title


def test_group_is_pure_and_bounded():
    events = [xid.parse(float(i), f"NVRM: Xid (PCI:0000:{i % 7:02x}:00): {31 + i % 3}, pid={i}, x")
              for i in range(3000)]
    groups, dropped = xid.group(events, max_groups=5)
    assert len(groups) == 5 and dropped == sum(1 for e in events
                                               if (e.pci, e.code) not in
                                               {(g.pci, g.code) for g in groups})
    assert sum(g.count for g in groups) + dropped == 3000
    assert all(len(g.pids) <= xid.MAX_PIDS for g in groups)
    assert xid.group(events, max_groups=5) == (groups, dropped)   # no hidden state


def test_unknown_code_says_look_it_up_and_hostile_bus_ids_do_not_raise():
    recs = [(1.0, "NVRM: Xid (PCI:zz:zz:zz.z): 999, pid=1, whatever"),
            (2.0, "NVRM: GPU at PCI:zzzz:zz:zz: GPU-00000000-0000")]
    f = list(kmsg.analyze(recs))
    assert f[0].evidence["resolution_bucket"] == "contact_support"
    assert "analyzing-xid-catalog" in f[0].remediation


def test_probe_with_a_flooded_kernel_log(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("".join(f"[{100 + i}.000000] {GSP}\n" for i in range(2000)))
    run = run_probe("--kmsg-file", str(log), "--only", "kmsg", "--trace-seconds", "0")
    xids = run.findings("gpu.xid")
    assert len(xids) == 1 and xids[0]["evidence"]["count"] == 2000
    assert xids[0]["severity"] == "critical" and run.returncode == 1


def test_healthy_kernel_log_stays_quiet(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("[    1.000000] Linux version 6.8.0\n"
                   f"[   12.100000] NVRM: GPU at PCI:{BUS}: {UUID}\n"
                   "[   12.200000] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  570.172.08\n")
    run = run_probe("--kmsg-file", str(log), "--only", "kmsg", "--trace-seconds", "0")
    assert run.findings() == [] and run.returncode == 0

"""Every form a kernel log takes (issue 40.8) and PCIe AER joined to the GPU (issue 40.3).

Verbatim lines from public threads, each with the cause the thread established:
- https://github.com/wilicc/gpu-burn/issues/1: a Tesla card under gpu-burn: corrected AER on the
  root port 0000:00:02.0, then an uncorrected fatal Surprise Down on it, "device has no
  AER-aware driver" for the GPU 0000:02:00.0 below it, then Xid 79. Cause (the thread): the
  card was faulty or overheating; the GPU fell off the bus.
- https://github.com/NVIDIA/nvidia-docker/issues/1553: "Cannot kill container running with
  failed GPU": `NVRM: GPU 0000:09:00.0: GPU has fallen off the bus.` and a corrected AER on
  pcieport 0000:00:01.1.
- https://github.com/leptonai/gpud (components/cpu tests): `INFO: task containerd-shim:931150
  blocked for more than 122 seconds.`, `watchdog: BUG: soft lockup - CPU#0 stuck for 27s!
  [cuda-EvtHandlr:2255424]` (a CUDA process's thread spinning).
- https://github.com/leptonai/gpud/pull/1271 and components/accelerator/nvidia/nvlink/kmsg.go:
  `NVRM: knvlinkDiscoverPostRxDetLinks_GH100: Getting peer0's postRxDetLinkMask failed!` (the
  NVLinks to a peer were not detected: GPUd marks the node unhealthy).
- gpud's xid kmsg tests: `NVRM: Xid (0000:03:00): 14, Channel 00000001` (no `PCI:`).
"""
import os
from pathlib import Path

from node_probe.checks import gpu_lost, kmsg
from node_probe.host import aer

GPU_BURN_1 = """\
[74785.660366] pcieport 0000:00:02.0: AER: Corrected error received: id=0010
[74785.660380] pcieport 0000:00:02.0: PCIe Bus Error: severity=Corrected, type=Data Link Layer, id=0010(Transmitter ID)
[74785.660496] pcieport 0000:00:02.0:   device [8086:6f04] error status/mask=00001000/00002000
[74785.660559] pcieport 0000:00:02.0:    [12] Replay Timer Timeout
[74889.542031] pcieport 0000:00:02.0: AER: Uncorrected (Fatal) error received: id=0010
[74889.542044] pcieport 0000:00:02.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, id=0010(Receiver ID)
[74889.542125] pcieport 0000:00:02.0:   device [8086:6f04] error status/mask=00000020/00000000
[74889.542184] pcieport 0000:00:02.0:    [ 5] Surprise Down Error    (First)
[74889.542234] pcieport 0000:00:02.0: broadcast error_detected message
[74889.542239] nvidia 0000:02:00.0: device has no AER-aware driver
[74889.644112] NVRM: GPU at PCI:0000:02:00: GPU-660d987e-5b28-3bf6-2a2d-1d5ecae7f6df
[74889.644132] NVRM: GPU Board Serial Number: 0322716036227
[74889.644138] NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.
"""
# nvidia-docker#1553: the corrected AER on a port (the GPU in this test sits elsewhere)
CORRECTED_1553 = """\
[1086487.613065] pcieport 0000:00:01.1: AER: Corrected error received: 0000:00:00.0
[1086487.613071] pcieport 0000:00:01.1: AER: PCIe Bus Error: severity=Corrected, type=Data Link Layer, (Receiver ID)
"""


def run(text, **kw):
    summary = kmsg.Summary()
    found = list(kmsg.analyze(kmsg.parse_log_file(text), summary=summary, **kw))
    return found, summary


def one(found, fid):
    got = [f for f in found if f.id == fid]
    assert len(got) == 1, [(f.id, f.severity.value, f.title) for f in found]
    return got[0]


def test_fatal_aer_then_xid79_is_the_cause_and_the_node_needs_a_reboot():
    found, summary = run(GPU_BURN_1)
    a = one(found, "gpu.pcie_aer")
    assert a.severity.value == "critical"
    assert a.evidence["gpus"] == ["0000:02:00.0"] and a.evidence["device"] == "0000:00:02.0"
    assert a.evidence["surprise_down"] is True
    assert a.evidence["cant_recover"] == ["0000:02:00.0"]
    assert "Surprise Down" in a.title and "reboot" in a.remediation
    x = one(found, "gpu.xid")
    assert x.evidence["caused_by_aer"]["device"] == "0000:00:02.0"
    assert x.evidence["resolution_bucket"] == "reboot" and "reboot the node" in x.title
    assert summary.lost["0000:02:00.0"]["aer_fatal"] and summary.lost["0000:02:00.0"]["xid79"] == 1


def test_an_xid_whose_own_bucket_is_restart_app_follows_a_fatal_aer():
    # the same report, then an Xid 13 instead of 79: the GPU is gone, whatever Xid 13 says
    text = GPU_BURN_1.replace("79, GPU has fallen off the bus.",
                              "13, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0)")
    x = one(run(text)[0], "gpu.xid")
    assert x.severity.value == "critical" and x.evidence["resolution_bucket"] == "reboot"


def _sysfs(root: Path, gpu: str, ports: list[str]) -> Path:
    """/sys/bus/pci/devices/<gpu> -> ../../../devices/pci0000:00/<ports...>/<gpu>, as sysfs
    links it."""
    devs = root / "sys/bus/pci/devices"
    devs.mkdir(parents=True, exist_ok=True)
    chain = "/".join(["pci0000:00", *ports, gpu])
    (root / "sys/devices" / chain).mkdir(parents=True, exist_ok=True)
    os.symlink(f"../../../devices/{chain}", devs / gpu)
    return devs


def test_corrected_aer_on_a_port_without_a_gpu_below_stays_quiet(tmp_path):
    devs = _sysfs(tmp_path, "0000:3b:00.0", ["0000:3a:00.0"])
    text = CORRECTED_1553 + "[    1.0] NVRM: GPU at PCI:0000:3b:00: GPU-2f815c32-1111-2222-3333-444455556666\n"
    found, _ = run(text, sys_pci=devs)
    assert found == []


def test_corrected_aer_on_the_gpus_upstream_port_is_joined_by_sysfs(tmp_path):
    devs = _sysfs(tmp_path, "0000:09:00.0", ["0000:00:01.1"])
    text = CORRECTED_1553 + "[    1.0] NVRM: GPU at PCI:0000:09:00: GPU-26fba6b2-9e52-006e-68db-4ce18382a5ea\n"
    a = one(run(text, sys_pci=devs)[0], "gpu.pcie_aer")
    assert a.severity.value == "info" and a.evidence["gpus"] == ["0000:09:00.0"]
    assert a.evidence["joined_by"].startswith("sysfs")
    assert aer.upstream_ports(devs, "0000:09:00.0") == ("0000:00:01.1",)


def test_completion_timeout_on_the_gpu_itself_is_nonfatal_warning():
    # aer.c's format for an uncorrected non-fatal error logged by the endpoint itself
    text = ("[ 10.0] nvidia 0000:3b:00.0: AER: Uncorrected (Non-Fatal) error received: 0000:3b:00.0\n"
            "[ 10.0] nvidia 0000:3b:00.0: PCIe Bus Error: severity=Uncorrected (Non-Fatal), type=Transaction Layer, (Requester ID)\n"
            "[ 10.0] nvidia 0000:3b:00.0:   device [10de:2330] error status/mask=00004000/00000000\n"
            "[ 10.0] nvidia 0000:3b:00.0:    [14] CmpltTO                (First)\n")
    a = one(run(text)[0], "gpu.pcie_aer")
    assert a.severity.value == "warning" and a.evidence["completion_timeout"] is True


def test_fallen_off_the_bus_without_an_xid_names_the_gpu_and_it_is_lost():
    text = ("[1084456.074566] NVRM: GPU 0000:09:00.0: GPU has fallen off the bus.\n"
            "[1084456.074567] NVRM: GPU 0000:09:00.0: GPU is on Board .\n")
    found, summary = run(text)
    d = one(found, "gpu.driver_error")
    assert d.severity.value == "critical" and d.evidence["gpu"] == "0000:09:00.0"
    assert d.evidence["kind"] == "off_the_bus"
    xids, signs = gpu_lost.from_kmsg(summary.lost)
    assert xids == {} and signs == {"0000:09:00.0": {"off_the_bus": 1, "aer_fatal": False}}


def test_fallen_off_the_bus_with_a_short_bus_id():
    # the short form (`0000:65:00`, no function) as `NVRM: GPU at PCI:` lines print bus ids
    d = one(run("[ 5.0] NVRM: GPU at PCI:0000:65:00: GPU has fallen off the bus.\n")[0],
            "gpu.driver_error")
    assert d.severity.value == "critical" and d.evidence["gpu"] == "0000:65:00"


def test_a_bus_id_that_does_not_parse_is_never_a_critical_alone():
    found, _ = run("[ 5.0] NVRM: GPU 0000:zz:00.0: GPU has fallen off the bus.\n")
    d = one(found, "gpu.driver_error")
    assert d.severity.value == "warning" and d.evidence["bus_id_parsed"] is False
    found, _ = run("[ 6.0] NVRM: Xid (PCI:zz:zz:zz.z): 79, GPU has fallen off the bus.\n")
    x = one(found, "gpu.xid")
    assert x.severity.value == "warning"
    assert x.evidence["bus_id_parsed"] is False and "did not parse" in x.title


def test_xid_line_with_nothing_after_the_code():
    found, _ = run("[ 7.0] NVRM: Xid (PCI:0000:3b:00): 79,\n[ 8.0] NVRM: Xid (0000:03:00): 48\n")
    x = {f.evidence["pci"]: f.evidence for f in found if f.id == "gpu.xid"}
    assert x["0000:3b:00"]["xid"] == 79 and x["0000:3b:00"]["last_message"] == ""
    assert x["0000:03:00"]["xid"] == 48


def test_hung_tasks_as_every_kernel_prints_them():
    text = ("[228678.600423] INFO: task containerd-shim:931150 blocked for more than 122 seconds.\n"
            "[228678.600500] task kubelet:2201 blocked for more than 120 seconds.\n"
            "[228678.600600] INFO: task nv-fabricmanager:77 blocked for more than 240s.\n")
    got = {(f.evidence["comm"], f.evidence["blocked_s"]) for f in run(text)[0]
           if f.id == "kernel.hung_task"}
    assert got == {("containerd-shim", 122), ("kubelet", 120), ("nv-fabricmanager", 240)}


def test_knvlink_lines_are_rated():
    found, _ = run("Jul 09 10:42:47 pool0-0082 kernel: NVRM: knvlinkDiscoverPostRxDetLinks_GH100: "
                   "Getting peer0's postRxDetLinkMask failed!\n")
    d = one(found, "gpu.driver_error")
    assert d.severity.value == "critical" and d.evidence["kind"] == "nvlink_rxdet"
    # a knvlink line that says nothing failed is not a finding
    assert run("[ 1.0] NVRM: NVLink link training completed\n")[0] == []


def test_soft_lockup_in_a_cuda_thread_and_in_the_driver():
    cuda = "[Sun Jan  5 18:37:06 2025] watchdog: BUG: soft lockup - CPU#0 stuck for 27s! [cuda-EvtHandlr:2255424]\n"
    f = one(run(cuda)[0], "kernel.lockup")
    assert f.severity.value == "warning" and f.evidence["gpu_process"] is True
    # the same report with its stack in the driver (frames as the kernel prints them)
    in_drv = ("[Sun Jan  5 18:28:55 2025] watchdog: BUG: soft lockup - CPU#18 stuck for 27s! [python3:2254956]\n"
              "[Sun Jan  5 18:28:55 2025] Modules linked in: nvidia_uvm(POE) nvidia(POE) xt_conntrack\n"
              "[Sun Jan  5 18:28:55 2025] CPU: 18 PID: 2254956 Comm: python3 Tainted: P           OEL\n"
              "[Sun Jan  5 18:28:55 2025] RIP: 0010:_nv011486rm+0x1f/0x30 [nvidia]\n")
    f = one(run(in_drv)[0], "kernel.lockup")
    assert f.severity.value == "critical" and f.evidence["nvidia_modules"] == ["nvidia"]
    # an RCU stall that names nvidia only in the module list: shown, informational
    rcu = ("[ 9.0] rcu: INFO: rcu_sched self-detected stall on CPU\n"
           "[ 9.0] Modules linked in: nvidia(POE) ext4\n")
    assert one(run(rcu)[0], "kernel.lockup").severity.value == "info"


def test_a_lockup_that_does_not_name_nvidia_stays_quiet():
    text = ("[ 9.0] watchdog: BUG: soft lockup - CPU#3 stuck for 23s! [kworker/3:1:120]\n"
            "[ 9.0] Modules linked in: ext4 xfs\n")
    assert run(text)[0] == []


def test_lines_without_a_marker_are_skipped_before_decoding():
    noise = "".join(f"[ {i}.0] eth0: link up, 100Gbps, full duplex\n" for i in range(50))
    found, summary = run(noise + GPU_BURN_1 + noise)
    assert {f.id for f in found} == {"gpu.xid", "gpu.pcie_aer"}
    assert len(summary.xid_lines) == 1


def test_trace_verdicts_take_the_kmsg_checks_xid_lines_without_reading_the_log():
    from node_probe.checks import _trace_verdicts
    _, summary = run(GPU_BURN_1)
    lines = summary.as_fact("test")["xid_lines"]
    assert lines == ({"uptime_s": 74889.644138, "pci": "0000:02:00", "xid": 79,
                      "text": "GPU has fallen off the bus."},)
    calls = [{"pid": 7, "tid": 7, "comm": "gpu_burn", "ts": 1.0, "mono_s": 74889.6,
              "duration_s": 0.1, "func": "cuCtxSynchronize", "result": 999,
              "error": "CUDA_ERROR_UNKNOWN"}]
    (found,) = _trace_verdicts.cuda_findings(calls, [], None, lambda: lines)
    assert "Xid 79 on 0000:02:00" in found.title

"""Kernel log parsing on realistic samples (dmesg and raw /dev/kmsg formats)."""
from pathlib import Path

from node_probe.checks import kmsg
from tests.probe_run import run_probe

SAMPLE = """\
[ 1021.339512] NVRM: GPU at PCI:0000:3b:00: GPU-2f815c32-768d-d782-1073-db01d7b90215
[ 1021.339519] NVRM: Xid (PCI:0000:3b:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address
[ 1021.339527] NVRM: Xid (PCI:0000:3b:00): 13, pid=48211, name=python3, Graphics Exception: ESR 0x504648=0x102000e 0x504650=0x0
[ 2200.100000] NVRM: Xid (PCI:0000:86:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
[ 2200.100100] NVRM: GPU 0000:86:00.0: GPU has fallen off the bus.
[ 2460.000000] INFO: task nvidia-device-p:3321 blocked for more than 122 seconds.
[ 2460.000010]       Tainted: P           OE     5.15.0-1078-nvidia #79-Ubuntu
[ 2460.000020] "echo 0 > /proc/sys/kernel/hung_task_timeout_secs" disables this message.
[ 2460.000030] task:nvidia-device-p state:D stack:0     pid:3321  ppid:3001   flags:0x00004002
[ 2583.000000] INFO: task python3:9100 blocked for more than 245 seconds.
[ 2583.000030] task:python3         state:D stack:0     pid:9100  ppid:1   flags:0x00000000
"""


def test_analyze_sample(tmp_path):
    findings = list(kmsg.analyze(kmsg.parse_log_file(SAMPLE), now_s=2600.0))
    xids = {(f.evidence["xid"], f.evidence["pci"]): f for f in findings if f.id == "gpu.xid"}
    assert set(xids) == {(13, "0000:3b:00"), (79, "0000:86:00")}
    x79 = xids[(79, "0000:86:00")]
    assert x79.severity.value == "critical" and x79.evidence["usual_cause"] == "hardware"
    assert x79.evidence["last_age_s"] == 399.9
    x13 = xids[(13, "0000:3b:00")]
    assert x13.severity.value == "warning" and x13.evidence["usual_cause"] == "application"
    assert x13.evidence["count"] == 2 and x13.evidence["pids"] == ["48211 (python3)"]
    hung = {f.subject: f for f in findings if f.id == "kernel.hung_task"}
    assert set(hung) == {"nvidia-device-p:3321", "python3:9100"}
    assert hung["nvidia-device-p:3321"].severity.value == "critical"
    assert hung["nvidia-device-p:3321"].evidence["state"] == "D"
    assert hung["nvidia-device-p:3321"].evidence["blocked_s"] == 122
    assert hung["python3:9100"].severity.value == "warning"


def test_raw_kmsg_record_format():
    rec = "4,1234,2200100000,-;NVRM: Xid (PCI:0000:86:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n SUBSYSTEM=pci\n"
    ts, msg = kmsg.parse_kmsg_record(rec)
    assert ts == 2200.1 and msg.startswith("NVRM: Xid")
    f = list(kmsg.analyze([(ts, msg)]))
    assert f[0].evidence["xid"] == 79


def test_probe_with_kmsg_file(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text(SAMPLE)
    run = run_probe("--kmsg-file", str(log), "--only", "kmsg", "--trace-seconds", "0")
    assert run.returncode == 1
    ids = sorted((f["id"], f["subject"]) for f in run.findings())
    assert ids == [("gpu.xid", "pci 0000:3b:00"), ("gpu.xid", "pci 0000:86:00"),
                   ("kernel.hung_task", "nvidia-device-p:3321"),
                   ("kernel.hung_task", "python3:9100")]


def test_live_kmsg_is_read_without_blocking():
    import time
    t0 = time.monotonic()
    recs = kmsg.read_kmsg(Path("/dev/kmsg"))
    assert time.monotonic() - t0 < 30  # hang guard: a blocking read would never return
    assert recs, "the kernel ring buffer is never empty on a booted machine"


def test_hung_task_critical_only_for_node_daemon_names_by_prefix():
    log = "".join(f"[ {100 + i}.0] INFO: task {comm}:{1000 + i} blocked for more than 122 seconds.\n"
                  for i, comm in enumerate(("runc:[2:INIT]", "containerd-shim", "kubelet",
                                            "prunc-job", "my-kubelet-tes", "scanvidia")))
    sev = {f.evidence["comm"]: f.severity.value
           for f in kmsg.analyze(kmsg.parse_log_file(log)) if f.id == "kernel.hung_task"}
    assert sev == {"runc:[2:INIT]": "critical", "containerd-shim": "critical",
                   "kubelet": "critical", "prunc-job": "warning", "my-kubelet-tes": "warning",
                   "scanvidia": "warning"}


def test_hostile_numbers_in_the_log_do_not_raise():
    big = "9" * 5000
    log = (f"[ 1.0] INFO: task x:{big} blocked for more than 5 seconds.\n"
           f"[ 2.0] INFO: task y:12 blocked for more than {big} seconds.\n"
           f"[ 3.0] NVRM: Xid (PCI:0000:3b:00): {big}, pid={big}, name=x, boom\n"
           f"[ 4.0] INFO: task z:13 blocked for more than 122 seconds.\n"
           f"[ 4.1] task:z state:D stack:0 pid:{big} ppid:1\n")
    found = list(kmsg.analyze(kmsg.parse_log_file(log)))
    assert [(f.id, f.subject) for f in found] == [("kernel.hung_task", "z:13")]


def test_every_reader_of_the_kernel_log_streams_it(tmp_path):
    """X-02: besides the kmsg check, gpu_lost (Xid 79 per GPU) and the trace verdicts (Xids near
    failed CUDA calls) read the kernel log; they read it whole into memory (the capture child
    reached 216 MiB in a 200,000-line storm). Both now keep what they need: peak Python
    allocations stay far below the log's own size. The storm's lines are the driver's own
    Xid 79 and Xid 13 wording, as in SAMPLE."""
    import tracemalloc
    import types
    from node_probe.checks import _trace_verdicts, gpu_lost

    log = tmp_path / "storm.log"
    line = ("[ 2200.100000] NVRM: Xid (PCI:0000:86:00): 79, pid='<unknown>', name=<unknown>, "
            "GPU has fallen off the bus.\n"
            "[ 1021.339519] NVRM: Xid (PCI:0000:3b:00): 13, pid='<unknown>', name=<unknown>, "
            "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address\n")
    with log.open("w") as f:
        for _ in range(30_000):
            f.write(line)
    size = log.stat().st_size                         # ~7 MB
    ctx = types.SimpleNamespace(options=types.SimpleNamespace(kmsg_file=log, host_root=tmp_path))
    tracemalloc.start()
    try:
        counts, why = gpu_lost.xid79(ctx)
        _, peak_lost = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        calls = [{"pid": 7, "tid": 7, "comm": "python3", "ts": 1.0, "mono_s": 2200.0,
                  "duration_s": 0.1, "func": "cuInit", "result": 999,
                  "error": "CUDA_ERROR_UNKNOWN"}]
        (found,) = _trace_verdicts.cuda_findings(calls, [], None,
                                                 lambda: kmsg.kernel_log(ctx.options))
        _, peak_trace = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert why is None and counts == {"0000:86:00.0": 30_000}
    assert "Xid 79 on 0000:86:00" in found.title          # the storm's Xids near the call
    assert peak_lost < size / 8 and peak_trace < size / 4, (peak_lost, peak_trace, size)

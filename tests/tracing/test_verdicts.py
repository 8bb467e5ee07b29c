"""The judgement rules on recorded trace results (no BPF, no root)."""
from __future__ import annotations

import errno

from pathlib import Path

from node_probe.checks import _trace_verdicts as verdicts
from node_probe.engine.facts import ContainerList
from node_probe.host import containers as hc
from node_probe.host.cgroup_rules import parse_lines
from node_probe.tracing.cgroup_devices import devices_relpath, grants_gpus


UID = "3f8a1c52-6b1e-4c1b-9a9e-0d2f5e7a8b90"
CID = "ab" * 32


def _containers(pids=(), gpu=True, **meta) -> ContainerList:
    """The typed containers fact holding one container of pod UID (devices cgroup relpath
    /kubepods/burstable/pod<UID>/<CID>)."""
    ref = hc.parse_cgroup_path(f"/kubepods/burstable/pod{UID}/{CID}")
    c = hc.Container(ref=ref, cgroup_path=Path("/sys/fs/cgroup/devices" + ref.rel),
                     cgroup_version=1, pids=list(pids), meta=dict(meta),
                     gpu_source="podresources" if gpu else None)
    return ContainerList(None, (c,))


def _open(pid, path, err, comm="cuda-app", cg="/kubepods/pod1/c1"):
    return {"pid": pid, "tid": pid, "comm": comm, "path": path, "errno": err, "fd": None,
            "device": {"major": 195, "minor": 255}, "cgroup": {"devices": cg}, "cgroup_id": 7,
            "ts": 1.0}


def test_eperm_is_a_denial_and_enxio_is_not():
    opens = [_open(10, "/dev/nvidiactl", errno.EPERM), _open(10, "/dev/nvidiactl", errno.EPERM),
             _open(10, "/dev/nvidia-uvm", errno.EPERM), _open(11, "/dev/nvidia0", errno.ENXIO),
             _open(12, "/dev/nvidia0", 0)]
    found = verdicts.eperm_findings(opens)
    assert [f.evidence["pid"] for f in found] == [10]
    ev = found[0].evidence
    assert ev["count"] == 3 and ev["errno"] == errno.EPERM
    assert [(d["path"], d["count"]) for d in ev["devices"]] == [("/dev/nvidiactl", 2),
                                                               ("/dev/nvidia-uvm", 1)]
    assert ev["cgroup"] == "/kubepods/pod1/c1"
    assert found[0].id == "container.nvidia_eperm" and found[0].severity.value == "critical"


def _w(which, text, pid=50, comm="runc", cg="/kubepods/pod1/c1", ret=None):
    return {"pid": pid, "comm": comm, "which": which, "text": text,
            "ret": len(text) if ret is None else ret, "cgroup": cg, "path": "", "ts": 1.0}


def _never(_rel):
    return None


def test_rewrite_of_gpu_container_without_195_is_found():
    writes = [_w("deny", "a"), _w("allow", "c 1:3 rwm"), _w("allow", "c 136:* rwm")]
    found = verdicts.rewrite_findings(writes, ["/kubepods/pod1/c1"], None, _never)
    assert len(found) == 1
    ev = found[0].evidence
    assert ev["writers"] == [{"pid": 50, "comm": "runc"}]
    assert [w["text"] for w in ev["writes"]] == ["a", "c 1:3 rwm", "c 136:* rwm"]
    assert "195" in ev["gpu_evidence"][0]


def test_rewrite_that_allows_195_again_is_normal():
    writes = [_w("deny", "a"), _w("allow", "c 1:3 rwm"), _w("allow", "c 195:* rwm")]
    assert verdicts.rewrite_findings(writes, ["/kubepods/pod1/c1"], None, _never) == []


def test_rewrite_of_non_gpu_container_is_not_a_finding():
    writes = [_w("deny", "a"), _w("allow", "c 1:3 rwm")]
    assert verdicts.rewrite_findings(writes, ["/kubepods/other"], None, _never) == []


def test_gpu_evidence_from_an_earlier_write_or_the_containers_fact():
    earlier = [_w("allow", "c 195:0 rw"), _w("deny", "a *:* rwm"), _w("allow", "c 1:3 rwm")]
    assert len(verdicts.rewrite_findings(earlier, [], None, _never)) == 1
    cg = f"/kubepods/burstable/pod{UID}/{CID}"
    writes = [_w("deny", "a", cg=cg), _w("allow", "c 1:3 rwm", cg=cg)]
    found = verdicts.rewrite_findings(writes, [], _containers(), _never)
    assert len(found) == 1 and found[0].subject == f"container {CID[:13]} (pod {UID})"
    assert found[0].evidence["container"]["gpu"] is True
    # the same container without GPUs: nothing says it is a GPU container
    assert verdicts.rewrite_findings(writes, [], _containers(gpu=False), _never) == []


def test_explicit_deny_of_195_counts_and_rejected_writes_do_not():
    assert len(verdicts.rewrite_findings([_w("deny", "c 195:* rwm")], ["/kubepods/pod1/c1"],
                                         None, _never)) == 1
    rejected = [_w("deny", "a", ret=-errno.EINVAL), _w("allow", "c 1:3 rwm")]
    assert verdicts.rewrite_findings(rejected, ["/kubepods/pod1/c1"], None, _never) == []


def test_access_back_in_devices_list_now_suppresses():
    writes = [_w("deny", "a"), _w("allow", "c 1:3 rwm")]
    found = verdicts.rewrite_findings(writes, ["/kubepods/pod1/c1"], None,
                                      lambda rel: "c 1:3 rwm\nc 195:* rw\n")
    assert found == []


def test_stall_severity_depends_on_target_and_threshold():
    inflight = [{"pid": 5, "tid": 6, "comm": "plugin", "fd": 3, "path": "/dev/nvidiactl",
                 "request": 0xc020462a, "request_hex": "0xc020462a", "wait_s": 4.0},
                {"pid": 7, "tid": 7, "comm": "train", "fd": 4, "path": "/dev/nvidia0",
                 "request": 1, "request_hex": "0x00000001", "wait_s": 4.0},
                {"pid": 8, "tid": 8, "comm": "fast", "fd": 4, "path": "/dev/nvidia0",
                 "request": 1, "request_hex": "0x00000001", "wait_s": 0.1}]
    found = verdicts.stall_findings(inflight, [], 2.0, critical_pids=[5])
    assert [(f.evidence["pid"], f.severity.value) for f in found] == [(5, "critical"),
                                                                    (7, "warning")]


def test_rules_parsing_and_devices_paths():
    rules = parse_lines("a *:* rwm\nc 195:* rwm\nc 1:3 r\nb 8:0 m\na\nnot a rule\n")
    assert [r.kind for r in rules] == ["a", "c", "c", "b", "a"]
    # a GPU container at attach: an exception of its own for 195 with open access; the
    # default-allow root (or a privileged container) is not evidence of one
    assert grants_gpus("c 1:3 rwm\nc 195:* rwm\n") and grants_gpus("c 195:0 rw\n")
    assert not grants_gpus("a *:* rwm\n") and not grants_gpus("c 195:* m\n")
    assert devices_relpath("/sys/fs/cgroup/devices/kubepods/pod1/c1") == "/kubepods/pod1/c1"
    assert devices_relpath("/host/sys/fs/cgroup/cpuset,devices/x") == "/x"
    assert devices_relpath("/sys/fs/cgroup/devices") == "/"
    assert devices_relpath("/tmp/x") is None


def test_unavailable_finding_says_what_and_how():
    f = verdicts.unavailable_finding(["no bcc"], ["apt-get install python3-bpfcc"], {"k": 1})
    assert f.id == "probe.ebpf_unavailable" and "no bcc" in f.title
    assert "apt-get install python3-bpfcc" in f.remediation


def test_eperm_names_the_container_from_the_fact():
    fact = _containers(pids=[10], namespace="ml", pod="trainer-0", container="main")
    found = verdicts.eperm_findings([_open(10, "/dev/nvidia-uvm", errno.EPERM)], fact)
    assert "ml/trainer-0 container main" in found[0].title
    assert found[0].evidence["container"]["pod"] == "trainer-0"


def test_rewrite_verdict_reads_rules_as_the_kernel_does():
    """The two inputs the old private regex got backwards: after a rewrite to 'a *:* rwm' the
    NVIDIA major IS allowed (default allow), after 'c 195:* m' it is NOT (mknod only)."""
    gpu = ["/kubepods/pod1/c1"]
    to_all = [_w("deny", "a"), _w("allow", "a *:* rwm")]
    assert verdicts.rewrite_findings(to_all, gpu, None, _never) == []
    mknod_only = [_w("deny", "a"), _w("allow", "c 195:* m")]
    found = verdicts.rewrite_findings(mknod_only, gpu, None, _never)
    assert len(found) == 1 and found[0].id == "cgroup.device_rules_rewritten"
    # and what the kernel then shows in devices.list decides the same way
    assert verdicts.rewrite_findings(mknod_only, gpu, None, lambda rel: "c 195:* m\n")
    assert verdicts.rewrite_findings(mknod_only, gpu, None, lambda rel: "a *:* rwm\n") == []
    # a deny of mknod alone takes no open access away; a deny of read does
    assert verdicts.rewrite_findings([_w("deny", "c 195:* m")], gpu, None, _never) == []
    assert len(verdicts.rewrite_findings([_w("deny", "c 195:* r")], gpu, None, _never)) == 1


def test_every_loader_has_a_verdict_and_live_events_name_no_unknown_program():
    from node_probe.tracing.session import LOADERS
    assert [c.name for c in LOADERS] == list(verdicts.VERDICTS)


def _cuda(pid, func, result, ts=100.0, mono=50.0, comm="train"):
    from node_probe.tracing.cuda_calls import error_name
    return {"pid": pid, "tid": pid, "comm": comm, "func": func, "result": result,
            "error": error_name(result), "duration_s": 0.01, "ts": ts, "mono_s": mono,
            "cgroup": {"devices": f"/kubepods/burstable/pod{UID}/{CID}"}}


def test_cuda_failures_are_grouped_per_process_and_memory_only_is_a_warning():
    fact = _containers(pids=[7], namespace="ml", pod="trainer-0", container="main")
    failed = [_cuda(7, "cuMemAlloc_v2", 2), _cuda(7, "cuMemAlloc_v2", 2, ts=100.5),
              _cuda(8, "cuInit", 100, comm="probe")]
    found = verdicts.cuda_findings(failed, [], fact, lambda: [])
    assert [(f.evidence["pid"], f.severity.value) for f in found] == [(7, "warning"),
                                                                    (8, "critical")]
    ev = found[0].evidence
    assert ev["calls"] == [{"func": "cuMemAlloc_v2", "result": 2,
                            "error": "CUDA_ERROR_OUT_OF_MEMORY", "count": 2, "first_ts": 100.0}]
    assert ev["container"]["pod"] == "trainer-0"       # by pid, then by cgroup
    assert "ml/trainer-0 container main" in found[0].title
    assert "CUDA_ERROR_NO_DEVICE (100)" in found[1].title
    assert found[1].evidence["container"]["pod"] == "trainer-0"   # pid 8 found by its cgroup


def test_cuda_kernel_evidence_only_from_the_same_moment_and_process():
    opens = [{"pid": 7, "path": "/dev/nvidia-uvm", "errno": errno.EPERM, "errno_name": "EPERM",
              "ts": 101.0},
             {"pid": 7, "path": "/dev/nvidia0", "errno": errno.EPERM, "errno_name": "EPERM",
              "ts": 160.0},                                   # a minute later: not the cause
             {"pid": 9, "path": "/dev/nvidiactl", "errno": errno.EPERM, "errno_name": "EPERM",
              "ts": 100.0}]                                   # another process
    log = [(50.5, "NVRM: Xid (PCI:0000:3b:00): 79, pid=7, GPU has fallen off the bus."),
           (10.0, "NVRM: Xid (PCI:0000:3b:00): 13, long before"), (None, "unrelated")]
    found = verdicts.cuda_findings([_cuda(7, "cuInit", 999)], opens, None, lambda: log)
    k = found[0].evidence["kernel"]
    assert [o["path"] for o in k["denied_opens"]] == ["/dev/nvidia-uvm"]
    assert [x["xid"] for x in k["xids"]] == [79]
    assert "/dev/nvidia-uvm (EPERM)" in found[0].title and "Xid 79" in found[0].title
    assert verdicts.cuda_findings([], opens, None, lambda: log) == []


def test_live_events_per_record_kind():
    """What each verdict says live (event, subject, message), and when it says nothing."""
    def live(program, kind, rec, state=None):
        return verdicts.VERDICTS[program].live(kind, rec, {} if state is None else state)

    who = {"pid": 7, "tid": 8, "comm": "app"}
    assert live("nvidia_dev", "open", {**who, "path": "/dev/nvidia0", "errno": errno.EPERM}) == (
        "nvidia.open_denied", "pid 7 (app)", "open(/dev/nvidia0) = EPERM")
    assert live("nvidia_dev", "open", {**who, "path": "/dev/nvidia0", "errno": errno.ENXIO}) is None
    assert live("nvidia_dev", "slow_ioctl", {**who, "request_hex": "0xc020462a",
                                             "path": "/dev/nvidiactl", "duration_s": 1.5}) == (
        "ioctl.slow", "pid 7 (app)", "ioctl 0xc020462a on /dev/nvidiactl took 1.50s")
    assert live("cgroup_devices", "write", {**who, "text": "a", "path": None, "which": "deny",
                                            "errno": errno.EINVAL, "errno_name": "EINVAL"}) == (
        "cgroup.device_rule_write", "pid 7 (app)", "wrote 'a' to devices.deny (EINVAL)")
    assert live("cgroup_devices", "bpf_attach", {**who, "cmd": "BPF_PROG_ATTACH", "cgroup": None,
                                                 "target_fd": 5}) == (
        "cgroup.device_prog_attach", "pid 7 (app)", "BPF_PROG_ATTACH BPF_CGROUP_DEVICE on fd 5")
    assert live("cuda_calls", "failed", {**who, "func": "cuInit", "error": "CUDA_ERROR_UNKNOWN",
                                         "result": 999}) == (
        "cuda.call_failed", "pid 7 (app)", "cuInit returned CUDA_ERROR_UNKNOWN (999)")
    assert live("cuda_calls", "open", who) is None                 # a kind it does not know
    state: dict = {}
    assert live("futex_wait", "long_wait", {**who, "wait_s": 2.0}, state) is None   # not in NVML
    assert live("nvml_calls", "entered", {**who, "func": "nvmlInit_v2"}, state) == (
        "nvml.entered", "pid 7 (app) tid 8", "entered nvmlInit_v2")
    assert live("futex_wait", "long_wait", {**who, "wait_s": 2.0}, state) == (
        "futex.long_wait", "pid 7 (app) tid 8", "futex wait of 2.00s inside an NVML call")

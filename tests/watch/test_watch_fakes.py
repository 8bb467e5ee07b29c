"""The watch loop against the faithful fakes: a kernel log with an Xid flood, a wedged NVML
(the C stand-in), a device plugin that blocks in NVML init, a FIFO and a huge file in the host
root, real cgroups whose device rules are rewritten under it. Each costs one check its deadline,
never the loop, and a problem is one condition, not one per log line."""
from __future__ import annotations

import dataclasses
import os
import resource
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from node_probe.engine.context import ProbeOptions
from node_probe.watch import detect
from node_probe.watch.state import ConditionState
from tests.fakes.nvml import build_fake_nvml
from tests.watch.conftest import wait_for

NODE = "gpu-node-a"
XID = "GpuDoctorXidErrors"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _flood(n: int) -> str:
    lines = [f"[{100 + i * 0.001:.3f}] NVRM: Xid (PCI:0000:3b:00): 95, pid={4000 + i % 7}, "
             f"name=python, Uncontained ECC error" for i in range(n)]
    return "\n".join(lines) + "\n[200.0] eth0: link up\n"


@pytest.mark.slow
def test_xid_flood_is_one_problem_one_event_and_clears(api, start_agent, tmp_path):
    api.cluster.add_capture_node(NODE)
    api.bind("tok-a", NODE)
    root, cg = tmp_path / "root", tmp_path / "cg"
    root.mkdir()
    cg.mkdir()
    kmsg = tmp_path / "kmsg.txt"
    kmsg.write_text(_flood(5000))
    start_agent("--host-root", str(root), "--cgroup-root", str(cg), "--kmsg-file", str(kmsg),
                "--node-name", NODE, "--interval", "1", "--clear-after", "2", "--clear-quiet", "0",
                "--api-token-file", str(api.token_file), "--api-ca-file", str(api.ca),
                "--no-evidence", env=api.env())
    cond = wait_for(lambda: api.cluster.conditions(NODE).get(XID, {}).get("status") == "True"
                    and api.cluster.conditions(NODE)[XID], 60, "the Xid condition")
    assert cond["reason"] == "GpuXid"
    assert "Xid 95" in cond["message"] and "5000 times" in cond["message"]
    assert "more)" not in cond["message"]   # one GPU, one code: one problem
    time.sleep(3)                           # more passes over the same flood
    xid_events = [e for e in api.cluster.posted_events if e["reason"] == "GpuXid"]
    assert len(xid_events) == 1
    kmsg.write_text("[300.0] eth0: link up\n")  # the flood is gone (ring buffer rotated)
    wait_for(lambda: api.cluster.conditions(NODE)[XID]["status"] == "False", 60, "cleared")
    wait_for(lambda: [e for e in api.cluster.posted_events if e["reason"] == "XidErrorsCleared"], 30,
             "the clearing Event")


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def _gauge(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


@pytest.mark.slow
def test_wedged_nvml_costs_one_check_its_deadline_and_provoking_is_rate_limited(
        host, start_plugin, start_agent, tmp_path):
    lib = build_fake_nvml(host.root / "usr/lib/x86_64-linux-gnu", init="block")
    plugin = start_plugin("nvidia-gpu.sock", mode="nvml-block", nvml_lib=lib)
    kmsg = tmp_path / "kmsg.txt"
    kmsg.write_text("")
    port = _free_port()
    agent = start_agent(*host.args(), "--node-name", NODE, "--no-api", "--no-evidence",
                        "--kmsg-file", str(kmsg), "--interval", "1", "--nvml-timeout", "2",
                        "--metrics-port", str(port), "--provoke-min-gap", "3600")
    text = wait_for(lambda: _metrics_or_none(port, "nvml.init_hang"), 60, "a pass with the hang")
    first = _gauge(text, "gpu_doctor_last_pass_timestamp_seconds")
    # NVML hung in its child: the pass still ends within the check's deadline, and more follow
    assert _gauge(text, "gpu_doctor_pass_duration_seconds") < 20
    wait_for(lambda: (_gauge(_metrics(port), "gpu_doctor_last_pass_timestamp_seconds") or 0)
             > first + 1, 60, "later passes")
    # the hang pointed at the plugin: provoked once, which wedged a plugin thread; never again
    text = wait_for(lambda: _metrics_or_none(port, "deviceplugin.blocked_in_nvml"), 60,
                    "the plugin seen blocked")
    wait_for(lambda: (_gauge(_metrics(port), "gpu_doctor_last_pass_timestamp_seconds") or 0)
             > _gauge(text, "gpu_doctor_last_pass_timestamp_seconds") + 3, 60, "more passes")
    assert plugin.calls().count("GetPreferredAllocation") == 1
    assert not {"Allocate", "PreStartContainer"} & set(plugin.calls())
    assert 'gpu_doctor_condition{condition="GpuDoctorDevicePluginStuck"} 1' in _metrics(port)
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 405
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=10)
    assert e.value.code == 404
    assert agent.stop() == 0


def _metrics_or_none(port: int, needle: str) -> str | None:
    try:
        text = _metrics(port)
    except OSError:
        return None
    return text if f'id="{needle}"' in text else None


def test_fifo_and_huge_files_in_the_host_root_cost_no_more_than_deadlines(tmp_path):
    root = tmp_path / "root"
    (root / "proc/driver/nvidia/gpus/0000:3b:00.0").mkdir(parents=True)
    (root / "dev").mkdir()
    (root / "var/lib/kubelet/device-plugins").mkdir(parents=True)
    os.mkfifo(root / "proc/driver/nvidia/version")      # nobody ever writes
    os.mkfifo(root / "dev/kmsg")
    os.mkfifo(root / "proc/devices")
    huge = root / "proc/driver/nvidia/gpus/0000:3b:00.0/information"
    with open(huge, "wb") as f:                          # 4 GiB, sparse
        f.truncate(4 << 30)
    (root / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    os.mkfifo(root / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")
    base = ProbeOptions(host_root=root, cgroup_root=tmp_path / "cg", kubelet_dir=None)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(2):
        res = detect.run_pass(base, 20.0)
        assert res.duration_s < 20.5
        statuses = {c.id: c.status for c in res.checks}
        assert set(statuses) >= {"nvml", "kmsg", "gpu_lost", "deviceplugin"}
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    assert grown_mib < 64, grown_mib  # the 4 GiB file was not read whole


@pytest.mark.root
def test_device_rules_rewritten_under_a_running_container(v1_tree, tmp_path):
    from tests.cgroups.conftest import GPU0_UUID, deny_all_then_allow, make_host_root, new_cid, \
        new_uid
    from tests.cgroups.test_audit_v1 import BASE, GPU0_NO_UVM

    host = make_host_root(tmp_path)
    uid, cid = new_uid(), new_cid()
    cg = v1_tree.container(uid, cid)
    full = GPU0_NO_UVM + ["c 237:0 rw", "c 237:1 rw"]
    deny_all_then_allow(cg, full)
    v1_tree.spawn(cg, {"NVIDIA_VISIBLE_DEVICES": GPU0_UUID})
    base = ProbeOptions(host_root=host, cgroup_root=Path("/sys/fs/cgroup"))
    state = ConditionState(clear_after=1)

    def mine(res):
        return [p for p in res.problems.get("GpuDoctorDeviceAccessLost", ())
                if uid in p.subject or cid[:12] in p.subject or uid in p.title]

    res = detect.run_pass(base, 20.0)
    assert mine(res) == []
    deny_all_then_allow(cg, BASE)            # the rewrite: devices dropped under it
    res = detect.run_pass(base, 20.0)
    (p,) = mine(res)
    assert p.finding_id == "cgroup.device_denied" and p.severity == "critical"
    tr = state.update({"GpuDoctorDeviceAccessLost": mine(res)})
    assert tr[0].status == "True"
    deny_all_then_allow(cg, full)            # restored (the pod was recreated)
    res = detect.run_pass(base, 20.0)
    assert mine(res) == []
    assert state.update({k: [] for k in res.problems})[0].status == "False"


def test_healthy_node_stays_quiet(tmp_path):
    """Nothing wrong (an empty host root and an empty /proc: the machine's own /proc holds
    the daemons and GPU containers other tests start beside this one): no problem, no
    condition True."""
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "proc").mkdir()
    kmsg = tmp_path / "kmsg.txt"
    kmsg.write_text("[1.0] Linux version 6.1\n")
    res = detect.run_pass(ProbeOptions(host_root=root, cgroup_root=tmp_path / "cg",
                                       proc_root=tmp_path / "proc", kmsg_file=kmsg), 20.0)
    probs = {k: v for k, v in res.problems.items() if k != "GpuDoctorMemoryThrash"}
    assert probs == {}  # memory pressure depends on the shared machine's load
    assert res.stuck == ()
    state = ConditionState()
    assert state.update(probs) == []
    assert all(c.status == "False" for c in state.conds.values())


def test_a_check_stuck_from_an_earlier_pass_is_not_started_again(tmp_path, monkeypatch):
    import threading

    gate = threading.Event()
    t = threading.Thread(target=gate.wait, name="check:kmsg", daemon=True)
    t.start()
    try:
        root = tmp_path / "root"
        root.mkdir()
        res = detect.run_pass(ProbeOptions(host_root=root, cgroup_root=tmp_path / "cg"), 20.0)
        assert res.stuck == ("kmsg",)
        assert "kmsg" not in {c.id for c in res.checks}
        assert {"GpuDoctorXidErrors", "GpuDoctorKernelHungTask"} <= res.unsure
    finally:
        gate.set()


ISO = "GpuDoctorIsolationBreach"
NS = "watch-iso"   # not another test's namespace: the scan sees every container here


@pytest.fixture
def iso_node(v1_tree):
    """A node where pod-resources gives train-0 GPU0 and gives notebook-1 none, and each has a
    real process in its kubepods cgroup holding GPU0 open (tests/cgroups/test_gpu_isolation's
    host root: the driver's major is 1 there, so the kernel opens the mknod'ed nodes)."""
    import shutil
    import tempfile

    from tests.cgroups.conftest import GPU0_UUID, new_cid, new_uid
    from tests.cgroups.test_gpu_isolation import MINORS, bundle, holding, host_root
    from tests.fakes.fake_podresources import serve

    base = Path(tempfile.mkdtemp(prefix="gdw-", dir="/tmp"))   # unix socket paths: short
    root = host_root(base)
    gpu0 = root / f"dev/nvidia{MINORS[GPU0_UUID]}"
    rows, procs = [], {}
    for pod, given in (("train-0", [GPU0_UUID]), ("notebook-1", [])):
        uid, cid = new_uid(), new_cid()
        cg = v1_tree.container(uid, cid)
        bundle(root, cid, NS, pod, uid, "main")
        procs[pod] = holding(v1_tree, cg, [gpu0])
        rows.append({"namespace": NS, "pod": pod, "container": "main",
                     "resource": "nvidia.com/gpu" if given else "example.com/nic",
                     "device_ids": given or ["nic-0"]})
    server = serve(root / "var/lib/kubelet/pod-resources/kubelet.sock", rows)
    try:
        yield root, procs
    finally:
        server.stop(0)
        shutil.rmtree(base, ignore_errors=True)


def _mine(res):
    """This test's breaches (other tests' containers on this machine are scanned too)."""
    return [p for p in res.problems.get(ISO, ()) if p.subject.startswith(f"pod {NS}/")]


@pytest.mark.root
def test_isolation_breach_marks_the_node_and_clears_with_hysteresis(iso_node):
    root, procs = iso_node
    base = ProbeOptions(host_root=root, cgroup_root=Path("/sys/fs/cgroup"),
                        kubelet_dir=root / "var/lib/kubelet")
    state = ConditionState(clear_after=2)
    res = detect.run_pass(base, 20.0)
    (p,) = _mine(res)
    assert p.finding_id == "gpu.isolation_breach" and p.severity == "critical"
    assert p.subject == f"pod {NS}/notebook-1 container main"
    assert res.isolation_cpu_s is not None and res.isolation_cpu_s >= 0
    (tr,) = state.update({ISO: _mine(res)}, res.unsure)
    assert (tr.ctype, tr.status, tr.reason) == (ISO, "True", "GpuIsolationBreach")
    assert state.conds[ISO].message.startswith(f"gpu.isolation_breach: pod {NS}/notebook-1")
    # a pass that does not run the scan (the pacer said wait) proves nothing
    res = detect.run_pass(base, 20.0, isolation=False)
    assert ISO in res.unsure and res.isolation_cpu_s is None
    assert state.update({ISO: _mine(res)}, res.unsure) == []
    procs["notebook-1"].kill()                 # the intruder is gone
    procs["notebook-1"].wait(10)
    res = detect.run_pass(base, 20.0)
    assert _mine(res) == [] and ISO not in res.unsure
    assert state.update({ISO: _mine(res)}, res.unsure) == []   # hysteresis: 1 of 2
    res = detect.run_pass(base, 20.0)
    (tr,) = state.update({ISO: _mine(res)}, res.unsure)
    assert (tr.status, tr.reason) == ("False", "IsolationBreachCleared")
    assert "was GpuIsolationBreach" in tr.message


@pytest.mark.root
def test_isolation_scan_cut_by_its_descriptor_cap_is_unsure_not_absent(iso_node):
    root, _ = iso_node
    base = ProbeOptions(host_root=root, cgroup_root=Path("/sys/fs/cgroup"),
                        kubelet_dir=root / "var/lib/kubelet", isolation_max_fds=1)
    res = detect.run_pass(base, 20.0)
    (r,) = [c for c in res.checks if c.id == "gpu.isolation"]
    assert r.status == "skipped" and "cap of 1 descriptors" in r.reason
    assert ISO in res.unsure       # a breach it did not read cannot clear the condition


def test_isolation_pacer_spreads_the_scans_cpu():
    pacer = detect.IsolationPacer(share=0.001)
    assert pacer.want(now=0.0)
    pacer.used(0.16, now=0.0)                  # 0.16 s of CPU: next run 160 s later
    assert not pacer.want(now=159.0) and pacer.want(now=160.0)
    pacer.used(0.0, now=160.0)                 # skipped before scanning: again next pass
    assert pacer.want(now=160.0)

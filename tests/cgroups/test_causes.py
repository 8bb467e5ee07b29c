"""Which cause a denial gets, from the facts other checks publish (run in-process so the facts
can be set; the cgroups, processes and device nodes are real)."""
import json
from pathlib import Path

import pytest

from node_probe.checks.cgroup_devices import cgroup_devices, causes_for
from node_probe.checks.containers import containers_check
from node_probe.engine import facts as F
from node_probe.engine.context import ProbeContext, ProbeOptions
from tests.cgroups.conftest import (GPU0_UUID, UVM_MAJOR, deny_all_then_allow, make_host_root,
                                    new_cid, new_uid)
from tests.cgroups.test_audit_v1 import BASE, GPU0_NO_UVM

pytestmark = pytest.mark.root


def run_check(host, uids, facts, trace_s=0.0):
    opts = ProbeOptions(host_root=host, cgroup_root=Path("/sys/fs/cgroup"), trace_s=trace_s,
                        only=("cgroup.devices",), focus_pods=tuple(uids), timeout_s=15)
    records = []
    ctx = ProbeContext(opts, records.append)
    for k, v in facts.items():
        ctx.publish(k, v)
    for key in F.declared():   # what the test does not give, no check produces in this run
        if key is not F.CONTAINERS:
            ctx.facts.fail(key, "not given by the test")
    containers_check(ctx)      # the producer of the container list, as the runner would run it
    findings = list(cgroup_devices(ctx))
    return findings, ctx, records


def write_bundle(host, cid, ns, pod, name, spec_rules):
    d = host / f"run/containerd/io.containerd.runtime.v2.task/k8s.io/{cid}"
    d.mkdir(parents=True)
    d.joinpath("config.json").write_text(json.dumps({
        "process": {"env": ["SECRET=do-not-print"]},
        "annotations": {"io.kubernetes.cri.sandbox-name": pod,
                        "io.kubernetes.cri.sandbox-namespace": ns,
                        "io.kubernetes.cri.container-name": name},
        "linux": {"resources": {"devices": [{"allow": False, "access": "rwm"}] + spec_rules}}}))


def test_seed_002_stale_plugin_view_via_podresources(v1_tree, tmp_path):
    """The plugin's own /dev lacks nvidia-uvm (computed from /proc/PID/root/dev, since no
    check publishes deviceplugin.stale_dev_view in this run)."""
    host = make_host_root(tmp_path)
    uid, cid = new_uid(), new_cid()
    cg = v1_tree.container(uid, cid)
    deny_all_then_allow(cg, GPU0_NO_UVM)
    v1_tree.spawn(cg, {})            # no NVIDIA_* env: only pod-resources says it has a GPU
    plugin = v1_tree.spawn_with_private_dev(v1_tree.container(new_uid(), new_cid()), {},
                                            [("nvidiactl", 195, 255), ("nvidia0", 195, 0)])
    write_bundle(host, cid, "ml", "train-0", "trainer",
                 [{"allow": True, "type": "c", "major": 195, "minor": 255, "access": "rw"},
                  {"allow": True, "type": "c", "major": 195, "minor": 0, "access": "rw"}])
    facts = {"podresources": [{"namespace": "ml", "pod": "train-0", "container": "trainer",
                               "resource": "nvidia.com/gpu", "device_ids": [GPU0_UUID]}],
             "deviceplugin.targets": [F.PluginTargetInfo(pid=plugin.pid,
                                                         comm="nvidia-device-plugin",
                                                         resource="nvidia.com/gpu",
                                                         socket="nvidia.sock")]}
    findings, ctx, _ = run_check(host, [uid], facts)
    assert len(findings) == 1
    f = findings[0]
    assert f.subject == "pod ml/train-0 container trainer"
    assert f.evidence["gpu_source"] == "podresources"
    assert f.evidence["causes"][0] == "plugin_stale_dev_view"
    assert "restart the device plugin" in f.remediation
    assert f.evidence["plugin_dev_missing"] == ["nvidia-uvm", "nvidia-uvm-tools"]
    assert [d["in_runtime_spec"] for d in f.evidence["denied"]] == [False, False]
    assert "do-not-print" not in json.dumps(f.to_record())
    fact = ctx.fact(F.CONTAINERS, timeout=0)
    mine = [c for c in fact if c.ref.pod_uid == uid]
    assert mine and mine[0].meta["pod"] == "train-0" and mine[0].is_gpu
    assert fact.gpu == tuple(mine) and fact.by_pid(mine[0].pids[0]) is mine[0]


def test_seed_001_cpu_manager_static_without_specs_and_the_writer(v1_tree, tmp_path):
    host = make_host_root(tmp_path)
    uid, cid = new_uid(), new_cid()
    cg = v1_tree.container(uid, cid)
    deny_all_then_allow(cg, BASE)    # rewritten: no NVIDIA device left at all
    v1_tree.spawn(cg, {"NVIDIA_VISIBLE_DEVICES": GPU0_UUID})
    plugin_cg = v1_tree.container(new_uid(), new_cid())
    plugin = v1_tree.spawn_with_private_dev(  # its /dev is complete: not the seed 002 cause
        plugin_cg, {"PASS_DEVICE_SPECS": "false"},
        [("nvidiactl", 195, 255), ("nvidia0", 195, 0), ("nvidia-uvm", UVM_MAJOR, 0),
         ("nvidia-uvm-tools", UVM_MAJOR, 1)])
    writes = [{"pid": 4711, "comm": "runc", "path": f"{cg}/devices.deny", "text": "a *:* rwm",
               "ts": 1.0},
              {"pid": 4711, "comm": "runc", "path": f"{cg}/devices.allow", "text": "c 1:3 rwm",
               "ts": 1.1},
              {"pid": 1, "comm": "other", "path": "/sys/fs/cgroup/devices/x/devices.deny",
               "text": "a", "ts": 1.2}]
    facts = {"kubelet.config": {"cpuManagerPolicy": "static", "cgroupDriver": "cgroupfs"},
             "deviceplugin.targets": [F.PluginTargetInfo(pid=plugin.pid,
                                                         comm="nvidia-device-plugin",
                                                         resource="nvidia.com/gpu",
                                                         socket="nvidia.sock")],
             "trace.ready": {"available": True, "probes": ["cgroup_devices"], "target_pids": []},
             "trace.results": {"cgroup_writes": writes}}
    findings, _, records = run_check(host, [uid], facts, trace_s=1.0)
    assert len(findings) == 1
    ev = findings[0].evidence
    assert ev["causes"] == ["cpu_manager_static_without_device_specs"]
    assert ev["plugin_passes_device_specs"] is False
    assert {d["device"] for d in ev["denied"]} >= {"/dev/nvidiactl", "/dev/nvidia0",
                                                   "/dev/nvidia-uvm"}
    assert [w["text"] for w in ev["rewritten_by"]] == ["a *:* rwm", "c 1:3 rwm"]
    assert "runc[4711]" in findings[0].remediation
    assert "PASS_DEVICE_SPECS" in findings[0].remediation
    assert any(r["kind"] == "event" and r["name"] == "cgroup.device_denied" for r in records)


@pytest.mark.parametrize("links", [False, True])
def test_systemd_driver_and_dev_char_links(v1_tree, tmp_path, links):
    host = make_host_root(tmp_path, dev_char=links)
    uid = new_uid()
    cg = v1_tree.container(uid, new_cid(), layout="systemd")
    deny_all_then_allow(cg, GPU0_NO_UVM + [f"c {UVM_MAJOR}:0 rw"])
    v1_tree.spawn(cg, {"NVIDIA_VISIBLE_DEVICES": "0"})
    findings, ctx, _ = run_check(host, [uid], {})
    by_id = {f.id: f for f in findings}
    assert ctx.fact(F.CONTAINERS, timeout=0).items[0].ref.driver == "systemd"
    # uvm allowed, uvm-tools not: a warning, not critical
    d = by_id["cgroup.device_denied"]
    assert d.severity.value == "warning"
    assert [x["device"] for x in d.evidence["denied"]] == ["/dev/nvidia-uvm-tools"]
    assert d.evidence["causes"] == ["systemd_driver_device_reset"]
    if links:
        assert "cgroup.dev_char_symlinks_missing" not in by_id
    else:
        s = by_id["cgroup.dev_char_symlinks_missing"]
        assert {m["link"] for m in s.evidence["missing"]} == {
            "/dev/char/195:255", "/dev/char/195:0", f"/dev/char/{UVM_MAJOR}:0",
            f"/dev/char/{UVM_MAJOR}:1"}


def test_cause_order_and_fallback():
    both = causes_for({"nvidia-uvm"}, {"nvidia-uvm"}, {"cpuManagerPolicy": "static"},
                      "cgroupfs", None)
    assert [c["cause"] for c in both] == ["plugin_stale_dev_view",
                                          "cpu_manager_static_without_device_specs"]
    # specs passed: static policy is not the cause
    assert [c["cause"] for c in causes_for({"nvidia0"}, None, {"cpuManagerPolicy": "static"},
                                           "cgroupfs", True)] == ["unknown_rewrite"]

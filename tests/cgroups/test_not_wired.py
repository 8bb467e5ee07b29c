"""A GPU container that was never given its devices is runtime.not_wired, not a rewrite.

The cgroups, processes and device nodes are real (as in test_causes); the runtime's OCI spec
is a config.json where containerd keeps it. Without an NVIDIA handler, CDI or device specs the
spec holds no NVIDIA device and no NVIDIA hook: the denial is "never wired", even when the
trace saw the runtime re-apply the rules. With nvidia-container-runtime's hook in the spec the
devices were added outside it, so a rewrite that dropped them is claimed as before.
"""
import json

import pytest

from tests.cgroups.conftest import GPU0_UUID, deny_all_then_allow, make_host_root, new_cid, new_uid
from tests.cgroups.test_audit_v1 import BASE
from tests.cgroups.test_causes import run_check

pytestmark = pytest.mark.root

CONTAINERD_RUNC_ONLY = """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "runc"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
"""
HOOK = {"prestart": [{"path": "/usr/bin/nvidia-container-runtime-hook",
                      "args": ["nvidia-container-runtime-hook", "prestart"]}]}


def bundle(host, cid, hooks=None):
    d = host / f"run/containerd/io.containerd.runtime.v2.task/k8s.io/{cid}"
    d.mkdir(parents=True)
    rules = [{"allow": False, "access": "rwm"}] + [
        {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rwm"}]
    doc = {"process": {"env": ["NVIDIA_VISIBLE_DEVICES=" + GPU0_UUID, "TOKEN=do-not-print"]},
           "annotations": {"io.kubernetes.cri.sandbox-name": "train-0",
                           "io.kubernetes.cri.sandbox-namespace": "ml",
                           "io.kubernetes.cri.container-name": "trainer"},
           "linux": {"resources": {"devices": rules}}}
    if hooks:
        doc["hooks"] = hooks
    d.joinpath("config.json").write_text(json.dumps(doc))


@pytest.mark.parametrize("wired", [False, True], ids=["never-wired", "legacy-hook"])
def test_never_given_is_not_wired_and_a_rewrite_needs_the_devices_first(v1_tree, tmp_path,
                                                                        wired):
    host = make_host_root(tmp_path)
    (host / "etc/containerd").mkdir(parents=True)
    (host / "etc/containerd/config.toml").write_text(CONTAINERD_RUNC_ONLY)
    uid, cid = new_uid(), new_cid()
    cg = v1_tree.container(uid, cid)
    deny_all_then_allow(cg, BASE)            # what runc applied from the spec: no NVIDIA device
    v1_tree.spawn(cg, {"NVIDIA_VISIBLE_DEVICES": GPU0_UUID})
    bundle(host, cid, HOOK if wired else None)
    writes = [{"pid": 4711, "comm": "runc", "path": f"{cg}/devices.deny", "text": "a",
               "ts": 1.0},
              {"pid": 4711, "comm": "runc", "path": f"{cg}/devices.allow", "text": "c 1:3 rwm",
               "ts": 1.1}]
    facts = {"trace.ready": {"available": True, "probes": ["cgroup_devices"], "target_pids": []},
             "trace.results": {"cgroup_writes": writes}}
    findings, _, _ = run_check(host, [uid], facts, trace_s=1.0)
    ids = [f.id for f in findings]
    if wired:          # the hook added the devices outside the spec: a re-apply drops them
        assert ids == ["cgroup.device_denied"], findings
        assert findings[0].evidence["rewritten_by"][0]["comm"] == "runc"
        return
    assert ids == ["runtime.not_wired"], findings
    f = findings[0]
    assert f.severity.value == "critical"
    assert f.subject == "pod ml/train-0 container trainer"
    ev = f.evidence
    assert {d["device"] for d in ev["denied"]} >= {"/dev/nvidiactl", "/dev/nvidia0"}
    assert (ev["runtime"], ev["default_handler"], ev["nvidia_handlers"]) == ("containerd", "runc", [])
    assert ev["spec"].endswith(f"{cid}/config.json")
    assert any("no nvidia handler" in m for m in ev["missing"])
    assert any("no CDI" in m for m in ev["missing"])
    assert "never given its GPU" in f.title
    assert "nvidia-ctk runtime configure --runtime=containerd --set-as-default" in f.remediation
    assert "rewrote" not in f.remediation and "do-not-print" not in json.dumps(f.to_record())

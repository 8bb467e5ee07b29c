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


def bundle(host, cid, hooks=None, state="run/containerd"):
    d = host / f"{state}/io.containerd.runtime.v2.task/k8s.io/{cid}"
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


CUSTOM = "home/ubuntu/containerd/k8s-containerd"      # canonical/k8s-snap#1046's layout
NVIDIA_DEFAULT = """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "nvidia"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
    BinaryName = "/usr/bin/nvidia-container-runtime"
"""


def test_a_containerd_outside_the_defaults_is_found_and_its_spec_read(v1_tree, tmp_path):
    """Issue 29 item 3, as seen on a real node: containerd runs with --config and --address
    outside the defaults (canonical/k8s-snap#1046). A resolver trying only fixed paths read the
    default config (which names an nvidia default handler), found no OCI spec and called the
    never-wired container a rewrite ("unknown_rewrite", "recreate the pod"). Decided from the
    running containerd, its own config and state dir: runtime.not_wired, from that config."""
    from tests.fakes import fake_daemon
    host = make_host_root(tmp_path)
    (host / "etc/containerd").mkdir(parents=True)
    (host / "etc/containerd/config.toml").write_text(NVIDIA_DEFAULT)   # not the one in use
    cfg = host / CUSTOM / "etc/containerd/config.toml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text(f'state = "/{CUSTOM}/run/containerd"\n' + CONTAINERD_RUNC_ONLY)
    ctd = fake_daemon.spawn("containerd", [host / CUSTOM / "run/containerd/containerd.sock"],
                            "--config", f"/{CUSTOM}/etc/containerd/config.toml",
                            "--address", f"/{CUSTOM}/run/containerd/containerd.sock", root=host)
    try:
        uid, cid = new_uid(), new_cid()
        cg = v1_tree.container(uid, cid)
        deny_all_then_allow(cg, BASE)
        v1_tree.spawn(cg, {"NVIDIA_VISIBLE_DEVICES": GPU0_UUID})
        bundle(host, cid, state=f"{CUSTOM}/run/containerd")
        facts = {"trace.ready": {"available": False, "probes": [], "target_pids": []}}
        findings, _, _ = run_check(host, [uid], facts)
    finally:
        ctd.kill()
        ctd.wait(10)
    assert [f.id for f in findings] == ["runtime.not_wired"], findings
    ev = findings[0].evidence
    assert ev["spec"] == f"/{CUSTOM}/run/containerd/io.containerd.runtime.v2.task/k8s.io/{cid}/" \
        "config.json"
    assert ev["runtime_config_files"] == [f"/{CUSTOM}/etc/containerd/config.toml"]
    assert (ev["default_handler"], ev["nvidia_handlers"]) == ("runc", [])

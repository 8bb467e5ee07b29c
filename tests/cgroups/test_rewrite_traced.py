"""Seed 001 live: while the probe traces, a writer resets a GPU container's device rules the
way runc applies a container update (`a` to devices.deny, then an allow list without the
NVIDIA devices). The audit re-checks that container after the window and names the writer.
Run twice: with the host's kernel headers, and with them hidden (a private mount namespace) so
BCC compiles with the probe's bundled header set."""
import json
import os
import subprocess
import sys

import pytest

from tests.cgroups.conftest import GPU0_UUID, deny_all_then_allow, make_host_root, new_cid, new_uid
from tests.cgroups.test_audit_v1 import BASE, GPU0_NO_UVM
from tests.probe_run import REPO
from tests.tracing.conftest import HIDE_HEADERS, build_header_set

pytestmark = [pytest.mark.root, pytest.mark.bcc, pytest.mark.slow]


@pytest.mark.parametrize("headers", ["host", "bundled"])
def test_rules_rewritten_during_the_window_are_audited_and_the_writer_named(v1_tree, tmp_path,
                                                                            headers):
    wrapper, env = [], dict(os.environ, PYTHONPATH=str(REPO))
    if headers == "bundled":
        why = build_header_set(tmp_path / "kheaders")
        if why:
            pytest.skip(why)
        wrapper, env["GPU_DOCTOR_KHEADERS_DIR"] = HIDE_HEADERS, str(tmp_path / "kheaders")
    host = make_host_root(tmp_path)
    uid = new_uid()
    cg = v1_tree.container(uid, new_cid())
    deny_all_then_allow(cg, GPU0_NO_UVM + ["c 237:* rw"])       # healthy at start
    v1_tree.spawn(cg, {"NVIDIA_VISIBLE_DEVICES": GPU0_UUID})
    probe = subprocess.Popen(
        [*wrapper, sys.executable, "-m", "node_probe", "-o", "jsonl", "--host-root", str(host),
         "--cgroup-root", "/sys/fs/cgroup", "--trace-seconds", "3", "--timeout", "40",
         "--focus-pod", uid, "--only", "cgroup.devices", "--only", "trace"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO, env=env)
    records, writer = [], None
    try:
        for line in probe.stdout:
            rec = json.loads(line)
            records.append(rec)
            if rec.get("kind") == "finding" and rec["id"] == "probe.ebpf_unavailable":
                pytest.skip(f"eBPF tracing unavailable here: {rec['title']}")
            if writer is None and rec.get("phase") == "trace":     # programs attached
                assert rec["kernel_headers"]["source"] == headers or headers == "host"
                script = f"echo a > {cg}/devices.deny; " + "; ".join(
                    f"echo '{r}' > {cg}/devices.allow" for r in BASE)
                writer = subprocess.Popen(["/bin/sh", "-c", script])
                writer.wait(timeout=10)
        probe.wait(timeout=40)
    finally:
        if probe.poll() is None:
            probe.kill()
            probe.wait()
    assert writer is not None, "the trace never attached"
    assert records[-1]["kind"] == "summary"
    denied = [r for r in records if r.get("kind") == "finding" and r["id"] == "cgroup.device_denied"]
    assert len(denied) == 1, records
    ev = denied[0]["evidence"]
    assert {d["device"] for d in ev["denied"]} >= {"/dev/nvidiactl", "/dev/nvidia0",
                                                   "/dev/nvidia-uvm"}
    assert ev["rewritten_by"][0] == {**ev["rewritten_by"][0], "pid": writer.pid,
                                     "file": "devices.deny", "text": "a"}
    assert f"sh[{writer.pid}]" in denied[0]["remediation"]

"""CUDA driver calls that fail, per process, with what the kernel saw (bpf/cuda_calls.bpf.c).

A stand-in libcuda.so.1 (tests/fakes/fake_libcuda.c, built by gcc) whose cuInit really opens a
mknod'ed UVM device node; the process sits in a real cgroup v1 device cgroup that denies it, so
the kernel answers EPERM and cuInit returns CUDA_ERROR_UNKNOWN (999), as the real library does.
The probe CLI runs as a child, as on a node.
"""
from __future__ import annotations

import errno
import os
import stat
import sys
import time
from pathlib import Path

import pytest

from tests.tracing.conftest import build_helper, events, findings, REPO

pytestmark = [pytest.mark.root, pytest.mark.bcc, pytest.mark.slow]


def _lib(tmp_path: Path) -> Path:
    sys.path.insert(0, str(REPO))
    from tests.fakes.cuda import build_fake_libcuda
    return build_fake_libcuda(tmp_path / "driver")


def _caller(children, lib: Path, **env):
    e = dict(os.environ)
    e.update({k: str(v) for k, v in env.items()})
    child = children([str(build_helper("cuda_caller", "-ldl")), str(lib)], env=e)
    pid = int(child.expect("ready").split()[1])
    return child, pid


def test_cuinit_failing_on_a_denied_uvm_node_names_the_kernel_cause(bcc_ready, devices_cgroup,
                                                                     children, probe, tmp_path):
    uvm = tmp_path / "nvidia-uvm"
    os.mknod(uvm, 0o666 | stat.S_IFCHR, os.makedev(195, 254))
    cg = devices_cgroup("cuda")
    (cg / "devices.deny").write_text("c 195:* rwm")
    lib = _lib(tmp_path)
    child, pid = _caller(children, lib, FAKE_CUDA_UVM=uvm)
    (cg / "cgroup.procs").write_text(str(pid))

    run = probe("--only", "trace", "--trace-seconds", "2", "--trace-pid", str(pid),
                "--dev-prefix", str(tmp_path / "nvidia"))
    ready = run.wait_attached()
    assert "cuda_calls" in ready["probes"]
    child.send()
    assert child.expect("results") == "results 999 -1 -1 -1"   # the kernel said EPERM
    recs = run.finish()

    found = findings(recs, "cuda.call_failed")
    assert len(found) == 1, found
    f = found[0]
    ev = f["evidence"]
    assert f["severity"] == "critical" and ev["pid"] == pid
    assert ev["calls"] == [{"func": "cuInit", "result": 999, "error": "CUDA_ERROR_UNKNOWN",
                            "count": 1, "first_ts": ev["calls"][0]["first_ts"]}]
    denied = ev["kernel"]["denied_opens"]
    assert [(d["path"], d["errno"], d["errno_name"]) for d in denied] == [
        (str(uvm), errno.EPERM, "EPERM")]
    assert (denied[0]["device"]["major"], denied[0]["device"]["minor"]) == (195, 254)
    assert ev["cgroup"] == "/" + cg.name
    assert "cuInit returned CUDA_ERROR_UNKNOWN (999)" in f["title"]
    assert "refused it" in f["title"] and str(uvm) in f["title"]
    assert "container.nvidia_eperm" in f["remediation"]
    live = events(recs, "cuda.call_failed")
    assert [(e["data"]["pid"], e["data"]["func"], e["data"]["result"]) for e in live] == [
        (pid, "cuInit", 999)]
    # the EPERM itself is its own finding, as before
    assert [x["evidence"]["pid"] for x in findings(recs, "container.nvidia_eperm")] == [pid]


def test_chosen_error_with_an_xid_at_the_same_moment(bcc_ready, children, probe, tmp_path):
    """cuInit returns CUDA_ERROR_SYSTEM_NOT_READY (802) with nothing denied; the kernel log
    (a saved one, --kmsg-file: the machine's own log is shared) has an Xid seconds later."""
    lib = _lib(tmp_path)
    child, pid = _caller(children, lib, FAKE_CUDA_UVM="/dev/null", FAKE_CUDA_INIT_RESULT=802)
    kmsg = tmp_path / "kmsg.txt"
    kmsg.write_text(f"[{time.monotonic() - 600:.6f}] NVRM: Xid (PCI:0000:3b:00): 79, old\n")
    run = probe("--only", "trace", "--trace-seconds", "2", "--trace-pid", str(pid),
                "--dev-prefix", str(tmp_path / "nvidia"), "--kmsg-file", str(kmsg))
    run.wait_attached()
    child.send()
    assert child.expect("results") == "results 802 -1 -1 -1"
    with kmsg.open("a") as f:   # written while the probe still traces, read at the end
        f.write(f"[{time.monotonic():.6f}] NVRM: Xid (PCI:0000:3b:00): 119, pid=1, "
                "Timeout waiting for RPC from GSP\n")
    recs = run.finish()
    found = findings(recs, "cuda.call_failed")
    assert len(found) == 1, found
    ev = found[0]["evidence"]
    assert [(c["func"], c["error"]) for c in ev["calls"]] == [("cuInit",
                                                               "CUDA_ERROR_SYSTEM_NOT_READY")]
    assert ev["kernel"]["denied_opens"] == []
    assert [(x["xid"], x["pci"]) for x in ev["kernel"]["xids"]] == [(119, "0000:3b:00")]
    assert "Xid 119 on 0000:3b:00" in found[0]["title"]


def test_healthy_cuda_process_gives_no_finding(bcc_ready, children, probe, tmp_path):
    lib = _lib(tmp_path)
    child, pid = _caller(children, lib, FAKE_CUDA_UVM="/dev/null")
    run = probe("--only", "trace", "--trace-seconds", "2", "--trace-pid", str(pid),
                "--dev-prefix", str(tmp_path / "nvidia"))
    ready = run.wait_attached()
    assert "cuda_calls" in ready["probes"]     # it looked
    child.send()
    assert child.expect("results") == "results 0 0 0 0"
    recs = run.finish()
    assert findings(recs, "cuda.call_failed") == []
    assert events(recs, "cuda.call_failed") == []
    bad = [r for r in recs if r.get("kind") == "finding" and r["severity"] != "info"]
    assert bad == [], bad
    assert recs[-1]["kind"] == "summary" and recs[-1]["checks"][0]["status"] == "ok"

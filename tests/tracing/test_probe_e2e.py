"""End to end: `python -m node_probe --only trace` against real kernel behaviour.

Each test starts the probe CLI, waits until it reports its programs attached, then makes the
kernel do the real thing (an EPERM from a device cgroup, a rule rewrite through a shell's
dup'ed fd, an NVML init blocked on a futex in another mount namespace, an ioctl that does not
return) and checks the findings and events the probe printed.
"""
from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tracing.conftest import build_helper, events, findings, REPO

pytestmark = [pytest.mark.root, pytest.mark.bcc, pytest.mark.slow]

OPENER = r"""
import os, sys
with open("/proc/self/comm", "w") as f:
    f.write(sys.argv[2])
print("ready", os.getpid(), flush=True)
sys.stdin.readline()
try:
    os.close(os.open(sys.argv[1], os.O_RDWR))
    print("errno 0", flush=True)
except OSError as e:
    print("errno", e.errno, flush=True)
sys.stdin.readline()
"""


def denied_opener(devices_cgroup, children, tmp_path, comm: str):
    """(opener process, its device node, its cgroup): a process in a device cgroup that denies
    major 195, waiting to open a 195:0 node (send() makes it try)."""
    node = tmp_path / "nvidia0"
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(195, 0))
    cg = devices_cgroup(comm)
    (cg / "devices.deny").write_text("c 195:* rwm")
    opener = children([sys.executable, "-c", OPENER, str(node), comm])
    opener.expect("ready")
    (cg / "cgroup.procs").write_text(str(opener.proc.pid))
    return opener, node, cg


def test_eperm_open_is_reported_and_enxio_is_not(bcc_ready, devices_cgroup, children, probe,
                                                  tmp_path):
    denied, node, cg = denied_opener(devices_cgroup, children, tmp_path, "eperm-victim")
    allowed = children([sys.executable, "-c", OPENER, str(node), "enxio-opener"])
    allowed.expect("ready")

    run = probe("--only", "trace", "--trace-seconds", "2", "--dev-prefix", str(tmp_path / "nvidia"))
    run.wait_attached()
    denied.send()
    allowed.send()
    # The real kernel's answers: the cgroup denies (EPERM); with no driver for major 195 the
    # allowed open fails with ENXIO instead.
    assert denied.expect("errno") == f"errno {errno.EPERM}"
    assert allowed.expect("errno") == f"errno {errno.ENXIO}"
    recs = run.finish()

    found = findings(recs, "container.nvidia_eperm")
    assert len(found) == 1, found
    ev = found[0]["evidence"]
    assert ev["pid"] == denied.proc.pid
    assert ev["comm"] == "eperm-victim"
    assert ev["errno"] == errno.EPERM
    assert ev["devices"][0]["path"] == str(node)
    assert (ev["devices"][0]["major"], ev["devices"][0]["minor"]) == (195, 0)
    assert ev["cgroup"] == "/" + cg.name
    assert found[0]["severity"] == "critical"
    assert str(allowed.proc.pid) not in found[0]["subject"]
    live = events(recs, "nvidia.open_denied")
    assert [e["data"]["pid"] for e in live] == [denied.proc.pid]


def test_device_rules_rewritten_names_writer_and_text(bcc_ready, devices_cgroup, children,
                                                      probe, tmp_path):
    gpu = devices_cgroup("gpu")          # a GPU container's rules: deny all, allow null + 195
    for rule in ("c 1:3 rwm", "c 195:* rwm"):
        (gpu / "devices.allow").write_text(rule)
    (gpu / "devices.deny").write_text("a")
    for rule in ("c 1:3 rwm", "c 195:* rwm"):
        (gpu / "devices.allow").write_text(rule)
    gpu_rel = devices_cgroup("gpurel")   # the same, rewritten through relative paths
    (gpu_rel / "devices.deny").write_text("a")
    for rule in ("c 1:3 rwm", "c 195:0 rw"):
        (gpu_rel / "devices.allow").write_text(rule)
    plain = devices_cgroup("plain")      # no GPU: a rewrite there is not a finding
    (plain / "devices.deny").write_text("a")
    (plain / "devices.allow").write_text("c 1:3 rwm")
    assert "195" in (gpu / "devices.list").read_text()

    run = probe("--only", "trace", "--trace-seconds", "2")
    run.wait_attached()
    # The shell opens the file, dup2()s it onto fd 1 (via fcntl(F_DUPFD) first) and writes.
    w1 = subprocess.Popen(["sh", "-c", f"echo a > {gpu}/devices.deny; "
                                       f"echo 'c 1:3 rwm' > {gpu}/devices.allow"])
    # A writer that stays alive a moment, so its cwd resolves the relative paths.
    w2 = subprocess.Popen(["sh", "-c", "echo 'a *:* rwm' > devices.deny; "
                                       "echo 'c 1:3 rwm' > devices.allow; sleep 1"], cwd=gpu_rel)
    w3 = subprocess.Popen(["sh", "-c", f"echo a > {plain}/devices.deny; "
                                       f"echo 'c 1:5 rwm' > {plain}/devices.allow"])
    for w in (w1, w2, w3):
        assert w.wait(10) == 0
    recs = run.finish()

    assert "195" not in (gpu / "devices.list").read_text()   # the kernel applied the rewrite
    found = {f["evidence"]["cgroup"]: f for f in findings(recs, "cgroup.device_rules_rewritten")}
    # (other tests on this machine may rewrite their own cgroups meanwhile: look at ours only)
    mine = {k for k in found if k in {"/" + gpu.name, "/" + gpu_rel.name, "/" + plain.name}}
    assert mine == {"/" + gpu.name, "/" + gpu_rel.name}, found.keys()
    ev = found["/" + gpu.name]["evidence"]
    assert ev["writers"] == [{"pid": w1.pid, "comm": "sh"}]
    assert [(w["which"], w["text"]) for w in ev["writes"]] == [("deny", "a"),
                                                              ("allow", "c 1:3 rwm")]
    assert "195" not in ev["devices_list_now"]
    assert found["/" + gpu.name]["severity"] == "critical"
    ev2 = found["/" + gpu_rel.name]["evidence"]
    assert [(w["which"], w["text"]) for w in ev2["writes"]] == [("deny", "a *:* rwm"),
                                                               ("allow", "c 1:3 rwm")]
    assert ev2["writers"] == [{"pid": w2.pid, "comm": "sh"}]
    live = events(recs, "cgroup.device_rule_write")
    assert {w1.pid, w2.pid, w3.pid} <= {e["data"]["pid"] for e in live}


def test_nvml_init_blocked_in_other_mount_namespace(bcc_ready, children, probe, tmp_path):
    sys.path.insert(0, str(REPO))
    from tests.fakes.nvml import build_fake_nvml
    real = tmp_path / "driver-lib"
    build_fake_nvml(real, init="block")
    ns_only = tmp_path / "ns-only"       # empty here; the library appears there only inside
    ns_only.mkdir()                      # the child's own mount namespace
    caller = build_helper("nvml_caller", "-ldl")
    child = children(["unshare", "-m", "--propagation", "private", "sh", "-c",
                      f"mount --bind {real} {ns_only} && exec {caller} {ns_only}/libnvidia-ml.so.1"])
    pid = int(child.expect("ready").split()[1])
    assert not (ns_only / "libnvidia-ml.so.1").exists()
    assert (Path(f"/proc/{pid}/root") / str(ns_only).lstrip("/") / "libnvidia-ml.so.1").exists()

    run = probe("--only", "trace", "--trace-seconds", "2", "--trace-pid", str(pid))
    ready = run.wait_attached()
    assert "nvml_calls" in ready["probes"] and "futex_wait" in ready["probes"]
    child.send()
    child.expect("calling")
    recs = run.finish()

    entered = events(recs, "nvml.entered")
    assert [(e["data"]["pid"], e["data"]["func"]) for e in entered] == [(pid, "nvmlInit_v2")]
    blocked = events(recs, "nvml.call_blocked")
    assert len(blocked) == 1, blocked
    call = blocked[0]["data"]
    assert call["pid"] == pid and call["tid"] == pid
    assert call["func"] == "nvmlInit_v2" and call["returned"] is False
    assert call["library"] == f"{ns_only}/libnvidia-ml.so.1"
    assert 0.5 < call["duration_s"] < 10
    assert 0.5 < call["futex_wait_s"] <= call["duration_s"]
    assert any(f.startswith("nvmlInit_v2+") for f in call["stack"]), call["stack"]
    assert child.proc.poll() is None      # still blocked: nothing was signalled or stopped


def test_ioctl_that_does_not_return_is_a_stall(bcc_ready, children, probe, tmp_path):
    ctl = tmp_path / "nvidiactl"          # any file under the prefix: the fd is what is traced
    ctl.write_bytes(b"x" * 16)
    devio = build_helper("devio")
    child = children([str(devio), str(ctl), "stall"])
    pid = int(child.expect("ready").split()[1])
    run = probe("--only", "trace", "--trace-seconds", "3", "--trace-pid", str(pid),
                "--dev-prefix", str(tmp_path / "nvidia"))
    run.wait_attached()
    child.send()
    fd = int(child.expect("stalling").split()[1])
    recs = run.finish()
    found = findings(recs, "ioctl.stall")
    assert len(found) == 1, found
    ev = found[0]["evidence"]
    assert (ev["pid"], ev["tid"], ev["fd"], ev["path"]) == (pid, pid, fd, str(ctl))
    assert ev["request_hex"] == "0x00005421"          # FIONBIO
    assert ev["in_progress"] is True and ev["wait_s"] >= 2.0
    assert found[0]["severity"] == "critical"          # a target process
    assert child.proc.poll() is None


def test_split_headers_under_host_root_are_merged_for_bcc(bcc_ready, probe, tmp_path):
    """The debug pod's case: no headers in the probe's own /lib/modules, the host's under
    --host-root, split in Debian's -amd64 (build) and -common (source) directories."""
    release = os.uname().release
    build = Path(f"/lib/modules/{release}/build")
    source = Path(f"/lib/modules/{release}/source")
    if not (build.is_symlink() and source.is_symlink()):
        pytest.skip("this test needs /lib/modules/$(uname -r)/{build,source} symlinks")
    host = tmp_path / "host"
    mods = host / "lib/modules" / release
    mods.mkdir(parents=True)
    (mods / "build").symlink_to(os.readlink(build))     # absolute, as on the host
    (mods / "source").symlink_to(os.readlink(source))
    (host / "usr/src").mkdir(parents=True)
    # Inside a private mount namespace: hide our /lib/modules, show /usr/src under the host.
    script = (f"mount -t tmpfs none /lib/modules && mount --bind /usr/src {host}/usr/src && "
              'exec "$0" "$@"')
    run = probe("--only", "trace", "--trace-seconds", "1", "--host-root", str(host),
                wrapper=["unshare", "-m", "--propagation", "private", "sh", "-c", script])
    try:
        recs = run.finish(timeout=60)
    finally:  # the merged tree links into tmp_path: do not leave it behind
        import hashlib, shutil, tempfile
        key = hashlib.sha256(f"{host}{os.readlink(build)}\0{host}{os.readlink(source)}"
                             .encode()).hexdigest()[:12]
        shutil.rmtree(Path(tempfile.gettempdir()) / f"gpu-doctor-kheaders-{release}-{key}",
                      ignore_errors=True)
    assert not findings(recs, "probe.ebpf_unavailable"), findings(recs, "probe.ebpf_unavailable")
    assert any(r.get("kind") == "progress" and r.get("phase") == "trace" for r in recs)
    logs = [r["message"] for r in recs if r.get("kind") == "log"]
    assert any("merged them for BCC" in m for m in logs), logs

"""The BPF programs through TraceSession, in-process, against real processes and files.

Covers what the end-to-end tests do not pin down: each .bpf.c compiling on its own, fd tracking
through fcntl(F_DUPFD)/dup2/close, per-fd ioctl counts, fds opened before attach (seeded from
/proc), bpf(BPF_PROG_ATTACH) of a real cgroup device program on the cgroup v2 hierarchy, and
the syscall tracepoint layout check against this kernel's tracefs.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from node_probe.tracing import bundle, sources
from node_probe.tracing.loader import TraceConfig
from node_probe.tracing.session import PROGRAMS, TraceSession
from tests.tracing.conftest import build_helper

pytestmark = [pytest.mark.root, pytest.mark.bcc]

TRACEFS = next((d for d in ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
                if os.path.isdir(d + "/events")), "/sys/kernel/tracing")


@pytest.fixture
def session_for(tmp_path):
    made = []

    def make(**kw) -> TraceSession:
        cfg = TraceConfig(dev_prefix=kw.pop("dev_prefix", str(tmp_path / "nvidia")),
                          cgroup_dir=Path("/sys/fs/cgroup"))
        s = TraceSession(cfg, tracefs=TRACEFS, **kw)
        made.append(s)
        s.compile()
        return s

    yield make
    for s in made:
        s.close()


@pytest.mark.parametrize("name", PROGRAMS)
def test_each_program_compiles_on_its_own(bcc_ready, name):
    """Alone in its compile unit, without any -D option (the headers it includes pasted in)."""
    from bcc import BPF
    b = BPF(text=sources.unit_text([name]).encode(), cflags=["-w"])
    try:
        assert b.load_funcs()  # and the verifier accepts every program in it
    finally:
        b.cleanup()


def test_syscall_tracepoint_layout_matches_this_kernel(bcc_ready):
    for event in ("sys_enter_openat", "sys_exit_openat", "sys_enter_ioctl", "sys_exit_ioctl",
                  "sys_enter_write", "sys_enter_futex", "sys_enter_bpf", "sys_enter_fcntl"):
        assert bundle.syscall_layout_ok(TRACEFS, event) == (True, ""), event


def test_ioctls_are_counted_per_fd_through_fcntl_dupfd_and_dup2(bcc_ready, children,
                                                               session_for, tmp_path):
    ctl = tmp_path / "nvidiactl"
    ctl.write_bytes(b"0123456789")
    other = tmp_path / "not-a-device"          # outside the prefix: never tracked
    other.write_bytes(b"x")
    devio = build_helper("devio")
    child = children([str(devio), str(ctl), "count", "300"])
    decoy = children([str(devio), str(other), "count", "300"])
    pid = int(child.expect("ready").split()[1])
    decoy.expect("ready")
    s = session_for()
    s.attach()
    child.send()
    decoy.send()
    _, fd, dupfd, dup2fd = child.expect("done").split()
    decoy.expect("done")
    s.poll(time.monotonic() + 0.3)
    r = s.collect()
    mine = {(x["fd"], x["request_hex"]): x for x in r["ioctls"] if x["pid"] == pid}
    assert set(mine) == {(int(dupfd), "0x0000541b"), (int(dup2fd), "0x0000541b")}  # FIONREAD
    for x in mine.values():
        assert x["count"] == 300 and x["errors"] == 0 and x["path"] == str(ctl)
        assert x["comm"] == devio.name[:15]
    assert all(x["pid"] == pid for x in r["ioctls"])      # the decoy's file is not traced
    opened = [o for o in r["opens"] if o["pid"] == pid]
    assert [(o["path"], o["errno"], o["fd"]) for o in opened] == [(str(ctl), 0, int(fd))]
    assert r["ioctls_inflight"] == []


def test_fds_opened_before_attach_are_seeded(bcc_ready, children, session_for, tmp_path):
    ctl = tmp_path / "nvidia-uvm"
    ctl.write_bytes(b"abc")
    # python holds the fd open from before the probe starts, then ioctls on it when told
    script = ("import fcntl, os, sys, termios, array\n"
              f"fd = os.open({str(ctl)!r}, os.O_RDONLY)\n"
              "print('ready', fd, flush=True)\n"
              "sys.stdin.readline()\n"
              "buf = array.array('i', [0])\n"
              "for _ in range(7): fcntl.ioctl(fd, termios.FIONREAD, buf)\n"
              "print('done', flush=True)\n"
              "sys.stdin.readline()\n")
    child = children([sys.executable, "-c", script])
    fd = int(child.expect("ready").split()[1])
    s = session_for(targets=[child.proc.pid])
    s.attach()
    child.send()
    child.expect("done")
    s.poll(time.monotonic() + 0.2)
    r = s.collect()
    assert r["nvidia_dev"]["seeded_fds"] >= 1
    mine = [x for x in r["ioctls"] if x["pid"] == child.proc.pid]
    assert [(x["fd"], x["count"], x["path"]) for x in mine] == [(fd, 7, str(ctl))]


def test_cgroup_v2_device_program_attach_is_seen(bcc_ready, children, session_for, tmp_path):
    unified = Path("/sys/fs/cgroup/unified")
    if not (unified / "cgroup.procs").exists():
        pytest.skip("no cgroup v2 hierarchy at /sys/fs/cgroup/unified")
    cg = unified / f"gpu-doctor-test-v2-{os.getpid()}"
    cg.mkdir()
    try:
        s = session_for()
        s.attach()
        # A separate process attaches a real BPF_CGROUP_DEVICE program (what runc does on v2)
        # and stays alive a moment, as runc does, so its fd names the target cgroup.
        attacher = (
            "import os, sys\n"
            "from bcc import BPF, BPFAttachType\n"
            "b = BPF(text='int dev(struct bpf_cgroup_dev_ctx *ctx) { return 1; }')\n"
            "fn = b.load_func('dev', BPF.CGROUP_DEVICE)\n"
            "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
            "print('ready', flush=True)\n"
            "sys.stdin.readline()\n"
            "BPF.attach_func(fn, fd, BPFAttachType.CGROUP_DEVICE)\n"
            "BPF.detach_func(fn, fd, BPFAttachType.CGROUP_DEVICE)\n"
            "print('done', flush=True)\n"
            "sys.stdin.readline()\n")
        child = children([sys.executable, "-c", attacher, str(cg)])
        child.expect("ready", timeout=60)
        child.send()
        child.expect("done")
        pid = child.proc.pid
        s.poll(time.monotonic() + 0.3)
        r = s.collect()
        mine = [a for a in r["bpf_attaches"] if a["pid"] == pid]
        assert [(a["cmd"], a["attach_type"], a["ret"]) for a in mine] == [
            ("BPF_PROG_ATTACH", "BPF_CGROUP_DEVICE", 0), ("BPF_PROG_DETACH", "BPF_CGROUP_DEVICE", 0)]
        assert mine[0]["cgroup"] == str(cg)
    finally:
        cg.rmdir()


def test_nothing_stays_attached_after_close(bcc_ready, session_for, tmp_path):
    s = session_for(targets=[os.getpid()])
    s.attach()
    fds = [fd for _e, _f, fd in s.tps.attached]
    assert len(fds) >= 20
    s.close()
    for fd in fds:          # closed here at once (a grandchild releases the perf events)
        with pytest.raises(OSError):
            os.fstat(fd)


def test_wait_that_began_before_attach_is_found_with_its_stack(bcc_ready, children, session_for,
                                                               tmp_path):
    """Seed 000 as the probe usually meets it: the plugin is already stuck in nvmlInit_v2."""
    from tests.fakes.nvml import build_fake_nvml
    lib = build_fake_nvml(tmp_path / "lib", init="block")
    child = children([str(build_helper("nvml_caller", "-ldl")), str(lib)])
    pid = int(child.expect("ready").split()[1])
    child.send()
    child.expect("calling")
    deadline = time.monotonic() + 5
    while not (Path(f"/proc/{pid}/syscall").read_text().startswith("202 ")
               or time.monotonic() > deadline):
        time.sleep(0.02)
    s = session_for(targets=[pid])
    assert "nvml_calls" in s.attach()
    s.poll(time.monotonic() + 0.6)
    r = s.collect()
    assert r["nvml_calls"] == []            # entered before the uprobes existed
    mine = [w for w in r["futex_waits"] if w["pid"] == pid]
    assert len(mine) == 1 and mine[0]["in_progress"] and mine[0]["started_before_trace"]
    assert mine[0]["wait_s"] >= 0.5
    assert any(f.startswith("nvmlInit_v2+") for f in mine[0]["stack"]), mine[0]["stack"]


LEGACY_OPEN = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
print("ready", os.getpid(), flush=True)
sys.stdin.readline()
# open(2) itself, as C libraries before glibc 2.26 (CentOS 7 images) call it
fd = libc.syscall(2, sys.argv[1].encode(), os.O_RDONLY)   # __NR_open on x86_64
print("fd", fd, ctypes.get_errno(), flush=True)
sys.stdin.readline()
"""


def test_legacy_open_syscall_is_traced(bcc_ready, children, session_for, tmp_path):
    if os.uname().machine != "x86_64":
        pytest.skip("open(2) exists as a syscall only on x86_64 here")
    ctl = tmp_path / "nvidia-legacy"
    ctl.write_bytes(b"x")
    child = children([sys.executable, "-c", LEGACY_OPEN, str(ctl)])
    pid = int(child.expect("ready").split()[1])
    s = session_for()
    s.attach()
    assert ("sys_enter_open", "fdt_enter_open_legacy") in [(e, f) for e, f, _ in s.tps.attached]
    child.send()
    fd = int(child.expect("fd").split()[1])
    s.poll(time.monotonic() + 0.3)
    r = s.collect()
    assert [(o["path"], o["fd"], o["errno"]) for o in r["opens"] if o["pid"] == pid] == [
        (str(ctl), fd, 0)]


DIRFD_WRITER = r"""
import os, sys
d = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
print("ready", flush=True)
sys.stdin.readline()
for name, text in (("devices.deny", b"a"), ("devices.allow", b"c 1:3 rwm")):
    fd = os.open(name, os.O_WRONLY, dir_fd=d)       # openat(dirfd, relative), as runc does
    os.write(fd, text)
    os.close(fd)
print("done", flush=True)
sys.stdin.readline()
"""


def test_rule_writes_relative_to_a_directory_fd_resolve(bcc_ready, children, devices_cgroup,
                                                        session_for):
    cg = devices_cgroup("dirfd")
    child = children([sys.executable, "-c", DIRFD_WRITER, str(cg)])
    child.expect("ready")
    s = session_for()
    s.attach()
    child.send()
    child.expect("done")
    s.poll(time.monotonic() + 0.3)
    r = s.collect()
    mine = [w for w in r["cgroup_writes"] if w["pid"] == child.proc.pid]
    assert [(w["which"], w["text"], w["cgroup"], w["ret"]) for w in mine] == [
        ("deny", "a", "/" + cg.name, 1), ("allow", "c 1:3 rwm", "/" + cg.name, 9)]
    assert mine[0]["path"] == str(cg / "devices.deny")


def test_each_syscall_tracepoint_runs_one_program(bcc_ready, session_for):
    """One fd tracker for all programs: openat/close/dup*/fcntl run ONE prefilter, not one per
    program (nvidia_dev and cgroup_devices used to attach 15 tracepoints each)."""
    from collections import Counter
    s = session_for(targets=[os.getpid()])
    s.attach()
    per_event = Counter(e for e, _f, _fd in s.tps.attached)
    assert per_event and max(per_event.values()) == 1, per_event


REUSE = r"""
import array, fcntl, os, sys, termios
buf = array.array("i", [0])
print("ready", flush=True)
sys.stdin.readline()
fd = os.open(sys.argv[1], os.O_RDONLY)                 # tracked
for _ in range(3): fcntl.ioctl(fd, termios.FIONREAD, buf)
os.close(fd)
fd2 = os.open(sys.argv[2], os.O_RDONLY)                # untracked, same fd number
assert fd2 == fd, (fd, fd2)
for _ in range(5): fcntl.ioctl(fd2, termios.FIONREAD, buf)
t = os.open(sys.argv[1], os.O_RDONLY)                  # tracked again ...
for _ in range(2): fcntl.ioctl(t, termios.FIONREAD, buf)
u = os.open(sys.argv[2], os.O_RDONLY)
os.dup2(u, t)                                          # ... then replaced by dup2
for _ in range(7): fcntl.ioctl(t, termios.FIONREAD, buf)
print("done", fd, t, flush=True)
sys.stdin.readline()
"""


def test_fd_reused_after_close_or_dup2_is_not_counted(bcc_ready, children, session_for, tmp_path):
    """The per-thread "this fd is a device fd" cache must not outlive the fd: counts stop at
    close() and at dup2() of another file onto it."""
    dev = tmp_path / "nvidiactl"
    dev.write_bytes(b"x")
    other = tmp_path / "plain"
    other.write_bytes(b"y")
    child = children([sys.executable, "-c", REUSE, str(dev), str(other)])
    child.expect("ready")
    s = session_for()
    s.attach()
    child.send()
    _, fd, t = child.expect("done").split()
    s.poll(time.monotonic() + 0.3)
    r = s.collect()
    mine = sorted((x["fd"], x["count"], x["path"]) for x in r["ioctls"]
                  if x["pid"] == child.proc.pid)
    assert mine == sorted([(int(fd), 3, str(dev)), (int(t), 2, str(dev))]), mine


def test_ioctl_clock_is_reported_with_its_resolution(bcc_ready, session_for):
    s = session_for()
    s.attach()
    clock = s.collect()["nvidia_dev"]["ioctl_clock"]
    assert clock["source"] in ("jiffies", "ktime")
    assert 0 < clock["resolution_s"] <= 0.01


def test_threads_sharing_a_slot_are_all_counted_and_a_stall_is_kept(bcc_ready, children,
                                                                     session_for, tmp_path):
    """nvidia_dev keeps a call in flight and unflushed counts in a per-thread slot (tid mod
    NVDEV_THREAD_SLOTS). A thread landing on an idle slot of a dead thread takes it over (the
    old counts are flushed), one landing on a slot whose owner is stuck in the driver uses the
    overflow map; nothing is lost and the stuck call stays visible."""
    from node_probe.tracing.nvidia_dev import C
    dev = tmp_path / "nvidiactl"
    dev.write_bytes(b"x")
    child = children([str(build_helper("tidclash", "-lpthread")), str(dev),
                      str(C.NVDEV_THREAD_SLOTS), "50"])
    pid = int(child.expect("ready").split()[1])
    s = session_for()
    s.attach()
    child.send()
    _, fd, a, stuck, b, c = child.expect("done", timeout=60).split()
    slot = C.NVDEV_THREAD_SLOTS - 1
    assert int(b) > 0 and int(b) & slot == int(a) & slot and int(b) != int(a)
    assert int(c) > 0 and int(c) & slot == int(stuck) & slot
    s.poll(time.monotonic() + 0.3)
    r = s.collect()
    counted = [(x["fd"], x["count"], x["path"]) for x in r["ioctls"]
               if x["pid"] == pid and x["request_hex"] == "0x0000541b"]   # FIONREAD
    assert counted == [(int(fd), 150, str(dev))]                         # A + B + C
    inflight = [(w["tid"], w["request_hex"], w["path"]) for w in r["ioctls_inflight"]
                if w["pid"] == pid]
    assert inflight == [(int(stuck), "0x00005421", str(dev))]            # FIONBIO, stuck

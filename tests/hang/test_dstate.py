"""gpu.d_state end to end on REAL processes: a real probe process scanning the real /proc.

Staging a process in D for real without a hung NFS/FUSE mount: the parent of vfork() sleeps in
the kernel, TASK_KILLABLE, until its child execs or exits, and /proc reports that as "D"
(kernel/fork.c wait_for_vfork_done; proc(5): "D  Waiting in uninterruptible disk sleep");
tests/hang/vfork_hold.c keeps the child in pause(). The process holds a character device node
named nvidia0 (mknod, major 1 minor 3: /dev/null's driver, as no NVIDIA driver is loaded here);
the host root's proc/devices names major 1 as the driver's, so host.gpu_holders counts it by
major exactly as it counts /dev/nvidia0. The wchan is whatever this kernel reports for that
sleep. Needs root (mknod); skipped otherwise, and said why.
"""
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from node_probe.host import dstate
from tests.probe_run import run_probe

SRC = Path(__file__).with_name("vfork_hold.c")
ONLY = ("--only", "gpu.d_state", "--trace-seconds", "0")


def _state(pid: int) -> str | None:
    try:
        return dstate.state_of(Path(f"/proc/{pid}/stat").read_text())
    except OSError:
        return None


def _wait_for(pred, what: str, limit_s: float = 10.0):
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError(f"{what} not reached within {limit_s} s")


@pytest.fixture
def staged(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mknod of the stand-in GPU node needs root")
    exe = tmp_path / "vfork_hold"
    subprocess.run(["gcc", "-O1", "-Wall", "-o", str(exe), str(SRC)], check=True, timeout=60)
    host = tmp_path / "host"
    (host / "proc").mkdir(parents=True)
    (host / "proc/devices").write_text("Character devices:\n  1 mem\n  1 nvidia-frontend\n")
    node = host / "dev/nvidia0"
    node.parent.mkdir()
    os.mknod(node, 0o600 | 0o020000, os.makedev(1, 3))
    procs = []

    def start(mode: str) -> subprocess.Popen:
        p = subprocess.Popen([str(exe), str(node), mode])
        procs.append(p)
        return p

    yield host, start
    for p in procs:
        for c in _children(p.pid):
            os.kill(c, signal.SIGKILL)
        p.kill()
        p.wait(timeout=10)


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def test_a_gpu_holder_stuck_in_d_is_named_with_its_wchan(staged):
    host, start = staged
    p = start("d")
    _wait_for(lambda: _state(p.pid) == "D", "the holder in D state")
    run = run_probe("--host-root", str(host), *ONLY)
    mine = [f for f in run.findings("process.gpu_d_state") if f["evidence"]["pid"] == p.pid]
    assert len(mine) == 1, run.findings()
    f = mine[0]
    assert f["severity"] == "warning" and f["subject"] == f"pid/{p.pid}"
    assert f["evidence"]["gpu_minors"] == [3]
    assert f["evidence"]["threads"][0]["state"] == "D"
    assert f["evidence"]["samples"] == 2
    assert "vfork_hold" in f["title"] and "uninterruptible sleep (D)" in f["title"]
    wchan = Path(f"/proc/{p.pid}/wchan").read_text().strip()
    if wchan not in ("", "0"):       # a kernel that hides wchan says 0
        assert f["evidence"]["wchan"] == [wchan]


def test_the_same_holder_asleep_in_s_raises_nothing(staged):
    host, start = staged
    p = start("s")
    _wait_for(lambda: _state(p.pid) == "S", "the holder asleep in S")
    run = run_probe("--host-root", str(host), *ONLY)
    assert [f for f in run.findings("process.gpu_d_state")
            if f["evidence"]["pid"] == p.pid] == []
    [c] = [c for c in run.summary["checks"] if c["id"] == "gpu.d_state"]
    assert c["status"] == "ok"


def test_no_nvidia_driver_major_is_skipped(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/devices").write_text("Character devices:\n  1 mem\n")
    run = run_probe("--host-root", str(tmp_path), *ONLY)
    [c] = [c for c in run.summary["checks"] if c["id"] == "gpu.d_state"]
    assert c["status"] == "skipped" and "major" in c["reason"]


def test_state_of_reads_past_a_comm_with_parentheses():
    # /proc/PID/stat as the kernel writes it (fs/proc/array.c do_task_stat: "%d (%s) %c"),
    # with a comm a tenant chose to hold ") S ("
    assert dstate.state_of("4242 (a) S (b) D 1 4242 4242 0 -1 4194560 0") == "D"
    assert dstate.state_of("17 (python3) S 1 17 17 0 -1") == "S"
    assert dstate.state_of("garbage") is None

"""SIGKILL of `local` leaves no probe behind (issue 21, item 7): the probe child is told by the
kernel when its parent dies (PR_SET_PDEATHSIG) instead of tracing on for its whole window.

A real CLI process and its real probe child; the probe's trace window (60 s) is far longer
than the bound checked here, so a probe that outlives the CLI cannot pass by chance."""
from __future__ import annotations

import os
import select
import signal
import time
from pathlib import Path

from .conftest import popen_cli


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_for_line(p, needle: str, within_s: float) -> bool:
    """Read the CLI's stdout (jsonl) until a line holds `needle`; False after `within_s`."""
    end = time.monotonic() + within_s
    buf = b""
    fd = p.stdout.fileno()
    while time.monotonic() < end:
        if select.select([fd], [], [], 0.2)[0]:
            chunk = os.read(fd, 65536)
            if not chunk:
                return False
            buf += chunk
            if needle.encode() in buf:
                return True
    return False


def test_sigkill_of_local_ends_the_probe():
    p = popen_cli("local", "--only", "trace", "--trace-seconds", "60", "--timeout", "90",
                  "-o", "jsonl")
    probe = None
    try:
        # the probe has attached its eBPF programs and now traces, silent, for 60 s
        assert _wait_for_line(p, '"phase":"trace"', 60), "the probe never started tracing"
        kids = _children(p.pid)
        assert len(kids) == 1 and "node_probe" in Path(f"/proc/{kids[0]}/cmdline").read_text()
        probe = kids[0]
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
        end = time.monotonic() + 10  # well inside the probe's own 60 s window
        while _alive(probe) and time.monotonic() < end:
            time.sleep(0.05)
        still = _alive(probe)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    if still:
        os.killpg(probe, signal.SIGKILL)  # the probe runs in its own session
    assert not still, "the probe outlived the CLI that started it"

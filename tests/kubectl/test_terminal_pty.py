"""The CLI under a real pseudo-terminal: live progress is ONE status line, rewritten in place
and erased before the report, so no finding is printed twice (issue 22).

The CLI runs as a real process whose stdout and stderr are the slave side of a pty (what an
on-call engineer's terminal is); the test reads the master side and replays carriage returns
and erase-line sequences the way a terminal does, then checks what stays on the screen.
"""
from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import time

from .conftest import DATA, cli_env, REPO
from .fakecluster import cut_odd
from .test_cli_cluster import healthy_node

ERASE = "\r\x1b[2K"
MAX_BYTES = 1 << 20


def screen(raw: str) -> list[str]:
    """The lines a terminal shows after `raw`: `\\r` returns to the line's start, ESC[2K
    erases it, later text overwrites earlier text."""
    lines, cur, col = [], [], 0
    i = 0
    while i < len(raw):
        if raw.startswith("\x1b[2K", i):
            cur, i = [], i + 4
            continue
        c = raw[i]
        i += 1
        if c == "\r":
            col = 0
        elif c == "\n":
            lines.append("".join(cur).rstrip())
            cur, col = [], 0
        else:
            if col < len(cur):
                cur[col] = c
            else:
                cur.append(c)
            col += 1
    if "".join(cur).strip():
        lines.append("".join(cur).rstrip())
    return lines


def run_in_pty(*args: str, columns: int = 200, timeout: float = 60) -> tuple[int, str]:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = dict(cli_env(), COLUMNS=str(columns))
    p = subprocess.Popen([sys.executable, "-m", "kubectl_gpudoctor", *args], stdin=slave,
                         stdout=slave, stderr=slave, env=env, cwd=str(REPO), close_fds=True)
    os.close(slave)
    chunks, total = [], 0
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and total < MAX_BYTES:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the slave side is closed, the CLI is gone
                break
            if not data:
                break
            chunks.append(data)
            total += len(data)
        return p.wait(timeout=max(1.0, deadline - time.monotonic())), \
            b"".join(chunks).decode("utf-8", "replace")
    finally:
        os.close(master)
        if p.poll() is None:
            p.kill()
            p.wait()


def test_status_line_is_replaced_and_cleared_and_no_finding_is_printed_twice(
        cluster, kubeconfig):
    healthy_node(cluster)
    cluster.log_chunks = cut_odd((DATA / "probe_stream.ndjson").read_bytes(), (300, 500))
    cluster.log_chunk_delay_s = 0.05
    code, raw = run_in_pty("node", "gpu-1", "--kubeconfig", str(kubeconfig),
                           "--start-timeout", "10")
    assert code == 1, raw
    assert "Traceback" not in raw
    # the status line was used, and rewritten in place more than once
    assert raw.count(ERASE) >= 3, raw
    lines = screen(raw)
    # nothing of the live line is left on the screen: the report starts on a clean line
    assert lines[0].startswith("node gpu-1: live "), lines[:3]
    assert not any(re.match(r"\s*(created debug pod|debug pod |check |node checks|"
                            r"\d+ critical, \d+ warning so far)", ln) for ln in lines), lines
    # each finding once: a problem as one block, its title on the screen once (the verdict's
    # headline says the root cause's own title, so its block points there); info and ok
    # findings folded into one line of ids (their titles with --details)
    rows = [ln for ln in lines if re.match(r"CRITICAL\s\s+nvml.init_hang\s", ln)]
    assert len(rows) == 1, lines
    assert sum(ln.count("nvmlInit_v2 did not return within 8 s") for ln in lines) <= 1, lines
    assert sum(ln.count("kubelet.config") for ln in lines) == 1, lines
    assert not any("kubelet config in effect" in ln for ln in lines), lines
    # the verdict leads, after the header (what, when, how the node was reached)
    assert any(ln.startswith("CRITICAL  ") for ln in lines[1:3]), lines[:4]


def test_no_live_lines_when_not_a_terminal(cluster, kubeconfig):
    from .conftest import run_cli
    healthy_node(cluster)
    cluster.log_chunks = cut_odd((DATA / "probe_stream.ndjson").read_bytes())
    r = run_cli("node", "gpu-1", "--kubeconfig", str(kubeconfig), "--start-timeout", "10")
    assert r.returncode == 1
    assert "\r" not in r.stdout + r.stderr and "\x1b" not in r.stdout + r.stderr
    assert r.stderr == ""

"""Fixtures for the kubectl plugin tests: a fake API server (kmock) and a CLI runner.

The CLI runs as a real subprocess (`python -m kubectl_gpudoctor`) against the fake over TCP,
driven by the real kubernetes client, so exit codes, stderr lines and signals are the user's.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .fakecluster import FakeCluster

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).with_name("data")


@pytest.fixture
def cluster():
    fc = FakeCluster().start()
    try:
        yield fc
    finally:
        fc.stop()


@pytest.fixture
def kubeconfig(cluster, tmp_path):
    return cluster.kubeconfig(tmp_path / "kubeconfig")


def cli_env() -> dict:
    env = dict(os.environ)
    env.pop("KUBECONFIG", None)
    env["NO_COLOR"] = "1"
    env["PYTHONPATH"] = str(REPO)
    env["HOME"] = env.get("HOME", "/tmp")
    return env


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kubectl_gpudoctor", *args],
                          capture_output=True, text=True, timeout=timeout, env=cli_env(),
                          cwd=str(REPO))


def popen_cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "kubectl_gpudoctor", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=cli_env(), cwd=str(REPO))


def interrupt_when(p: subprocess.Popen, ready, signals=(signal.SIGINT,), settle_s: float = 0.0,
                   gap_s: float = 0.0, wait_s: float = 30.0) -> tuple[str, str]:
    """Wait (at most wait_s) until `ready()` holds, let it settle, send `signals` to the CLI
    process, and return its (stdout, stderr); the process is killed on any failure."""
    try:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and not ready():
            time.sleep(0.05)
        time.sleep(settle_s)
        for sig in signals:
            p.send_signal(sig)
            time.sleep(gap_s)
        return p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def one_error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one stderr line, got: {stderr!r}"
    assert "Traceback" not in stderr
    assert lines[0].startswith("kubectl gpu-doctor: ")
    return lines[0]

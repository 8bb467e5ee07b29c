"""Fixtures for the kubectl plugin tests: a fake API server (kmock) and a CLI runner.

The CLI runs as a real subprocess (`python -m kubectl_gpudoctor`) against the fake over TCP,
driven by the real kubernetes client, so exit codes, stderr lines and signals are the user's.
"""
from __future__ import annotations

import os
import subprocess
import sys
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


def one_error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one stderr line, got: {stderr!r}"
    assert "Traceback" not in stderr
    assert lines[0].startswith("kubectl gpu-doctor: ")
    return lines[0]

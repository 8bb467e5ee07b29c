"""Fixtures for the watch tests: the fake API server behind TLS, an in-cluster env for the
agent (token file, CA, KUBERNETES_SERVICE_HOST/PORT)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.watch.fakeapi import NodeStatusCluster, TlsFront, make_ca


@dataclasses.dataclass
class Api:
    cluster: NodeStatusCluster
    front: TlsFront
    ca: Path
    token_file: Path

    def env(self) -> dict:
        return {"KUBERNETES_SERVICE_HOST": "127.0.0.1",
                "KUBERNETES_SERVICE_PORT": str(self.front.port)}

    def bind(self, token: str, node: str) -> None:
        """A bound token for `node` written where the agent reads it (rotation = call again)."""
        self.cluster.tokens[token] = node
        self.token_file.write_text(token + "\n")


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory):
    return make_ca(tmp_path_factory.mktemp("ca"))


@pytest.fixture
def api(tls_files, tmp_path):
    ca, crt, key = tls_files
    from tests.watch.fakeapi import exec_cluster_class
    fc = exec_cluster_class()().start()
    front = TlsFront(fc.url, crt, key)
    try:
        yield Api(fc, front, ca, tmp_path / "token")
    finally:
        front.close()
        fc.stop()


# the device-plugin fixtures (temp host root, real fake-plugin processes, pod-resources)
from tests.deviceplugin.conftest import host, podres, start_plugin  # noqa: E402,F401
# real kubepods-shaped cgroups under the v1 devices controller
from tests.cgroups.conftest import v1_tree  # noqa: E402,F401

import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


class Agent:
    """A real `python -m node_probe agent-watch` process (stopped by its pid)."""

    def __init__(self, args, env, log: Path) -> None:
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "node_probe", "agent-watch", *args],
            env={**os.environ, "PYTHONPATH": str(REPO), **env}, cwd=REPO,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(log, "wb"))
        self.pid = self.proc.pid

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.proc.wait(10)
        return self.proc.returncode


@pytest.fixture
def start_agent(tmp_path):
    agents: list[Agent] = []

    def start(*args, env=None) -> Agent:
        a = Agent(list(args), env or {}, tmp_path / f"agent-{len(agents)}.log")
        agents.append(a)
        return a

    yield start
    for a in agents:
        a.stop()


def wait_for(pred, timeout: float, what: str = ""):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout}s: {what}")

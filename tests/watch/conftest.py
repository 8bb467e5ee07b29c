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
    fc = NodeStatusCluster().start()
    front = TlsFront(fc.url, crt, key)
    try:
        yield Api(fc, front, ca, tmp_path / "token")
    finally:
        front.close()
        fc.stop()

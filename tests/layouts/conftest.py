"""Fake host roots for the layout tests, and real processes standing in for node daemons.

A daemon here is a real process: it binds a real unix socket at the path its distribution
uses (under the test's host root), names itself (comm) like the daemon, and carries the
daemon's command-line flags and environment, so the probe's resolvers identify it exactly as
they do on a node: by the socket inode it serves, then its flags.
"""
from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.fakes import fake_daemon


def write(root: Path, rel: str, text: str = "") -> Path:
    p = root / rel.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def stale_socket(path: Path) -> None:
    """A socket file nobody serves (a daemon that died)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()


@pytest.fixture
def daemons():
    """spawn(comm, sockets, *flags, env=..., root=...) -> Popen of a process serving `sockets`
    (chrooted in `root`: a daemon of that host root)."""
    made: list[subprocess.Popen] = []

    def start(comm: str, sockets: list[Path], *flags: str, env: dict | None = None, root=None):
        p = fake_daemon.spawn(comm, sockets, *flags, env=env, root=root)
        made.append(p)
        return p

    yield start
    for p in made:
        p.kill()
        p.wait(5)


@pytest.fixture
def tmp_path():
    """A short temp dir (unix socket paths are limited to 107 bytes; pytest's are long)."""
    d = Path(tempfile.mkdtemp(prefix="gdl-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)

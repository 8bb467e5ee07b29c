"""Fake host roots for the layout tests, and real processes standing in for node daemons.

A daemon here is a real process: it binds a real unix socket at the path its distribution
uses (under the test's host root), names itself (comm) like the daemon, and carries the
daemon's command-line flags and environment, so the probe's resolvers identify it exactly as
they do on a node: by the socket inode it serves, then its flags.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

SERVE = r"""
import os, socket, sys
with open("/proc/self/comm", "w") as f:
    f.write(sys.argv[1])
socks = []
for path in sys.argv[2].split(","):
    if not path:
        continue
    os.makedirs(os.path.dirname(path), exist_ok=True)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(4)
    socks.append(s)
print("ready", flush=True)
sys.stdin.readline()
"""


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
    """spawn(comm, sockets, *flags, env=...) -> Popen of a process serving `sockets`."""
    made: list[subprocess.Popen] = []

    def spawn(comm: str, sockets: list[Path], *flags: str, env: dict | None = None):
        script = Path(tempfile.gettempdir()) / "gpu-doctor-layout-daemon.py"
        if not script.exists() or script.read_text() != SERVE:
            tmp = script.with_suffix(f".{os.getpid()}")
            tmp.write_text(SERVE)
            tmp.replace(script)
        # a script file, not `python -c`: a daemon's flags may include -c (containerd's config)
        p = subprocess.Popen([sys.executable, str(script), comm, ",".join(map(str, sockets)),
                              *flags], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env={**os.environ, **(env or {})})
        made.append(p)
        assert p.stdout.readline().strip() == "ready"
        return p

    yield spawn
    for p in made:
        p.kill()
        p.wait(5)


@pytest.fixture
def tmp_path():
    """A short temp dir (unix socket paths are limited to 107 bytes; pytest's are long)."""
    d = Path(tempfile.mkdtemp(prefix="gdl-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)

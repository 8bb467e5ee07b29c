"""A real process standing in for a node daemon (kubelet, containerd, crio, a device plugin's
host service): it names itself (comm), binds and listens on real unix sockets, and carries the
daemon's command-line flags and environment, so the probe identifies it exactly as it does a
real one (by the socket inode it serves, then its flags). It does nothing else.

    spawn(comm, sockets, *flags, env=None, root=None) -> subprocess.Popen   (prints "ready" first)

With `root`, the process chroots there before binding (its sockets given as paths under
`root`): a daemon of that host root, as the host's kubelet is of the host's /; without it the
process's root is the machine's /, which a test's host root is not (a container's process, as
far as the probe can tell).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

SERVE = r"""
import os, socket, sys
comm, root, socks = sys.argv[1], sys.argv[3], []
if comm:
    with open("/proc/self/comm", "w") as f:
        f.write(comm)
if root:
    os.chroot(root)
    os.chdir("/")
for path in sys.argv[2].split(","):
    if not path:
        continue
    if root:
        path = "/" + os.path.relpath(path, root)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(8)
    socks.append(s)
print("ready", flush=True)
sys.stdin.readline()
"""


def _script() -> Path:
    script = Path(tempfile.gettempdir()) / "gpu-doctor-fake-daemon.py"
    if not script.exists() or script.read_text() != SERVE:
        tmp = script.with_suffix(f".{os.getpid()}")
        tmp.write_text(SERVE)
        tmp.replace(script)
    return script


def spawn(comm: str, sockets, *flags: str, env: dict | None = None,
          root=None) -> subprocess.Popen:
    """A script file, not `python -c`: a daemon's flags may include -c (containerd's config).
    Ends when its stdin closes or it is killed."""
    p = subprocess.Popen([sys.executable, str(_script()), comm or "",
                          ",".join(str(s) for s in sockets), str(root or ""), *flags],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         env={**os.environ, **(env or {})})
    if p.stdout.readline().strip() != "ready":
        p.kill()
        raise RuntimeError(f"fake daemon {comm!r} did not start")
    return p

"""`kubectl gpu-doctor local`: run the node probe on this host, in a child process.

Why a child process: kubectl_gpudoctor must never import bcc or pynvml (DESIGN.md section 2),
and the probe's own deadlines and signal handling work best when it owns its process. The
child prints gpu-doctor/v1 NDJSON, which we render with the same code as `node X`. When the
plugin is frozen by PyInstaller there is no interpreter to run `-m node_probe` with, so the
frozen executable re-enters itself with a hidden first argument (`__probe`) that `cli.
entrypoint` dispatches straight to node_probe.cli.main.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Iterator, Sequence

PROBE_ARGV0 = "__probe"


def probe_command(args: Sequence[str]) -> list[str]:
    if getattr(sys, "frozen", False):
        return [sys.executable, PROBE_ARGV0, *args]
    return [sys.executable, "-m", "node_probe", *args]


class ProbeProcess:
    """The probe child: stream its stdout chunks; stop it (process group) on any exit path."""

    def __init__(self, args: Sequence[str]) -> None:
        argv = probe_command(["-o", "jsonl", *args])
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                     env=env, start_new_session=True)

    def chunks(self) -> Iterator[bytes]:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                return
            yield chunk

    def wait(self, timeout_s: float) -> int | None:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        """SIGTERM the group (the probe then writes an incomplete summary), then SIGKILL."""
        if self.proc.poll() is not None:
            return
        for sig, grace in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 2.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            if self.wait(grace) is not None:
                return

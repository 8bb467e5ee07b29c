"""`python3 -m node_probe agent-idle`: the standing agent's main process, which does nothing.

Why: on a node whose kubelet admits no new pod (seed 000) the only way in is an exec into a pod
that is already running. The agent DaemonSet keeps one such pod per node; the probe itself runs
only when a user execs `python3 -m node_probe ...` into it. So this process just waits, costing
one sleeping interpreter (imports nothing beyond the stdlib's signal module), and exits 0 at once
on SIGTERM/SIGINT: with hostPID it is not PID 1 of its own namespace, but it must not rely on
the runtime's SIGKILL after the grace period either.
"""
from __future__ import annotations

import signal
import sys


def main() -> int:
    stop = []

    def on_signal(signum, frame):  # noqa: ARG001 - signal handler signature
        stop.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    while not stop:
        signal.pause()  # no timer, no polling: 0 CPU until a signal arrives
    return 0


if __name__ == "__main__":
    sys.exit(main())

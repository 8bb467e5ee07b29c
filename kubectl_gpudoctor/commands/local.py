"""`local`: the node probe on this host in a child process, rendered like `node X`."""
from __future__ import annotations

import os
from typing import Sequence


from node_probe.protocol import ExitStatus

from .. import errors
from ..session import Session


OFFLINE_FLAGS = ("--nvidia-smi-file", "--lspci-file", "--bug-report")


def local(session: Session, o: dict, probe_args: Sequence[str]) -> ExitStatus:
    """The node probe on this host in a child process, rendered like `node X`."""
    from ..reach import localproc as local_probe
    from ..reach import stream
    host = os.uname().nodename
    args = ["--timeout", f"{o['timeout']:g}", "--trace-seconds", f"{o['trace_seconds']:g}",
            "--fail-on", o["fail_on"], *probe_args]
    out = session.open_report(o["output"], o["fail_on"],
                              {"kind": "local", "name": host, "node": host}, api_only=False,
                              details=bool(o.get("details")))
    files = [os.path.basename(v) for k, v in zip(probe_args, probe_args[1:])
             if k in OFFLINE_FLAGS]
    if files:       # evidence captured elsewhere: the header must not say "live"
        out.origin = "offline, from " + ", ".join(files)
    proc = local_probe.ProbeProcess(["--target-name", host, *args])
    try:
        got_summary = False
        for rec in stream.records(proc.chunks()):
            out.node_record(rec)
            got_summary = got_summary or rec.get("kind") == "summary"
        rc = proc.wait(5.0)
        if rc == ExitStatus.USAGE and not got_summary:
            raise errors.UsageError("the probe rejected its arguments (see above)")
        if not got_summary:
            out.mark_incomplete(f"the probe ended without a summary (exit {rc})")
    finally:
        proc.stop()
    return out.exit_status()


LIST_TIMEOUT_S = 30.0


def list_checks(session: Session) -> ExitStatus:
    """`local --list-checks`: the probe's own list (the ids --only and --skip take)."""
    import subprocess
    from ..reach.localproc import probe_command
    from ..session import echo
    try:
        r = subprocess.run(probe_command(["--list-checks"]), stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=LIST_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise errors.InternalError(f"the probe did not list its checks within "
                                   f"{LIST_TIMEOUT_S:g}s") from None
    if r.returncode != 0:
        raise errors.InternalError(f"the probe could not list its checks (exit "
                                   f"{r.returncode})")
    echo(r.stdout.decode("utf-8", "replace")[:65536], nl=False)
    return ExitStatus.OK

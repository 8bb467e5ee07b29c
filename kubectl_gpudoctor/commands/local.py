"""`local`: the node probe on this host in a child process, rendered like `node X`."""
from __future__ import annotations

import os
from typing import Sequence


from node_probe.protocol import ExitStatus

from .. import errors
from ..session import Session


OFFLINE_FLAGS = ("--nvidia-smi-file", "--lspci-file", "--bug-report")
# the target's `offline`: what was read from another machine (the verdict's CAPTURES keys)
CAPTURE_OF = {"--nvidia-smi-file": "nvidia-smi", "--lspci-file": "lspci",
              "--bug-report": "bug-report"}


def local(session: Session, o: dict, probe_args: Sequence[str]) -> ExitStatus:
    """The node probe on this host in a child process, rendered like `node X`."""
    from ..reach import localproc as local_probe
    from ..reach import stream
    host = os.uname().nodename
    files = [os.path.basename(v) for k, v in zip(probe_args, probe_args[1:])
             if k in OFFLINE_FLAGS]
    target = {"kind": "local", "name": host, "node": host}
    if files:       # the evidence is another machine's: the verdict must not send you here
        target["offline"] = [CAPTURE_OF[k] for k in OFFLINE_FLAGS if k in probe_args]
    out = session.open_report(o["output"], o["fail_on"], target, api_only=False,
                              details=bool(o.get("details")))
    if files:       # evidence captured elsewhere: the header must not say "live"
        out.origin = "offline, from " + ", ".join(files)
    args = local_probe.local_probe_args(host, o["timeout"], o["trace_seconds"], o["fail_on"],
                                        probe_args)
    # started before the CLI's imports (launch.py) when its arguments were these
    proc = local_probe.take_early(args) or local_probe.ProbeProcess(args)
    try:
        got_summary = False
        for rec in stream.records(proc.chunks()):
            out.node_record(rec)
            got_summary = got_summary or rec.get("kind") == "summary"
        rc = proc.wait(5.0)
        if rc == ExitStatus.USAGE and not got_summary:
            raise errors.ProbeUsageError("the probe rejected its arguments (its line above)")
        if not got_summary:
            out.mark_incomplete(f"the probe ended without a summary (exit {rc})")
    finally:
        proc.stop()
    _say_sudo(out)
    return out.exit_status()


def _say_sudo(out) -> None:
    """Not root, and checks could not look for it: a warning for bots (-o json `logs`); the
    table says it on its could-not-look line (render.needs_root)."""
    from node_probe.protocol.render import needs_root
    if os.geteuid() == 0:
        return
    ids = needs_root(out.report)
    if ids:
        out.log("warning", f"not run as root: {len(ids)} check{'s' if len(ids) != 1 else ''} "
                           f"could not read what only root may ({', '.join(ids)}); run it "
                           f"with sudo: `sudo kubectl-gpu_doctor local`")


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

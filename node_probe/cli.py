"""`gpu-doctor-probe` / `python -m node_probe`: run the node checks on this host.

Why argparse and not click: the probe runs in a minimal image with only the stdlib, grpcio,
pynvml and bcc (DESIGN.md section 2), so its CLI must not need anything else.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import tempfile
import sys
from pathlib import Path

from node_probe import protocol
from node_probe.protocol import duration
from node_probe.protocol.version import __version__
from node_probe.engine import registry
from node_probe.protocol import render
from node_probe.host import subproc
from node_probe.engine.context import ProbeOptions
from .protocol import ExitStatus, Report
from node_probe.engine.runner import Runner


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line on stderr, exit 2 (never a traceback)
        raise _UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="gpu-doctor-probe",
                description="Diagnose GPU problems on this node (checks + eBPF probes).")
    p.add_argument("--version", action="version", version=f"gpu-doctor-probe {__version__}")
    p.add_argument("-o", "--output", choices=("table", "json", "jsonl"), default="table")
    p.add_argument("--fail-on", choices=protocol.FAIL_ON, default="warning")
    p.add_argument("--timeout", type=duration.argparse_type(0, exclusive=True), default=30.0,
                   metavar="DURATION",
                   help="deadline for the whole run: 30s, 2m, 1m30s or seconds (default 30s)")
    p.add_argument("--trace-seconds", type=duration.argparse_type(0), default=5.0,
                   metavar="DURATION", help="eBPF trace window; 0 disables tracing (default 5s)")
    p.add_argument("--host-root", type=Path, default=Path("/"),
                   help="where the host's / is mounted (default /; /host in the debug pod)")
    p.add_argument("--cgroup-root", type=Path, default=None,
                   help="cgroup mount (default <host-root>/sys/fs/cgroup)")
    p.add_argument("--kubelet-dir", type=Path, default=None,
                   help="kubelet state dir (default <host-root>/var/lib/kubelet)")
    p.add_argument("--kmsg-file", type=Path, default=None,
                   help="read the kernel log from this file instead of /dev/kmsg")
    p.add_argument("--plugin-log", type=Path, default=None,
                   help="a device plugin log file to scan for known errors")
    p.add_argument("--nvidia-smi-file", type=Path, default=None, metavar="FILE",
                   help="judge the GPUs of a saved `nvidia-smi -q` (text) or `nvidia-smi -q -x` "
                        "(XML) for slow-GPU causes, offline")
    p.add_argument("--lspci-file", type=Path, default=None, metavar="FILE",
                   help="judge the PCIe links of a saved `lspci -vvv` (LnkCap/LnkSta, AER)")
    p.add_argument("--bug-report", type=Path, default=None, metavar="FILE",
                   help="an nvidia-bug-report.log(.gz): its nvidia-smi, lspci and kernel log "
                        "sections, through every check that applies")
    p.add_argument("--nvml-timeout", type=duration.argparse_type(0, exclusive=True),
                   default=8.0, metavar="DURATION",
                   help="how long NVML init may take before it counts as hung (default 8s)")
    p.add_argument("--dev-prefix", default="/dev/nvidia",
                   help="device path prefix traced by eBPF (tests use a temp dir)")
    p.add_argument("--trace-pid", action="append", type=int, default=[], metavar="PID",
                   help="also watch this process's futex waits and NVML init calls (repeatable)")
    p.add_argument("--focus-pod", action="append", default=[], metavar="POD_UID",
                   help="limit container checks to these pod UIDs (repeatable)")
    p.add_argument("--trusted-namespace", action="append", default=None, metavar="NAMESPACE",
                   help="pods in this namespace may hold GPUs they were not given (GPU "
                        "agents; repeatable; replaces the default list gpu-operator, "
                        "nvidia-gpu-operator, kube-system, gpu-doctor; env "
                        "GPU_DOCTOR_TRUSTED_NAMESPACES=a,b)")
    p.add_argument("--only", action="append", default=[], metavar="CHECK",
                   help="run only these checks (repeatable)")
    p.add_argument("--skip", action="append", default=[], metavar="CHECK",
                   help="skip these checks (repeatable)")
    p.add_argument("--target-name", default=None, help=argparse.SUPPRESS)
    p.add_argument("--list-checks", action="store_true", help="list checks and exit")
    return p


def options_from_args(a: argparse.Namespace, workdir: Path | None = None) -> ProbeOptions:
    """The run's options; offline files (--nvidia-smi-file, --lspci-file, --bug-report) are
    read here, a bug report's kernel log copied under `workdir`."""
    if a.timeout <= 0:
        raise _UsageError("--timeout must be > 0")
    if a.trace_seconds < 0:
        raise _UsageError("--trace-seconds must be >= 0")
    if not a.host_root.is_dir():
        raise _UsageError(f"--host-root {a.host_root}: not a directory")
    if a.kmsg_file is not None and not a.kmsg_file.is_file():
        raise _UsageError(f"--kmsg-file {a.kmsg_file}: no such file")
    offline = _offline(a, workdir)
    kmsg_file = a.kmsg_file
    if kmsg_file is None and offline is not None and offline.kernel_log is not None:
        kmsg_file = offline.kernel_log     # the bug report's kernel log, read by `kmsg`
    return ProbeOptions(host_root=a.host_root, cgroup_root=a.cgroup_root,
                        kubelet_dir=a.kubelet_dir, timeout_s=a.timeout,
                        trace_s=a.trace_seconds, kmsg_file=kmsg_file, offline=offline,
                        nvml_timeout_s=a.nvml_timeout, dev_prefix=a.dev_prefix,
                        focus_pods=tuple(a.focus_pod), only=tuple(a.only),
                        skip=tuple(a.skip), plugin_log=a.plugin_log,
                        trace_pids=tuple(a.trace_pid),
                        trusted_namespaces=(None if a.trusted_namespace is None
                                            else tuple(a.trusted_namespace)))


def _offline(a: argparse.Namespace, workdir: Path | None):
    """The offline input of --nvidia-smi-file/--lspci-file/--bug-report, or None."""
    for flag, path in (("--nvidia-smi-file", a.nvidia_smi_file), ("--lspci-file", a.lspci_file),
                       ("--bug-report", a.bug_report)):
        if path is not None and not path.is_file():
            raise _UsageError(f"{flag} {path}: no such file")
    if not (a.nvidia_smi_file or a.lspci_file or a.bug_report):
        return None
    from node_probe.host.offline import load
    try:
        return load.read_all(a.nvidia_smi_file, a.lspci_file, a.bug_report,
                             workdir or Path(tempfile.gettempdir()))
    except load.BadFile as exc:
        raise _UsageError(" ".join(str(exc).split())[:400]) from None


def offline_origin(a) -> str | None:
    """The header's "when" for a run over pasted files: they were captured elsewhere, not
    live on this host."""
    names = [p.name for p in (a.nvidia_smi_file, a.lspci_file, a.bug_report) if p is not None]
    return f"offline, from {', '.join(names)}" if names else None


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Run the probe; return its exit code. A bug (any exception that escapes) is one line on
    stderr and ExitStatus.INTERNAL, as in the kubectl plugin, never a traceback and never a
    code a bot would read as the node's state (GPU_DOCTOR_DEBUG=1 shows the traceback)."""
    try:
        return _main(argv)
    except Exception as exc:  # noqa: BLE001 - one line and the internal-error code
        if os.environ.get("GPU_DOCTOR_DEBUG"):
            raise
        subproc.kill_all()
        text = " ".join(f"{type(exc).__name__}: {exc}".split())[:400]
        print(f"gpu-doctor-probe: internal error: {text} (GPU_DOCTOR_DEBUG=1 shows the "
              f"traceback)", file=sys.stderr)
        return ExitStatus.INTERNAL


def _main(argv: list[str] | None) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="gpu-doctor-offline-"))
    try:
        return _run(argv, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _run(argv: list[str] | None, workdir: Path) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.list_checks:
            for c in registry.all_checks():
                print(f"{c.id:24} {c.title}")
            return ExitStatus.OK
        opts = options_from_args(args, workdir)
        try:
            checks = registry.select(opts.only, opts.skip)
        except KeyError as exc:
            raise _UsageError(f"unknown check {exc.args[0]!r} (see --list-checks)")
        if opts.offline is None and "offline" not in opts.only:
            checks = [c for c in checks if c.id != "offline"]   # nothing to judge: not listed
    except _UsageError as exc:
        print(f"gpu-doctor-probe: error: {exc}", file=sys.stderr)
        return ExitStatus.USAGE

    # SIGTERM (kubectl delete of the debug pod, timeout of a wrapper) ends the run like Ctrl-C:
    # children killed, a summary with complete=false, exit 130.
    signal.signal(signal.SIGTERM, _raise_interrupt)

    node = args.target_name or os.uname().nodename
    report = Report({"kind": "local", "name": node, "node": node}, __version__)
    live = render.LiveProgress(sys.stderr)
    if args.output == "jsonl":
        writer = render.JsonlWriter(sys.stdout)

        def emit(rec: dict) -> None:
            writer(rec)
    else:
        def emit(rec: dict) -> None:
            report.add_record(rec)
            live(rec)

    runner = Runner(checks, opts, emit, fail_on=args.fail_on)
    try:
        result = runner.run()
    except KeyboardInterrupt:  # a second Ctrl-C while the summary is written
        subproc.kill_all()
        live.clear()
        return ExitStatus.INTERRUPTED
    code = int(result.exit_status)
    live.clear()  # the status line goes before the report
    if args.output == "json":
        render.render_json(report, sys.stdout, args.fail_on, code)
    elif args.output == "table":
        render.render_table(report, sys.stdout, args.fail_on, code,
                            origin=offline_origin(args))
    return code


def entrypoint() -> None:
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:  # `| head`: not an error worth a traceback
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        code = ExitStatus.OK
    # Abandoned check threads may be stuck in C calls; do not wait for them at exit.
    os._exit(int(code))

"""The node probe on this host, in a child process (`local`, and the frozen build's re-entry).

Why a child process: kubectl_gpudoctor must never import bcc or pynvml (DESIGN.md section 2),
and the probe's own deadlines and signal handling work best when it owns its process. The
child prints gpu-doctor/v1 NDJSON, which we render with the same code as `node X`. When the
plugin is frozen by PyInstaller there is no interpreter to run `-m node_probe` with, so the
frozen executable re-enters itself with a hidden first argument (`__probe`) that `cli.
entrypoint` dispatches to `run_probe_here`, i.e. straight to node_probe.cli.main.
The child dies with us: the kernel sends it SIGTERM when the CLI dies, however it dies
(PR_SET_PDEATHSIG; SIGKILL of the CLI used to leave the probe tracing for its whole window).
SIGTERM, not SIGKILL: the probe's handler then kills its own helpers and detaches its probes.
"""
from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess
import sys
import time
from typing import Iterator, NoReturn, Sequence

from node_probe.protocol import duration

from .stream import PROBE_GRACE_S

PROBE_ARGV0 = "__probe"
DEFAULT_TIMEOUT_S = 30.0   # the probe's own --timeout default
GRACE_S = PROBE_GRACE_S    # past its --timeout the probe is stuck (or a child holds stdout)
TERM_GRACE_S = 2.0         # after SIGTERM: time for its incomplete summary


def probe_command(args: Sequence[str]) -> list[str]:
    if getattr(sys, "frozen", False):
        return [sys.executable, PROBE_ARGV0, *args]
    return [sys.executable, "-m", "node_probe", *args]


def run_probe_here(args: Sequence[str]) -> NoReturn:
    """The `__probe` re-entry of a frozen build: this process is the probe child. The one
    import of node_probe outside node_probe.protocol in the plugin (lazy, so no other command
    loads the probe's engine; tests/kubectl/test_import_rule.py names it)."""
    from node_probe.cli import main as probe_main
    code = probe_main(list(args))
    sys.stdout.flush()
    os._exit(int(code))


class ProbeProcess:
    """The probe child: stream its stdout chunks; stop it (process group) on any exit path."""

    def __init__(self, args: Sequence[str]) -> None:
        argv = probe_command(["-o", "jsonl", *args])
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                     env=env, start_new_session=True,
                                     preexec_fn=die_with(os.getpid()))
        self.deadline_s = _timeout_arg(args) + GRACE_S

    def chunks(self) -> Iterator[bytes]:
        """Its stdout as it comes, until EOF or the deadline: then SIGTERM, a short grace for
        its incomplete summary, SIGKILL, and the stream ends (the run is incomplete)."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        end, termed = time.monotonic() + self.deadline_s, False
        while True:
            left = end - time.monotonic()
            if left <= 0:
                if termed:
                    self.stop()
                    return
                self._signal(signal.SIGTERM)
                end, termed = time.monotonic() + TERM_GRACE_S, True
                continue
            if not select.select([fd], [], [], left)[0]:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                return
            yield chunk

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

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


# -- `local`'s child started before the CLI's imports (launch.py, issue 41.4) ----------------
# the probe's flags `local` passes on, in the order commands/local.py and cli.local_cmd give
# them; `local`'s own defaults (cli._DEFAULTS) for the three it always passes
EARLY_PATHS = ("--host-root", "--cgroup-root", "--kubelet-dir", "--kmsg-file", "--plugin-log",
               "--nvidia-smi-file", "--lspci-file", "--bug-report")
EARLY_DEFAULTS = {"--timeout": 60.0, "--trace-seconds": 5.0, "--fail-on": "warning"}
_EARLY_VALUED = {*EARLY_PATHS, "--only", "--skip", "--timeout", "--trace-seconds", "--fail-on",
                 "-o", "--output"}
_early: tuple[list[str], "ProbeProcess"] | None = None


def local_probe_args(host: str, timeout_s: float, trace_s: float, fail_on: str,
                     probe_args: Sequence[str]) -> list[str]:
    """The probe child's arguments for `local` (before probe_command's `-o jsonl`)."""
    return ["--target-name", host, "--timeout", f"{timeout_s:g}", "--trace-seconds",
            f"{trace_s:g}", "--fail-on", fail_on, *probe_args]


def early_args(argv: Sequence[str]) -> list[str] | None:
    """The probe child's arguments for `local ARGV`, read without click, or None whenever
    there is any doubt (a flag it does not know, --help, a value click would refuse): then
    nothing starts early. A wrong guess costs only time: `local` compares (take_early)."""
    from node_probe.protocol import FAIL_ON
    paths: dict[str, str] = {}
    only: list[str] = []
    skip: list[str] = []
    opts: dict = dict(EARLY_DEFAULTS)
    i = 0
    while i < len(argv):
        name, eq, value = argv[i].partition("=")
        if name == "--details" and not eq:
            i += 1
            continue
        if name not in _EARLY_VALUED or (eq and not name.startswith("--")):
            return None
        if not eq:
            if i + 1 >= len(argv):
                return None
            value = argv[i + 1]
        i += 1 if eq else 2
        if value.startswith("-"):
            return None
        if name in EARLY_PATHS:
            paths[name] = value
        elif name in ("--only", "--skip"):
            (only if name == "--only" else skip).append(value)
        elif name in ("--timeout", "--trace-seconds"):
            try:
                opts[name] = duration.parse(value)
            except duration.DurationError:
                return None
            if opts[name] < (1.0 if name == "--timeout" else 0.0):
                return None
        elif name == "--fail-on":
            if value not in FAIL_ON:
                return None
            opts[name] = value
    if opts["--trace-seconds"] >= opts["--timeout"]:
        return None
    probe_args = [x for flag in EARLY_PATHS if paths.get(flag) for x in (flag, paths[flag])]
    probe_args += [x for c in only for x in ("--only", c)]
    probe_args += [x for c in skip for x in ("--skip", c)]
    return local_probe_args(os.uname().nodename, opts["--timeout"], opts["--trace-seconds"],
                            opts["--fail-on"], probe_args)


def start_early(argv: Sequence[str]) -> None:
    """Start `local ARGV`'s probe child now, if its arguments can be read without click."""
    global _early
    args = early_args(argv)
    if args is not None:
        _early = (args, ProbeProcess(args))


def take_early(args: Sequence[str]) -> "ProbeProcess | None":
    """The child start_early started, if it runs exactly `args`; else None (it is stopped)."""
    global _early
    early, _early = _early, None
    if early is None:
        return None
    if early[0] == list(args):
        return early[1]
    early[1].stop()
    return None


def drop_early() -> None:
    """Stop a child started early that `local` did not take (click refused the command line)."""
    take_early(())


PR_SET_PDEATHSIG = 1


def die_with(parent: int):
    """preexec_fn: SIGTERM this child when `parent` dies (Linux). prctl is looked up here,
    before the fork: the child only calls it. Kept by execve; if the parent is already gone
    when it is set, the child ends itself. The kernel sends it when the *thread* that forked
    dies: ProbeProcess is made on the main thread (`local`), the MCP server's children on
    its event loop's (commands/mcp_calls.py)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: the probe's own --timeout still ends it
        return None

    def set_in_child() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)
    return set_in_child


def _timeout_arg(args: Sequence[str]) -> float:
    """The --timeout the probe was given (its default when absent)."""
    value = DEFAULT_TIMEOUT_S
    for i, a in enumerate(args):
        try:
            if a == "--timeout" and i + 1 < len(args):
                value = duration.parse(args[i + 1])
            elif a.startswith("--timeout="):
                value = duration.parse(a.split("=", 1)[1])
        except duration.DurationError:
            pass  # the probe rejects it itself (usage error)
    return value

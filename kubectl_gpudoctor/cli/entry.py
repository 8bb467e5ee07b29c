"""The one end of every run: `main` runs the click group once, catches what the program raised,
maps it to an exit code through errors.exit_status_of and lets Session.finish render the
report once (SIGINT and SIGTERM held meanwhile); the executables' entry points (the CLI, and
kubectl's plugin completion protocol) start here."""
from __future__ import annotations

import gc
import os
import signal
import sys
import threading

import click

from node_probe.protocol import ExitStatus

from .. import errors
from ..session import PROG, Session, closed_pipe_ok
from .parser import cli


class _Terminated(KeyboardInterrupt):
    """SIGTERM, delivered like Ctrl-C so every `finally` (pod deletion) runs."""


def _on_sigterm(signum, frame):
    raise _Terminated()


def main(argv: list[str] | None = None, exiting: bool = False) -> int:
    """Run one command; return its exit code. Never raises (except SystemExit from click
    completion, which exits on its own).

    exiting=True (entrypoint: the process ends right after): from the finish on, SIGINT and
    SIGTERM stay held, so a late signal cannot end the process with another code between the
    verdict and the exit."""
    _reopen_closed_streams()
    session = Session()
    old = signal.signal(signal.SIGTERM, _on_sigterm)
    # A short-lived CLI holding 30,000 pod dicts: the cyclic GC would rescan them on every
    # collection (seconds at fleet scale) and there are no cycles worth collecting.
    gc_was = gc.isenabled()
    gc.disable()
    try:
        try:
            rv = cli.main(args=argv, prog_name=PROG, standalone_mode=False, obj=session)
            return _end(session, int(rv or 0), None, exiting)
        except click.exceptions.Exit as exc:  # --help, --version
            return int(exc.exit_code)
        except _NO_ARGS_HELP as exc:  # bare `kubectl gpu-doctor`: its help, exit 0, as kubectl
            with closed_pipe_ok():
                click.echo(exc.ctx.get_help() if exc.ctx else cli.get_help(
                    click.Context(cli, info_name=PROG)))
            return int(ExitStatus.OK)
        except BrokenPipeError:  # the reader left mid-run (`-o jsonl | head -1`)
            _quiet_stdout()
            if session.out is None:
                return int(ExitStatus.OK)
            session.out.mark_incomplete("stdout was closed by its reader before the run ended")
            return _end(session, int(ExitStatus.OK), None, exiting)
        except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - one line and a code
            err = _as_error(exc)
            if os.environ.get("GPU_DOCTOR_DEBUG") and isinstance(err, errors.InternalError):
                session.close()
                raise
            return _end(session, errors.exit_status_of(err), err, exiting)
    finally:
        if not exiting:
            signal.signal(signal.SIGTERM, old)
        if gc_was:
            gc.enable()


_ENDING_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _end(session: Session, status: int, error: errors.GpuDoctorError | None,
         exiting: bool) -> int:
    """Session.finish with SIGINT/SIGTERM ignored: Ctrl-C hammered while the run ends must
    not cut the pod deletions or the report short. The finish is bounded (each DELETE has a
    deadline); signals that arrive meanwhile are dropped, the run is ending anyway. Ignored,
    not masked: a mask is per thread, and the kernel hands a process signal to any thread
    that does not block it, while Python runs the handler in the main thread regardless."""
    held = threading.current_thread() is threading.main_thread()
    if held:
        old = {s: signal.signal(s, signal.SIG_IGN) for s in _ENDING_SIGNALS}
    try:
        return session.finish(status, error)
    finally:
        if held and not exiting:
            for sig, handler in old.items():
                signal.signal(sig, handler)


def _as_error(exc: BaseException) -> errors.GpuDoctorError:
    """click's and Python's exceptions in our hierarchy, so errors.exit_status_of stays the one
    mapping to exit codes."""
    if isinstance(exc, errors.GpuDoctorError):
        return exc
    if isinstance(exc, click.UsageError):
        msg = " ".join(m.strip() for m in exc.format_message().strip().splitlines())
        path = exc.ctx.command_path if exc.ctx is not None else PROG
        if exc.ctx is not None and exc.ctx.info_name == "node" and "Missing argument" in msg:
            msg = msg.rstrip(".") + " (every node: `kubectl gpu-doctor nodes`)"
        # as kubectl's usage errors end (cmdutil.UsageErrorf), on the same line
        end = "" if msg.endswith("?") else "."  # click's "Did you mean --x?" keeps its "?"
        return errors.UsageError(f"{msg.rstrip('.')}{end} See '{path} -h' for help and "
                                 f"examples")
    if isinstance(exc, (click.Abort, KeyboardInterrupt)):
        return errors.Interrupted("interrupted")
    if isinstance(exc, click.ClickException):
        return errors.UsageError(exc.format_message())
    return errors.InternalError(f"internal error: {type(exc).__name__}: {exc} "
                                "(GPU_DOCTOR_DEBUG=1 shows the traceback)")


# click >= 8.2 raises this for a group called without a command (older ones print the help
# and exit 0 themselves)
_NO_ARGS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


def _reopen_closed_streams() -> None:
    """Started with stdout or stderr closed (`>&-`): Python then has None there and the first
    write would be an AttributeError (exit 70). Write to /dev/null instead."""
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w"))  # noqa: SIM115 - lives as long as we do


def _quiet_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass


def cobra_complete(args: list[str]) -> str:
    """kubectl's plugin completion protocol (kubernetes/kubernetes#105867): kubectl runs
    `kubectl_complete-gpu_doctor <words after the plugin name>` (last word = the partial one)
    and expects Cobra's `__complete` output: one candidate per line (`value<TAB>help`), then
    `:<directive>` (4 = do not fall back to file names)."""
    from click.shell_completion import ShellComplete
    words, incomplete = (args[:-1], args[-1]) if args else ([], "")
    comp = ShellComplete(cli, {}, "kubectl-gpu_doctor", "_KUBECTL_GPU_DOCTOR_COMPLETE")
    lines = []
    for item in comp.get_completions(words, incomplete):
        lines.append(f"{item.value}\t{item.help}" if item.help else str(item.value))
    return "\n".join(lines + [":4"]) + "\n"


def complete_entrypoint() -> None:
    """The `kubectl_complete-gpu_doctor` executable kubectl looks for on PATH."""
    try:
        sys.stdout.write(cobra_complete(sys.argv[1:]))
        sys.stdout.flush()
    except Exception:  # noqa: BLE001 - completion must never print a traceback into a shell
        sys.stdout.write(":4\n")
    os._exit(0)


def entrypoint() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["__complete"]:  # `kubectl-gpu_doctor __complete ...` == the completer
        sys.argv = sys.argv[:1] + argv[1:]
        complete_entrypoint()
    if argv[:1] == ["__probe"]:  # frozen builds: run the node probe in this child process
        from ..reach import localproc as local
        local.run_probe_here(argv[1:])
    code = main(argv, exiting=True)
    if argv[:1] == ["local"]:      # a probe child started early and not taken: stop it
        from ..reach import localproc
        localproc.drop_early()
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _quiet_stdout()
    # Abandoned threads (a hung proxy call) must not keep the process alive.
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    entrypoint()

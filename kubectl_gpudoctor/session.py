"""One invocation's state between the program that runs and `cli.main` that ends it.

Why: a run can end in three ways (the program returns, it raises, the user interrupts it) and
all three must end the same way: debug pods deleted, the report rendered once with whatever
was collected (findings gathered before an error are still shown), ONE line on stderr for an
error, and one exit code. Programs (commands/) only collect into the session's Output and
return or raise; `Session.finish`, called by `cli.main` alone, is the one finish sequence.
"""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Callable, Iterator, Mapping

from . import errors
from .report.output import Output

PROG = "kubectl gpu-doctor"


class Session:
    def __init__(self) -> None:
        self.out: Output | None = None        # the report, once a program opened one
        self.pods: list = []                  # every debug pod of this run (DebugPod)
        self.preamble: Callable[[], str] = lambda: ""  # table-only text before the report
        self.bundle: Any = None               # bundle.Saver of `--save FILE`

    def open_report(self, fmt: str, fail_on: str, target: Mapping[str, Any],
                    api_only: bool = True, details: bool = False) -> Output:
        self.out = Output(fmt, fail_on, target, details=details)
        self.out.api_only = api_only
        return self.out

    def register(self, pod) -> None:
        """on_pod callback of diagnose/fleet: remember every debug pod to delete at the end."""
        if pod is not None:
            self.pods.append(pod)

    def close(self) -> None:
        """Delete every debug pod still there. run_probe's finally deletes its own already;
        this is idempotent, and the only path for pods of worker threads cut short."""
        for pod in list(self.pods):
            pod.delete()

    def finish(self, status: int, error: errors.GpuDoctorError | None) -> int:
        """Render the report (if any) for the final code, say the error, return the code."""
        self.close()
        if isinstance(error, errors.Interrupted):
            created = [p for p in self.pods if p.created]
            if created:
                gone = all(p.deleted for p in created)
                what = "debug pod" if len(created) == 1 else f"{len(created)} debug pods"
                error.message = "interrupted; " + (
                    f"{what} deleted" if gone else
                    f"could not delete every {what}, run `kubectl gpu-doctor cleanup -n "
                    f"{created[0].namespace}`")
        err_status = errors.exit_status_of(error) if error is not None else None
        out = self.out
        if out is None:
            code = int(err_status if err_status is not None else status)
        else:
            out.clear_live()  # the status line goes before the report or the error line
            if error is not None:
                out.mark_incomplete(error.one_line())
            code = int(out.exit_status(err_status))
            if self.bundle is not None:  # the same verdict the report shows
                self.bundle.save(code, error, self.preamble)
            if error is None or out.report.findings or out.fmt not in ("table", "wide"):
                with closed_pipe_ok():  # `nodes | head`: the code stays the verdict's
                    out.finish(code, pre_table=self.preamble(), error=None if error is None
                               else {"type": type(error).__name__,
                                     "message": error.one_line()})
        if error is not None:
            with closed_pipe_ok(sys.stderr):
                say_error(error)
        return code


@contextlib.contextmanager
def closed_pipe_ok(stream: Any = None) -> Iterator[None]:
    """A reader that went away (`| head`, a closed stdout) ends the output, not the run: the
    exit code stays the one the run decided, and no traceback is printed. Later writes to the
    stream go to /dev/null (Python would otherwise report the failed flush at exit)."""
    stream = stream if stream is not None else sys.stdout
    try:
        yield
        stream.flush()
    except BrokenPipeError:
        quiet(stream)


def quiet(stream: Any) -> None:
    """Point the file descriptor of `stream` at /dev/null (a reader closed it)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def echo(text: str = "", nl: bool = True) -> None:
    """click.echo to stdout that survives a closed pipe (the command's code stays its own)."""
    import click
    with closed_pipe_ok():
        click.echo(text, nl=nl)


def say_error(error: errors.GpuDoctorError) -> None:
    if error.said:
        return
    prefix = "" if isinstance(error, errors.Interrupted) else "error: "
    from node_probe.protocol.render import terminal_safe  # API text can carry tenant strings
    sys.stderr.write(f"{PROG}: {prefix}{terminal_safe(error.one_line())}\n")
    sys.stderr.flush()

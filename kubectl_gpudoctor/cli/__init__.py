"""`kubectl gpu-doctor`: the commands users type (click), and the one place errors become exits.

Why here: kubectl finds the plugin as the `kubectl-gpu_doctor` executable and passes the rest
of the command line through. parser.py parses it with kubectl's conventions (--kubeconfig,
--context, -n, -o; the shared flags in options.py, the examples in help_text.py) and hands the
options to one program of commands/, which collects and returns or raises. entry.main alone
ends the run, as httpie's `main` does: it installs the SIGTERM handler, catches what the
program raised, maps it to an exit code of DESIGN.md section 7 through errors.exit_status_of,
and lets Session.finish render the report once and print ONE line on stderr for an error
(never a traceback; GPU_DOCTOR_DEBUG=1 shows it for bugs). The kubernetes client is imported
only by programs that talk to a cluster, so --help, version, completion and local start fast.
The names below are the package's entry points (pyproject, launch.py, tests).
"""
from __future__ import annotations

from .entry import cobra_complete, complete_entrypoint, entrypoint, main
from .parser import cli

__all__ = ["cli", "cobra_complete", "complete_entrypoint", "entrypoint", "main"]

"""The `kubectl-gpu_doctor` executable's first lines: `local` starts its probe child here,
before the CLI's imports (issue 41.4).

Why: `local` runs the node probe in a child process (reach/localproc.py), and the CLI's own
imports (click, every command, the renderers: about 110 ms) used to come first, so the two
interpreters started one after the other. Here, for a plain `local` run whose options this
module reads exactly as click will (reach/localproc.early_args: the flags `local` has, in
their usual forms; anything else, such as --help or a flag it does not know, starts nothing
early), the probe child starts at once; click then parses the command line as always, and
`local` adopts the child only if the arguments it computes are the same ones
(localproc.take_early), else stops it and starts its own. Every other command goes straight
to cli.entrypoint."""
from __future__ import annotations

import sys


def entrypoint() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["local"]:
        from .reach import localproc
        localproc.start_early(argv[1:])
    from .cli import entrypoint as cli_entrypoint
    cli_entrypoint()


if __name__ == "__main__":  # pragma: no cover
    entrypoint()

"""`replay BUNDLE`: render a saved evidence bundle with the renderer and exit code of the run
that saved it, saying it is a replay, of which file, captured when and by which command."""
from __future__ import annotations



from node_probe.protocol import ExitStatus

from ..session import Session


def replay(session: Session, path: str, fmt: str, fail_on: str | None,
           details: bool = False) -> ExitStatus:
    from ..report import bundle
    return ExitStatus(bundle.replay(bundle.load(path), fmt, fail_on,
                                    details=details, source=path))



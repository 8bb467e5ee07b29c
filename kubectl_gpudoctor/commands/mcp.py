"""`mcp`: gpu-doctor's read-only diagnosis as tools for incident assistants (Model Context
Protocol over stdio).

Why: assistants that call tools are where on-call bots increasingly run; they should get the
same verdicts, findings and exit codes a bot reads from `-o json` today, under the same
deadlines, bounds and RBAC, and nothing that creates a pod unless the person who started the
server said so (--allow-node-probe). The server is commands/mcp_server.py (on the official
`mcp` SDK, an optional extra, imported only here); each tool call is one run of this CLI in a
child (commands/mcp_calls.py says why). This module checks the SDK is there, starts the
server and turns how it ended into the exit code: 0 when the client closed stdin, 130 on
SIGINT/SIGTERM.
"""
from __future__ import annotations

import gc
import importlib.util
from typing import Any, Mapping

from node_probe.protocol import ExitStatus

from .. import errors
from ..session import Session

DEFAULT_CALL_TIMEOUT_S = 300.0
# the SDK itself, as the [mcp] extra pins it: this project has no PyPI release to name (audit
# round 5, N16: `pip install 'kubectl-gpu-doctor[mcp]'` resolved nowhere)
INSTALL_HINT = ("pip install 'mcp>=2.3,<3' into this Python (3.10 or newer), or `pip install "
                "'.[mcp]'` in a clone; the krew plugin carries it")


def serve(session: Session, o: Mapping[str, Any]) -> ExitStatus:
    """Serve the tools until the client goes away (exit 0) or a signal ends it (exit 130)."""
    if importlib.util.find_spec("mcp") is None:
        raise errors.UsageError(f"`mcp` needs the Model Context Protocol SDK (the Python "
                                f"package mcp), which this installation lacks: {INSTALL_HINT}")
    import anyio

    from . import mcp_server
    from .mcp_calls import Options

    # cli.main turns the cyclic GC off for a short run; a server runs for hours
    gc.enable()
    opts = Options.of(o, DEFAULT_CALL_TIMEOUT_S)
    if anyio.run(mcp_server.serve, opts):
        raise errors.Interrupted("interrupted")
    return ExitStatus.OK

"""Driving `kubectl gpu-doctor mcp` as an MCP client does, for the tests.

Two ways in: the official SDK's own client (`calls`: a stdio client session that spawns the real
server process, initializes, lists the tools and calls them), and raw JSON-RPC lines on a
`subprocess.Popen` (`RawServer`) for what a client library hides: stdin closed mid-call, a
signal, exactly what the server writes on stdout.
"""
from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from .conftest import REPO, cli_env

# What differs between two runs of the same command on the same cluster, and nothing else:
# when the run started and how long it (and each of its checks) took, and the run id in the
# name of its debug pod (gpu-doctor-NODE-<8 hex>, reach/debugpod.py: secrets.token_hex(4))...
VOLATILE = ("started_at", "duration_s", "checks[].duration_s", "debug pod run id")
RUN_ID = re.compile(r"\b(gpu-doctor-[a-z0-9.-]*?)-[0-9a-f]{8}\b")
# ...and the ages a run measures against its own clock (how long a pod has waited, how old the
# node Lease's renewal is, anywhere in the document): they grow by the time between the runs.
AGES = ("waiting_s", "oldest_wait_s", "pending_s", "lease_renew_age_s", "lease_age_s")


def steady(doc: dict) -> dict:
    """The document without VOLATILE, and its AGES as None."""
    d = json.loads(RUN_ID.sub(r"\1-RUNID", json.dumps(doc)))
    d.pop("started_at", None)
    d.pop("duration_s", None)
    for c in d.get("checks") or ():
        c.pop("duration_s", None)
    for parent, key, _ in _ages(d):
        parent[key] = None
    return d


def _ages(node: Any, path: str = "") -> list[tuple[Any, Any, str]]:
    found = []
    items = node.items() if isinstance(node, dict) else enumerate(node) \
        if isinstance(node, list) else ()
    for k, v in items:
        if k in AGES and isinstance(v, (int, float)) and not isinstance(v, bool):
            found.append((node, k, f"{path}.{k}"))
        else:
            found.extend(_ages(v, f"{path}.{k}"))
    return found


def assert_same_document(got: dict, want: dict, slack_s: float) -> None:
    """`got` is `want` as a later run of the same command sees it: equal but for VOLATILE, and
    each of AGES as old or at most `slack_s` (the seconds between the two runs) older."""
    assert steady(got) == steady(want)
    g = {p: parent[k] for parent, k, p in _ages(got)}
    w = {p: parent[k] for parent, k, p in _ages(want)}
    assert g.keys() == w.keys()
    for p in g:
        assert 0 <= g[p] - w[p] <= slack_s + 1, (p, g[p], w[p])


def calls(command: Sequence[str], todo: Sequence[tuple[str, dict | None]],
          env: dict | None = None, cwd: Path = REPO) -> tuple[Any, list, str]:
    """(tools/list result, one CallToolResult per (tool, arguments), the server's stderr),
    through the SDK's stdio client spawning `command`."""
    import anyio
    from mcp import ClientSession, StdioServerParameters, stdio_client

    with tempfile.TemporaryFile("w+") as errlog:
        async def go():
            params = StdioServerParameters(command=command[0], args=list(command[1:]),
                                           env=env or cli_env(), cwd=str(cwd))
            async with stdio_client(params, errlog=errlog) as (r, w):
                async with ClientSession(r, w) as session:
                    await session.initialize()
                    listed = await session.list_tools()
                    return listed, [await session.call_tool(name, args) for name, args in todo]
        listed, results = anyio.run(go)
        errlog.seek(0)
        return listed, results, errlog.read()


def server_command(*args: str) -> list[str]:
    import sys
    return [sys.executable, "-m", "kubectl_gpudoctor", "mcp", *args]


def text(result: Any) -> str:
    return "\n".join(c.text for c in result.content)


# -- raw JSON-RPC ------------------------------------------------------------------------------

INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "tests", "version": "0"}}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def tool_call(rid: int, name: str, arguments: dict) -> dict:
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call",
            "params": {"name": name, "arguments": arguments}}


class RawServer:
    """The server process with pipes: send() lines, read_until() answers."""

    def __init__(self, *args: str) -> None:
        self.p = subprocess.Popen(server_command(*args), stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  env=cli_env(), cwd=str(REPO))
        self.lines: list[bytes] = []

    def send(self, msg: dict | bytes) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(msg if isinstance(msg, bytes) else json.dumps(msg).encode() + b"\n")
        self.p.stdin.flush()

    def close_stdin(self) -> None:
        """The client goes away: EOF on the server's stdin."""
        assert self.p.stdin is not None
        self.p.stdin.close()
        self.p.stdin = None

    def read_until(self, rid: int, wait_s: float = 60) -> dict:
        """The answer to request `rid` (every line read is kept in `lines`)."""
        import select
        assert self.p.stdout is not None
        end = time.monotonic() + wait_s
        while time.monotonic() < end:
            if not select.select([self.p.stdout], [], [], 0.2)[0]:
                continue
            line = self.p.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            msg = json.loads(line)
            if msg.get("id") == rid:
                return msg
        raise AssertionError(f"no answer to request {rid}")

    def finish(self, wait_s: float = 60) -> tuple[int, bytes, str]:
        """(exit code, the rest of stdout, stderr) once the process ended."""
        try:
            out, err = self.p.communicate(timeout=wait_s)
        finally:
            if self.p.poll() is None:
                self.p.kill()
                self.p.wait()
        return self.p.returncode, out, err.decode("utf-8", "replace")


def runs_of(marker: str) -> list[int]:
    """Pids of the tool runs (children `... -o json ...`) whose command line names `marker`
    (a test's own kubeconfig path): whichever parent they have now."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in b"".join(argv) and b"json" in argv and b"mcp" not in argv:
            pids.append(int(d.name))
    return pids


def wait_for(pred, wait_s: float = 30) -> bool:
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False

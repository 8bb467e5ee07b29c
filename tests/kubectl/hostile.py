"""A hostile API server (and agent) for the plugin's memory and deadline bounds (issue 21).

Why: everything an API server, a kubelet it proxies or the agent sends is hostile input. This
is the fake API server of fakecluster.py / fakeexec.py (real HTTP on 127.0.0.1, driven by the
real kubernetes client in a real CLI process), with paths that can be made to misbehave:
- `endless(prefix, unit)`: a chunked body that never ends (an endless node, list, goroutine
  dump, healthz, or a debug pod log: `unit` without a newline is one giant line);
- `trickle(prefix, unit, every_s)`: the same, slowly;
- `pages(make_page)`: a list whose every page is made by `make_page(n, token)`, e.g. a fresh
  `continue` token forever (`endless_pages`) or the same one again (`repeated_token`);
- `status(code)`: an error answer (a pod list or Lease that answers 500).
Each hostile answer stops by itself: after HOSTILE_MAX_BYTES or HOSTILE_MAX_S, or when the
client hangs up. `run_measured` runs the CLI and reads its peak RSS and CPU time from the
kernel's accounting of that one process (wait4), never from wall-clock speed.
"""
from __future__ import annotations

import asyncio
import gc
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import aiohttp.web
import pytest

from .conftest import REPO, cli_env
from .fakecluster import status_body
from .fakeexec import ExecCluster, _Handler, _kill
from .kubelet_dump import healthy_kubelet_dump

HOSTILE_MAX_BYTES = 8 << 30   # what one hostile answer sends at most
HOSTILE_MAX_S = 180.0         # and for how long at most
CLI_AS_LIMIT = 6 << 30        # address-space limit of the CLI under test: a safety net for
                              # the machine when the bound being tested does not hold

Behaviour = Callable[[aiohttp.web.BaseRequest], Awaitable[aiohttp.web.StreamResponse]]


def endless(prefix: bytes = b"", unit: bytes | Callable[[int], bytes] = b" " * 65536,
            every_s: float = 0.0,
            content_type: str = "application/json",
            first: tuple[bytes, int] = (b"", 0)) -> Behaviour:
    """A 200 answer whose chunked body starts with `prefix`, then `first[0]` `first[1]` times
    (e.g. one giant line), then repeats `unit` forever (or unit(0), unit(1)... if callable)."""
    async def answer(req: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        resp = aiohttp.web.StreamResponse(status=200, headers={"Content-Type": content_type})
        resp.enable_chunked_encoding()
        await resp.prepare(req)
        sent, t0 = 0, time.monotonic()
        try:
            await resp.write(prefix)
            for _ in range(first[1]):
                await resp.write(first[0])
            n = 0
            while sent < HOSTILE_MAX_BYTES and time.monotonic() - t0 < HOSTILE_MAX_S:
                data = unit(n) if callable(unit) else unit
                await resp.write(data)
                sent, n = sent + len(data), n + 1
                await asyncio.sleep(every_s)
        except (ConnectionError, RuntimeError):  # the client hung up: what we want
            pass
        return resp
    return answer


def trickle(prefix: bytes = b"", unit: bytes = b" ", every_s: float = 0.2) -> Behaviour:
    return endless(prefix, unit, every_s)


def pages(make_page: Callable[[int, str | None], dict]) -> Behaviour:
    """A list served page by page: make_page(number of pages served, continue token asked)."""
    served = [0]

    async def answer(req: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        doc = make_page(served[0], req.query.get("continue"))
        served[0] += 1
        return aiohttp.web.json_response(doc)
    answer.served = served  # type: ignore[attr-defined]
    return answer


def status(code: int, message: str = "etcdserver: request timed out") -> Behaviour:
    async def answer(req: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        return aiohttp.web.json_response(
            status_body(code, "InternalError", message), status=code)
    return answer


def node_items(n: int, start: int = 0) -> list[dict]:
    return [{"metadata": {"name": f"gpu-{start + i:06d}", "uid": f"u{start + i}",
                          "labels": {"nvidia.com/gpu.present": "true"}},
             "status": {"capacity": {"nvidia.com/gpu": "8"},
                        "allocatable": {"nvidia.com/gpu": "8"},
                        "conditions": [{"type": "Ready", "status": "True"}]}}
            for i in range(n)]


def endless_pages(kind: str = "NodeList", per_page: int = 500,
                  items: Callable[[int, int], list[dict]] = node_items) -> Behaviour:
    """Every page full, with a new continue token: a list that never ends."""
    return pages(lambda n, _tok: {"kind": kind, "apiVersion": "v1",
                                  "metadata": {"resourceVersion": "1", "continue": f"page-{n + 1}",
                                               "remainingItemCount": 10 ** 9},
                                  "items": items(per_page, n * per_page)})


def repeated_token(kind: str = "NodeList", per_page: int = 1) -> Behaviour:
    """Every page answers with the same continue token."""
    return pages(lambda n, _tok: {"kind": kind, "apiVersion": "v1",
                                  "metadata": {"resourceVersion": "1", "continue": "again"},
                                  "items": node_items(per_page, n * per_page)})


class _HostileHandler(_Handler):
    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        for key, how in self.cluster.hostile.items():
            if key == raw_request.path or (isinstance(key, re.Pattern) and
                                           key.fullmatch(raw_request.path)):
                return await how(raw_request)
        return await super().__call__(raw_request)


class HostileCluster(ExecCluster):
    """The fake API server (with exec), where `hostile[path]` answers that path instead."""

    def __init__(self) -> None:
        super().__init__()
        self.hostile: dict[str | re.Pattern, Behaviour] = {}  # path or its pattern

    def _make_handler(self) -> Any:
        h = _HostileHandler()
        h.cluster = self
        return h


@dataclass
class Measured:
    returncode: int
    stdout: str
    stderr: str
    max_rss_mib: float   # peak resident set of the CLI process (and children it waited for)
    cpu_s: float         # user + system CPU time of the same
    wall_s: float

    def __str__(self) -> str:
        return (f"rc={self.returncode} peak RSS {self.max_rss_mib:.0f} MiB, CPU "
                f"{self.cpu_s:.1f}s, wall {self.wall_s:.1f}s")


# A small parent that starts the CLI and reads the kernel's accounting of it (wait4). Not the
# test process itself: a forked child's ru_maxrss starts at its parent's peak RSS (Linux keeps
# the pre-exec high-water mark), and pytest's grows over a session; this launcher's is ~10 MiB.
_LAUNCHER = """
import json, os, resource, sys
report, limit, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
pid = os.fork()
if pid == 0:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    os.execv(argv[0], argv)
_, status, ru = os.wait4(pid, 0)
with open(report, "w") as f:
    json.dump({"status": status, "maxrss_kib": ru.ru_maxrss,
               "cpu_s": ru.ru_utime + ru.ru_stime}, f)
"""


def run_measured(*args: str, timeout: float = 120) -> Measured:
    """The CLI in a real process; its peak RSS and CPU time as the kernel accounted them."""
    import signal
    import tempfile

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "rusage.json")
        t0 = time.monotonic()
        p = subprocess.Popen([sys.executable, "-c", _LAUNCHER, report, str(CLI_AS_LIMIT),
                              sys.executable, "-m", "kubectl_gpudoctor", *args],
                             stdout=out, stderr=err, env=cli_env(), cwd=str(REPO),
                             start_new_session=True)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)  # the CLI ran past every deadline: kill it
            p.wait()
        wall = time.monotonic() - t0
        assert os.path.exists(report), f"the CLI was still running after {timeout:g}s: killed"
        with open(report) as f:
            ru = json.load(f)
        out.seek(0)
        err.seek(0)
        return Measured(os.waitstatus_to_exitcode(ru["status"]),
                        out.read().decode("utf-8", "replace"),
                        err.read().decode("utf-8", "replace"), ru["maxrss_kib"] / 1024.0,
                        ru["cpu_s"], wall)


def finding_line(i: int, n: int = 0) -> bytes:
    return json.dumps({"schema": "gpu-doctor/v1", "kind": "finding", "id": "nvml.init_hang",
                       "severity": "warning", "subject": f"gpu-{n}-{i}", "title": "flood " * 20,
                       "evidence": {"i": i}, "remediation": "r", "refs": [],
                       "check": "nvml"}).encode() + b"\n"


def flood_unit(n: int) -> bytes:
    """~60 KiB of records no two alike (a report keeps each: findings by (id, subject), logs
    all): 100 valid findings and 100 lines of noise, numbered `n`."""
    return b"".join(finding_line(i, n) + b"noise %d %d " % (n, i) + b"z" * 300 + b"\n"
                    for i in range(100))


GIANT_LINE_MIB = 200


def flooding_agent(seconds: float = 120.0) -> list[str]:
    """argv of an agent 'probe' that sends one 200 MB line, then records at full speed (it
    stops by itself after `seconds`)."""
    code = f"""
import os, sys, time
chunk = b"x" * (1 << 20)
for _ in range({GIANT_LINE_MIB}):
    os.write(1, chunk)
os.write(1, b"\\n")
import json
t0, n = time.monotonic(), 0
while time.monotonic() - t0 < {seconds}:
    os.write(1, b"".join(json.dumps({{"schema": "gpu-doctor/v1", "kind": "finding",
        "id": "nvml.init_hang", "severity": "warning", "subject": "gpu-%d-%d" % (n, i),
        "title": "flood " * 20, "evidence": {{"i": i}}, "remediation": "r", "refs": [],
        "check": "nvml"}}).encode() + b"\\n" + b"noise %d %d " % (n, i) + b"z" * 300 + b"\\n"
        for i in range(100)))
    n += 1
"""
    return [sys.executable, "-c", code]


NODE = "gpu-1"


@pytest.fixture
def hc():
    """A HostileCluster with one healthy GPU node (goroutine dump, configz) and gpu-doctor's
    probe namespace, started; nothing hostile until a test says so."""
    fc = HostileCluster()
    fc.add_node(NODE, gpus=1)
    fc.goroutines[NODE] = healthy_kubelet_dump()
    fc.configz[NODE] = {"cpuManagerPolicy": "none", "cgroupDriver": "systemd"}
    fc.start()
    try:
        yield fc
    finally:
        _settle(fc)
        fc.stop()


def _settle(fc: HostileCluster) -> None:
    """Kill the agent processes still flooding, and let their pipe transports be collected
    while the server's loop still runs: collected after it closed, their __del__ raises
    'Event loop is closed' from inside whatever runs the GC then (seen: pytest's ast.parse,
    which CPython 3.11 then fails with 'AST constructor recursion depth mismatch')."""
    async def settle() -> None:
        # the exec handlers of a client that hung up mid-flood: end them in this loop
        me = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not me and
                 any(n in getattr(t.get_coro(), "__qualname__", "")
                     for n in ("_exec", "pump", "watch_client", "_handle"))]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for p in list(fc.exec_procs):
            _kill(p)
            p._transport.close()  # its pipes too, now, in the loop that owns them
        await asyncio.sleep(0.1)
        gc.collect()
        await asyncio.sleep(0.1)
    if fc._loop is not None and fc.exec_procs:
        try:
            asyncio.run_coroutine_threadsafe(settle(), fc._loop).result(20)
        except Exception:  # noqa: BLE001 - stop() reaps what is left
            pass


@pytest.fixture
def kc(hc, tmp_path):
    return str(hc.kubeconfig(tmp_path / "kc"))

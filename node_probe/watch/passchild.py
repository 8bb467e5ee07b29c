"""Each watch pass in a short-lived forked child: the agent keeps nothing a pass needed.

Why: the agent is resident on every GPU node; its memory is what a peer's is judged by (EKS's
node monitoring agent requests 30 MiB, node-problem-detector 80 MiB). A pass in the agent's own
process left grpc and protobuf (~12 MiB, loaded by the device-plugin and pod-resources RPCs)
and each pass's peak (a kernel log in an Xid storm: security round 4, X-02) resident for
ever. Here the pass runs in a child forked from the agent -- the checks already imported, so
the child pays only for what it loads itself, such as grpc (~30 ms of CPU) -- and hands back
the little the loop needs (problems, check statuses), as bounded JSON lines on a pipe. The child
is its own process group with a hard deadline: at the deadline it and its descendants are
SIGKILLed, as the NVML child already is. Checks that had not finished then are "stuck": while
that child is unreapable (a read in D state), they are skipped, as the in-process threads were
(detect.stuck_checks), so a wedged node costs one process, not one per pass.
"""
from __future__ import annotations

import dataclasses
import json
import os
import select
import signal
import time

from . import detect
from .state import Problem

MAX_OUTPUT = 4 * 1024 * 1024   # bytes of JSON a pass may hand back
MAX_PROBLEMS = 500
TITLE_MAX = 400
MAX_STUCK_CHILDREN = 4         # unreapable children kept; beyond, passes wait for them
GRACE_S = 5.0                  # past the pass's own deadline before the child is killed


@dataclasses.dataclass(frozen=True)
class Seen:
    """A finding as the loop needs it after a pass: its id (Provoker.observe)."""
    id: str


@dataclasses.dataclass(frozen=True)
class Check:
    id: str
    status: str
    duration_s: float


class PassRunner:
    """Runs passes in forked children; remembers children that would not die."""

    def __init__(self) -> None:
        self.stuck: dict[int, tuple[str, ...]] = {}   # pid -> checks unfinished when killed
        self.killed = 0

    def alive(self) -> bool:
        """Is a pass child killed earlier still exiting (not reaped yet)?"""
        self.stuck_checks()
        return bool(self.stuck)

    def stuck_checks(self) -> tuple[str, ...]:
        for pid in list(self.stuck):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                del self.stuck[pid]
        return tuple(sorted({c for cs in self.stuck.values() for c in cs}))

    def run(self, base, timeout_s: float, provoke: bool = False, isolation: bool = True,
            skip: tuple[str, ...] = ()) -> detect.PassResult:
        """`skip`: checks left out of this pass (their classes are unsure: no flip)."""
        stuck = self.stuck_checks()
        started = time.time()
        if len(self.stuck) >= MAX_STUCK_CHILDREN:  # bounded: no more processes, no pass
            return detect.PassResult(started, 0.0, [], [], {}, set(detect_classes()), stuck,
                                     provoke)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            os.close(r)
            _child(w, base, timeout_s, provoke, isolation, tuple(sorted({*stuck, *skip})))
        os.close(w)
        try:
            lines, complete = _read(r, pid, timeout_s + GRACE_S)
        except BaseException:  # SIGTERM/Ctrl-C in the agent: the pass goes with it
            _kill_tree(pid)
            _reap(pid, 2.0)
            raise
        finally:
            os.close(r)
        return self._result(pid, lines, complete, started, provoke, stuck)

    def _result(self, pid: int, lines: list[dict], complete: bool, started: float,
                provoke: bool, stuck: tuple[str, ...]) -> detect.PassResult:
        begun: list[str] = []
        done: set[str] = set()
        final = None
        for d in lines:
            if d.get("t") == "start":
                begun = [str(c) for c in d.get("checks") or ()][:64]
            elif d.get("t") == "done":
                done.add(str(d.get("check")))
            elif d.get("t") == "result":
                final = d
        if not complete or final is None:
            _kill_tree(pid)
            self.killed += 1
            unfinished = tuple(c for c in begun if c not in done) or tuple(begun)
            if not _reap(pid, 2.0):
                self.stuck[pid] = unfinished
            checks = [Check(c, "ok" if c in done else "timeout", 0.0) for c in begun]
            return detect.PassResult(started, time.time() - started, [], checks, {},
                                     set(detect_classes()), tuple(sorted(set(stuck) |
                                                                         set(unfinished))),
                                     provoke)
        _reap(pid, 5.0)
        problems: dict[str, list[Problem]] = {}
        for ct, ps in (final.get("problems") or {}).items():
            problems[str(ct)] = [Problem(str(ct), str(p[0]), str(p[1]), str(p[2])[:TITLE_MAX],
                                         str(p[3])[:TITLE_MAX],
                                         tuple(str(u)[:800] for u in (p[4] if len(p) > 4 and
                                                                      isinstance(p[4], list)
                                                                      else ())[:detect.MAX_USERS]))
                                 for p in ps[:MAX_PROBLEMS]]
        iso = final.get("isolation_cpu_s")
        seen = final.get("plugin_targets")
        return detect.PassResult(
            float(final.get("started") or started), float(final.get("duration_s") or 0.0),
            [Seen(str(i)) for i in (final.get("finding_ids") or ())[:10000]],
            [Check(str(c[0]), str(c[1]), float(c[2])) for c in final.get("checks") or ()],
            problems, {str(u) for u in final.get("unsure") or ()}, stuck, provoke,
            float(iso) if isinstance(iso, (int, float)) else None, _gauges(final.get("gpus")),
            plugin_targets=tuple(str(x)[:600] for x in seen[:64]) if isinstance(seen, list)
            else None, plugin_rpc=final.get("plugin_rpc") is not False)


def _gauges(rows) -> list[dict]:
    """The per-GPU gauges a pass handed back, re-checked: only the known keys, numbers or
    short strings, at most detect.MAX_GPUS."""
    out = []
    for r in (rows if isinstance(rows, list) else [])[:detect.MAX_GPUS]:
        if not isinstance(r, dict):
            continue
        g = {"uuid": str(r.get("uuid") or "")[:96], "pci_bus_id": str(r.get("pci_bus_id") or "")[:32]}
        for k in detect.GAUGES:
            v = r.get(k)
            g[k] = v if isinstance(v, (int, float)) and not isinstance(v, bool) else None
        out.append(g)
    return out


def detect_classes():
    from .state import CLASS_CHECKS
    return CLASS_CHECKS.keys()


def _child(w: int, base, timeout_s: float, provoke: bool, isolation: bool,
           stuck: tuple[str, ...]) -> None:
    """The forked pass: its own process group, default signals, one JSON line per event."""
    code = 0
    try:
        os.setpgid(0, 0)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        out = os.fdopen(w, "w", buffering=1)

        def emit(rec: dict) -> None:
            if rec.get("kind") == "progress" and rec.get("phase") == "start":
                out.write(json.dumps({"t": "start", "checks": rec.get("checks")}) + "\n")
            elif rec.get("kind") == "progress" and rec.get("phase") == "check":
                out.write(json.dumps({"t": "done", "check": rec.get("check")}) + "\n")

        res = detect.run_pass(base, timeout_s, provoke, isolation=isolation, skip=stuck,
                              emit=emit)
        n = 0
        problems = {}
        for ct, ps in res.problems.items():
            keep = ps[:max(0, MAX_PROBLEMS - n)]
            n += len(keep)
            problems[ct] = [[p.finding_id, p.severity, p.subject[:TITLE_MAX],
                             p.title[:TITLE_MAX], list(p.pods[:detect.MAX_USERS])]
                            for p in keep]
        out.write(json.dumps({
            "t": "result", "started": res.started, "duration_s": res.duration_s,
            "finding_ids": sorted({f.id for f in res.findings}),
            "checks": [[c.id, c.status, round(c.duration_s, 3)] for c in res.checks],
            "problems": problems, "unsure": sorted(res.unsure),
            "isolation_cpu_s": res.isolation_cpu_s,
            "gpus": res.gpus[:detect.MAX_GPUS],
            "plugin_targets": None if res.plugin_targets is None else list(res.plugin_targets),
            "plugin_rpc": res.plugin_rpc}) + "\n")
        out.flush()
    except BaseException:  # noqa: BLE001 - the parent sees an incomplete pass
        code = 1
    finally:
        try:
            from node_probe.host import nvml_forkserver, subproc
            subproc.kill_all()
            nvml_forkserver.kill_live()
        except Exception:  # noqa: BLE001
            pass
        os._exit(code)


def _read(fd: int, pid: int, deadline_s: float) -> tuple[list[dict], bool]:
    """The child's lines until it closes the pipe (complete) or the deadline (not)."""
    end = time.monotonic() + deadline_s
    buf, size = bytearray(), 0
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return _lines(buf), False
        r, _, _ = select.select([fd], [], [], min(left, 1.0))
        if not r:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return _lines(buf), True
        size += len(chunk)
        if size > MAX_OUTPUT:
            return _lines(buf), False
        buf += chunk


def _lines(buf: bytes) -> list[dict]:
    out = []
    for line in bytes(buf).split(b"\n"):
        try:
            d = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(d, dict):
            out.append(d)
    return out


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo and len(out) < 1000:
        p = todo.pop()
        kids = []
        try:  # children are listed per thread that forked them (the checks' threads)
            for tid in os.listdir(f"/proc/{p}/task")[:4096]:
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    kids += [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            pass
        out += kids
        todo += kids
    return out


def _kill_tree(pid: int) -> None:
    """SIGKILL the pass child, its process group and every descendant (the NVML child runs
    in a session of its own)."""
    for p in [pid, *_descendants(pid)]:
        for kill in (lambda: os.killpg(p, signal.SIGKILL), lambda: os.kill(p, signal.SIGKILL)):
            try:
                kill()
            except (ProcessLookupError, PermissionError):
                pass


def _reap(pid: int, wait_s: float) -> bool:
    end = time.monotonic() + wait_s
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return True
        if done:
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(0.02)

"""Fixtures for the eBPF tests: real cgroups, real device nodes, real helper processes.

Why: the probes are only worth something against the real kernel, so these tests run as root
with BCC (skipping with the reason otherwise), create and remove their own cgroup v1 device
cgroups, mknod their own device nodes in temp dirs, compile tiny C helpers, and run the probe
CLI as a child whose NDJSON stream they read while they provoke the traced behaviour.
"""
from __future__ import annotations

import hashlib
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HELPERS = Path(__file__).with_name("helpers")
CGROUP_DEVICES = Path("/sys/fs/cgroup/devices")
_BUILD = Path(tempfile.gettempdir()) / "gpu-doctor-trace-helpers"


KHEADERS_SCRIPT = REPO / "scripts" / "build-kheaders.py"
# Run a command with the host's kernel headers out of sight: a private mount namespace with
# tmpfs over /lib/modules and /usr/src (the host's own links stay as they are for others).
HIDE_HEADERS = ["unshare", "-m", "--propagation", "private", "sh", "-c",
                "mount -t tmpfs none /lib/modules && mount -t tmpfs none /usr/src && "
                'exec "$0" "$@"']


def build_header_set(dest: Path) -> str | None:
    """Build the probe's bundled header set into dest from the installed Debian packages;
    the reason it cannot, or None."""
    r = subprocess.run([sys.executable, str(KHEADERS_SCRIPT), "build", "--no-download",
                        str(dest)], capture_output=True, text=True, timeout=120)
    return None if r.returncode == 0 else f"cannot build the header set here: {r.stderr[-300:]}"


@pytest.fixture(scope="session")
def header_set(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("kheaders") / "set"
    why = build_header_set(dest)
    if why:
        pytest.skip(why)
    return dest


def bcc_skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (eBPF, cgroups, mknod)"
    try:
        import bcc  # noqa: F401
    except Exception as exc:
        return f"BCC is not importable here ({exc}); install python3-bpfcc and use .venv"
    from node_probe.tracing import bcc_env
    env = bcc_env.check(Path("/"), lambda *a, **k: None)
    if not env.ok:
        return "eBPF unavailable: " + "; ".join(env.missing)
    return None


@pytest.fixture(scope="session")
def bcc_ready():
    reason = bcc_skip_reason()
    if reason:
        pytest.skip(reason)
    return True


def build_helper(name: str, *libs: str) -> Path:
    src = HELPERS / f"{name}.c"
    digest = hashlib.sha256(src.read_bytes()).hexdigest()[:12]
    out = _BUILD / f"{name}-{digest}"
    if not out.exists():
        _BUILD.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".tmp{os.getpid()}")
        subprocess.run(["gcc", "-O1", "-Wall", "-o", str(tmp), str(src), *libs], check=True,
                       capture_output=True, timeout=60)
        tmp.replace(out)
    return out


@pytest.fixture
def devices_cgroup():
    """Factory: a fresh v1 device cgroup (removed at the end, its processes killed first)."""
    if not (CGROUP_DEVICES / "devices.list").exists():
        pytest.skip("no cgroup v1 devices controller at /sys/fs/cgroup/devices")
    made: list[Path] = []

    def make(tag: str = "cg") -> Path:
        p = CGROUP_DEVICES / f"gpu-doctor-test-{tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        p.mkdir()
        made.append(p)
        return p

    yield make
    for p in reversed(made):
        for _ in range(50):
            try:
                pids = [int(x) for x in (p / "cgroup.procs").read_text().split()]
            except OSError:
                pids = []
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                p.rmdir()
                break
            except OSError:
                time.sleep(0.05)


class Child:
    """A helper process speaking lines on stdin/stdout, always killed at the end."""

    def __init__(self, argv, preexec_fn=None, **kw) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, bufsize=1,
                                     preexec_fn=preexec_fn, **kw)
        self.lines: "queue.Queue[str]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put("")

    def expect(self, prefix: str, timeout: float = 10.0) -> str:
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError(f"helper did not print {prefix!r} in {timeout}s "
                                     f"(stderr: {self.proc.stderr.read() if self.proc.poll() is not None else ''})")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line.startswith(prefix):
                return line
            if line == "" and self.proc.poll() is not None:
                raise AssertionError(f"helper exited ({self.proc.returncode}) before {prefix!r}")

    def send(self, text: str = "go") -> None:
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass


@pytest.fixture
def children():
    made: list[Child] = []

    def spawn(argv, **kw) -> Child:
        c = Child(argv, **kw)
        made.append(c)
        return c

    yield spawn
    for c in made:
        c.kill()


class ProbeRun:
    """`python -m node_probe --only trace -o jsonl ...` as a child; records read as they come."""

    def __init__(self, args, python: str | None = None, env: dict | None = None,
                 wrapper: list[str] | None = None) -> None:
        python = python or sys.executable
        e = dict(os.environ)
        e["PYTHONPATH"] = str(REPO) + os.pathsep + e.get("PYTHONPATH", "")
        e.pop("BCC_KERNEL_SOURCE", None)
        e.update(env or {})
        self.proc = subprocess.Popen([*(wrapper or []), python, "-m", "node_probe", "-o", "jsonl",
                                      *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     cwd=str(REPO), env=e, start_new_session=True)
        self.records: list[dict] = []
        self._q: "queue.Queue[dict | None]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            self._q.put(rec)
        self._q.put(None)

    def wait_for(self, pred, timeout: float = 20.0) -> dict:
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no matching record in {timeout}s; got {self.records[-5:]}"
                                     f" stderr={self._stderr()}")
            try:
                rec = self._q.get(timeout=left)
            except queue.Empty:
                continue
            if rec is None:
                raise AssertionError(f"probe ended without a matching record: {self.records[-5:]}"
                                     f" stderr={self._stderr()}")
            self.records.append(rec)
            if pred(rec):
                return rec

    def wait_attached(self, timeout: float = 20.0) -> dict:
        return self.wait_for(lambda r: r.get("kind") == "progress" and r.get("phase") == "trace",
                             timeout)

    def finish(self, timeout: float = 40.0) -> list[dict]:
        self.wait_for(lambda r: r.get("kind") == "summary", timeout)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        return self.records

    def _stderr(self) -> str:
        if self.proc.poll() is None:
            return "(running)"
        return self.proc.stderr.read()[-2000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)


@pytest.fixture
def probe():
    runs: list[ProbeRun] = []

    def start(*args, **kw) -> ProbeRun:
        r = ProbeRun(list(args), **kw)
        runs.append(r)
        return r

    yield start
    for r in runs:
        r.kill()


def findings(records, fid: str) -> list[dict]:
    return [r for r in records if r.get("kind") == "finding" and r.get("id") == fid]


def events(records, name: str) -> list[dict]:
    return [r for r in records if r.get("kind") == "event" and r.get("name") == name]

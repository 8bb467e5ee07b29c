"""A real, contained page-cache thrash: a memory cgroup at its limit, a hog and a re-reader.

Why: seed 004 is a node whose binaries lose their page cache and re-fault from disk in a loop.
We reproduce the mechanism inside one small memory cgroup so the machine itself is never under
pressure: one process holds anonymous memory close to the cgroup's limit, another re-reads a
file larger than what is left. The reader *mmaps* the file and touches every page: re-reads
through a mapping are major faults of the reader (`/proc/PID/stat` majflt), exactly like a
binary's code pages; plain read() re-reads would show up only as refaults/IO, not majflt.

Cgroup v1 (`/sys/fs/cgroup/memory/<unique>`, memory.limit_in_bytes) is what this host has; v2
(`memory.max`) is used when the unified hierarchy has the memory controller instead.
Everything is torn down in `stop()`: processes killed, cgroup removed, file deleted.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

MiB = 1 << 20

HOG = r"""
import ctypes, sys, time
ctypes.CDLL(None).prctl(15, b"gd-hog", 0, 0, 0)
size = int(sys.argv[1])
buf = b"\x01" * size          # written, so every page is charged to the cgroup
sys.stdout.write("ready\n"); sys.stdout.flush()
while True:
    time.sleep(3600)
"""

READER = r"""
import ctypes, mmap, os, sys
ctypes.CDLL(None).prctl(15, b"gd-reader", 0, 0, 0)
path = sys.argv[1]
fd = os.open(path, os.O_RDONLY)
size = os.fstat(fd).st_size
m = mmap.mmap(fd, size, prot=mmap.PROT_READ)
passes = 0
sys.stdout.write("ready\n"); sys.stdout.flush()
while True:
    s = 0
    for off in range(0, size, 4096):
        s += m[off]
    passes += 1
"""


def memcg_v1_root() -> Path | None:
    p = Path("/sys/fs/cgroup/memory")
    return p if (p / "memory.limit_in_bytes").exists() else None


def memcg_v2_root() -> Path | None:
    for p in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        try:
            if "memory" in (p / "cgroup.controllers").read_text().split():
                return p
        except OSError:
            continue
    return None


class Thrash:
    """Start with `start()`; always call `stop()` (use it as a context manager)."""

    def __init__(self, workdir: Path, limit_mib: int = 256, hog_mib: int = 176,
                 file_mib: int = 160) -> None:
        self.workdir = Path(workdir)
        self.limit = limit_mib * MiB
        self.hog_size = hog_mib * MiB
        self.file_size = file_mib * MiB
        self.name = f"gpu-doctor-test-{uuid.uuid4().hex[:10]}"
        self.cgroup: Path | None = None
        self.version = 0
        self.procs: list[subprocess.Popen] = []
        self.hog: subprocess.Popen | None = None
        self.reader: subprocess.Popen | None = None
        self.file = self.workdir / "thrash.bin"

    # -- setup ----------------------------------------------------------------------------
    def _make_cgroup(self) -> None:
        v1 = memcg_v1_root()
        if v1 is not None:
            self.cgroup = v1 / self.name
            self.cgroup.mkdir()
            self.version = 1
            (self.cgroup / "memory.limit_in_bytes").write_text(str(self.limit))
            return
        v2 = memcg_v2_root()
        if v2 is None:
            raise RuntimeError("no memory cgroup controller (neither v1 nor v2)")
        self.cgroup = v2 / self.name
        self.cgroup.mkdir()
        self.version = 2
        (self.cgroup / "memory.max").write_text(str(self.limit))
        (self.cgroup / "memory.swap.max").write_text("0")

    def _write_file(self) -> None:
        chunk = os.urandom(MiB)
        with open(self.file, "wb") as f:
            for _ in range(self.file_size // MiB):
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
            # Drop the file's pages (charged to *our* cgroup when written) so the reader's
            # faults charge the test cgroup and its limit governs the file's page cache.
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)

    def _spawn(self, code: str, *args: str) -> subprocess.Popen:
        procs_file = str(self.cgroup / "cgroup.procs")

        def join_cgroup() -> None:  # runs in the child before exec: all its memory is charged
            with open(procs_file, "w") as f:
                f.write(str(os.getpid()))

        p = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, preexec_fn=join_cgroup,
                             start_new_session=True)
        self.procs.append(p)
        line = _readline(p, timeout=30)
        if line.strip() != b"ready":
            raise RuntimeError(f"helper did not start (rc={p.poll()}, said {line!r})")
        return p

    def start(self) -> "Thrash":
        self._make_cgroup()
        self._write_file()
        self.hog = self._spawn(HOG, str(self.hog_size))
        self.reader = self._spawn(READER, str(self.file))
        return self

    # -- observation -----------------------------------------------------------------------
    def usage_bytes(self) -> int:
        name = "memory.usage_in_bytes" if self.version == 1 else "memory.current"
        return int((self.cgroup / name).read_text())

    def reader_majflt(self) -> int:
        fields = Path(f"/proc/{self.reader.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[9])  # field 12 (majflt); fields[0] is field 3

    def oom_kills(self) -> int | None:
        try:
            text = (self.cgroup / ("memory.oom_control" if self.version == 1
                                   else "memory.events")).read_text()
        except OSError:
            return None
        for line in text.splitlines():
            k, _, v = line.partition(" ")
            if k == "oom_kill":
                return int(v)
        return None

    # -- teardown --------------------------------------------------------------------------
    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            if p.stdout:
                p.stdout.close()
        if self.cgroup is not None and self.cgroup.exists():
            deadline = time.monotonic() + 30  # the kernel frees the pages late under load
            while True:
                try:
                    self.cgroup.rmdir()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
        try:
            self.file.unlink()
        except FileNotFoundError:
            pass

    def __enter__(self) -> "Thrash":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()


def _readline(p: subprocess.Popen, timeout: float) -> bytes:
    import select
    end = time.monotonic() + timeout
    buf = b""
    while time.monotonic() < end and not buf.endswith(b"\n"):
        r, _, _ = select.select([p.stdout], [], [], max(0.0, end - time.monotonic()))
        if not r:
            break
        ch = os.read(p.stdout.fileno(), 1)
        if not ch:
            break
        buf += ch
    return buf

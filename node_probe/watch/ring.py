"""The evidence ring: bundles captured by the agent, kept on the node within fixed bounds.

Why: the evidence of an intermittent fault is gone by the time someone looks (the plugin was
restarted, the rules rewritten back). The agent keeps the bundle of each transition under a host
directory so `kubectl gpu-doctor node X --history` can replay it later. Bounded by count and
bytes (oldest dropped first), files mode 0600 in a 0700 directory, and every open is relative to
the directory's own descriptor with O_NOFOLLOW: a symlink planted in the directory (or as the
directory) is never followed.
"""
from __future__ import annotations

import errno
import json
import os
import re
import stat
import threading
import time
from pathlib import Path

from node_probe.protocol.bundle import NotABundleFile, read_capped

NAME_RE = re.compile(r"^bundle-(\d{13})-(\d{3})-([A-Za-z0-9]{1,64})\.json$")
TMP_PREFIX = ".tmp-bundle-"   # a bundle being written; left behind only by a crash
DEFAULT_RING = Path("/var/lib/gpu-doctor/evidence")
DEFAULT_MAX_COUNT = 20
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
MAX_ENTRIES_SCANNED = 10000  # a directory stuffed with junk is not walked without bound


class RingError(Exception):
    pass


def _open_dir(path: Path, create: bool) -> int:
    if create:
        try:
            os.makedirs(path.parent, mode=0o755, exist_ok=True)
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise RingError(f"cannot create {path}: {exc.strerror}") from None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        why = "a symlink, refused" if exc.errno in (errno.ELOOP, errno.ENOTDIR) and \
            path.is_symlink() else exc.strerror
        raise RingError(f"cannot open {path}: {why}") from None
    if create:
        try:  # a directory made by someone else (a DirectoryOrCreate hostPath is 0755)
            os.fchmod(fd, 0o700)
        except OSError:
            pass
    return fd


def _unlink(name: str, dirfd: int) -> bool:
    """Remove a name in the ring (a symlink is removed, never followed)."""
    try:
        os.unlink(name, dir_fd=dirfd)
        return True
    except OSError:
        return False


class Ring:
    """Bundles as `bundle-<ms since epoch>-<seq>-<class>.json`; newest last in `entries()`."""

    def __init__(self, path: Path, max_count: int = DEFAULT_MAX_COUNT,
                 max_bytes: int = DEFAULT_MAX_BYTES, create: bool = True) -> None:
        if max_count < 1 or max_bytes < 1024:
            raise ValueError("the ring needs room for at least one bundle")
        self.path = Path(path)
        self.max_count = max_count
        self.max_bytes = max_bytes
        self._create = create
        self._lock = threading.Lock()
        self._seq = 0

    def _dirfd(self) -> int:
        return _open_dir(self.path, self._create)

    def entries(self) -> list[dict]:
        """Bundles oldest first: name, bytes, time (s since epoch), class."""
        fd = self._dirfd()
        try:
            out = []
            with os.scandir(fd) as it:
                for n, e in enumerate(it):
                    if n >= MAX_ENTRIES_SCANNED:
                        break
                    m = NAME_RE.match(e.name)
                    if not m:
                        continue
                    try:
                        st = os.stat(e.name, dir_fd=fd, follow_symlinks=False)
                    except OSError:
                        continue
                    if not stat.S_ISREG(st.st_mode):
                        continue
                    out.append({"name": e.name, "bytes": st.st_size,
                                "time": int(m.group(1)) / 1000.0, "class": m.group(3)})
            out.sort(key=lambda x: x["name"])
            return out
        finally:
            os.close(fd)

    def add(self, doc: dict, ctype: str) -> str | None:
        """Write one bundle atomically (0600), then drop the oldest until within bounds.
        A bundle larger than the whole ring is not kept (returns None)."""
        data = json.dumps(doc, separators=(",", ":"), default=str).encode()
        if len(data) > self.max_bytes:
            return None
        safe = re.sub(r"[^A-Za-z0-9]", "", ctype)[:64] or "Unknown"
        with self._lock:
            self._seq = (self._seq + 1) % 1000
            name = f"bundle-{int(time.time() * 1000):013d}-{self._seq:03d}-{safe}.json"
            fd = self._dirfd()
            try:
                tmp = f".tmp-{name}"
                wfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                              | os.O_CLOEXEC, 0o600, dir_fd=fd)
                try:
                    try:
                        view = memoryview(data)
                        while view:
                            view = view[os.write(wfd, view):]
                        os.fchmod(wfd, 0o600)
                    finally:
                        os.close(wfd)
                    os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
                except BaseException:  # a full disk (ENOSPC): no half bundle stays behind
                    _unlink(tmp, fd)
                    raise
            finally:
                os.close(fd)
            self._prune()
        return name

    def sweep(self) -> int:
        """Remove the temporary files of writes that never finished (an agent killed mid-write;
        a full disk before the failed write's own unlink). The agent calls it at start, and
        every prune does; the readers never do. Returns how many were removed."""
        with self._lock:
            return self._sweep()

    def _sweep(self) -> int:
        fd = self._dirfd()
        n = 0
        try:
            with os.scandir(fd) as it:
                for i, e in enumerate(it):
                    if i >= MAX_ENTRIES_SCANNED:
                        break
                    if e.name.startswith(TMP_PREFIX) and _unlink(e.name, fd):
                        n += 1
        finally:
            os.close(fd)
        return n

    def _prune(self) -> None:
        self._sweep()
        entries = self.entries()
        total = sum(e["bytes"] for e in entries)
        fd = self._dirfd()
        try:
            while entries and (len(entries) > self.max_count or total > self.max_bytes):
                old = entries.pop(0)
                try:
                    os.unlink(old["name"], dir_fd=fd)
                except OSError:
                    pass
                total -= old["bytes"]
        finally:
            os.close(fd)

    def read(self, name: str, limit: int) -> bytes:
        """One bundle's bytes (a regular file, not followed if a symlink, at most `limit`)."""
        if not NAME_RE.match(name):
            raise RingError(f"{name!r} is not a bundle name")
        fd = self._dirfd()
        try:
            try:
                bfd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                              dir_fd=fd)
            except OSError as exc:
                raise RingError(f"cannot open {name}: {exc.strerror}") from None
        finally:
            os.close(fd)
        try:
            return read_capped(bfd, limit, name)
        except NotABundleFile as exc:
            raise RingError(str(exc)) from None
        finally:
            os.close(bfd)

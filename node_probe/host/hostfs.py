"""Reading the host's (or a container's) filesystem through a root without escaping it.

Why: in the debug pod the host's / is mounted at /host, and host symlinks are absolute
(`/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 -> /usr/lib/.../libnvidia-ml.so.570.158.01`,
or into /run/nvidia/driver for the GPU Operator). Following them naively would read the
probe image's files instead of the host's. Container roots (`/proc/PID/root`) are worse: the
tenant owns every name in them and can swap a symlink between our check and our open, put a
FIFO where a config is expected, or leave a 400 MB sparse file for us to read.

So there is exactly one way to open something under a root here, `open_under()`:
- the kernel resolves the path with `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)` where it
  has it (Linux 5.6+), so `..` and absolute symlinks stay inside the root at open time;
- elsewhere a component-by-component walk from a directory fd, each step opened with
  `O_NOFOLLOW`, symlinks read and re-walked inside the root (same result, no race window);
- the final object is first opened `O_PATH` (opening a device or FIFO has side effects or
  blocks), checked with fstat to be a regular file, and only then re-opened for reading,
  `O_NONBLOCK`; reads are capped (`Blob.truncated` says the cap was hit) and text is decoded
  with replacement.
`read_file()` applies the same regular-file/cap/non-blocking rules to a plain path (procfs
files, `--plugin-log`).
"""
from __future__ import annotations

import ctypes
import dataclasses
import errno
import os
import platform
import stat
from pathlib import Path

MAX_LINKS = 40
DEFAULT_CAP = 1 << 20  # 1 MiB: far above any config, checkpoint or proc file we parse

# openat2(2): struct open_how and RESOLVE_* from linux/openat2.h; the syscall number is 437 on
# every architecture that has the generic syscall table, x86_64 included.
_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437, "arm64": 437}.get(platform.machine())
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


class NotRegularFile(OSError):
    """The path names a FIFO, device, socket or directory where a regular file was expected."""


@dataclasses.dataclass(frozen=True)
class Blob:
    """What a capped read returned: the bytes, and whether the file held more than the cap."""

    data: bytes
    truncated: bool

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


_openat2_state: dict[str, bool] = {}


def openat2_available() -> bool:
    """Whether this kernel (and seccomp profile) lets us call openat2."""
    if "ok" not in _openat2_state:
        ok = False
        if _SYS_OPENAT2 is not None:
            try:
                fd = _openat2(-100, ".", os.O_PATH | os.O_CLOEXEC, 0)
            except OSError:
                ok = False
            else:
                os.close(fd)
                ok = True
        _openat2_state["ok"] = ok
    return _openat2_state["ok"]


_libc = None


def _openat2(dirfd: int, path: str, flags: int, resolve: int) -> int:
    global _libc
    if _SYS_OPENAT2 is None:
        raise OSError(errno.ENOSYS, "openat2 unavailable on this architecture")
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    how = _OpenHow(flags, 0, resolve)
    fd = _libc.syscall(ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(dirfd),
                       ctypes.c_char_p(os.fsencode(path)), ctypes.byref(how),
                       ctypes.c_size_t(ctypes.sizeof(how)))
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), path)
    return fd


def _split(rel: str | os.PathLike) -> list[str]:
    return [p for p in os.fsdecode(os.fspath(rel)).split("/") if p not in ("", ".")]


def _walk(root_fd: int, rel: str | os.PathLike) -> tuple[int, list[str]]:
    """The O_NOFOLLOW walk: an O_PATH fd of what `rel` names inside the root, and the real
    component names that lead there. Symlinks are read and re-walked inside the root; an
    absolute one restarts at the root, `..` never climbs above it."""
    parts = _split(rel)
    stack: list[int] = [os.dup(root_fd)]
    names: list[str] = []
    links = 0
    try:
        while parts:
            name = parts.pop(0)
            if name == "..":
                if len(stack) > 1:
                    os.close(stack.pop())
                    names.pop()
                continue
            cur = stack[-1]
            st = os.stat(name, dir_fd=cur, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                links += 1
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, "too many levels of symbolic links", str(rel))
                target = os.readlink(name, dir_fd=cur)
                if target.startswith("/"):
                    while len(stack) > 1:
                        os.close(stack.pop())
                    names.clear()
                parts = _split(target) + parts
                continue
            # O_NOFOLLOW: a symlink swapped in since the stat is not followed (a directory
            # open then fails with ENOTDIR/ELOOP; a final O_PATH open yields the link itself,
            # which the caller's fstat rejects).
            flags = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
            if parts:
                flags |= os.O_DIRECTORY
            stack.append(os.open(name, flags, dir_fd=cur))
            names.append(name)
        fd = stack.pop()
        return fd, names
    finally:
        for fd_ in stack:
            os.close(fd_)


def _open_path(root: Path | str, rel: str | os.PathLike, use_openat2: bool | None) -> int:
    """An O_PATH fd for `rel` resolved inside `root` (the root itself is trusted)."""
    root_fd = os.open(os.fspath(root), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if use_openat2 is None:
            use_openat2 = openat2_available()
        if use_openat2:
            rel_s = "/".join(_split(rel)) or "."
            return _openat2(root_fd, rel_s, os.O_PATH | os.O_CLOEXEC,
                            RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
        return _walk(root_fd, rel)[0]
    finally:
        os.close(root_fd)


def _reopen_regular(path_fd: int, what: str) -> int:
    """Re-open an O_PATH fd for reading once fstat says it is a regular file."""
    st = os.fstat(path_fd)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFile(errno.EINVAL, f"not a regular file ({_kind(st.st_mode)})", what)
    # /proc/self/fd/N re-opens the very inode we checked (no second path lookup).
    return os.open(f"/proc/self/fd/{path_fd}", _READ_FLAGS)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket"),
                       (stat.S_ISDIR, "directory"), (stat.S_ISLNK, "symlink")):
        if test(mode):
            return name
    return "special file"


def open_under(root: Path | str, rel: str | os.PathLike, *,
               use_openat2: bool | None = None) -> int:
    """A read-only, non-blocking fd of the regular file `rel` names inside `root`.

    Raises FileNotFoundError etc. as open() would, NotRegularFile for FIFOs/devices/sockets/
    directories. `use_openat2` forces one resolution method (tests exercise both)."""
    pfd = _open_path(root, rel, use_openat2)
    try:
        return _reopen_regular(pfd, f"{root}/{os.fspath(rel).lstrip('/')}")
    finally:
        os.close(pfd)


def read_fd(fd: int, cap: int = DEFAULT_CAP) -> Blob:
    """At most `cap` bytes from `fd` (from its current offset)."""
    chunks: list[bytes] = []
    got = 0
    while got <= cap:
        try:
            b = os.read(fd, min(1 << 16, cap + 1 - got))
        except BlockingIOError:
            break
        if not b:
            break
        chunks.append(b)
        got += len(b)
    data = b"".join(chunks)
    return Blob(data[:cap], len(data) > cap)


def read_under(root: Path | str, rel: str | os.PathLike, cap: int = DEFAULT_CAP, *,
               use_openat2: bool | None = None) -> Blob:
    """The capped contents of the regular file `rel` inside `root` (raises OSError)."""
    fd = open_under(root, rel, use_openat2=use_openat2)
    try:
        return read_fd(fd, cap)
    finally:
        os.close(fd)


def open_file(path: Path | str) -> int:
    """A read-only, non-blocking fd of a plain path (symlinks followed as the caller's own
    namespace sees them) that must be a regular file: procfs files, `--plugin-log`."""
    pfd = os.open(os.fspath(path), os.O_PATH | os.O_CLOEXEC)
    try:
        return _reopen_regular(pfd, os.fspath(path))
    finally:
        os.close(pfd)


def read_file(path: Path | str, cap: int = DEFAULT_CAP) -> Blob:
    """The capped contents of a plain path that must be a regular file (raises OSError)."""
    fd = open_file(path)
    try:
        return read_fd(fd, cap)
    finally:
        os.close(fd)


def read_pseudo(path: Path | str, cap: int = DEFAULT_CAP) -> Blob:
    """The capped contents of a procfs/cgroupfs file (raises OSError). These filesystems hold
    no FIFOs or devices, so the file is opened directly (non-blocking, half the syscalls of
    read_file: the probe reads thousands of them per sweep); anything but a regular file is
    still refused."""
    fd = os.open(os.fspath(path), _READ_FLAGS)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(errno.EINVAL, f"not a regular file ({_kind(mode)})",
                                 os.fspath(path))
        return read_fd(fd, cap)
    finally:
        os.close(fd)


def read_tail(path: Path | str, cap: int) -> Blob:
    """The last `cap` bytes of a regular file (`truncated` when it held more)."""
    fd = open_file(path)
    try:
        size = os.fstat(fd).st_size
        if size > cap:
            os.lseek(fd, size - cap, os.SEEK_SET)
        blob = read_fd(fd, cap)
        return Blob(blob.data, blob.truncated or size > cap)
    finally:
        os.close(fd)


def exists_under(root: Path | str, rel: str | os.PathLike, kind: str = "any") -> bool:
    """Whether `rel` resolves inside `root` to something of `kind` ("file", "dir", "any")."""
    try:
        pfd = _open_path(root, rel, None)
    except OSError:
        return False
    try:
        mode = os.fstat(pfd).st_mode
    except OSError:
        return False
    finally:
        os.close(pfd)
    if kind == "file":
        return stat.S_ISREG(mode)
    if kind == "dir":
        return stat.S_ISDIR(mode)
    return not stat.S_ISLNK(mode)


def resolve(root: Path, rel: str | os.PathLike) -> Path | None:
    """Resolve `rel` (host-absolute or relative) under `root`, following symlinks as the host
    would see them. Returns the real path under root, or None if it does not exist.

    For handing a host path to another program (dlopen of libnvidia-ml, BCC's kernel headers,
    a directory listing). To read a file, use read_under()/read_text(), which check what they
    open at open time."""
    try:
        root_fd = os.open(os.fspath(root), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fd, names = _walk(root_fd, rel)
    except OSError:
        return None
    finally:
        os.close(root_fd)
    try:
        if stat.S_ISLNK(os.fstat(fd).st_mode):
            return None
    finally:
        os.close(fd)
    return Path(root).joinpath(*names)


def read_text(root: Path, rel: str, limit: int = DEFAULT_CAP) -> str | None:
    """The text of a regular file inside `root` (at most `limit` bytes, decoded with
    replacement), or None when it is missing, unreadable or not a regular file."""
    try:
        return read_under(root, rel, limit).text
    except OSError:
        return None


def proc_devices(root: Path) -> dict[str, int]:
    """Character device majors by name from <root>/proc/devices (nvidia-uvm's is dynamic)."""
    text = read_text(root, "proc/devices") or ""
    out: dict[str, int] = {}
    section = None
    for line in text.splitlines():
        s = line.strip()
        if s.endswith("devices:"):
            section = s.split()[0].lower()
            continue
        if section != "character" or not s:
            continue
        num, _, name = s.partition(" ")
        if num.isdigit() and name:
            out.setdefault(name.strip(), int(num))
    return out

"""Compile the selected bpf/*.bpf.c programs as one BCC module and attach syscall tracepoints.

Why one module: BCC pays ~0.4 s of clang start-up per compile, so four separate compiles miss
the 2 s compile+attach budget (README, "Measured"). The sources are concatenated unchanged,
each behind a #line directive so compiler errors name the real file, with the shared headers
of bpf/include pasted in once (sources.unit_text); every file also compiles on its own
(tests/tracing check that). Options reach the programs only as -D cflags. The programs read
syscall tracepoint records through one fixed-layout struct (bpf/include/syscall_tp.h), so the
layout is checked here against tracefs before attaching, once per tracepoint. A tracepoint
is attached once per program function even when several loaders list it (the shared fd
tracker's).
"""
from __future__ import annotations

import fcntl
import os
import re
import threading
import time
from pathlib import Path
from typing import Iterable

from . import sources

# Warnings from kernel headers are noise on stderr; errors still fail the compile.
BASE_CFLAGS = ("-w",)
PERF_EVENT_IOC_DISABLE = 0x2401
_FIELD_RE = re.compile(r"field:([^;]*);\s*offset:(\d+);\s*size:(\d+);")


def compile_text(names: Iterable[str]) -> str:
    return sources.unit_text(names)


def compile_programs(names: Iterable[str], cflags: Iterable[str]):
    """One BPF object holding every named program (programs are loaded when attached)."""
    from bcc import BPF  # lazy: the probe runs without bcc
    text = compile_text(list(names))
    return BPF(text=text.encode(), cflags=[*BASE_CFLAGS, *cflags])


def syscall_layout_ok(tracefs: str, event: str) -> tuple[bool, str]:
    """Does events/syscalls/<event>/format have the layout our structs assume (syscall nr at 8,
    arguments or ret at 16 + 8*i, 8 bytes each)?"""
    path = Path(tracefs) / "events" / "syscalls" / event / "format"
    try:
        text = path.read_text()
    except OSError as exc:
        return False, f"{path}: {exc.strerror or exc}"
    fields = [(m.group(1).strip(), int(m.group(2)), int(m.group(3)))
              for m in _FIELD_RE.finditer(text)]
    own = [f for f in fields if not f[0].split()[-1].startswith("common_")]
    if not own or not own[0][0].endswith("__syscall_nr") or own[0][1] != 8:
        return False, f"{event}: unexpected syscall nr field {own[:1]}"
    for i, (decl, off, size) in enumerate(own[1:]):
        if off != 16 + 8 * i or size != 8:
            return False, f"{event}: field {decl!r} at offset {off} size {size}"
    return True, ""


class TracepointSet:
    """Attaches (event, fn) pairs of syscall tracepoints; remembers what it attached."""

    def __init__(self, b, tracefs: str) -> None:
        self.b = b
        self.tracefs = tracefs
        self.attached: list[tuple[str, str, int]] = []  # (event, fn, perf fd)
        self.skipped: list[str] = []
        self._checked: dict[str, tuple[bool, str]] = {}

    def attach(self, pairs: Iterable[tuple[str, str]], required: Iterable[str] = ()) -> None:
        required = set(required)
        for event, fn in pairs:
            if any(e == event and f == fn for e, f, _fd in self.attached):
                continue
            if not os.path.isdir(os.path.join(self.tracefs, "events", "syscalls", event)):
                if event in required:
                    raise RuntimeError(f"syscall tracepoint {event} does not exist")
                self.skipped.append(f"{event}: no such tracepoint on this kernel")
                continue
            ok, why = self._checked.get(event) or syscall_layout_ok(self.tracefs, event)
            self._checked[event] = (ok, why)
            if not ok:
                raise RuntimeError(f"syscall tracepoint layout differs from the expected one: {why}")
            # Not BPF.attach_tracepoint: it keeps one fd per tracepoint, and two programs
            # (nvidia_dev and cgroup_devices) share sys_enter_openat; the lost fd would leak.
            from bcc import BPF
            from bcc.libbcc import lib
            prog = self.b.load_func(fn.encode(), BPF.TRACEPOINT)
            fd = lib.bpf_attach_tracepoint(prog.fd, b"syscalls", event.encode())
            if fd < 0:
                raise RuntimeError(f"attaching {fn} to syscalls:{event} failed")
            self.attached.append((event, fn, fd))

    def detach(self, wait: bool = False) -> None:
        """Stop every program now (PERF_EVENT_IOC_DISABLE: immediate) and release the perf
        events. Releasing one waits for RCU grace periods under a kernel mutex (~30-70 ms each,
        about a second for the whole set here) and would otherwise delay either the verdict or
        the probe's exit (the kernel releases them in exit too). So by default a short-lived
        grandchild process inherits the fds and releases them; ours close at once."""
        fds = [fd for _event, _fn, fd in self.attached]
        self.attached.clear()
        for fd in fds:
            try:
                fcntl.ioctl(fd, PERF_EVENT_IOC_DISABLE, 0)
            except OSError:
                pass
        if not fds:
            return
        if wait or not _release_in_grandchild(fds):
            _close_all(fds)


def _close_all(fds: list[int]) -> None:
    """Close from parallel threads: the grace-period waits overlap."""
    def close(fd: int) -> None:
        try:
            os.close(fd)
        except OSError:
            pass

    threads = [threading.Thread(target=close, args=(fd,), daemon=True) for fd in fds]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10.0)


def _release_in_grandchild(fds: list[int]) -> bool:
    """Hand the perf fds to a detached grandchild that closes them; True if it worked. The
    grandchild waits until we have closed our copies (EOF on a pipe), so that its closes are
    the last references and the slow release happens there, never here."""
    try:
        rd, wr = os.pipe()
    except OSError:
        return False
    try:
        pid = os.fork()
    except OSError:
        os.close(rd)
        os.close(wr)
        return False
    if pid == 0:  # child: only os.* calls, then _exit (other threads do not exist here)
        try:
            keep = sorted({*fds, rd})
            lo = 0
            for fd in keep:            # drop everything else, the pipe's write end and our
                os.closerange(lo, fd)  # stdout above all (the reader of the probe's output
                lo = fd + 1            # must see EOF when the probe exits)
            os.closerange(lo, 65536)
            me = os.getpid()
            if os.fork() == 0:
                try:
                    os.read(rd, 1)     # EOF once the parent has closed its copies
                except OSError:
                    pass
                while os.getppid() == me:   # and the child (which closes its copies first)
                    time.sleep(0.002)
                for fd in fds:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            else:
                for fd in fds:         # cheap here: the grandchild still holds them
                    try:
                        os.close(fd)
                    except OSError:
                        pass
        finally:
            os._exit(0)
    os.close(rd)
    for fd in fds:
        try:
            os.close(fd)   # cheap: the grandchild still holds a reference
        except OSError:
            pass
    os.close(wr)
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
    return True


def mono_to_wall(ts_ns: int, now_mono_ns: int | None = None, now_wall: float | None = None) -> float:
    """bpf_ktime_get_ns() (CLOCK_MONOTONIC) to a Unix timestamp."""
    import time
    mono = time.monotonic_ns() if now_mono_ns is None else now_mono_ns
    wall = time.time() if now_wall is None else now_wall
    return round(wall - (mono - ts_ns) / 1e9, 6)


def who(e) -> dict:
    """pid, tid and comm from an event's head (struct gd_event_head, bpf/include/event.h)."""
    return {"pid": e.pid, "tid": e.tid, "comm": cstr(e.comm)}


def cstr(raw) -> str:
    """A fixed char array from a BPF event as text."""
    b = bytes(raw)
    return b.split(b"\0", 1)[0].decode("utf-8", "replace")

"""A thread-level view of a live process, taken without stopping or tracing it.

Why: eBPF only sees calls that start while it is attached. A device plugin thread that entered
nvmlInit hours ago (the kubelet's own GetPreferredAllocation, seed 000) is found here instead:
/proc/PID/task/TID/{stat,wchan,syscall} give each thread's state and the syscall it sits in (a
futex, an ioctl on /dev/nvidiactl: the fd is resolved through /proc/PID/fd), and the words on
its user stack, read from /proc/PID/mem starting at the stack pointer, are compared with the
address ranges of nvmlInit/nvmlInit_v2/nvmlInitWithFlags in the libnvidia-ml.so.1 the process
has mapped. Reading /proc/PID/mem needs ptrace access (root in the debug pod); without it the
view still has states and syscalls. Nothing here writes to or signals the process.
symbolic_stack() is the same scan for any blocked thread (the eBPF trace names the functions a
thread asleep in futex() is inside, because BPF user stacks stop at glibc): every word that
points just after a call instruction in an executable mapping, symbolized (a heuristic: stale
words can show up, so callers treat the frames as evidence, not proof).
"""
from __future__ import annotations

import dataclasses
import os
import platform
import struct
from pathlib import Path

from node_probe.host import elfsyms, procfs

PROC = Path("/proc")
NVML_LIB_PREFIX = "libnvidia-ml.so"
NVML_INIT_FUNCS = ("nvmlInit", "nvmlInit_v2", "nvmlInitWithFlags")
STACK_SCAN_BYTES = 1 << 20   # 1 MiB from the stack pointer up is plenty for C frames
MAX_THREADS = 4096

# syscall numbers we name (the rest are shown as numbers)
_SYSCALLS = {
    "x86_64": {0: "read", 1: "write", 7: "poll", 16: "ioctl", 23: "select", 24: "sched_yield",
               35: "nanosleep", 43: "accept", 47: "recvmsg", 61: "wait4", 202: "futex",
               219: "restart_syscall", 230: "clock_nanosleep", 232: "epoll_wait", 257: "openat",
               270: "pselect6", 271: "ppoll", 281: "epoll_pwait", 288: "accept4",
               441: "epoll_pwait2", 449: "futex_waitv"},
    "aarch64": {29: "ioctl", 63: "read", 64: "write", 56: "openat", 73: "ppoll",
                72: "pselect6", 98: "futex", 101: "nanosleep", 115: "clock_nanosleep",
                124: "sched_yield", 128: "restart_syscall", 202: "accept", 242: "accept4",
                212: "recvmsg", 260: "wait4", 22: "epoll_pwait", 441: "epoll_pwait2",
                449: "futex_waitv"},
}
# syscalls whose first argument is a file descriptor worth resolving
_FD_SYSCALLS = frozenset({"read", "write", "ioctl", "accept", "accept4", "recvmsg",
                          "epoll_wait", "epoll_pwait", "epoll_pwait2"})


def syscall_name(nr: int, machine: str | None = None) -> str | None:
    return _SYSCALLS.get(machine or platform.machine(), {}).get(nr)


@dataclasses.dataclass
class ThreadView:
    tid: int
    comm: str
    state: str                     # R, S, D, ...
    wchan: str | None = None
    syscall_nr: int | None = None  # None: running or unreadable; -1: blocked, not in a syscall
    syscall: str | None = None
    args: tuple[int, ...] = ()
    sp: int | None = None
    pc: int | None = None
    fd_path: str | None = None     # what the fd in args[0] points at (ioctl/read/...)
    nvml_init: str | None = None   # outermost nvmlInit* found on the stack
    nvml_frames: tuple[str, ...] = ()  # symbolized libnvidia-ml return addresses, inner first
    stack_scan: str = "not tried"  # ok | no nvml mapped | unreadable: ... | no stack pointer

    @property
    def waits_on(self) -> str:
        """Human words for what the thread is blocked in."""
        if self.syscall == "futex":
            return "a futex"
        if self.syscall == "ioctl":
            what = self.fd_path or (f"fd {self.args[0]}" if self.args else "an unknown fd")
            return f"an ioctl on {what}"
        if self.syscall:
            return f"{self.syscall}({self.fd_path})" if self.fd_path else f"syscall {self.syscall}"
        if self.syscall_nr is not None and self.syscall_nr >= 0:
            return f"syscall {self.syscall_nr}"
        if self.state == "R":
            return "nothing (running)"
        return f"state {self.state}" + (f" in {self.wchan}" if self.wchan else "")

    def to_dict(self) -> dict:
        d = {"tid": self.tid, "comm": self.comm, "state": self.state, "wchan": self.wchan,
             "syscall": self.syscall or self.syscall_nr, "waits_on": self.waits_on}
        if self.syscall in ("futex", "ioctl") and self.args:
            d["args"] = [hex(a) for a in self.args[:3]]
        if self.fd_path:
            d["fd_path"] = self.fd_path
        if self.nvml_init:
            d["nvml_init"] = self.nvml_init
        if self.nvml_frames:
            d["nvml_frames"] = list(self.nvml_frames)
        return d


def _read_text(path: Path) -> str | None:
    return procfs.read_str(path)


def parse_syscall_file(text: str) -> tuple[int | None, tuple[int, ...], int | None, int | None]:
    """(nr, args, sp, pc) from /proc/PID/task/TID/syscall ("running" -> nr None)."""
    parts = text.split()
    if not parts or parts[0] == "running":
        return None, (), None, None
    try:
        nr = int(parts[0])
        nums = [int(x, 16) for x in parts[1:]]
    except ValueError:
        return None, (), None, None
    if nr == -1:  # blocked but not in a syscall: "-1 sp pc"
        return -1, (), nums[0] if nums else None, nums[1] if len(nums) > 1 else None
    args = tuple(nums[:6])
    sp = nums[6] if len(nums) > 6 else None
    pc = nums[7] if len(nums) > 7 else None
    return nr, args, sp, pc


def read_syscall(pid: int, tid: int, proc: Path = PROC
                 ) -> tuple[int | None, tuple[int, ...], int | None, int | None]:
    """parse_syscall_file() of /proc/PID/task/TID/syscall; nr None if unreadable or running."""
    text = _read_text(proc / str(pid) / "task" / str(tid) / "syscall")
    return parse_syscall_file(text) if text is not None else (None, (), None, None)


def _fd_target(pid: int, fd: int, proc: Path) -> str | None:
    if fd < 0 or fd > 1 << 20:
        return None
    try:
        return os.readlink(proc / str(pid) / "fd" / str(fd))
    except OSError:
        return None


def _stack_mapping(maps: list[elfsyms.Mapping], sp: int) -> elfsyms.Mapping | None:
    for m in maps:
        if m.start <= sp < m.end:
            return m
    return None


def _open_mem(pid: int, tid: int, proc: Path):
    return open(proc / str(pid) / "task" / str(tid) / "mem", "rb", buffering=0)


def _read_stack(mem, sp: int, maps: list[elfsyms.Mapping], limit: int) -> bytes:
    """The bytes from sp (8-aligned) up to the end of its mapping, at most `limit`."""
    m = _stack_mapping(maps, sp)
    end = min(m.end if m else sp + 64 * 1024, sp + limit)
    start = sp & ~7
    mem.seek(start)
    return mem.read(end - start)


def _after_call(mem, addr: int) -> bool:
    """x86-64: is addr preceded by a call instruction? (other arches: accept)"""
    if platform.machine() not in ("x86_64", "AMD64"):
        return True
    try:
        mem.seek(addr - 7)
        b = mem.read(7)
    except (OSError, ValueError, OverflowError):
        return False
    if len(b) != 7:
        return False
    if b[2] == 0xE8:                      # call rel32
        return True
    for back in (2, 3, 4, 6, 7):          # call r/m64: FF /2 with various ModRM forms
        i = 7 - back
        if b[i] == 0xFF and (b[i + 1] >> 3) & 7 == 2:
            return True
    return False


def symbolic_stack(pid: int, tid: int, proc: Path = PROC, max_bytes: int = 64 * 1024,
                   max_frames: int = 24) -> dict | None:
    """{"syscall": nr, "frames": [...]} for a thread blocked in a syscall (innermost first:
    the PC, then the return addresses found on the stack); None when the thread is running,
    not in a syscall or cannot be read."""
    nr, _args, sp, pc = read_syscall(pid, tid, proc)
    if nr is None or nr < 0 or sp is None or pc is None:
        return None
    maps = elfsyms.read_maps(pid, proc)
    frames = []
    first = elfsyms.symbolize(pid, pc, maps, proc)
    if first:
        frames.append(first)
    try:
        with _open_mem(pid, tid, proc) as mem:
            data = _read_stack(mem, sp, maps, max_bytes)
            for (word,) in struct.iter_unpack("<Q", data[: len(data) // 8 * 8]):
                if word < 4096:
                    continue
                name = elfsyms.symbolize(pid, word, maps, proc)
                if name and _after_call(mem, word):
                    if not frames or frames[-1] != name:
                        frames.append(name)
                    if len(frames) >= max_frames:
                        break
    except (OSError, ValueError, OverflowError):
        pass
    return {"syscall": nr, "frames": frames}


def scan_stack(pid: int, tid: int, sp: int, maps: list[elfsyms.Mapping],
               image: elfsyms.LoadedImage, proc: Path = PROC,
               limit: int = STACK_SCAN_BYTES) -> tuple[str | None, tuple[str, ...], str]:
    """Words from sp upward that point into the library's code: (outermost nvmlInit* or None,
    symbolized frames inner-first, status)."""
    try:
        with _open_mem(pid, tid, proc) as mem:
            data = _read_stack(mem, sp, maps, limit)
    except (OSError, OverflowError, ValueError) as exc:
        return None, (), f"unreadable: {type(exc).__name__}: {exc}"
    init_ranges = []
    for name in NVML_INIT_FUNCS:
        sym = image.symbols.find(name)
        if sym is not None:
            lo, hi = image.runtime(sym)
            init_ranges.append((name, lo, hi))
    outermost = None
    frames: list[str] = []
    for (word,) in struct.iter_unpack("<Q", data[: len(data) // 8 * 8]):
        if not image.contains(word):
            continue
        for name, lo, hi in init_ranges:
            # a return address lies strictly inside the caller; == lo is a function pointer
            if lo < word < hi:
                outermost = name
        label = image.symbolize(word)
        if label and label.endswith("+0x0"):  # a function pointer, not a return address
            continue
        if label and (not frames or frames[-1] != label) and len(frames) < 16:
            frames.append(label)
    return outermost, tuple(frames), "ok"


def process_threads(pid: int, proc: Path = PROC, scan_nvml: bool = True) -> list[ThreadView]:
    """Every thread of pid with state, wchan, syscall and (optionally) the nvmlInit stack scan.
    [] if the process is gone."""
    maps = elfsyms.read_maps(pid, proc) if scan_nvml else []
    image = None
    image_err = "no nvml mapped"
    if scan_nvml:
        try:
            image = elfsyms.load_image(pid, maps, NVML_LIB_PREFIX, proc)
        except (OSError, elfsyms.ElfError) as exc:
            image_err = f"unreadable library: {exc}"
    machine = platform.machine()
    out = []
    for tid in procfs.tids(pid, proc)[:MAX_THREADS]:
        st = procfs.read_stat(pid, tid, proc)
        if st is None:
            continue
        tdir = proc / str(pid) / "task" / str(tid)
        wchan = (_read_text(tdir / "wchan") or "").strip() or None
        if wchan == "0":
            wchan = None
        tv = ThreadView(tid=tid, comm=st["comm"], state=st["state"], wchan=wchan)
        nr, args, sp, pc = read_syscall(pid, tid, proc)
        tv.syscall_nr, tv.args, tv.sp, tv.pc = nr, args, sp, pc
        if nr is not None and nr >= 0:
            tv.syscall = syscall_name(nr, machine)
            if tv.syscall in _FD_SYSCALLS and args:
                tv.fd_path = _fd_target(pid, args[0], proc)
        if scan_nvml:
            if image is None:
                tv.stack_scan = image_err
            elif tv.sp is None:
                tv.stack_scan = "no stack pointer (running or unreadable)"
            else:
                tv.nvml_init, tv.nvml_frames, tv.stack_scan = scan_stack(
                    pid, tid, tv.sp, maps, image, proc)
        out.append(tv)
    return out


def nvml_library(pid: int, proc: Path = PROC) -> str | None:
    """Path (as the process sees it) of the libnvidia-ml it has mapped, if any."""
    for m in elfsyms.read_maps(pid, proc):
        if m.path.startswith("/") and os.path.basename(m.path).startswith(NVML_LIB_PREFIX):
            return m.path.removesuffix(" (deleted)")
    return None

"""Function symbols of a mapped shared object, read with the stdlib, to name code addresses.

Why: to tell whether a thread of a live process is inside nvmlInit (seed 000) without stopping
or tracing it, the probe compares the return addresses on the thread's stack with the address
ranges of nvmlInit/nvmlInit_v2/nvmlInitWithFlags in the process's mapped libnvidia-ml.so.1. The
real library is stripped but exports those names in .dynsym; .symtab is used too when present
(it names static helpers, as in the test library). ELF64 little-endian only (x86_64, aarch64).
symbolize() names any code address of a process the same way (the eBPF trace uses it for the
stacks of threads blocked in futex()); symbols are cached per file.
"""
from __future__ import annotations

import bisect
import dataclasses
import functools
import os
import struct
from pathlib import Path
from typing import BinaryIO, Iterable

from node_probe.host import hostfs, procfs

MAX_READ = 64 << 20  # one symbol table or string table; libcuda's are a few MiB
MAPS_CAP = 16 << 20  # /proc/PID/maps of a process with very many mappings, bounded

SHT_SYMTAB = 2
SHT_DYNSYM = 11
STT_FUNC = 2
STT_GNU_IFUNC = 10
PT_LOAD = 1
MAX_SYMBOLS = 200_000


class ElfError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class Symbol:
    name: str
    value: int   # link-time virtual address
    size: int


@dataclasses.dataclass(frozen=True)
class ElfSymbols:
    functions: tuple[Symbol, ...]  # sorted by value
    first_load_vaddr: int          # p_vaddr of the first PT_LOAD, page-aligned down
    loads: tuple[tuple[int, int, int], ...] = ()  # PT_LOAD (p_offset, p_vaddr, p_filesz)

    @functools.cached_property
    def _starts(self) -> list[int]:
        return [s.value for s in self.functions]

    def vaddr(self, file_offset: int) -> int | None:
        """Link-time address of a file offset (through the PT_LOAD segment that holds it)."""
        for p_offset, p_vaddr, p_filesz in self.loads:
            if p_offset <= file_offset < p_offset + max(p_filesz, 1):
                return file_offset - p_offset + p_vaddr
        return None

    def find(self, name: str) -> Symbol | None:
        for s in self.functions:
            if s.name == name:
                return s
        return None

    def lookup(self, vaddr: int) -> tuple[Symbol, int] | None:
        """The function containing link-time address `vaddr` and the offset into it."""
        i = bisect.bisect_right(self._starts, vaddr) - 1
        while i >= 0:
            s = self.functions[i]
            end = s.value + s.size if s.size else (
                self.functions[i + 1].value if i + 1 < len(self.functions) else s.value + 1)
            if s.value <= vaddr < end:
                return s, vaddr - s.value
            if s.value < vaddr:
                return None
            i -= 1
        return None


def _read(f: BinaryIO, off: int, size: int) -> bytes:
    # offsets and sizes come from the file itself: a corrupt one must be an ElfError, not a
    # seek ValueError or a read of 2**60 bytes
    if off < 0 or size < 0 or off + size > os.fstat(f.fileno()).st_size:
        raise ElfError("truncated ELF file")
    if size > MAX_READ:
        raise ElfError(f"ELF part of {size} bytes is over the {MAX_READ}-byte cap")
    f.seek(off)
    data = f.read(size)
    if len(data) != size:
        raise ElfError("truncated ELF file")
    return data


def read_function_symbols(path: str | os.PathLike) -> ElfSymbols:
    """Function symbols from .dynsym and .symtab of an ELF64 LE file."""
    # a tenant names these files (/proc/PID/root/<mapped path>): regular files only, never a
    # FIFO or device that would block or stream forever
    with os.fdopen(hostfs.open_file(path), "rb") as f:
        ident = _read(f, 0, 64)
        if ident[:4] != b"\x7fELF":
            raise ElfError("not an ELF file")
        if ident[4] != 2 or ident[5] != 1:
            raise ElfError("only ELF64 little-endian is supported")
        (e_phoff, e_shoff) = struct.unpack_from("<QQ", ident, 32)
        (e_phentsize, e_phnum, e_shentsize, e_shnum, e_shstrndx) = struct.unpack_from(
            "<HHHHH", ident, 54)
        if (e_phnum and e_phentsize < 56) or (e_shnum and e_shentsize < 64):
            raise ElfError("corrupt ELF header (entry sizes)")
        first_load = 0
        loads = []
        if e_phoff and e_phnum:
            ph = _read(f, e_phoff, e_phentsize * e_phnum)
            for i in range(e_phnum):
                p_type, _flags, p_off, p_vaddr, _paddr, p_filesz = struct.unpack_from(
                    "<IIQQQQ", ph, i * e_phentsize)
                if p_type == PT_LOAD:
                    loads.append((p_off, p_vaddr, p_filesz))
            if loads:
                first_load = min(v for _o, v, _s in loads) & ~0xFFF
        if not e_shoff or not e_shnum:
            raise ElfError("no section headers")
        sh = _read(f, e_shoff, e_shentsize * e_shnum)
        sections = []
        for i in range(e_shnum):
            (name, typ, _flags, _addr, off, size, link, _info, _align, entsize) = \
                struct.unpack_from("<IIQQQQIIQQ", sh, i * e_shentsize)
            sections.append((typ, off, size, link, entsize))
        syms: dict[tuple[str, int], Symbol] = {}
        for typ, off, size, link, entsize in sections:
            if typ not in (SHT_DYNSYM, SHT_SYMTAB) or not entsize or link >= len(sections):
                continue
            count = min(size // entsize, MAX_SYMBOLS)
            table = _read(f, off, count * entsize)
            _st, str_off, str_size, _l, _e = sections[link]
            strtab = _read(f, str_off, str_size)
            for j in range(count):
                st_name, st_info, _other, st_shndx, st_value, st_size = struct.unpack_from(
                    "<IBBHQQ", table, j * entsize)
                if st_info & 0xF not in (STT_FUNC, STT_GNU_IFUNC) or not st_value or not st_shndx:
                    continue
                end = strtab.find(b"\0", st_name)
                nm = strtab[st_name:end if end >= 0 else None].decode("utf-8", "replace")
                if nm:
                    syms.setdefault((nm, st_value), Symbol(nm, st_value, st_size))
    funcs = tuple(sorted(syms.values(), key=lambda s: (s.value, s.name)))
    return ElfSymbols(funcs, first_load, tuple(loads))


@dataclasses.dataclass(frozen=True)
class Mapping:
    start: int
    end: int
    perms: str
    offset: int
    inode: int
    path: str


def read_maps(pid: int, proc: Path = Path("/proc")) -> list[Mapping]:
    text = procfs.read_str(proc / str(pid) / "maps", MAPS_CAP)
    if text is None:
        return []
    out = []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 5:
            continue
        try:
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            out.append(Mapping(lo, hi, parts[1], int(parts[2], 16), int(parts[4]),
                               parts[5].strip() if len(parts) > 5 else ""))
        except ValueError:
            continue
    return out


@dataclasses.dataclass(frozen=True)
class LoadedImage:
    """One shared object mapped into a process, with its symbols relocated."""
    path: str               # as the process sees it (/proc/PID/maps)
    readable_path: str      # where the probe read it from
    base: int               # runtime address of link-time address first_load_vaddr
    ranges: tuple[tuple[int, int], ...]  # executable mappings [start, end)
    symbols: ElfSymbols

    def runtime(self, sym: Symbol) -> tuple[int, int]:
        start = self.base + sym.value - self.symbols.first_load_vaddr
        return start, start + max(sym.size, 1)

    def contains(self, addr: int) -> bool:
        return any(lo <= addr < hi for lo, hi in self.ranges)

    def symbolize(self, addr: int) -> str | None:
        if not self.contains(addr):
            return None
        hit = self.symbols.lookup(addr - self.base + self.symbols.first_load_vaddr)
        if hit is None:
            return f"{os.path.basename(self.path)}+{addr - self.base:#x}"
        sym, off = hit
        return f"{sym.name}+{off:#x}"


def _file_of(pid: int, m: Mapping, proc: Path) -> list[Path]:
    """Where the probe can read the file behind mapping m: /proc/PID/map_files (the exact file,
    across mount namespaces), else the path under /proc/PID/root."""
    out = [proc / str(pid) / "map_files" / f"{m.start:x}-{m.end:x}"]
    if m.path.startswith("/"):
        out.append(proc / str(pid) / "root" / m.path.lstrip("/"))
    return out


def load_image(pid: int, maps: Iterable[Mapping], basename_prefix: str,
               proc: Path = Path("/proc")) -> LoadedImage | None:
    """Find the first mapped file whose basename starts with `basename_prefix` and read its
    symbols from /proc/PID/map_files (exact file) or /proc/PID/root + path."""
    maps = list(maps)
    target = next((m for m in maps if m.path.startswith("/")
                   and os.path.basename(m.path).startswith(basename_prefix)), None)
    if target is None:
        return None
    mine = [m for m in maps if m.path == target.path and m.inode == target.inode]
    base = min(m.start - m.offset for m in mine)
    ranges = tuple((m.start, m.end) for m in mine if "x" in m.perms)
    candidates = _file_of(pid, mine[0], proc)
    last_err: Exception | None = None
    for c in candidates:
        try:
            syms = read_function_symbols(c)
        except (OSError, ElfError) as exc:
            last_err = exc
            continue
        # start - offset of the first mapping is where link-time first_load_vaddr landed
        return LoadedImage(target.path.removesuffix(" (deleted)"), str(c), base, ranges, syms)
    if last_err is not None:
        raise last_err
    return None


_SYMBOL_CACHE: dict[tuple[int, int, int, int], ElfSymbols | None] = {}
_SYMBOL_CACHE_MAX = 256


def mapped_symbols(pid: int, m: Mapping, proc: Path = Path("/proc")) -> ElfSymbols | None:
    """Symbols of the file behind mapping `m` (via /proc/PID/map_files, else /proc/PID/root +
    path), cached per file; None if it cannot be read or is not an ELF64 LE file."""
    for c in _file_of(pid, m, proc):
        try:
            st = os.stat(c)
        except OSError:
            continue
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if key not in _SYMBOL_CACHE:
            if len(_SYMBOL_CACHE) >= _SYMBOL_CACHE_MAX:
                _SYMBOL_CACHE.clear()
            try:
                _SYMBOL_CACHE[key] = read_function_symbols(c)
            except (OSError, ElfError, struct.error):
                _SYMBOL_CACHE[key] = None
        return _SYMBOL_CACHE[key]
    return None


def symbolize(pid: int, addr: int, maps: Iterable[Mapping],
              proc: Path = Path("/proc")) -> str | None:
    """"func+0xoff (lib)" for a code address of process pid, "lib+0xfileoff" when no symbol
    covers it, None when addr is in no executable mapping."""
    for m in maps:
        if m.start <= addr < m.end and "x" in m.perms:
            lib = os.path.basename(m.path) or m.path or "?"
            file_off = addr - m.start + m.offset
            syms = mapped_symbols(pid, m, proc) if m.path.startswith("/") else None
            va = syms.vaddr(file_off) if syms else None
            hit = syms.lookup(va) if syms and va is not None else None
            if hit:
                return f"{hit[0].name}+0x{hit[1]:x} ({lib})"
            return f"{lib}+0x{file_off:x}"
    return None

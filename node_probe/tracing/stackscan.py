"""Which functions is a blocked thread inside? Scan its user stack without stopping it.

Why: BPF user stacks stop at the first glibc frame (no frame pointers), and a wait that began
before the probe attached has no BPF record at all. A thread blocked in a syscall has its user
SP and PC in /proc/PID/task/TID/syscall; the words on its stack that point just after a call
instruction in an executable mapping are its return addresses (a heuristic: stale words can
show up, so callers treat the result as evidence, not proof). Symbols come from the ELF files
themselves, opened through /proc/PID/map_files (works across mount namespaces), stdlib only.
"""
from __future__ import annotations

import bisect
import os
import platform
import struct
from pathlib import Path

PROC = Path("/proc")
_SYMCACHE: dict[tuple[int, int], "ElfSymbols | None"] = {}


def thread_syscall(pid: int, tid: int, proc: Path = PROC) -> dict | None:
    """{"nr", "args", "sp", "pc"} of a thread blocked in a syscall; None if running or gone."""
    try:
        text = (proc / str(pid) / "task" / str(tid) / "syscall").read_text().split()
    except OSError:
        return None
    if len(text) < 9 or not text[0].lstrip("-").isdigit():
        return None
    nr = int(text[0])
    if nr < 0:
        return None
    return {"nr": nr, "args": [int(x, 16) for x in text[1:7]], "sp": int(text[7], 16),
            "pc": int(text[8], 16)}


def read_maps(pid: int, proc: Path = PROC) -> list[tuple[int, int, str, int, str]]:
    """[(start, end, perms, offset, path)] of file-backed and stack mappings."""
    out = []
    try:
        lines = (proc / str(pid) / "maps").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) < 5:
            continue
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        path = parts[5].strip() if len(parts) > 5 else ""
        out.append((lo, hi, parts[1], int(parts[2], 16), path))
    return out


class ElfSymbols:
    """Function symbols of one ELF file (.symtab, else .dynsym) and its PT_LOAD segments."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.loads: list[tuple[int, int, int]] = []   # (p_offset, p_vaddr, p_filesz)
        self.addrs: list[int] = []
        self.syms: list[tuple[int, int, str]] = []    # (value, size, name)
        with open(path, "rb") as f:
            ident = f.read(64)
            if ident[:4] != b"\x7fELF" or ident[4] != 2:
                raise ValueError("not a 64-bit ELF")
            end = "<" if ident[5] == 1 else ">"
            phoff, shoff = struct.unpack_from(end + "QQ", ident, 0x20)
            phentsize, phnum, shentsize, shnum = struct.unpack_from(end + "HHHH", ident, 0x36)
            f.seek(phoff)
            ph = f.read(phentsize * phnum)
            for i in range(phnum):
                p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from(
                    end + "IIQQQQ", ph, i * phentsize)
                if p_type == 1:
                    self.loads.append((p_offset, p_vaddr, p_filesz))
            f.seek(shoff)
            sh = f.read(shentsize * shnum)
            secs = [struct.unpack_from(end + "IIQQQQIIQQ", sh, i * shentsize) for i in range(shnum)]
            symtabs = [s for s in secs if s[1] == 2] or [s for s in secs if s[1] == 11]
            syms = []
            for s in symtabs:
                strtab = secs[s[6]]
                f.seek(strtab[4])
                strings = f.read(strtab[5])
                f.seek(s[4])
                data = f.read(s[5])
                for off in range(0, len(data) - 23, 24):
                    st_name, st_info, _o, st_shndx, st_value, st_size = struct.unpack_from(
                        end + "IBBHQQ", data, off)
                    if st_info & 0xF != 2 or st_shndx == 0 or not st_value:
                        continue
                    name_end = strings.find(b"\0", st_name)
                    syms.append((st_value, st_size, strings[st_name:name_end].decode("utf-8", "replace")))
        syms.sort()
        self.syms = syms
        self.addrs = [s[0] for s in syms]

    def vaddr(self, file_offset: int) -> int | None:
        for p_offset, p_vaddr, p_filesz in self.loads:
            if p_offset <= file_offset < p_offset + max(p_filesz, 1):
                return file_offset - p_offset + p_vaddr
        return None

    def lookup(self, vaddr: int) -> tuple[str, int] | None:
        i = bisect.bisect_right(self.addrs, vaddr) - 1
        if i < 0:
            return None
        value, size, name = self.syms[i]
        if size and vaddr >= value + size:
            return None
        return name, vaddr - value


def _symbols(pid: int, lo: int, hi: int, path: str, proc: Path) -> ElfSymbols | None:
    candidates = [proc / str(pid) / "map_files" / f"{lo:x}-{hi:x}"]
    if path.startswith("/"):
        candidates.append(proc / str(pid) / "root" / path.lstrip("/"))
    for c in candidates:
        try:
            st = os.stat(c)
        except OSError:
            continue
        key = (st.st_dev, st.st_ino)
        if key not in _SYMCACHE:
            try:
                _SYMCACHE[key] = ElfSymbols(c)
            except (OSError, ValueError, struct.error, IndexError):
                _SYMCACHE[key] = None
        return _SYMCACHE[key]
    return None


def symbolize(pid: int, addr: int, maps, proc: Path = PROC) -> str | None:
    for lo, hi, perms, offset, path in maps:
        if lo <= addr < hi and "x" in perms:
            lib = os.path.basename(path) or path or "?"
            syms = _symbols(pid, lo, hi, path, proc) if path.startswith("/") else None
            va = syms.vaddr(addr - lo + offset) if syms else None
            hit = syms.lookup(va) if syms and va is not None else None
            if hit:
                return f"{hit[0]}+0x{hit[1]:x} ({lib})"
            return f"{lib}+0x{addr - lo + offset:x}"
    return None


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


def scan(pid: int, tid: int, proc: Path = PROC, max_bytes: int = 64 * 1024,
         max_frames: int = 24) -> dict | None:
    """{"syscall": nr, "frames": [...]} for a thread blocked in a syscall (innermost first);
    None when the thread is running or cannot be read."""
    sc = thread_syscall(pid, tid, proc)
    if sc is None:
        return None
    maps = read_maps(pid, proc)
    frames = []
    first = symbolize(pid, sc["pc"], maps, proc)
    if first:
        frames.append(first)
    sp = sc["sp"]
    stack_end = next((hi for lo, hi, _p, _o, _path in maps if lo <= sp < hi), sp + max_bytes)
    length = min(max_bytes, stack_end - sp)
    try:
        with open(proc / str(pid) / "mem", "rb", buffering=0) as mem:
            mem.seek(sp)
            data = mem.read(length)
            for off in range(0, len(data) - 7, 8):
                (word,) = struct.unpack_from("<Q", data, off)
                if word < 4096:
                    continue
                name = symbolize(pid, word, maps, proc)
                if name and _after_call(mem, word):
                    if not frames or frames[-1] != name:
                        frames.append(name)
                    if len(frames) >= max_frames:
                        break
    except (OSError, ValueError, OverflowError):
        pass
    return {"syscall": sc["nr"], "frames": frames}

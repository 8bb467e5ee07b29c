"""Bounded reading of a pasted file: plain or gzip (several members, as nvidia-bug-report.sh
appends them), capped in bytes read, bytes decompressed and line length.

Why: a ticket attachment is hostile input. A 1 KB gzip bomb must not become 10 GB in memory,
a file of one endless line must not become one endless string, and the reader stops at a cap
saying where (Stats.cut) instead of running past the run's deadline.
"""
from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Iterator

MAX_READ_BYTES = 256 << 20      # bytes read from the file (compressed or not)
MAX_TEXT_BYTES = 512 << 20      # bytes of text after decompression (gzip bomb cap)
MAX_LINE = 4096                 # a longer line is kept in part, the rest dropped
CHUNK = 1 << 16
GZIP_MAGIC = b"\x1f\x8b"


class Stats:
    """What one read saw: bytes read, text bytes, lines, and the cap it stopped at, if any."""

    def __init__(self) -> None:
        self.read = 0
        self.text = 0
        self.lines = 0
        self.gzip = False
        self.cut: str | None = None


def _chunks(path: Path, stats: Stats, max_read: int, max_text: int) -> Iterator[bytes]:
    """The file's text bytes: gunzipped when it starts with the gzip magic (member after
    member), each decompression step bounded so that no step yields more than CHUNK."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        first = os.read(fd, CHUNK)
        stats.read += len(first)
        stats.gzip = first[:2] == GZIP_MAGIC
        if not stats.gzip:
            pending = first
            while pending:
                if stats.text + len(pending) > max_text:
                    pending = pending[:max(0, max_text - stats.text)]
                    stats.cut = f"stopped after {max_text} bytes of text"
                stats.text += len(pending)
                yield pending
                if stats.cut or stats.read >= max_read:
                    if not stats.cut:
                        stats.cut = f"stopped after reading {max_read} bytes"
                    return
                pending = os.read(fd, CHUNK)
                stats.read += len(pending)
            return
        d = zlib.decompressobj(wbits=31)
        data = first
        while True:
            while data:
                out = d.decompress(data, CHUNK)
                data = d.unconsumed_tail
                if d.eof:                       # next gzip member (bug-report appends them)
                    rest = d.unused_data
                    d = zlib.decompressobj(wbits=31)
                    data = rest if rest[:2] == GZIP_MAGIC else b""
                if out:
                    if stats.text + len(out) > max_text:
                        out = out[:max(0, max_text - stats.text)]
                        stats.cut = (f"stopped after {max_text} bytes of decompressed text "
                                     "(gzip cap)")
                    stats.text += len(out)
                    yield out
                    if stats.cut:
                        return
            if stats.read >= max_read:
                stats.cut = f"stopped after reading {max_read} bytes"
                return
            data = os.read(fd, CHUNK)
            stats.read += len(data)
            if not data:
                return
    except zlib.error as exc:
        stats.cut = f"gzip data is damaged ({exc}); read up to there"
    finally:
        os.close(fd)


def iter_lines(path: Path, stats: Stats | None = None, max_read: int = MAX_READ_BYTES,
               max_text: int = MAX_TEXT_BYTES, max_line: int = MAX_LINE) -> Iterator[str]:
    """The file's lines (decoded UTF-8, invalid bytes replaced, no line ending), each at most
    `max_line` characters. Raises OSError when the file cannot be opened."""
    stats = stats if stats is not None else Stats()
    pending = b""
    skipping = False
    for chunk in _chunks(Path(path), stats, max_read, max_text):
        parts = chunk.split(b"\n")
        parts[0] = pending + parts[0]
        for raw in parts[:-1]:
            if skipping:
                skipping = False
                continue
            stats.lines += 1
            yield raw[:max_line].rstrip(b"\r").decode("utf-8", "replace")
        pending = parts[-1]
        if len(pending) > max_line:
            if not skipping:
                stats.lines += 1
                yield pending[:max_line].decode("utf-8", "replace")
            skipping, pending = True, b""
    if pending and not skipping:
        stats.lines += 1
        yield pending[:max_line].rstrip(b"\r").decode("utf-8", "replace")


def head(path: Path, n_lines: int = 64) -> list[str]:
    """The first lines of a file (for telling its format), bounded like iter_lines."""
    out: list[str] = []
    for line in iter_lines(path, max_read=1 << 20, max_text=1 << 20):
        out.append(line)
        if len(out) >= n_lines:
            break
    return out

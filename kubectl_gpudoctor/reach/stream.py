"""Splitting a byte stream (the debug pod's log) into NDJSON records.

Why: the API server hands the log over in chunks that end wherever the network cut them, in
the middle of a line or of a UTF-8 sequence. Records are rendered live, so each complete line
is decoded as soon as its newline arrives and a partial tail is kept for the next chunk; the
tail left at the end of the stream (a probe killed mid-line) is still decoded, as a log.
Decoding and validation live in kubectl_gpudoctor.reach.records; LineSplitter stays for callers
that only need lines.
"""
from __future__ import annotations

# How long past its own --timeout a probe may still talk before the client calls it stuck, on
# every path (local child, agent exec, debug pod log): it ends its run at its deadline and prints
# its (incomplete) summary at once, so a probe still sending after this is stuck or hostile.
PROBE_GRACE_S = 10.0

from typing import Iterable, Iterator


MAX_LINE_BYTES = 4 * 1024 * 1024  # one runaway line must not eat the laptop's memory


class LineSplitter:
    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, chunk: bytes) -> list[bytes]:
        """Add a chunk; return the complete lines (without the newline) it finished."""
        self._buf += chunk
        if b"\n" not in chunk:
            if len(self._buf) > MAX_LINE_BYTES:
                line = bytes(self._buf)
                self._buf.clear()
                return [line]
            return []
        *lines, rest = bytes(self._buf).split(b"\n")
        self._buf = bytearray(rest)
        return [ln[:-1] if ln.endswith(b"\r") else ln for ln in lines]

    def finish(self) -> list[bytes]:
        """What is left when the stream ends (a last line without a newline)."""
        rest = bytes(self._buf)
        self._buf.clear()
        return [rest] if rest.strip() else []


def records(chunks: Iterable[bytes], decoder=None) -> Iterator[dict]:
    """Validated gpu-doctor/v1 records from raw chunks: every caller (debug pod log, agent
    exec, `local`) goes through kubectl_gpudoctor.reach.records, which never raises, caps lines and
    turns records that do not validate into warning logs (and the run into an incomplete one)."""
    from . import records as _records
    yield from _records.records(chunks, decoder)

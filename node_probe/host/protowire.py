"""Protobuf wire format read by hand: the kubelet checkpoint's Allocate answers and the
plugin-registration and health replies.

Why: the probe decodes a few small messages (the device-manager checkpoint, a plugin's GetInfo,
a gRPC health reply) without generated stubs for them. One decoder serves all; malformed input
raises ValueError, never reads past the buffer.
"""
from __future__ import annotations

from typing import Iterator


def varint(buf: bytes, i: int) -> tuple[int, int]:
    """(value, next offset) of the varint at `i`."""
    shift = result = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of one message; value is bytes for length-delimited
    fields, int otherwise."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(buf, i)
        elif wt in (1, 5):
            n = 8 if wt == 1 else 4
            if i + n > len(buf):
                raise ValueError("truncated field")
            v, i = int.from_bytes(buf[i:i + n], "little"), i + n
        elif wt == 2:
            n, i = varint(buf, i)
            if i + n > len(buf):
                raise ValueError("truncated field")
            v, i = buf[i:i + n], i + n
        else:
            raise ValueError(f"unsupported wire type {wt}")
        yield num, wt, v

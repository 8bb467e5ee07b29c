"""Reading the websocket frames of an exec stream ourselves, bounded in memory and time.

Why: the kubernetes client's WSClient reads a whole frame of any announced size into memory,
keeps every byte it reads a second time (capture_all), loops for as long as frames keep
arriving (a flooding agent holds it past any deadline), and drops output it buffered when it
meets the close frame. After the upgrade the socket is ours alone (websocket-client reads the
handshake byte by byte, so nothing of the stream sits in its buffers), and RFC 6455 framing
is small: so frames are parsed here, payloads handed on in pieces of at most READ_SIZE bytes
as they arrive, every wait bounded by the caller's deadline.

Events are (channel, bytes) for the Kubernetes channel protocol (v4/v5.channel.k8s.io: the
first byte of each message names the channel) and (CLOSE, b"") for the server's close frame.
"""
from __future__ import annotations

import select
import socket
import ssl
import struct
import time
from typing import Any, Iterator

READ_SIZE = 64 * 1024
CLOSE = -1
_CONT, _TEXT, _BINARY, _CLOSE, _PING, _PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
_WAIT_SLICE_S = 1.0  # a blocked TLS read returns at least this often to look at the deadline


class Broken(Exception):
    """The connection ended or broke the protocol before the server's close frame."""


class DeadlinePassed(Exception):
    """The caller's deadline passed while waiting for (more of) a frame."""


class Reader:
    """Frames of one websocket (websocket-client's WebSocket, already upgraded)."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.sock = ws.sock
        self._buf = bytearray()
        try:
            self.sock.settimeout(_WAIT_SLICE_S)
        except (OSError, AttributeError):
            pass

    # -- bytes off the socket ------------------------------------------------------------
    def _recv(self, n: int, deadline: float) -> bytes:
        """Up to `n` (>0) bytes: from what was over-read, else one read of the socket.
        Past the deadline it raises, also while bytes keep coming (a flood never waits)."""
        if time.monotonic() >= deadline:
            raise DeadlinePassed()
        if self._buf:
            piece = bytes(self._buf[:n])
            del self._buf[:n]
            return piece
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DeadlinePassed()
            pending = isinstance(self.sock, ssl.SSLSocket) and self.sock.pending()
            if not pending:
                poll = select.poll()
                poll.register(self.sock, select.POLLIN)
                if not poll.poll(min(left, _WAIT_SLICE_S) * 1000):
                    continue
            try:
                data = self.sock.recv(max(n, 1))
            except (socket.timeout, ssl.SSLWantReadError):
                continue  # half a TLS record: look at the deadline, then wait for the rest
            except OSError as exc:
                raise Broken(f"{type(exc).__name__}: {exc}"[:200]) from None
            if not data:
                raise Broken("the connection closed without a close frame")
            return data

    def _exact(self, n: int, deadline: float) -> bytes:
        """Exactly `n` bytes (frame headers: at most 14)."""
        out = b""
        while len(out) < n:
            got = self._recv(READ_SIZE, deadline)
            need = n - len(out)
            out += got[:need]
            if len(got) > need:
                self._buf[:0] = got[need:]
        return out

    # -- frames --------------------------------------------------------------------------
    def events(self, deadline: float) -> Iterator[tuple[int, bytes]]:
        channel: int | None = None  # the channel of the message in progress
        in_message = False
        while True:
            b1, b2 = self._exact(2, deadline)
            fin, opcode, masked, length = b1 & 0x80, b1 & 0x0F, b2 & 0x80, b2 & 0x7F
            if length == 126:
                (length,) = struct.unpack("!H", self._exact(2, deadline))
            elif length == 127:
                (length,) = struct.unpack("!Q", self._exact(8, deadline))
            if masked:
                raise Broken("the server sent a masked frame")
            if opcode >= 0x8:  # control frames: at most 125 bytes, never fragmented
                if length > 125 or not fin:
                    raise Broken("a control frame over 125 bytes or fragmented")
                payload = self._exact(length, deadline) if length else b""
                if opcode == _CLOSE:
                    yield CLOSE, b""
                    return
                if opcode == _PING:
                    self.ws.pong(payload)
                elif opcode != _PONG:
                    raise Broken(f"unknown control frame opcode {opcode}")
                continue
            if opcode in (_TEXT, _BINARY):
                if in_message:
                    raise Broken("a new message inside a fragmented one")
                channel, in_message = None, True
            elif opcode != _CONT or not in_message:
                raise Broken(f"unexpected frame opcode {opcode}")
            left = length
            while left:
                piece = self._recv(min(left, READ_SIZE), deadline)
                left -= len(piece)
                if channel is None:
                    channel, piece = piece[0], piece[1:]
                if piece:
                    yield channel, piece
            if fin:
                in_message = False

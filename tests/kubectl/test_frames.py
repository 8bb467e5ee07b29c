"""reach/frames.py: websocket frames read piece by piece, bounded in memory and time, over a
real socket pair (the server side written by hand, byte for byte as RFC 6455 frames them)."""
from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from kubectl_gpudoctor.reach import frames


class _Ws:
    """What frames.Reader uses of websocket-client's WebSocket: the socket, pong()."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.pongs: list[bytes] = []

    def pong(self, payload: bytes) -> None:
        self.pongs.append(payload)


def frame(opcode: int, payload: bytes, fin: bool = True, masked: bool = False) -> bytes:
    n = len(payload)
    b1 = (0x80 if fin else 0) | opcode
    if n < 126:
        head = struct.pack("!BB", b1, n | (0x80 if masked else 0))
    elif n < 1 << 16:
        head = struct.pack("!BBH", b1, 126 | (0x80 if masked else 0), n)
    else:
        head = struct.pack("!BBQ", b1, 127 | (0x80 if masked else 0), n)
    return head + (b"\0\0\0\0" if masked else b"") + payload


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def _send_in_thread(sock: socket.socket, parts) -> threading.Thread:
    def run():
        try:
            for p in parts:
                sock.sendall(p)
        except OSError:
            pass
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_20_mib_frame_arrives_in_pieces_of_at_most_read_size(pair):
    server, client = pair
    big = bytes([1]) + b"y" * (20 << 20)
    _send_in_thread(server, [frame(2, bytes([1])), frame(2, big), frame(8, b"\x03\xe8")])
    got, biggest = 0, 0
    events = list(frames.Reader(_Ws(client)).events(time.monotonic() + 60))
    for ch, data in events[:-1]:
        assert ch == 1
        got += len(data)
        biggest = max(biggest, len(data))
    assert events[-1] == (frames.CLOSE, b"")
    assert got == 20 << 20 and biggest <= frames.READ_SIZE


def test_fragments_keep_the_channel_of_their_message_and_pings_are_answered(pair):
    server, client = pair
    ws = _Ws(client)
    _send_in_thread(server, [frame(2, b"\x02err", fin=False), frame(9, b"hi"),
                             frame(0, b"or\n"), frame(2, b"\x01out"), frame(8, b"")])
    events = list(frames.Reader(ws).events(time.monotonic() + 30))
    assert events == [(2, b"err"), (2, b"or\n"), (1, b"out"), (frames.CLOSE, b"")]
    assert ws.pongs == [b"hi"]


@pytest.mark.parametrize("bad", [frame(2, b"\x01x", masked=True), frame(9, b"p" * 200),
                                 frame(0, b"orphan"), frame(5, b"")],
                         ids=["masked", "long ping", "orphan continuation", "reserved opcode"])
def test_protocol_violations_are_broken(pair, bad):
    server, client = pair
    _send_in_thread(server, [bad])
    with pytest.raises(frames.Broken):
        list(frames.Reader(_Ws(client)).events(time.monotonic() + 30))


def test_a_cut_connection_is_broken(pair):
    server, client = pair
    server.sendall(frame(2, b"\x01partial")[:5])
    server.shutdown(socket.SHUT_WR)
    with pytest.raises(frames.Broken):
        list(frames.Reader(_Ws(client)).events(time.monotonic() + 30))


def test_the_deadline_holds_while_frames_keep_coming(pair):
    server, client = pair
    stop = threading.Event()

    def flood():
        unit = frame(2, bytes([1]) + b"z" * 4000) * 16
        try:
            while not stop.is_set():
                server.sendall(unit)
        except OSError:
            pass
    threading.Thread(target=flood, daemon=True).start()
    t0 = time.monotonic()
    n = 0
    with pytest.raises(frames.DeadlinePassed):
        for _ch, data in frames.Reader(_Ws(client)).events(time.monotonic() + 1.0):
            n += len(data)
    stop.set()
    assert n > 0 and time.monotonic() - t0 < 15  # a 15x hang guard: the flood never ends


def test_the_deadline_holds_against_a_trickle(pair):
    server, client = pair
    server.sendall(frame(2, bytes([1]) + b"t" * 100)[:10])  # then nothing more
    t0 = time.monotonic()
    with pytest.raises(frames.DeadlinePassed):
        list(frames.Reader(_Ws(client)).events(time.monotonic() + 1.0))
    assert time.monotonic() - t0 < 15  # hang guard

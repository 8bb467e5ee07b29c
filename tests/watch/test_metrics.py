"""The agent's metrics endpoint against the clients of the security audit (round 4, M-01/M-02,
m01_metrics.py): a slowloris client, a crowd of idle connections, clients that hang up."""
from __future__ import annotations

import socket
import struct
import threading
import time

from node_probe.watch import metrics as m


def _serve(text: bytes = b"gpu_doctor_x 1\n"):
    mt = m.Metrics()
    mt._text = text
    srv = m.serve(mt, 0, "127.0.0.1")
    return srv, srv.server_address[1]


def _scrape(port: int, out: list) -> None:
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=60)
        s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        out.append(data)
    except OSError as exc:
        out.append(exc)


def test_a_slowloris_client_and_idle_connections_do_not_block_a_scrape():
    """Before: one client sending a byte every 4 s held the single-threaded server for ever
    (its timeout was per recv), and 20 idle connections delayed a scrape 34 s. Now each
    connection is served on its own (bounded) and cut at its total deadline."""
    srv, port = _serve()
    stop = threading.Event()
    socks = []
    try:
        slow = socket.create_connection(("127.0.0.1", port))
        socks.append(slow)

        def trickle():
            for ch in b"GET /metrics HTTP/1.0\r\nX-Slow: " + b"a" * 1000:
                if stop.wait(0.5):
                    return
                try:
                    slow.send(bytes([ch]))
                except OSError:
                    return
        threading.Thread(target=trickle, daemon=True).start()
        socks += [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
        out: list = []
        t = threading.Thread(target=_scrape, args=(port, out), daemon=True)
        t.start()
        t.join(40)   # a bound for the test, not a timing measurement
        assert not t.is_alive(), "the scrape waited behind the slow clients"
        assert isinstance(out[0], bytes) and out[0].startswith(b"HTTP/1.0 200")
        assert out[0].endswith(b"gpu_doctor_x 1\n")
        # the slowloris connection was cut at its deadline, not served for ever
        slow.settimeout(30)
        try:
            rest = slow.recv(65536)
        except OSError:
            rest = b""
        assert b"200" not in rest
    finally:
        stop.set()
        for s in socks:
            s.close()
        srv.shutdown()
        srv.server_close()


def test_clients_that_hang_up_leave_no_traceback(capfd):
    """Before: each aborted client wrote a ~20-line BrokenPipeError traceback into the agent's
    log. Now it is counted, and nothing is written."""
    srv, port = _serve(b"x" * (4 << 20))
    try:
        for _ in range(5):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            time.sleep(0.05)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()   # RST while the server writes 4 MiB
        end = time.monotonic() + 30
        while srv.errors < 1 and time.monotonic() < end:
            time.sleep(0.05)
    finally:
        srv.shutdown()
        srv.server_close()
    assert srv.errors >= 1
    err = capfd.readouterr().err
    assert "Traceback" not in err and "BrokenPipe" not in err and "Reset" not in err


def test_it_binds_the_address_it_is_given():
    srv, _ = _serve()
    try:
        assert srv.server_address[0] == "127.0.0.1"
    finally:
        srv.shutdown()
        srv.server_close()


def _flood(port: int, n: int) -> list[socket.socket]:
    """n clients that have each begun a request and hold their connection (the audit's
    m02_metrics_flood.py trickles a byte every 1.5 s and reconnects when cut)."""
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /metr")
        socks.append(s)
    return socks


def _open(s: socket.socket) -> bool:
    """Whether the server still holds this connection (no EOF, no reset)."""
    s.setblocking(False)
    try:
        return s.recv(1) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        s.setblocking(True)


def test_a_flood_of_trickling_clients_does_not_starve_a_scrape(monkeypatch):
    """Audit round 5, M-02: 8 connection slots of 5 s and a 64-deep backlog; 30 clients that
    trickle and reconnect made scrapes take 10-13.5 s (Prometheus' scrape timeout is 10 s),
    100 made every scrape time out. Now one thread serves every connection: a scrape is
    answered while 100 such clients are all still connected. The deadline is raised here so
    that no client is cut while the test runs: the scrape cannot have waited for a slot."""
    monkeypatch.setattr(m, "REQUEST_DEADLINE_S", 120.0)
    srv, port = _serve()
    socks = _flood(port, 100)
    try:
        out: list = []
        t = threading.Thread(target=_scrape, args=(port, out), daemon=True)
        t.start()
        t.join(60)   # a bound for the test, not a timing measurement
        assert not t.is_alive(), "the scrape waited behind the trickling clients"
        assert isinstance(out[0], bytes) and out[0].startswith(b"HTTP/1.0 200"), out
        assert out[0].endswith(b"gpu_doctor_x 1\n")
        assert all(_open(s) for s in socks)   # answered while every one of them held on
    finally:
        for s in socks:
            s.close()
        srv.shutdown()
        srv.server_close()


def test_past_max_open_the_oldest_connection_is_cut_for_the_newest(monkeypatch):
    monkeypatch.setattr(m, "MAX_OPEN", 4)
    monkeypatch.setattr(m, "REQUEST_DEADLINE_S", 120.0)
    srv, port = _serve()
    socks = _flood(port, 6)
    try:
        out: list = []
        _scrape(port, out)
        assert isinstance(out[0], bytes) and out[0].startswith(b"HTTP/1.0 200"), out
        end = time.monotonic() + 30
        while _open(socks[0]) and time.monotonic() < end:
            time.sleep(0.05)
        assert not _open(socks[0]) and _open(socks[-1])
        assert srv.errors >= 2
    finally:
        for s in socks:
            s.close()
        srv.shutdown()
        srv.server_close()


def test_other_paths_and_methods_are_refused_without_a_body_read():
    srv, port = _serve()
    try:
        for req, want in ((b"GET / HTTP/1.0\r\n\r\n", b"HTTP/1.0 404"),
                          (b"POST /metrics HTTP/1.0\r\nContent-Length: 99\r\n\r\n",
                           b"HTTP/1.0 405")):
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            s.sendall(req)
            data = b""
            while chunk := s.recv(65536):
                data += chunk
            s.close()
            assert data.startswith(want), data
    finally:
        srv.shutdown()
        srv.server_close()

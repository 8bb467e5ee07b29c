"""Wall-clock deadlines for HTTP requests of the kubernetes client (urllib3).

Why: urllib3's timeouts bound each socket operation, not a request. An API server, or a kubelet
it proxies, that trickles one byte every 5 s resets a 15 s read timeout forever, and `node`
hangs. Each request here gets a `Ticket` with a deadline; the urllib3 pools of the client are
swapped for subclasses that attach the connection a request uses to the calling thread's
ticket, and one watchdog thread shuts that connection's socket down when the deadline passes.
The blocked read then returns at once (EOF), urllib3 raises, and `kube.py` reports the request
as unanswered in time (a 504) because the ticket says it expired. No thread is left stuck, so
thread pools never wait on a stuck worker for longer than the request's own deadline.
A stream that earns more time as it delivers (a streaming list: api/watchlist.py) moves its
deadline later with `Ticket.extend`; bytes alone never move it.
"""
from __future__ import annotations

import heapq
import itertools
import signal
import socket
import threading
import time
from typing import Any

_current = threading.local()


class Ticket:
    """One request's deadline. `expired` is set (and the socket shut) by the watchdog."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s
        self.start = time.monotonic()
        self.at = self.start + budget_s
        self.expired = False
        self.done = False
        self._conn: Any = None
        self._lock = threading.Lock()

    def attach(self, conn: Any) -> None:
        with self._lock:
            self._conn = conn
            if self.expired:
                _shut(conn)

    def expire(self) -> None:
        with self._lock:
            if self.done or self.expired:
                return
            self.expired = True
            _shut(self._conn)

    def extend(self, budget_s: float) -> None:
        """Move the deadline to `budget_s` after the ticket was armed, if that is later (never
        earlier): the watchdog waits again when it finds the deadline moved."""
        with self._lock:
            if self.start + budget_s > self.at:
                self.at = self.start + budget_s
                self.budget_s = budget_s

    def finish(self) -> None:
        with self._lock:
            self.done = True
            self._conn = None

    def __enter__(self) -> "Ticket":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.finish()


def _shut(conn: Any) -> None:
    sock = getattr(conn, "sock", None)
    if sock is None:
        return  # not connected yet: the connect timeout bounds that phase
    try:
        # the plain socket's shutdown, also for an SSLSocket: wakes a reader blocked in
        # another thread without touching the SSL object it is using
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass


class Watchdog:
    """One daemon thread that expires tickets at their deadlines."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._heap: list[tuple[float, int, Ticket]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, budget_s: float) -> Ticket:
        """A ticket for a request of the calling thread (its connections attach to it)."""
        ticket = Ticket(budget_s)
        with self._cv:
            heapq.heappush(self._heap, (ticket.at, next(self._seq), ticket))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="http-deadlines",
                                                daemon=True)
                self._thread.start()
            self._cv.notify()
        _current.ticket = ticket
        return ticket

    def _run(self) -> None:
        # Never the thread a Ctrl-C or SIGTERM is delivered to: the main thread masks them
        # around pod deletions, and a signal handed to this thread would bypass that mask.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        while True:
            with self._cv:
                while not self._heap:
                    self._cv.wait()
                at, _, ticket = self._heap[0]
                left = at - time.monotonic()
                if left > 0 and not ticket.done:
                    self._cv.wait(left)
                    continue
                heapq.heappop(self._heap)
                if ticket.at > at and not ticket.done:  # moved later (extend): wait again
                    heapq.heappush(self._heap, (ticket.at, next(self._seq), ticket))
                    continue
            if not ticket.done:
                ticket.expire()


def current_ticket() -> Ticket | None:
    t = getattr(_current, "ticket", None)
    return None if t is None or t.done else t


def install(pool_manager: Any) -> None:
    """Make the pools `pool_manager` creates attach their connections to the calling thread's
    ticket. Call before its first request (pools are created lazily)."""
    from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

    def make(base: type) -> type:
        class DeadlinePool(base):  # type: ignore[misc, valid-type]
            def _make_request(self, conn, *args, **kwargs):  # noqa: ANN001
                ticket = current_ticket()
                if ticket is not None:
                    ticket.attach(conn)
                return super()._make_request(conn, *args, **kwargs)
        DeadlinePool.__name__ = f"Deadline{base.__name__}"
        return DeadlinePool

    pool_manager.pool_classes_by_scheme = {"http": make(HTTPConnectionPool),
                                           "https": make(HTTPSConnectionPool)}

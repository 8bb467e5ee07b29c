"""Opt-in Prometheus text endpoint of the watching agent: GET /metrics, nothing else.

Why: platform teams alert on metrics as much as on conditions. Exposed: current problems per
finding id and subject (GPU, plugin, node), detector durations and failures per check, the last
successful pass and API write. Bounded: at most MAX_SERIES problem series, label values cut and
escaped, one thread serving every connection from a selector (a trickling client costs a
descriptor and a few bytes, never a scrape's turn), each connection within one total deadline,
at most MAX_OPEN open at once (the oldest cut first), a client that hangs up is counted, never
a traceback; any other method or path answered 404/405 without reading a body.

Where and how it is reachable (M-01): it binds the pod's own IP (POD_IP from the downward API
status.podIP), not 0.0.0.0, and speaks plain HTTP like node-exporter, node-problem-detector
(:20257) and dcgm-exporter (:9400); it is off unless `--metrics-port` is set, and `agent
install --metrics-port` ships a NetworkPolicy that admits only namespaces labelled as scrapers
(docs/agent.md, "Metrics").
"""
from __future__ import annotations

import selectors
import socket
import threading
import time

MAX_SERIES = 200
MAX_LABEL = 120
MAX_OPEN = 256              # connections open at once; past it the oldest is cut
MAX_REQUEST = 8192          # bytes of request line and headers
BACKLOG = 128
REQUEST_DEADLINE_S = 5.0    # a whole connection: request in, answer out (Prometheus: < 1 s)


def _label(v: object) -> str:
    s = "".join(c if c.isprintable() else " " for c in str(v))[:MAX_LABEL]
    return s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._text = b"# no pass yet\n"

    def update(self, passed, state, writer=None, capturer=None) -> None:
        lines = [
            "# HELP gpu_doctor_problem A problem the agent sees now (1 per finding id and subject).",
            "# TYPE gpu_doctor_problem gauge"]
        n = 0
        for ct, probs in sorted(passed.problems.items()):
            for p in probs:
                if n >= MAX_SERIES:
                    break
                n += 1
                lines.append(f'gpu_doctor_problem{{condition="{_label(ct)}",id="{_label(p.finding_id)}",'
                             f'subject="{_label(p.subject)}",severity="{_label(p.severity)}"}} 1')
        lines += ["# HELP gpu_doctor_condition Condition status of each problem class (1 True).",
                  "# TYPE gpu_doctor_condition gauge"]
        for ct, c in state.conds.items():
            lines.append(f'gpu_doctor_condition{{condition="{ct}"}} {1 if c.status == "True" else 0}')
        lines += ["# HELP gpu_doctor_check_duration_seconds Duration of each check in the last pass.",
                  "# TYPE gpu_doctor_check_duration_seconds gauge"]
        for c in passed.checks:
            lines.append(f'gpu_doctor_check_duration_seconds{{check="{_label(c.id)}"}} '
                         f'{c.duration_s:.3f}')
        lines += ["# HELP gpu_doctor_check_failed 1 if the check could not finish in the last pass "
                  "(timeout, error, or still stuck from an earlier pass).",
                  "# TYPE gpu_doctor_check_failed gauge"]
        for c in passed.checks:
            lines.append(f'gpu_doctor_check_failed{{check="{_label(c.id)}"}} '
                         f'{0 if c.status in ("ok", "skipped") else 1}')
        for cid in passed.stuck:
            lines.append(f'gpu_doctor_check_failed{{check="{_label(cid)}"}} 1')
        lines += gpu_lines(getattr(passed, "gpus", None) or [])
        lines += ["# HELP gpu_doctor_last_pass_timestamp_seconds End of the last pass.",
                  "# TYPE gpu_doctor_last_pass_timestamp_seconds gauge",
                  f"gpu_doctor_last_pass_timestamp_seconds {time.time():.3f}",
                  "# TYPE gpu_doctor_pass_duration_seconds gauge",
                  f"gpu_doctor_pass_duration_seconds {passed.duration_s:.3f}"]
        if writer is not None:
            lines += ["# TYPE gpu_doctor_api_write_errors_total counter",
                      f"gpu_doctor_api_write_errors_total {writer.errors}",
                      "# TYPE gpu_doctor_last_api_write_timestamp_seconds gauge",
                      f"gpu_doctor_last_api_write_timestamp_seconds {writer.last_ok or 0:.3f}"]
        if capturer is not None:
            lines += ["# TYPE gpu_doctor_evidence_captured_total counter",
                      f"gpu_doctor_evidence_captured_total {capturer.captured}"]
        text = ("\n".join(lines) + "\n").encode()
        with self._lock:
            self._text = text

    def text(self) -> bytes:
        with self._lock:
            return self._text


# per-GPU gauges of a slow GPU (issue 38): metric -> (help, gauge key in detect.gpu_gauges)
GPU_METRICS = (
    ("gpu_doctor_gpu_pcie_link_generation", "PCIe link generation of the GPU (which=current|max).",
     (("current", "pcie_gen_cur"), ("max", "pcie_gen_max"))),
    ("gpu_doctor_gpu_pcie_link_width", "PCIe link width in lanes (which=current|max).",
     (("current", "pcie_width_cur"), ("max", "pcie_width_max"))),
    ("gpu_doctor_gpu_clocks_event_reasons", "NVML clock event (throttle) reasons bitmask "
     "(0x4 SW power cap, 0x8 HW slowdown, 0x20 SW thermal, 0x40 HW thermal, 0x80 power brake).",
     ((None, "clocks_event_reasons"),)),
    ("gpu_doctor_gpu_thermal_margin_celsius", "Slowdown temperature minus GPU temperature.",
     ((None, "thermal_margin_c"),)),
)


def gpu_lines(gpus: list[dict]) -> list[str]:
    """Prometheus lines of the per-GPU gauges; a value NVML could not give writes no sample."""
    out = []
    for name, help_, series in GPU_METRICS:
        out += [f"# HELP {name} {help_}", f"# TYPE {name} gauge"]
        for g in gpus[:MAX_SERIES]:
            base = f'uuid="{_label(g.get("uuid"))}",pci_bus_id="{_label(g.get("pci_bus_id"))}"'
            for which, key in series:
                v = g.get(key)
                if not isinstance(v, (int, float)) or isinstance(v, bool):
                    continue
                lab = base + (f',which="{which}"' if which else "")
                out.append(f"{name}{{{lab}}} {int(v) if float(v).is_integer() else v}")
    return out


class _Conn:
    """One client: what it sent so far, then the answer being written, and its deadline."""
    __slots__ = ("deadline", "inbuf", "out", "sent")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.inbuf = b""
        self.out: bytes | None = None   # the answer, once the request is complete
        self.sent = 0


class _Server:
    """One thread serves every connection from a selector (non-blocking sockets): a client
    costs a few bytes and one descriptor while it trickles, never a slot a scrape waits for.
    Before, 8 threads of 5 s each and a 64-deep backlog let 30 clients trickling a byte every
    1.5 s stretch a scrape past Prometheus' 10 s timeout, and 100 made every scrape time out
    (audit round 5, M-02). Each connection still has one total deadline; past MAX_OPEN at
    once the oldest is cut for the newest (a scrape sends its request at once)."""

    def __init__(self, addr: tuple[str, int], metrics: "Metrics") -> None:
        self.metrics = metrics
        self.sock = socket.create_server(addr, backlog=BACKLOG)
        self.sock.setblocking(False)
        self.server_address = self.sock.getsockname()
        self.errors = 0           # clients that hung up, trickled past the deadline, were cut
        self._stop = threading.Event()
        self._done = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self.conns: dict[socket.socket, _Conn] = {}   # oldest first

    def serve_forever(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.sock, selectors.EVENT_READ, None)
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        try:
            while not self._stop.is_set():
                for key, _mask in sel.select(timeout=0.5):
                    if key.data is None:
                        self._accept(sel)
                    elif key.data != "wake":
                        self._step(sel, key.fileobj, key.data)
                now = time.monotonic()
                for c, conn in list(self.conns.items()):
                    if conn.deadline < now:
                        self._close(sel, c, failed=True)
        finally:
            for c in list(self.conns):
                self._close(sel, c)
            sel.close()
            self._done.set()

    def _accept(self, sel: selectors.BaseSelector) -> None:
        for _ in range(BACKLOG):
            try:
                c, _addr = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            c.setblocking(False)
            if len(self.conns) >= MAX_OPEN:
                self._close(sel, next(iter(self.conns)), failed=True)
            self.conns[c] = _Conn(time.monotonic() + REQUEST_DEADLINE_S)
            sel.register(c, selectors.EVENT_READ, self.conns[c])

    def _step(self, sel: selectors.BaseSelector, c: socket.socket, conn: _Conn) -> None:
        try:
            if conn.out is None:
                data = c.recv(4096)
                if not data:
                    self._close(sel, c, failed=True)
                    return
                conn.inbuf += data
                end = conn.inbuf.find(b"\r\n\r\n")
                if end < 0:
                    end = conn.inbuf.find(b"\n\n")
                if end < 0:
                    if len(conn.inbuf) > MAX_REQUEST:
                        self._close(sel, c, failed=True)
                    return
                conn.out = self._answer(conn.inbuf[:end])
                sel.modify(c, selectors.EVENT_WRITE, conn)
            conn.sent += c.send(memoryview(conn.out)[conn.sent:conn.sent + 65536])
            if conn.sent >= len(conn.out):
                try:
                    c.shutdown(socket.SHUT_WR)   # the answer ends with the connection (1.0)
                except OSError:
                    pass
                self._close(sel, c)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:   # reset, broken pipe: counted, never a traceback
            self._close(sel, c, failed=True)

    def _answer(self, head: bytes) -> bytes:
        """HTTP/1.0, one request per connection: GET /metrics, else 404 or 405."""
        parts = head.split(b"\n", 1)[0].split()
        method = parts[0] if parts else b""
        path = parts[1].split(b"?", 1)[0] if len(parts) > 1 else b""
        if method != b"GET":
            return _status(405, "Method Not Allowed")
        if path != b"/metrics":
            return _status(404, "Not Found")
        body = self.metrics.text()
        return (b"HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8"
                b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)

    def _close(self, sel: selectors.BaseSelector, c: socket.socket,
               failed: bool = False) -> None:
        self.conns.pop(c, None)
        if failed:
            self.errors += 1
        try:
            sel.unregister(c)
        except (KeyError, ValueError):
            pass
        try:
            c.close()
        except OSError:
            pass

    def shutdown(self) -> None:
        self._stop.set()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._done.wait(10)

    def server_close(self) -> None:
        for s in (self.sock, self._wake_r, self._wake_w):
            try:
                s.close()
            except OSError:
                pass


def _status(code: int, reason: str) -> bytes:
    body = f"{code} {reason}\n".encode()
    return (f"HTTP/1.0 {code} {reason}\r\nContent-Type: text/plain\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def serve(metrics: Metrics, port: int, host: str = "127.0.0.1") -> _Server:
    """Serve GET /metrics on host:port (the agent passes its pod IP, from the downward API).
    Each connection has one total deadline -- reading the request, writing the answer -- after
    which it is closed, whatever the client trickles."""
    srv = _Server((host, port), metrics)
    threading.Thread(target=srv.serve_forever, name="watch-metrics", daemon=True).start()
    return srv

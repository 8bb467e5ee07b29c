"""Opt-in Prometheus text endpoint of the watching agent: GET /metrics, nothing else.

Why: platform teams alert on metrics as much as on conditions. Exposed: current problems per
finding id and subject (GPU, plugin, node), detector durations and failures per check, the last
successful pass and API write. Bounded: at most MAX_SERIES problem series, label values cut and
escaped, at most MAX_CONNECTIONS served at once, each within one total deadline (a slowloris
client holds one slot for at most REQUEST_DEADLINE_S), a client that hangs up is counted, never
a traceback; any other method or path answered 404/405 without reading a body.

Where and how it is reachable (M-01): it binds the pod's own IP (POD_IP from the downward API
status.podIP), not 0.0.0.0, and speaks plain HTTP like node-exporter, node-problem-detector
(:20257) and dcgm-exporter (:9400); it is off unless `--metrics-port` is set, and `agent
install --metrics-port` ships a NetworkPolicy that admits only namespaces labelled as scrapers
(docs/agent.md, "Metrics").
"""
from __future__ import annotations

import http.server
import socket
import socketserver
import threading
import time

MAX_SERIES = 200
MAX_LABEL = 120
MAX_CONNECTIONS = 8         # served at once; more wait in the backlog
READ_TIMEOUT_S = 2.0        # per read of the request
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


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    """One thread per connection, at most MAX_CONNECTIONS at once: the accept loop waits for
    a free slot, so more clients queue in the kernel's backlog (each slot frees within
    REQUEST_DEADLINE_S) instead of costing a thread each. A slow or idle client holds one
    slot, never the server (M-02)."""

    daemon_threads = True
    request_queue_size = 64

    def __init__(self, addr, handler) -> None:
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.errors = 0
        super().__init__(addr, handler)

    def _handle_request_noblock(self) -> None:
        self.slots.acquire()
        handed = False
        try:
            try:
                request, client = self.get_request()
            except OSError:
                return
            if self.verify_request(request, client):
                try:
                    self.process_request(request, client)
                    handed = True
                except Exception:  # noqa: BLE001 - one client's trouble ends only its own
                    self.handle_error(request, client)
                    self.shutdown_request(request)
            else:
                self.shutdown_request(request)
        finally:
            if not handed:
                self.slots.release()

    def process_request_thread(self, request, client) -> None:
        try:
            super().process_request_thread(request, client)
        finally:
            self.slots.release()

    def handle_error(self, request, client) -> None:
        """A client that hung up (BrokenPipeError, ECONNRESET) or ran past its deadline: counted,
        never a traceback in the agent's log."""
        self.errors += 1


def serve(metrics: Metrics, port: int, host: str = "127.0.0.1") -> http.server.HTTPServer:
    """Serve GET /metrics on host:port (the agent passes its pod IP, from the downward API).
    Each connection has one total deadline -- reading the request, writing the answer -- after
    which its socket is shut down, whatever the client trickles."""
    class Handler(http.server.BaseHTTPRequestHandler):
        timeout = READ_TIMEOUT_S  # per read; the total is REQUEST_DEADLINE_S
        protocol_version = "HTTP/1.0"  # one request per connection: no keep-alive slot hog

        def setup(self):
            super().setup()
            self._guard = threading.Timer(REQUEST_DEADLINE_S, self._cut)
            self._guard.daemon = True
            self._guard.start()

        def _cut(self):
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

        def finish(self):
            self._guard.cancel()
            try:
                super().finish()
            except OSError:
                pass

        def do_GET(self):  # noqa: N802 - http.server's naming
            if self.path.split("?", 1)[0] != "/metrics":
                self.send_error(404)
                return
            body = metrics.text()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _refuse(self):
            self.send_error(405)

        do_POST = do_PUT = do_DELETE = do_PATCH = _refuse  # noqa: N815

        def log_message(self, *args):  # quiet
            pass

    srv = _Server((host, port), Handler)
    threading.Thread(target=srv.serve_forever, name="watch-metrics", daemon=True).start()
    return srv

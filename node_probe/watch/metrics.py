"""Opt-in Prometheus text endpoint of the watching agent: GET /metrics, nothing else.

Why: platform teams alert on metrics as much as on conditions. Exposed: current problems per
finding id and subject (GPU, plugin, node), detector durations and failures per check, the last
successful pass and API write. Bounded: at most MAX_SERIES problem series, label values cut and
escaped, one request at a time with a socket timeout, any other method or path answered 404/405
without reading a body.
"""
from __future__ import annotations

import http.server
import threading
import time

MAX_SERIES = 200
MAX_LABEL = 120


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


def serve(metrics: Metrics, port: int, host: str = "0.0.0.0") -> http.server.HTTPServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        timeout = 5  # a client that sends nothing does not hold the server

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

    srv = http.server.HTTPServer((host, port), Handler)
    srv.timeout = 5
    threading.Thread(target=srv.serve_forever, name="watch-metrics", daemon=True).start()
    return srv

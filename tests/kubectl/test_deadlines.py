"""Wall-clock deadlines: a server that trickles bytes (each within the per-read timeout) cannot
hold a request, a log stream, or `node` past its budget.

The server is a real HTTP server on 127.0.0.1 (http.server in a thread) that answers some
paths normally and trickles others one byte at a time; the client is the real kubernetes
client through kubectl_gpudoctor.kube, and the CLI a real subprocess.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kubectl_gpudoctor import errors
from kubectl_gpudoctor.api.kube import Kube

from .conftest import one_error_line, run_cli

BYTE_EVERY_S = 0.2  # far inside every per-read timeout used below


class Trickler:
    """routes: path -> (status, body) answered at once, or "body" / "headers" / "chunked" to
    trickle the body, the header block, or a chunked stream one byte at a time forever."""

    def __init__(self) -> None:
        self.routes: dict[str, object] = {}
        self.stop = threading.Event()
        self.trickling = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def do_GET(self):  # noqa: N802
                path = self.path.split("?", 1)[0]
                how = outer.routes.get(path)
                if how is None:
                    return self._answer(404, {"kind": "Status", "code": 404, "message":
                                              f"{path} not found", "reason": "NotFound"})
                if isinstance(how, tuple):
                    return self._answer(*how)
                outer.trickling += 1
                try:
                    if how == "headers":
                        self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                    else:
                        self.send_response(200)
                        self.send_header("Content-Type", "application/json")
                        if how == "chunked":
                            self.send_header("Transfer-Encoding", "chunked")
                        else:
                            self.send_header("Content-Length", "1000000")
                        self.end_headers()
                    self.wfile.flush()
                    while not outer.stop.is_set():
                        self.wfile.write(b"1\r\nx\r\n" if how == "chunked" else b" ")
                        self.wfile.flush()
                        time.sleep(BYTE_EVERY_S)
                except OSError:
                    pass  # the client hung up: what we want
                self.close_connection = True

            def _answer(self, status, doc):
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()

    def kubeconfig(self, path):
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "t",
            "clusters": [{"name": "t", "cluster": {"server": self.url}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "t", "context": {"cluster": "t", "user": "u"}}]}))
        return path


@pytest.fixture
def trickler():
    t = Trickler()
    try:
        yield t
    finally:
        t.close()


def _bounded(fn, limit_s: float):
    """Run fn in a thread; fail (instead of hanging the suite) if it is not done in limit_s."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001
            box["error"] = exc
    t0 = time.monotonic()
    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(limit_s)
    assert not th.is_alive(), f"still running after {limit_s}s: no wall-clock deadline"
    return box, time.monotonic() - t0


@pytest.mark.parametrize("how", ["body", "headers"])
def test_a_trickling_answer_ends_at_the_request_deadline(trickler, tmp_path, how):
    trickler.routes["/api/v1/nodes/gpu-1"] = how
    trickler.routes["/api/v1/nodes/gpu-2"] = (200, {"metadata": {"name": "gpu-2"}})
    k = Kube(str(trickler.kubeconfig(tmp_path / "kc")))
    box, took = _bounded(lambda: k.get_json("/api/v1/nodes/gpu-1", timeout=1.0), 30)
    assert isinstance(box.get("error"), errors.GatewayTimeout), box
    assert "no complete answer within 1s" in box["error"].message
    assert 0.9 <= took < 10  # the answer trickles forever: a 10x hang guard, not a speed test
    assert trickler.trickling == 1
    # the client still works afterwards (the shut connection is not reused)
    assert k.get_json("/api/v1/nodes/gpu-2", timeout=2)["metadata"]["name"] == "gpu-2"


def test_a_trickling_log_stream_ends_at_its_deadline(trickler, tmp_path):
    path = "/api/v1/namespaces/default/pods/p/log"
    trickler.routes[path] = "chunked"
    k = Kube(str(trickler.kubeconfig(tmp_path / "kc")))
    got: list[bytes] = []

    def follow():
        for chunk in k.stream(path, [("follow", "true")], read_timeout=5, deadline_s=1.0):
            got.append(chunk)
    box, took = _bounded(follow, 30)
    assert isinstance(box.get("error"), errors.StreamBroken), box
    assert "deadline" in box["error"].message and took < 10  # 10x hang guard (trickles forever)
    assert b"".join(got).startswith(b"x")  # the trickled bytes did arrive until then


def test_node_does_not_hang_on_a_trickling_api_server(trickler, tmp_path):
    trickler.routes["/api/v1/nodes/gpu-1"] = "body"
    t0 = time.monotonic()
    r = run_cli("node", "gpu-1", "--kubeconfig", str(trickler.kubeconfig(tmp_path / "kc")),
                "--request-timeout", "2s", timeout=60)
    assert time.monotonic() - t0 < 20  # 10x hang guard: the node answer trickles forever
    line = one_error_line(r.stderr)
    assert r.returncode == 3 and "node gpu-1" in line and "within 2s" in line


def test_trickling_kubelet_proxy_is_bounded_by_kubelet_timeout(trickler, tmp_path):
    """The goroutine dump and healthz trickle: the API-side run still ends in time, with the
    dump reported unavailable (504) instead of the thread pool waiting on its workers."""
    node = {"metadata": {"name": "gpu-1", "uid": "u1"},
            "status": {"capacity": {"nvidia.com/gpu": "1"},
                       "allocatable": {"nvidia.com/gpu": "1"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}
    trickler.routes.update({
        "/api/v1/nodes/gpu-1": (200, node),
        "/api/v1/pods": (200, {"items": []}),
        "/api/v1/events": (200, {"items": []}),
        "/api/v1/nodes/gpu-1/proxy/debug/pprof/goroutine": "body",
        "/api/v1/nodes/gpu-1/proxy/healthz": "headers",
        "/api/v1/nodes/gpu-1/proxy/configz": "chunked",
    })
    t0 = time.monotonic()
    r = run_cli("node", "gpu-1", "--kubeconfig", str(trickler.kubeconfig(tmp_path / "kc")),
                "--no-probe", "--kubelet-timeout", "1", "-o", "json", timeout=40)
    took = time.monotonic() - t0
    assert took < 15, took
    doc = json.loads(r.stdout)
    f = next(f for f in doc["findings"] if f["id"] == "kubelet.goroutines_unavailable")
    assert f["evidence"]["status"] == 504
    checks = {c["id"]: c for c in doc["checks"]}
    assert checks["api.kubelet_goroutines"]["status"] == "skipped"
    assert trickler.trickling == 3


def test_worker_pool_exit_does_not_wait_for_stuck_workers():
    """An interrupted caller leaves at once; a `with ThreadPoolExecutor` would wait 5 s."""
    from kubectl_gpudoctor.api.kube import worker_pool
    release, started = threading.Event(), threading.Event()

    def first():
        started.set()
        return release.wait(5)
    with pytest.raises(KeyboardInterrupt):
        with worker_pool(2, "test") as pool:
            running = pool.submit(first)
            queued = [pool.submit(release.wait, 5) for _ in range(3)]
            assert started.wait(30), "the pool never ran the first job"
            raise KeyboardInterrupt
    # it left while the running worker still waits (a waiting exit would find it done)
    assert not running.done()
    assert all(f.cancelled() for f in queued[1:])  # not started: cancelled, never run
    release.set()
    assert running.result(timeout=5) is True

"""Writes the agent's conditions and Events to the API server: stdlib, bounded, never blocking.

Why stdlib: the probe image carries no Kubernetes client (DESIGN.md section 2). Why a thread:
the API server may be slow, unreachable or refusing; the watch loop hands the latest state over
and goes on looking, and this writer catches up. What a real 1.35 API server accepts (captures
k8s-1.35/node-status-writes): `PATCH /api/v1/nodes/<node>/status` with
`application/strategic-merge-patch+json` merges `status.conditions` by `type` (a JSON merge
patch would replace the kubelet's conditions: never used), `POST .../events` answers 201, a
denial by the admission policy is 422 `Invalid` and one by RBAC is 403. Every request has a
deadline and a bounded answer; failures back off exponentially with jitter; the projected token
is re-read for every request because the kubelet rotates it.
"""
from __future__ import annotations

import http.client
import json
import os
import random
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Callable

from node_probe.protocol import conditions

from .events import Correlator, Record

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
PATCH_TYPE = "application/strategic-merge-patch+json"
REQUEST_TIMEOUT_S = 10.0          # per read / connect
REQUEST_TOTAL_S = 20.0            # the whole request: connect, headers and body (W-01/W-02)
MAX_RESPONSE = 4 * 1024 * 1024     # a Node object with its images list fits many times over
MAX_TOKEN = 64 * 1024
BACKOFF_MIN_S = 1.0
BACKOFF_MAX_S = 300.0
COMPONENT = "gpu-doctor-agent"


class ConfigError(Exception):
    pass


class ApiAnswer:
    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.body = body

    def json(self) -> dict:
        try:
            doc = json.loads(self.body)
        except (ValueError, RecursionError):
            return {}
        return doc if isinstance(doc, dict) else {}

    def why(self) -> str:
        doc = self.json()
        msg = doc.get("message") or self.body[:200].decode("utf-8", "replace")
        return conditions.sanitize_message(f"HTTP {self.status} {doc.get('reason', '')}: {msg}",
                                           300)


class ApiClient:
    """HTTPS to the API server with the pod's service-account token (re-read per request)."""

    def __init__(self, host: str, port: int, token_file: Path, ca_file: Path,
                 timeout_s: float = REQUEST_TIMEOUT_S,
                 total_s: float = REQUEST_TOTAL_S) -> None:
        self.host = host.strip("[]")
        self.port = port
        self.token_file = Path(token_file)
        self.timeout_s = timeout_s
        self.total_s = total_s
        try:
            self.ctx = ssl.create_default_context(cafile=str(ca_file))
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot load the API server CA {ca_file}: {exc}") from None

    @classmethod
    def in_cluster(cls, env: dict | None = None, token_file: Path | None = None,
                   ca_file: Path | None = None) -> "ApiClient":
        env = os.environ if env is None else env
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
        if not host or not port or not port.isdigit():
            raise ConfigError("not in a cluster: KUBERNETES_SERVICE_HOST/PORT are not set")
        return cls(host, int(port), token_file or SA_DIR / "token", ca_file or SA_DIR / "ca.crt")

    def _token(self) -> str:
        try:
            fd = os.open(self.token_file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                raw = os.read(fd, MAX_TOKEN + 1)
            finally:
                os.close(fd)
        except OSError as exc:
            raise ConfigError(f"cannot read the token {self.token_file}: {exc.strerror}") from None
        token = raw.decode("ascii", "replace").strip()
        if not token or len(raw) > MAX_TOKEN or any(c in token for c in "\r\n "):
            raise ConfigError(f"the token in {self.token_file} is empty or malformed")
        return token

    def request(self, method: str, path: str, body: dict | list | None = None,
                content_type: str = "application/json") -> ApiAnswer:
        """One request within ONE total deadline (`total_s`: connect, TLS handshake, sending,
        status line, headers and body together) and a per-read timeout; the answer is cut at
        MAX_RESPONSE. A server that trickles a byte every few seconds -- in the headers or
        the body -- is cut at the deadline: a watchdog shuts the socket down, which ends any
        read or write in progress. OSError/ssl errors propagate (the caller backs off)."""
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        token = self._token()
        guard = _Deadline(self.total_s)
        conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout_s,
                                           context=self.ctx)
        try:
            raw = socket.create_connection((self.host, self.port),
                                           timeout=min(self.timeout_s, guard.left()))
            try:
                conn.sock = self.ctx.wrap_socket(raw, server_hostname=self.host,
                                                 do_handshake_on_connect=False)
            except BaseException:
                raw.close()
                raise
            guard.arm(conn.sock)  # the handshake too is within the deadline
            conn.sock.do_handshake()
            headers = {"Authorization": f"Bearer {token}", "Accept": "application/json",
                       "User-Agent": COMPONENT}
            if data is not None:
                headers["Content-Type"] = content_type
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            chunks, size = [], 0
            while size < MAX_RESPONSE:
                chunk = resp.read(min(65536, MAX_RESPONSE - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            if guard.fired:  # a cut body must not pass for a whole one
                raise socket.timeout(f"answer not complete within {self.total_s:g}s")
            return ApiAnswer(resp.status, b"".join(chunks))
        except (OSError, http.client.HTTPException, ValueError):
            if guard.fired:
                raise socket.timeout(f"answer not complete within {self.total_s:g}s") from None
            raise
        finally:
            guard.cancel()
            conn.close()


class _Deadline:
    """A request's one total deadline: when it passes, the armed socket is shut down, which
    wakes a recv/send blocked in http.client or ssl at once (a per-socket timeout is per
    call: a byte every few seconds would keep it alive for ever)."""

    def __init__(self, total_s: float) -> None:
        self.end = time.monotonic() + total_s
        self.fired = False
        self._sock: socket.socket | None = None
        self._timer: threading.Timer | None = None

    def left(self) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            self.fired = True
            raise socket.timeout("no time left for the request")
        return left

    def arm(self, sock: socket.socket) -> None:
        self._sock = sock
        self._timer = threading.Timer(self.left(), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        self.fired = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


def event_body(node: str, node_uid: str | None, namespace: str, reason: str, message: str,
               warning: bool, now: float, count: int = 1, first: float | None = None) -> dict:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    obj = {"kind": "Node", "name": node}
    if node_uid:
        obj["uid"] = node_uid
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{node}.gpu-doctor.", "namespace": namespace},
            "involvedObject": obj, "reason": reason,
            "message": conditions.sanitize_message(message),
            "source": {"component": COMPONENT, "host": node},
            "firstTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(
                now if first is None else first)),
            "lastTimestamp": stamp, "count": count,
            "type": "Warning" if warning else "Normal"}


def event_patch(rec: Record) -> dict:
    """What client-go's recordEvent patches on a repeated Event: count, lastTimestamp and the
    latest message (a strategic merge patch of the Event)."""
    return {"count": rec.count, "message": conditions.sanitize_message(rec.message),
            "lastTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(rec.last))}


class Writer:
    """Background writer. `publish()` never blocks: it replaces the desired conditions and
    records Events in the correlator (events.py); the thread PATCHes when they changed or a
    heartbeat is due, and writes each Event when it changed and its class has a token."""

    def __init__(self, client: ApiClient, node: str, events_namespace: str = "default",
                 heartbeat_s: float = conditions.HEARTBEAT_S,
                 log: Callable[[str], None] = lambda m: None,
                 correlator: Correlator | None = None) -> None:
        self.client = client
        self.node = node
        self.events_namespace = events_namespace
        self.heartbeat_s = heartbeat_s
        self.log = log
        self._cond = threading.Condition()
        self._conditions: Callable[[float], list[dict]] | None = None
        self._dirty = False
        self.correlator = correlator or Correlator()
        self._stop = False
        self._failures = 0
        self._retry_at = 0.0
        self._last_patch = 0.0
        self.node_uid: str | None = None
        self.last_ok: float | None = None
        self.last_error: str | None = None
        self.patches = 0
        self.events_posted = 0
        self.events_patched = 0
        self.errors = 0
        self._thread = threading.Thread(target=self._run, name="watch-writer", daemon=True)

    def start(self) -> "Writer":
        self._thread.start()
        return self

    def read_node(self) -> dict | None:
        """This node as the API server has it (what a new agent adopts), or None when it
        cannot be read (said in the log). Called before the thread writes anything."""
        try:
            ans = self.client.request("GET", f"/api/v1/nodes/{self.node}")
        except (OSError, ConfigError, http.client.HTTPException) as exc:
            self.log(f"cannot read node {self.node}: {type(exc).__name__}: {exc}")
            return None
        if ans.status != 200:
            self.log(f"cannot read node {self.node}: {ans.why()}")
            return None
        doc = ans.json()
        uid = (doc.get("metadata") or {}).get("uid")
        if isinstance(uid, str) and len(uid) <= 64:
            self.node_uid = uid
        return doc

    def publish(self, conds: Callable[[float], list[dict]], events=()) -> None:
        """`conds(heartbeat_time)` builds the conditions; `events`: (class, reason, message,
        warning) occurrences, correlated into one Event per reason."""
        now = time.time()
        with self._cond:
            self._conditions = conds
            self._dirty = True
            for cls, reason, message, warning in events:
                self.correlator.observe(cls, reason, message, warning, now)
            self._cond.notify()

    def stop(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(timeout)

    def flush(self, timeout: float) -> bool:
        """Wait until nothing is pending (tests, shutdown)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self._cond:
                if not self._dirty and not self.correlator.pending():
                    return True
            time.sleep(0.05)
        return False

    # -- the thread ------------------------------------------------------------------------
    def _backoff(self, why: str) -> None:
        self._failures += 1
        self.errors += 1
        self.last_error = why
        base = min(BACKOFF_MAX_S, BACKOFF_MIN_S * 2 ** min(self._failures - 1, 16))
        self._retry_at = time.monotonic() + base * random.uniform(0.5, 1.0)
        self.log(f"API write failed ({why}); next try in {self._retry_at - time.monotonic():.0f}s")

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stop:
                    now = time.monotonic()
                    due = self._conditions is not None and \
                        (self._dirty or now - self._last_patch >= self.heartbeat_s)
                    token_at = self.correlator.next_token_at(now)
                    events_due = token_at is not None and token_at <= now or \
                        (self.correlator.pending() and token_at is None)
                    if (due or events_due) and now >= self._retry_at:
                        break
                    waits = [self._retry_at - now] if now < self._retry_at else []
                    if self._conditions is not None:
                        waits.append(self._last_patch + self.heartbeat_s - now)
                    if token_at is not None:
                        waits.append(token_at - now)
                    self._cond.wait(max(0.05, min(waits)) if waits else None)
                if self._stop:
                    return
                build, dirty = self._conditions, self._dirty
                self._dirty = False
            try:
                ok = self._write(build, dirty)
            except Exception as exc:  # noqa: BLE001 - the writer thread must never die
                ok = False
                self._backoff(f"{type(exc).__name__}: {exc}")
            if not ok:
                with self._cond:
                    self._dirty = self._dirty or dirty

    def _write(self, build, dirty: bool) -> bool:
        now = time.time()
        if build is not None and (dirty or time.monotonic() - self._last_patch
                                  >= self.heartbeat_s):
            try:
                ans = self.client.request(
                    "PATCH", f"/api/v1/nodes/{self.node}/status",
                    {"status": {"conditions": build(now)}}, PATCH_TYPE)
            except (OSError, ConfigError, http.client.HTTPException) as exc:
                self._backoff(f"PATCH node status: {type(exc).__name__}: {exc}")
                return False
            if ans.status != 200:
                # 422 (admission policy) and 403 (RBAC) are not fixed by retrying soon, but the
                # policy or token may be fixed later: the backoff grows to its cap
                self._backoff(f"PATCH node status: {ans.why()}")
                return False
            uid = (ans.json().get("metadata") or {}).get("uid")
            if isinstance(uid, str) and len(uid) <= 64:
                self.node_uid = uid
            self._last_patch = time.monotonic()
            self.patches += 1
        with self._cond:
            due = [(r, r.count, r.last, r.message) for r in self.correlator.take_due()]
        for rec, count, _last, _msg in due:
            if not self._write_event(rec, count):
                return False
        self._failures = 0
        self.last_ok = time.time()
        self.last_error = None
        return True

    def _write_event(self, rec: Record, count: int) -> bool:
        """POST the Event the first time, PATCH its count/lastTimestamp/message after (a 404:
        it expired on the server, so it is created again with the whole count)."""
        base = f"/api/v1/namespaces/{self.events_namespace}/events"
        try:
            if rec.name is not None:
                ans = self.client.request("PATCH", f"{base}/{rec.name}", event_patch(rec),
                                          PATCH_TYPE)
                if ans.status == 404:
                    rec.name = None
                elif ans.status == 200:
                    rec.written = count
                    self.events_patched += 1
                    return True
            if rec.name is None:
                ans = self.client.request(
                    "POST", base, event_body(self.node, self.node_uid, self.events_namespace,
                                             rec.reason, rec.message, rec.warning, rec.last,
                                             count, rec.first), "application/json")
                if ans.status in (200, 201):
                    name = (ans.json().get("metadata") or {}).get("name")
                    rec.name = name if isinstance(name, str) and 0 < len(name) <= 253 \
                        and "/" not in name else None
                    rec.written = count
                    self.events_posted += 1
                    return True
        except (OSError, ConfigError, http.client.HTTPException) as exc:
            self._backoff(f"write event: {type(exc).__name__}: {exc}")
            return False
        self._backoff(f"write event: {ans.why()}")
        if ans.status in (400, 403, 422):  # this one will never be taken: counted as written
            rec.written = count
        return False

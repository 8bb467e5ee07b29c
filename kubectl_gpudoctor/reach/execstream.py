"""Exec a command in a running pod through the API server and stream its stdout, with deadlines.

Why: on a node whose kubelet admits no new pod (seed 000), exec into a pod that is already
running still works (DESIGN.md section 5), so `node X` runs the node probe in the standing
agent's pod instead of creating a debug pod. This is the official client's websocket exec
(`kubernetes.stream`, subprotocol v5/v4.channel.k8s.io: channel 1 stdout, 2 stderr, 3 the final
`Status`), wrapped so that it can never hang and fails as one clear error:
- the connect (TCP, TLS, the upgrade request and every header of its answer) has ONE total
  deadline: the client's create_websocket has no timeout of its own, and websocket-client's
  timeout is per recv, so an answer `101` whose headers came one line a second never ended
  (round-4 audit L-02: `nodes --probe` kept 20 such threads and sockets until exit). The
  request is built by the official client (its auth, its exec URL), the socket is ours: when
  the deadline fires the socket is shut, the connecting thread fails at once, closes it and
  ends; nothing is left behind. The upgrade's answer is read up to HANDSHAKE_MAX bytes, and a
  redirect is not followed. Once one upgrade hung to its deadline, the run's other execs
  through that API server fail at once (Kube.exec_hung) and their callers use a debug pod,
  instead of each waiting its own 10 s (round 5: `nodes --probe` over 20 nodes took 37 s);
- frames are read by reach/frames.py, not by the client's WSClient: every wait is bounded by
  the time left, also while an agent keeps sending, payloads come in pieces of at most 64 KiB
  whatever size a frame announces, and every stdout byte sent before the close is yielded;
- refusals before the upgrade (403 RBAC, 404 pod gone, 400 container not running) are the
  typed errors.ApiError of that status with the API server's message, so the caller can fall
  back to a debug pod;
- the end of the run is read from channel 3: Success, NonZeroExitCode (the probe exits 1 when
  it has findings: not an error), or anything else; a stream that stops without that status
  (connection cut) is errors.StreamBroken.
Closing our side does not stop the process in the container (CRI exec keeps it running); the
probe has its own --timeout for that.
"""
from __future__ import annotations

import dataclasses
import json
import re
import socket
import ssl
import threading
import time
from typing import Any, Iterator, Sequence

from .. import errors
from . import frames

STDOUT, STDERR, ERROR = 1, 2, 3
STDERR_KEEP = 16 * 1024  # bytes of the command's stderr kept for the report
STATUS_KEEP = 64 * 1024  # the final Status is ~300 bytes; more is not read into memory


@dataclasses.dataclass
class ExecEnd:
    """How the command ended, from the Status on channel 3."""

    exit_code: int | None      # None: no status (stream cut, deadline)
    status: dict | None
    stderr_tail: bytes = b""
    protocol: str | None = None

    @property
    def reason(self) -> str:
        st = self.status or {}
        return str(st.get("reason") or st.get("status") or "")


class ExecStream:
    """One exec: `open()`, iterate `chunks()` (stdout bytes as they come), read `end`."""

    def __init__(self, kube: Any, namespace: str, pod: str, container: str,
                 command: Sequence[str], connect_timeout_s: float = 10.0,
                 deadline_s: float = 90.0) -> None:
        self.kube = kube
        self.namespace = namespace
        self.pod = pod
        self.container = container
        self.command = list(command)
        self.connect_timeout_s = connect_timeout_s
        self.deadline_s = deadline_s
        self.client = None
        self.end: ExecEnd | None = None
        self._t0 = 0.0

    # -- connect -------------------------------------------------------------------------
    def open(self) -> "ExecStream":
        from kubernetes import client as kclient

        # every exec its own client over the same config: the request is built on it (the
        # shared Kube's client serves other threads' GETs meanwhile)
        shared = self.kube.api_client if hasattr(self.kube, "api_client") else self.kube._api
        hung = getattr(self.kube, "exec_hung", None)
        if hung:   # an upgrade through this API server already hung: not another 10 s each
            raise errors.ApiUnreachable(
                f"not waiting on the exec into {self.namespace}/{self.pod}: {hung}")
        self._api_client = kclient.ApiClient(shared.configuration)
        self._t0 = time.monotonic()
        deadline = self._t0 + self.connect_timeout_s
        try:
            url, header = self._request()
        except Exception as exc:  # noqa: BLE001 - the client could not even build it
            self.close()
            raise errors.ApiError(f"exec into {self.namespace}/{self.pod} failed: "
                                  f"{_short(exc)}") from None
        dial = _Dial(url, header, self._api_client.configuration, deadline)
        t = threading.Thread(target=dial.run, name="exec-connect", daemon=True)
        t.start()
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            dial.cut()          # the thread's socket op fails now: it closes it and ends
            t.join(CUT_GRACE_S)
            self.close()
            said = (f"no answer to the exec into {self.namespace}/{self.pod} within "
                    f"{self.connect_timeout_s:g}s")
            try:   # the run's later execs (`nodes --probe`: one per node) fail at once
                self.kube.exec_hung = said    # (audit round 5, L-02: 20 nodes took 37 s)
            except AttributeError:
                pass
            raise errors.ApiUnreachable(said)
        if dial.error is not None:
            self.close()
            raise _refusal(dial.error, self.namespace, self.pod) from None
        self.client = dial.connection()
        try:
            self.client.sock.settimeout(max(1.0, self.connect_timeout_s))
        except Exception:  # noqa: BLE001 - a socket without timeouts still has poll() bounds
            pass
        return self

    def _request(self) -> tuple[str, list[str]]:
        """(ws URL, upgrade headers) of this exec as the official client builds it (its auth
        header, refreshed by its token hook; the command as repeated `command=` parameters),
        without sending anything: the client's REST transport (every client version sends
        through it) is swapped for a recorder on this exec's own client."""
        from kubernetes import client as kclient
        from kubernetes.stream import ws_client

        built: dict = {}

        def record(method, url, query_params=None, headers=None, **_kw):
            built.update(url=ws_client.get_websocket_url(url, query_params),
                         headers=dict(headers or {}))
            raise _Built()

        self._api_client.rest_client.request = record
        try:
            kclient.CoreV1Api(self._api_client).connect_get_namespaced_pod_exec(
                self.pod, self.namespace, command=self.command, container=self.container,
                stderr=True, stdin=False, stdout=True, tty=False, _preload_content=False)
        except _Built:
            pass
        hdrs = {k.lower(): v for k, v in built["headers"].items()}
        header = [f"sec-websocket-protocol: {ws_client.V5_CHANNEL_PROTOCOL},"
                  f"{ws_client.V4_CHANNEL_PROTOCOL}"]
        if hdrs.get("authorization"):
            header.insert(0, f"authorization: {hdrs['authorization']}")
        return built["url"], header

    # -- read ----------------------------------------------------------------------------
    def chunks(self) -> Iterator[bytes]:
        """Stdout bytes as they arrive. Ends when the server closes the stream; `end` then
        holds the exit status. Raises errors.StreamBroken on a cut stream or the deadline.

        Frames are read here (frames.py), not by the client's WSClient.update(): that one
        keeps every byte in memory twice (capture_all), concatenates a channel's data
        quadratically, loops for as long as frames keep coming (no deadline while data flows)
        and, through read_channel()'s own update(), buffers output that is then dropped when
        the close frame is seen (issue 21: 174 of 400 records lost behind a slow consumer).
        Here every byte sent before the close is yielded, at most READ_SIZE at a time."""
        c = self.client
        assert c is not None, "open() first"
        deadline = self._t0 + self.deadline_s
        stderr = bytearray()
        status_raw = bytearray()
        closed = False
        try:
            for channel, data in frames.Reader(c.sock).events(deadline):
                if channel == frames.CLOSE:
                    closed = True
                    break
                if channel == STDOUT:
                    yield data
                elif channel == STDERR:
                    stderr += data
                    del stderr[:-STDERR_KEEP]
                elif channel == ERROR and len(status_raw) < STATUS_KEEP:
                    status_raw += data[:STATUS_KEEP - len(status_raw)]
                if time.monotonic() > deadline:  # a slow consumer or a flood: still bounded
                    raise frames.DeadlinePassed()
        except frames.DeadlinePassed:
            raise errors.StreamBroken(
                f"the command in {self.namespace}/{self.pod} did not finish within "
                f"{self.deadline_s:g}s") from None
        except frames.Broken as exc:
            if not status_raw.strip():
                raise errors.StreamBroken(
                    f"the exec stream from {self.namespace}/{self.pod} broke: {exc}") from None
            closed = True  # the Status came; a connection dropped after it lost nothing
        finally:
            self.close(polite=closed)
        status = _parse_status(bytes(status_raw))
        self.end = ExecEnd(_exit_code(status), status, bytes(stderr),
                           getattr(c, "subprotocol", None))
        if status is None:
            raise errors.StreamBroken(
                f"the exec stream from {self.namespace}/{self.pod} ended without an exit "
                f"status (connection cut)")

    def close(self, polite: bool = False) -> None:
        """Shut the socket at once (the client's own close() reads on for up to 3 s, whole
        frames of any size); after the server's close frame, answer it first."""
        c, self.client = self.client, None
        if c is not None:
            ws = getattr(c, "sock", None)
            try:
                c._connected = False
                if ws is not None:
                    if polite and ws.connected:
                        ws.send_close()
                    ws.shutdown()
            except Exception:  # noqa: BLE001 - closing a dead socket
                pass
        api_client, self._api_client = getattr(self, "_api_client", None), None
        if api_client is not None:
            try:
                api_client.close()
            except Exception:  # noqa: BLE001 - its pools hold no state worth an error
                pass


CUT_GRACE_S = 2.0          # a cut connect's thread ends in well under this
HANDSHAKE_MAX = 1 << 20    # bytes of the upgrade's answer read (headers, a refusal's body)


class _Built(Exception):
    """The exec request was built; nothing is sent."""


class _Capped:
    """The connecting socket as websocket-client reads the upgrade's answer through it: at
    most HANDSHAKE_MAX bytes (its header reader has no bound of its own, and it reads a
    refusal's body of any Content-Length)."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self._left = HANDSHAKE_MAX

    def recv(self, n: int) -> bytes:
        if self._left <= 0:
            raise OSError(f"the exec upgrade's answer is longer than {HANDSHAKE_MAX} bytes")
        data = self._sock.recv(min(n, self._left))
        self._left -= len(data)
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class _Dial:
    """One websocket connect under one total deadline, cut from another thread.

    The TCP connection, the TLS handshake (verified as the client's configuration says: its
    CA, client certificate, server name) and the upgrade all run on a socket held here, so
    `cut()` can shut it whatever step is waiting. A configured HTTP proxy is left to
    websocket-client (cut once its socket exists)."""

    def __init__(self, url: str, header: list[str], cfg: Any, deadline: float) -> None:
        import websocket
        self.url, self.header, self.cfg, self.deadline = url, header, cfg, deadline
        self.ws = websocket.WebSocket(skip_utf8_validation=False)
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._sock: Any = None
        self._cut = False

    def _left(self) -> float:
        return max(0.05, self.deadline - time.monotonic())

    def _hold(self, sock: Any) -> None:
        """Publish the socket `cut()` shuts; raise if the deadline already fired."""
        with self._lock:
            self._sock = sock
            if self._cut:
                raise OSError("the exec connect's deadline passed")

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            sock = self._sock if self._sock is not None else getattr(self.ws, "sock", None)
        for s in (getattr(sock, "_sock", sock),):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except (OSError, AttributeError):
                pass

    def run(self) -> None:
        from urllib.parse import urlsplit
        sock = None
        try:
            if self.cfg.proxy:
                self.ws.connect(self.url, header=self.header, timeout=self._left(),
                                redirect_limit=0, **_proxy_options(self.cfg))
                return
            u = urlsplit(self.url)
            secure = u.scheme == "wss"
            sock = socket.create_connection((u.hostname, u.port or (443 if secure else 80)),
                                            timeout=self._left())
            self._hold(sock)
            if secure:
                sock = _tls_context(self.cfg).wrap_socket(
                    sock, server_hostname=self.cfg.tls_server_name or u.hostname,
                    do_handshake_on_connect=False)
                self._hold(sock)
                sock.settimeout(self._left())
                sock.do_handshake()
            sock.settimeout(self._left())
            self.ws.connect(self.url, header=self.header, socket=_Capped(sock),
                            timeout=self._left(), redirect_limit=0)
            self.ws.sock = sock   # the handshake is over: frames are read from the socket
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            self.error = exc
            for s in (sock, getattr(self.ws, "sock", None)):
                try:
                    if s is not None:
                        s.close()
                except OSError:
                    pass

    def connection(self) -> Any:
        """What chunks() and close() read: the websocket, its subprotocol."""
        ws = self.ws
        proto = getattr(ws, "subprotocol", None)
        if not proto:
            proto = next((v for k, v in (ws.getheaders() or {}).items()
                          if k.lower() == "sec-websocket-protocol"), None)
        return _Connection(ws, proto)


@dataclasses.dataclass
class _Connection:
    sock: Any               # the websocket (websocket-client's WebSocket)
    subprotocol: str | None
    _connected: bool = True


def _tls_context(cfg: Any) -> ssl.SSLContext:
    """TLS as the client's configuration says (the same settings its HTTP calls use)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if cfg.verify_ssl:
        if cfg.ssl_ca_cert:
            ctx.load_verify_locations(cafile=cfg.ssl_ca_cert)
        else:
            ctx.load_default_certs()
        ctx.check_hostname = cfg.assert_hostname is not False
    else:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cfg.cert_file:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    return ctx


def _proxy_options(cfg: Any) -> dict:
    from kubernetes.stream import ws_client
    return ws_client.websocket_proxycare({}, cfg, "", {})


def _parse_status(raw: bytes) -> dict | None:
    if not raw.strip():
        return None
    try:
        doc = json.loads(raw.decode("utf-8", "replace"))
    except (ValueError, RecursionError):   # not JSON, or nested past the decoder
        return {"status": "Failure", "message": raw[:300].decode("utf-8", "replace")}
    return doc if isinstance(doc, dict) else None


def _exit_code(status: dict | None) -> int | None:
    if status is None:
        return None
    if status.get("status") == "Success":
        return 0
    if status.get("reason") == "NonZeroExitCode":
        for cause in (status.get("details") or {}).get("causes") or ():
            if cause.get("reason") == "ExitCode":
                try:
                    return int(cause.get("message"))
                except (TypeError, ValueError):
                    return None
    return None


_HANDSHAKE = re.compile(r"Handshake status (\d{3})")


def _refusal(exc: BaseException, namespace: str, pod: str) -> errors.GpuDoctorError:
    """The client wraps a refused upgrade into ApiException(status=0, reason=str(...)); the
    original WebSocketBadStatusException (HTTP status and Status body) is its __context__."""
    inner = exc.__context__ or exc
    code = getattr(inner, "status_code", None)
    body = getattr(inner, "resp_body", None)
    text = str(getattr(exc, "reason", "") or exc)
    if code is None:
        m = _HANDSHAKE.search(text)
        code = int(m.group(1)) if m else None
    if code is None:
        if isinstance(inner, (OSError, ConnectionError)) or "Connection" in type(inner).__name__:
            return errors.ApiUnreachable(
                f"cannot open the exec stream to {namespace}/{pod}: {_short(inner)}")
        return errors.ApiError(f"exec into {namespace}/{pod} failed: {_short(inner)}")
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    err = errors.api_error(int(code), "", body or text[:300],
                           f"/api/v1/namespaces/{namespace}/pods/{pod}/exec")
    return err.about(f"pods/exec in {namespace}/{pod}", "create")


def _short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__

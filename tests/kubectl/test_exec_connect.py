"""The exec connect has one total deadline, upgrade headers included, and leaves nothing behind
(round-4 audit L-02, t4-repro/lf02_exec_headers.py: an API server that answers the upgrade with
`HTTP/1.1 101 Switching Protocols` and then one more header line a second, forever; websocket-
client's timeout is per recv, so the connect never ended and `nodes --probe` over 20 nodes kept
20 abandoned exec-connect threads and their sockets until exit).

The hostile server is a real socket server in this process; the normal path is the suite's
websocket exec fake (tests/kubectl/fakeexec.py), also behind real TLS (the watch tests' CA and
TLS front, tests/watch/fakeapi.py) so the connect's own TLS is checked against a CA.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from kubectl_gpudoctor import errors
from kubectl_gpudoctor.api.kube import Kube
from kubectl_gpudoctor.reach import execstream

from .fakeexec import ExecCluster, PROBE_NS

NODE = "gpu-0001"


class Trickler:
    """Answers every request with 101 and then a header line every `every` seconds."""

    def __init__(self, every: float = 0.2, tls=None) -> None:
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.port = self.srv.getsockname()[1]
        self.tls = tls
        self.every = every
        self.closed_by_peer = threading.Event()
        self.answered = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        try:
            c, _ = self.srv.accept()
        except OSError:
            return
        try:
            if self.tls is not None:
                c = self.tls.wrap_socket(c, server_side=True)
            head = b""
            while b"\r\n\r\n" not in head:
                head += c.recv(65536)
            c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                      b"Connection: Upgrade\r\n")
            self.answered.set()
            for i in range(3000):
                c.sendall(b"X-More-%d: x\r\n" % i)
                time.sleep(self.every)
        except OSError:     # the client shut the connection: what the test waits for
            self.closed_by_peer.set()
        finally:
            c.close()

    def close(self) -> None:
        self.srv.close()


def _kubeconfig(path: Path, server: str, ca: Path | None = None) -> Path:
    cluster = {"server": server}
    if ca is not None:
        cluster["certificate-authority"] = str(ca)
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": {"token": "fake-token"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    return path


def _sockets() -> int:
    n = 0
    for f in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{f}").startswith("socket:")
        except OSError:     # the listing's own descriptor, gone
            pass
    return n


def _connect_threads() -> list:
    return [t for t in threading.enumerate() if t.name == "exec-connect" and t.is_alive()]


@pytest.fixture
def certs(tmp_path):
    from tests.watch.fakeapi import make_ca
    d = tmp_path / "pki"
    d.mkdir()
    return make_ca(d)


@pytest.mark.parametrize("tls", [False, True])
def test_an_upgrade_whose_headers_never_end_is_cut_at_the_deadline(tmp_path, certs, tls):
    import ssl
    ca, crt, key = certs
    ctx = None
    if tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(crt), str(key))
    srv = Trickler(tls=ctx)
    scheme = "https" if tls else "http"
    kube = Kube(str(_kubeconfig(tmp_path / "kc", f"{scheme}://127.0.0.1:{srv.port}",
                                ca if tls else None)))
    before = _sockets()
    ex = execstream.ExecStream(kube, "gpu-doctor", "agent-x", "probe", ["true"],
                               connect_timeout_s=1.5)
    t0 = time.monotonic()
    try:
        with pytest.raises(errors.ApiUnreachable) as ei:
            ex.open()
        assert srv.answered.is_set()              # it was the headers that never ended
        assert time.monotonic() - t0 < 15         # 10x hang guard: the headers go on 10 min
        assert "within 1.5s" in ei.value.one_line()
        assert _connect_threads() == []           # not abandoned: ended
        assert srv.closed_by_peer.wait(10)        # and its socket was shut, not left open
        end = time.monotonic() + 10               # (the server's side closes just after)
        while _sockets() > before and time.monotonic() < end:
            time.sleep(0.05)
        assert _sockets() <= before
    finally:
        srv.close()


def test_exec_over_tls_is_verified_against_the_kubeconfigs_ca(tmp_path, certs):
    """The connect does its own TLS now: the suite's exec fake behind a TLS front with a
    certificate from a test CA. With that CA the exec runs; with another CA it is refused."""
    from tests.watch.fakeapi import TlsFront, make_ca
    ca, crt, key = certs
    xc = ExecCluster()
    xc.namespaces["gpu-doctor"] = {PROBE_NS: "true"}
    xc.add_node(NODE)
    xc.start()
    front = TlsFront(xc.url, crt, key)
    try:
        pod = xc.add_agent_pod(NODE)
        xc.exec_argv = lambda cmd: ["/bin/sh", "-c", "echo hello"]
        url = f"https://127.0.0.1:{front.port}"
        kube = Kube(str(_kubeconfig(tmp_path / "kc", url, ca)))
        ex = execstream.ExecStream(kube, "gpu-doctor", pod["metadata"]["name"], "probe",
                                   ["true"]).open()
        assert b"".join(ex.chunks()) == b"hello\n" and ex.end.exit_code == 0
        other = tmp_path / "other"
        other.mkdir()
        other_ca, _, _ = make_ca(other)
        kube = Kube(str(_kubeconfig(tmp_path / "kc2", url, other_ca)))
        with pytest.raises(errors.ApiUnreachable) as ei:
            execstream.ExecStream(kube, "gpu-doctor", pod["metadata"]["name"], "probe",
                                  ["true"], connect_timeout_s=10).open()
        assert "CERTIFICATE_VERIFY_FAILED" in ei.value.one_line()
        assert _connect_threads() == []
    finally:
        front.close()
        xc.stop()


class _Counting(Trickler):
    """A Trickler that takes any number of connections and counts them."""

    def __init__(self, every: float = 0.2) -> None:
        self.accepted = 0
        super().__init__(every)

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c) -> None:
        try:
            head = b""
            while b"\r\n\r\n" not in head:
                head += c.recv(65536)
            c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n")
            self.answered.set()
            for i in range(3000):
                c.sendall(b"X-More-%d: x\r\n" % i)
                time.sleep(self.every)
        except OSError:
            pass
        finally:
            c.close()


def test_after_one_hung_upgrade_the_runs_other_execs_do_not_wait_again(tmp_path):
    """Round 5 (L-02 still partial): `nodes --probe` over 20 nodes whose exec upgrades hung
    waited 10 s for each (37 s with --timeout 20) before each used a debug pod. The first hung
    upgrade is remembered on the run's client: the next exec fails at once, without a
    connection, and its caller falls back to a debug pod."""
    srv = _Counting()
    kube = Kube(str(_kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{srv.port}")))
    try:
        first = execstream.ExecStream(kube, "gpu-doctor", "agent-a", "probe", ["true"],
                                      connect_timeout_s=1.5)
        with pytest.raises(errors.ApiUnreachable):
            first.open()
        assert srv.accepted == 1 and "within 1.5s" in (kube.exec_hung or "")
        second = execstream.ExecStream(kube, "gpu-doctor", "agent-b", "probe", ["true"],
                                       connect_timeout_s=1.5)
        with pytest.raises(errors.ApiUnreachable) as ei:
            second.open()
        assert "not waiting on the exec into gpu-doctor/agent-b" in ei.value.one_line()
        assert srv.accepted == 1            # no second connection was even made
        assert _connect_threads() == []
    finally:
        srv.close()

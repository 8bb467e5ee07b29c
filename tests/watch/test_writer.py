"""The agent's API writer against the fake API server (real TLS, real http.client), checking
the exact requests a real 1.35 API server accepts (captures k8s-1.35/node-status-writes)."""
from __future__ import annotations

import time

import pytest

from node_probe.protocol import conditions
from node_probe.watch.state import ConditionState, Problem
from node_probe.watch.writer import PATCH_TYPE, ApiClient, ConfigError, Writer, event_body
from tests.watch.fakeapi import capture

NODE = "gpu-node-a"


def _client(api):
    return ApiClient.in_cluster(api.env(), token_file=api.token_file, ca_file=api.ca)


def _wait(pred, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_patch_merges_conditions_by_type_and_keeps_the_kubelets(api):
    api.cluster.add_capture_node(NODE)
    api.bind("tok-a", NODE)
    state = ConditionState(clear_after=2, now=1000.0)
    tr = state.update({"GpuDoctorXidErrors": [Problem("GpuDoctorXidErrors", "gpu.xid",
                                                      "critical", "pci 0000:3b:00.0",
                                                      "Xid 95 x4000")]}, now=1000.0)
    w = Writer(_client(api), NODE).start()
    try:
        w.publish(state.api_conditions, [(t.ctype, t.reason, t.message, True) for t in tr])
        assert w.flush(30)
    finally:
        w.stop()
    (p,) = api.cluster.patches
    assert p["content_type"] == PATCH_TYPE == "application/strategic-merge-patch+json"
    assert list(p["body"]) == ["status"] and list(p["body"]["status"]) == ["conditions"]
    sent = p["body"]["status"]["conditions"]
    assert {c["type"] for c in sent} == set(conditions.OWNED_TYPES)
    for c in sent:  # the captured request's fields, nothing else
        assert set(c) == {"type", "status", "reason", "message", "lastHeartbeatTime",
                          "lastTransitionTime"}
    have = api.cluster.conditions(NODE)
    assert have["Ready"]["reason"] == "KubeletReady"  # merged by type: the kubelet's stay
    assert have["GpuDoctorXidErrors"]["status"] == "True"
    assert have["GpuDoctorXidErrors"]["reason"] == "GpuXid"
    assert have["GpuDoctorWatching"]["status"] == "True"
    assert have["GpuDoctorMemoryThrash"]["status"] == "False"
    assert w.node_uid == api.cluster.nodes[NODE]["metadata"]["uid"]
    (ev,) = api.cluster.posted_events
    want = capture("event-create.201.json")
    for k in ("involvedObject", "reason", "message", "source", "type", "count"):
        assert type(ev[k]) is type(want[k]), k
    assert ev["involvedObject"] == {"kind": "Node", "name": NODE, "uid": w.node_uid}
    assert ev["metadata"]["generateName"] == f"{NODE}.gpu-doctor."
    assert ev["metadata"]["namespace"] == "default" and ev["type"] == "Warning"
    assert ev["source"] == {"component": "gpu-doctor-agent", "host": NODE}


def test_other_node_is_refused_with_422_and_the_writer_backs_off(api):
    api.cluster.add_capture_node(NODE)
    api.cluster.add_capture_node("gpu-node-other")
    api.bind("tok-a", NODE)
    state = ConditionState()
    w = Writer(_client(api), "gpu-node-other").start()
    try:
        w.publish(state.api_conditions)
        assert _wait(lambda: w.errors >= 1)
        time.sleep(1.5)
        # exponential backoff: 1 s (with jitter) after the first failure, then 2 s: at most 2
        assert len(api.cluster.patches) <= 2
    finally:
        w.stop()
    assert "422" in w.last_error and "Invalid" in w.last_error
    assert "may only patch the status of the node its token is bound to" in w.last_error
    assert not any(c.startswith("GpuDoctor") for c in api.cluster.conditions("gpu-node-other"))


def test_token_is_reread_for_each_request(api):
    api.cluster.add_capture_node(NODE)
    api.bind("tok-1", NODE)
    c = _client(api)
    body = {"status": {"conditions": ConditionState().api_conditions(time.time())}}
    assert c.request("PATCH", f"/api/v1/nodes/{NODE}/status", body, PATCH_TYPE).status == 200
    api.bind("tok-2", NODE)          # the kubelet rotated the projected token
    del api.cluster.tokens["tok-1"]  # and the old one expired
    assert c.request("PATCH", f"/api/v1/nodes/{NODE}/status", body, PATCH_TYPE).status == 200
    assert [p["token"] for p in api.cluster.patches] == ["tok-1", "tok-2"]


def test_server_errors_are_retried_and_events_are_not_lost(api):
    api.cluster.add_capture_node(NODE)
    api.bind("tok-a", NODE)
    api.cluster.fail_next = [503, 503]
    w = Writer(_client(api), NODE).start()
    try:
        w.publish(ConditionState().api_conditions, [("agent", "AgentWatching", "started", False)])
        assert w.flush(30)
    finally:
        w.stop()
    assert w.errors == 2 and w.last_error is None
    assert len(api.cluster.posted_events) == 1
    assert api.cluster.conditions(NODE)["GpuDoctorWatching"]["status"] == "True"


def test_a_silent_api_server_does_not_block_publish(api, monkeypatch):
    api.cluster.add_capture_node(NODE)
    api.bind("tok-a", NODE)
    api.front.paused.set()
    c = _client(api)
    c.timeout_s = 0.5
    w = Writer(c, NODE).start()
    try:
        t0 = time.monotonic()
        for i in range(1000):
            w.publish(ConditionState().api_conditions, [("c", f"X{i}", "y", False)])
        assert time.monotonic() - t0 < 1.0  # never waits on the network
        assert _wait(lambda: w.errors >= 1, 10)
        assert "timed out" in w.last_error or "Timeout" in w.last_error
    finally:
        w.stop()
    assert len(w.correlator.records) <= 256  # bounded: the oldest reasons forgotten


def test_bad_in_cluster_env_is_one_clear_error(tmp_path, api):
    with pytest.raises(ConfigError, match="KUBERNETES_SERVICE_HOST"):
        ApiClient.in_cluster({}, token_file=api.token_file, ca_file=api.ca)
    c = _client(api)  # token file missing
    with pytest.raises(ConfigError, match="cannot read the token"):
        c.request("PATCH", "/api/v1/nodes/x/status", {}, PATCH_TYPE)


def test_event_message_is_bounded_and_one_line():
    ev = event_body("n", None, "default", "GpuXid", "a\nb\x1b[31m" + "x" * 5000, True, 0.0)
    assert "\n" not in ev["message"] and "\x1b" not in ev["message"]
    assert len(ev["message"].encode()) <= conditions.MESSAGE_MAX
    assert "uid" not in ev["involvedObject"]


class _Trickle:
    """A TLS server that answers one byte every `gap_s`: the status line and headers
    (`where="headers"`), or fast headers with a 1 MiB Content-Length and then the body, as
    the audit's hostile API server did (security round 4, W-01/W-02: w_agent.py)."""

    def __init__(self, tls_files, where: str, gap_s: float = 0.2) -> None:
        import socket
        import ssl
        import threading
        _, crt, key = tls_files
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(str(crt), str(key))
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.where, self.gap_s, self.done = where, gap_s, threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        try:
            raw, _ = self.sock.accept()
            s = self.ctx.wrap_socket(raw, server_side=True)
            s.recv(65536)
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + b"X-Pad: " + \
                b"a" * 10000 + b"\r\nContent-Length: 1048576\r\n\r\n"
            if self.where == "body":
                s.sendall(head)
                head = b"{" + b" " * 1048575
            for i in range(len(head)):
                if self.done.wait(self.gap_s):
                    break
                s.sendall(head[i:i + 1])
        except OSError:
            pass

    def close(self) -> None:
        self.done.set()
        self.sock.close()


@pytest.mark.parametrize("where", ["headers", "body"])
def test_one_total_deadline_holds_while_bytes_trickle(api, tls_files, where):
    """W-01/W-02: one byte every 0.2 s kept the old writer's request open for hours (the
    socket timeout is per recv, the deadline was checked only between 64 KiB reads). Now the
    request ends at its total deadline, as a timeout, whatever part of the answer trickles."""
    import threading
    srv = _Trickle(tls_files, where)
    api.token_file.write_text("tok-a\n")
    c = ApiClient("127.0.0.1", srv.port, api.token_file, api.ca, timeout_s=10, total_s=1.5)
    out: list = []

    def go():
        try:
            out.append(c.request("GET", "/api/v1/nodes/x"))
        except Exception as exc:  # noqa: BLE001 - what it raised is the result
            out.append(exc)
    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(60)   # a bound for the test, far above the deadline: not a timing measurement
    srv.close()
    assert not t.is_alive(), "the request outlived its deadline"
    (res,) = out
    assert isinstance(res, TimeoutError) and "within 1.5s" in str(res)

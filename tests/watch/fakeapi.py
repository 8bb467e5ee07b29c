"""The fake API server taught the node-status writes of the watching agent, behind real TLS.

Why: the agent's writer must be tested against what a real 1.35 API server does with its
requests (tests/data/captures/k8s-1.35/node-status-writes): a strategic merge patch on
`nodes/<n>/status` merges `status.conditions` by `type` and answers 200 with the whole Node; a
JSON merge patch replaces the list (the capture saw the kubelet's Ready vanish); the agent's own
ServiceAccount patching another node than its token is bound to gets the policy's 422 `Invalid`;
a patch of the node itself (not status) is RBAC's 403; an Event create is 201. Bearer tokens map
to the node their (fake) bound token names, as `request.userInfo.extra
["authentication.kubernetes.io/node-name"]` would. The writer speaks HTTPS only, so a small TLS
terminator (real ssl, a CA the test makes with openssl) forwards to the HTTP fake.
"""
from __future__ import annotations

import copy
import json
import re
import socket
import ssl
import subprocess
import threading
import time
import uuid
from pathlib import Path

import kmock

from tests.kubectl import apiwrites
from tests.kubectl.fakecluster import FakeCluster

CAPTURES = Path(__file__).resolve().parents[1] / "data/captures/k8s-1.35/node-status-writes"
NODE_STATUS = re.compile(r"^/api/v1/nodes/([^/]+)/status$")
NODE = re.compile(r"^/api/v1/nodes/([^/]+)$")
NS_EVENTS = re.compile(r"^/api/v1/namespaces/([^/]+)/events$")
NS_EVENT = re.compile(r"^/api/v1/namespaces/([^/]+)/events/([^/]+)$")
SA_USER = "system:serviceaccount:gpu-doctor:gpu-doctor-agent"
ADMIN_TOKEN = "fake-token"   # FakeCluster.kubeconfig's user
POLICY = "gpu-doctor-agent-own-node"


def capture(name: str) -> dict:
    return json.loads((CAPTURES / name).read_text())


class NodeStatusCluster(FakeCluster):
    """FakeCluster + PATCH nodes/<n>/status, PATCH nodes/<n> (403), POST events (201)."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens: dict[str, str] = {}       # bearer token -> node it is bound to
        self.patches: list[dict] = []          # {"node", "content_type", "body", "token"}
        self.posted_events: list[dict] = []
        self.event_patches: list[dict] = []
        self.fail_next: list[int] = []         # statuses to answer before acting (503 ...)
        self.user_agents: list[str] = []       # of each write (the field manager's name)

    def add_capture_node(self, name: str) -> dict:
        """The captured Node (its kubelet conditions), renamed, without foreign conditions."""
        node = capture("patch-own-node-status.200.json")
        node["metadata"]["name"] = name
        node["metadata"]["uid"] = str(uuid.uuid4())
        node["status"]["conditions"] = [c for c in node["status"]["conditions"]
                                        if c["type"] in ("MemoryPressure", "DiskPressure",
                                                         "PIDPressure", "Ready")]
        self.nodes[name] = node
        return node

    def conditions(self, node: str) -> dict[str, dict]:
        return {c["type"]: c for c in self.nodes[node]["status"].get("conditions") or ()}

    def _denied(self, node: str, message: str) -> kmock.Response:
        msg = (f'nodes "{node}" is forbidden: ValidatingAdmissionPolicy \'{POLICY}\' with '
               f"binding '{POLICY}' denied request: {message}")
        return kmock.Response(status=422, payload={
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": msg, "reason": "Invalid",
            "details": {"name": node, "kind": "nodes", "causes": [{"message": msg.split(
                "is forbidden: ", 1)[1]}]}, "code": 422})

    def _route(self, method, path, q, request):
        if method not in ("PATCH", "POST") or not (NODE_STATUS.match(path) or NODE.match(path)
                                                   or NS_EVENTS.match(path)
                                                   or NS_EVENT.match(path)):
            return super()._route(method, path, q, request)
        auth = request.headers.get("Authorization", "")
        token = auth[len("Bearer "):] if auth.startswith("Bearer ") else ""
        if token == ADMIN_TOKEN:  # the CLI's kubeconfig (a cluster admin): no agent policy
            return super()._route(method, path, q, request)
        if token not in self.tokens:
            return self._status(401, "Unauthorized", "Unauthorized")
        if self.fail_next:
            code = self.fail_next.pop(0)
            return self._status(code, "ServiceUnavailable" if code == 503 else "InternalError",
                                "the server is currently unable to handle the request")
        body = json.loads(request.body or b"{}")
        ctype = request.headers.get("Content-Type", "")
        self.user_agents.append(request.headers.get("User-Agent", ""))
        m = NODE_STATUS.match(path)
        if method == "PATCH" and m:
            return self._patch_status(m.group(1), ctype, body, token)
        m = NODE.match(path)
        if method == "PATCH" and m:
            return kmock.Response(status=403, payload=capture("patch-node-spec-forbidden.403.json"))
        m = NS_EVENTS.match(path)
        if method == "POST" and m:
            return self._create_event(m.group(1), body)
        m = NS_EVENT.match(path)
        if method == "PATCH" and m:
            return self._patch_event(m.group(1), m.group(2), ctype, body)
        return self._status(405, "MethodNotAllowed", "method not allowed")

    def _patch_status(self, name: str, ctype: str, body: dict, token: str):
        self.patches.append({"node": name, "content_type": ctype, "body": body, "token": token})
        if name not in self.nodes:
            return self._status(404, "NotFound", f'nodes "{name}" not found')
        if self.tokens[token] != name:  # the shipped policy, as the capture's 422 words it
            return self._denied(name, "the agent may only patch the status of the node its "
                                      "token is bound to")
        new = (body.get("status") or {}).get("conditions") or []
        if any(not str(c.get("type", "")).startswith("GpuDoctor") for c in new):
            return self._denied(name, "the agent may only write GpuDoctor* conditions")
        code, out = apiwrites.patch_node(self.nodes[name], ctype, body, apiwrites.manager_of(
            self.user_agents[-1] if self.user_agents else ""), True)
        return kmock.Response(status=code, payload=json.dumps(out).encode(),
                              headers={"Content-Type": "application/json"})

    def _patch_event(self, ns: str, name: str, ctype: str, body: dict):
        """A strategic merge patch of an Event (client-go's correlator: count, lastTimestamp,
        message); 404 when it is gone (Events expire after the API server's --event-ttl)."""
        self.event_patches.append({"namespace": ns, "name": name, "body": body})
        ev = next((e for e in self.events if e["metadata"].get("namespace") == ns
                   and e["metadata"].get("name") == name), None)
        if ev is None:
            return self._status(404, "NotFound", f'events "{name}" not found')
        if ctype != "application/strategic-merge-patch+json":
            return self._status(415, "UnsupportedMediaType", "unsupported patch type")
        ev.update(body)
        return self._json(ev)

    def _create_event(self, ns: str, body: dict):
        ev = copy.deepcopy(body)
        meta = ev.setdefault("metadata", {})
        meta["namespace"] = ns
        meta["name"] = meta.get("generateName", "event.") + uuid.uuid4().hex[:5]
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        ev.setdefault("eventTime", None)
        ev.setdefault("reportingComponent", "")
        ev.setdefault("reportingInstance", "")
        self.posted_events.append(ev)
        self.events.append(ev)
        return kmock.Response(status=201, payload=json.dumps(ev).encode(),
                              headers={"Content-Type": "application/json"})


def make_ca(tmp: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 (openssl, EC keys): (ca.crt, crt, key)."""
    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60, cwd=tmp)
    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=fake-kubernetes-ca")
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "srv.key", "-out", "srv.csr", "-subj", "/CN=kube-apiserver")
    (tmp / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:kubernetes.default.svc\n")
    run("x509", "-req", "-in", "srv.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "srv.crt", "-days", "2", "-extfile", "ext.cnf")
    return tmp / "ca.crt", tmp / "srv.crt", tmp / "srv.key"


class TlsFront:
    """Terminates TLS on 127.0.0.1:<port> and pipes each connection to the HTTP fake."""

    def __init__(self, backend_url: str, cert: Path, key: Path) -> None:
        host, port = backend_url.split("//", 1)[1].rsplit(":", 1)
        self.backend = (host, int(port))
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(str(cert), str(key))
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.paused = threading.Event()   # set: accept but never answer (a wedged API server)
        self._stop = False
        threading.Thread(target=self._accept, daemon=True, name="tls-front").start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                raw, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        try:
            raw.settimeout(30)
            tls = self.ctx.wrap_socket(raw, server_side=True)
            if self.paused.is_set():
                time.sleep(60)
                return
            back = socket.create_connection(self.backend, timeout=30)
        except OSError:
            raw.close()
            return

        def pump(src, dst):
            try:
                while True:
                    data = src.recv(65536)
                    if not data:
                        break
                    dst.sendall(data)
            except OSError:
                pass
            finally:
                for s in (src, dst):
                    try:
                        s.close()
                    except OSError:
                        pass
        threading.Thread(target=pump, args=(back, tls), daemon=True).start()
        pump(tls, back)

    def close(self) -> None:
        self._stop = True
        self.sock.close()


def exec_cluster_class():
    """NodeStatusCluster that also serves websocket exec into agent pods (tests/kubectl's
    ExecCluster): one fake API server for the watching agent's writes and the CLI's reads."""
    from tests.kubectl.fakeexec import ExecCluster

    class WatchExecCluster(NodeStatusCluster, ExecCluster):
        pass
    return WatchExecCluster


"""The Kubernetes exec protocol, faithfully, on top of the fake API server (FakeCluster).

Why: `node X` runs the node probe by exec in the standing agent's pod (pods/exec through the
API server). The plugin uses the official client's websocket exec (`kubernetes.stream`), so the
fake must speak what a real API server speaks there:
- GET /api/v1/namespaces/NS/pods/NAME/exec?command=..&command=..&container=C&stdout=true&
  stderr=true&stdin=false&tty=false with `Upgrade: websocket`; the client offers the
  subprotocols `v5.channel.k8s.io,v4.channel.k8s.io` and the server picks the first one it
  supports in the client's order (a 1.29 server knows only v4; 1.30+ v5).
- Refusals happen BEFORE the upgrade, as plain HTTP with a `Status` body: 403 (RBAC: websocket
  exec is authorized as `create` on pods/exec since 1.35, `get` before), 404 (no such pod),
  400 (no such container, container not running).
- After the upgrade, every binary message starts with one channel byte: 1 stdout, 2 stderr,
  3 error. The server first sends an empty message on stdout ("established"), then output as
  it comes, then ONE message on channel 3 holding the final `Status` JSON (v4+): `Success`, or
  `Failure` with reason `NonZeroExitCode` and the code in details.causes[ExitCode], and closes.
- A pod deleted mid-run: the kubelet kills the container's processes; the exec ends with exit
  code 137 on channel 3. A cut stream: the TCP connection drops with no close frame and no
  status. A client that hangs up does NOT kill the process (CRI exec keeps running it).

The "container process" is a real local process: `exec_argv` maps the command the plugin sent
(`python3 -m node_probe ... --host-root /host`) onto this machine (the test's interpreter, a
temp host root), so the agent path runs the real probe against tests/fakes.

The fake also plays the DaemonSet controller for `agent install`: creating the agent DaemonSet
creates one Running agent pod per matching node.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import time
import uuid
from typing import Any, Callable

import aiohttp.web
import kmock

from . import apiwrites
from .fakecluster import ApiHandler, FakeCluster, _match_labels, request_body, status_body, ts

EXEC = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/exec$")
DAEMONSETS = re.compile(r"^/apis/apps/v1/namespaces/([^/]+)/daemonsets$")
DAEMONSET = re.compile(r"^/apis/apps/v1/namespaces/([^/]+)/daemonsets/([^/]+)$")
NAMESPACES = "/api/v1/namespaces"
NAMESPACE = re.compile(r"^/api/v1/namespaces/([^/]+)$")
QUOTAS = re.compile(r"^/api/v1/namespaces/([^/]+)/resourcequotas$")
QUOTA = re.compile(r"^/api/v1/namespaces/([^/]+)/resourcequotas/([^/]+)$")
# the watching agent's identity and its metrics NetworkPolicy: kept by path, written as a real
# API server writes them (apiwrites)
IDENTITY = re.compile(r"^(/api/v1/namespaces/[^/]+/serviceaccounts|/apis/rbac\.authorization"
                      r"\.k8s\.io/v1/clusterroles|/apis/rbac\.authorization\.k8s\.io/v1/"
                      r"clusterrolebindings|/apis/networking\.k8s\.io/v1/namespaces/[^/]+/"
                      r"networkpolicies)(?:/([^/]+))?$")
RESOURCES = {"serviceaccounts": apiwrites.Resource("serviceaccounts"),
             "clusterroles": apiwrites.Resource("clusterroles", "rbac.authorization.k8s.io"),
             "clusterrolebindings": apiwrites.Resource("clusterrolebindings",
                                                       "rbac.authorization.k8s.io"),
             "networkpolicies": apiwrites.Resource("networkpolicies", "networking.k8s.io"),
             "daemonsets.apps": apiwrites.Resource("daemonsets", "apps"),
             "resourcequotas": apiwrites.Resource("resourcequotas")}
STDOUT, STDERR, ERROR = 1, 2, 3
PROBE_NS = "gpu-doctor.io/probe-namespace"  # the label gpu-doctor's own namespace carries


def image_id(image: str) -> str:
    """containerStatuses[].imageID as containerd reports it: <repo>@<manifest digest> for an
    image pulled by digest; the image's config digest for one imported locally (the captures'
    pods)."""
    if "@sha256:" in image:
        name, digest = image.split("@", 1)
        head, _, last = name.rpartition("/")
        repo = f"{head}/{last.split(':')[0]}" if head else last.split(":")[0]
        return f"{repo}@{digest}"
    return "sha256:" + uuid.uuid5(uuid.NAMESPACE_URL, image).hex * 2


def success_status() -> dict:
    return {"metadata": {}, "status": "Success"}


def exit_status(code: int, argv: list[str]) -> dict:
    return {"metadata": {}, "status": "Failure",
            "message": f"command terminated with non-zero exit code: error executing command "
                       f"{argv}, exit code {code}",
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}


class _Handler(ApiHandler):
    """The fake's handler, plus websocket upgrades of pods/exec, which kmock cannot serve."""

    cluster: "ExecCluster"

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        m = EXEC.match(raw_request.path)
        if m:
            return await self.cluster._exec(raw_request, m.group(1), m.group(2))
        if raw_request.path == NAMESPACES:  # kmock's path parser cannot take this one
            return await self.cluster._namespaces(raw_request)
        return await super().__call__(raw_request)


class ExecCluster(FakeCluster):
    def __init__(self) -> None:
        super().__init__()
        self.exec_protocols: tuple[str, ...] = ("v5.channel.k8s.io", "v4.channel.k8s.io")
        # command sent by the plugin -> argv run on this machine (None: run it as sent)
        self.exec_argv: Callable[[list[str]], list[str]] | None = None
        self.exec_env: dict[str, str] = {}
        # "run"; "gone": after exec_cut_after stdout bytes the pod is deleted (exit 137);
        # "cut": after exec_cut_after stdout bytes the TCP connection drops
        self.exec_mode = "run"
        self.exec_cut_after = 1
        self.execs: list[dict] = []          # what each exec asked for, and what it got
        self.exec_procs: list[asyncio.subprocess.Process] = []
        self.daemonsets: dict[tuple[str, str], dict] = {}
        self.objects: dict[str, dict] = {}   # path -> ServiceAccount, RBAC objects
        self.namespace_objects: dict[str, dict] = {}  # name -> Namespace (annotations, owners)
        self.agent_pod_phase = "Running"     # the phase of pods the fake DS controller makes

    def _make_handler(self) -> kmock.RawHandler:
        h = _Handler()
        h.cluster = self
        return h

    def stop(self) -> None:
        """Kill and reap the exec'd processes still running (in the server's loop, so their
        transports close there), then stop the server."""
        async def reap() -> None:
            for p in list(self.exec_procs):
                _kill(p)
                await p.wait()
        if self._loop is not None and self.exec_procs:
            try:
                asyncio.run_coroutine_threadsafe(reap(), self._loop).result(10)
            except Exception:  # noqa: BLE001 - a loop already gone has nothing to reap
                pass
        super().stop()

    # -- agent pods (what the DaemonSet controller would make) ---------------------------
    def add_agent_pod(self, node: str, namespace: str = "gpu-doctor", image: str | None = None,
                      phase: str = "Running", version: str | None = None,
                      template: dict | None = None) -> dict:
        from kubectl_gpudoctor.reach import agent_manifests
        tmpl = template or agent_manifests.daemonset(namespace, image or agent_manifests.default_image())[
            "spec"]["template"]
        spec = json.loads(json.dumps(tmpl["spec"]))
        spec["nodeName"] = node
        labels = dict(tmpl["metadata"]["labels"])
        if version is not None:
            labels["app.kubernetes.io/version"] = version
        if image is not None:
            spec["containers"][0]["image"] = image
        name = f"{agent_manifests.AGENT_NAME}-{uuid.uuid4().hex[:5]}"
        # the pod's controller: the DaemonSet (created here when a test adds agent pods alone)
        ds = self.daemonsets.get((namespace, agent_manifests.AGENT_NAME))
        if ds is None:
            ds = agent_manifests.daemonset(namespace, spec["containers"][0]["image"])
            self.daemonsets[(namespace, agent_manifests.AGENT_NAME)] = ds
        ds["metadata"].setdefault("uid", str(uuid.uuid4()))
        now = ts(__import__("datetime").datetime.now(__import__("datetime").timezone.utc))
        c = spec["containers"][0]
        status: dict = {"phase": phase, "hostIP": "10.188.52.1"}
        if phase == "Running":
            status.update({"startTime": now, "containerStatuses": [{
                "name": c["name"], "ready": True, "restartCount": 0, "image": c["image"],
                "imageID": image_id(c["image"]), "state": {"running": {"startedAt": now}}}]})
        pod = {"kind": "Pod", "apiVersion": "v1",
               "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()),
                            "labels": labels, "creationTimestamp": now,
                            "resourceVersion": "1",
                            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                                 "name": agent_manifests.AGENT_NAME,
                                                 "uid": ds["metadata"]["uid"],
                                                 "controller": True,
                                                 "blockOwnerDeletion": True}]},
               "spec": spec, "status": status}
        self.pods[(namespace, name)] = pod
        self.list_cache.clear()
        return pod

    # -- routes for the agent's objects --------------------------------------------------
    def _route(self, method: str, path: str, q: dict, request: kmock.Request) -> Any:
        body = None
        if method in ("POST", "PUT", "PATCH"):
            raw = request.body
            if request.headers.get("Content-Type", "").startswith(apiwrites.APPLY):
                import yaml
                body = yaml.safe_load(raw)
            else:
                body = json.loads(raw) if raw else None
        m = NAMESPACE.match(path)
        if m and method == "GET":
            if m.group(1) not in self.namespaces:
                return self._status(404, "NotFound", f'namespaces "{m.group(1)}" not found')
            return self._json(self._namespace_object(m.group(1)))
        m = IDENTITY.match(path)
        if m:
            return self._identity(method, m.group(1), m.group(2), body, q, request)
        m = NAMESPACE.match(path)
        if m and method in ("PATCH", "DELETE"):
            return self._namespace_write(method, m.group(1), q, body, request)
        quotas = _ListStore(self.quotas)  # FakeCluster lists them; writes here
        for coll_rx, one_rx, store, kind in ((DAEMONSETS, DAEMONSET, self.daemonsets,
                                              "daemonsets.apps"),
                                             (QUOTAS, QUOTA, quotas, "resourcequotas")):
            m = coll_rx.match(path) if method == "POST" else one_rx.match(path)
            if not m:
                continue
            ns = m.group(1)
            name = body["metadata"]["name"] if method == "POST" else m.group(2)
            key = (ns, name)
            if method == "GET":
                if key not in store:
                    return self._status(404, "NotFound", f'{kind} "{name}" not found')
                obj = apiwrites._public(store[key])
                return self._json(self._ds_status(key, obj) if store is self.daemonsets
                                  else obj)
            if ns not in self.namespaces and method in ("POST", "PATCH"):
                return self._status(404, "NotFound", f'namespaces "{ns}" not found')
            if method == "DELETE":
                self.deleted.append((ns, name, q))
            if q.get("dryRun") == "All":
                self.dry_runs.append((method, path))
            rv = store[key]["metadata"].get("resourceVersion") if key in store else None
            code, out = apiwrites.write(store, key, RESOURCES[kind], name, method, q, body,
                                        request.headers.get("Content-Type", ""),
                                        request.headers.get("User-Agent", ""), namespace=ns)
            if 200 <= code < 300 and q.get("dryRun") != "All" and store is self.daemonsets:
                if method == "DELETE":  # the garbage collector deletes its pods
                    for pk, p in list(self.pods.items()):
                        owners = (p["metadata"].get("ownerReferences") or ())
                        if pk[0] == ns and any(o.get("name") == name and
                                               o.get("kind") == "DaemonSet" for o in owners):
                            del self.pods[pk]
                    self.list_cache.clear()
                elif store[key]["metadata"]["resourceVersion"] != rv:  # new or changed
                    self._run_daemonset(ns, store[key])
            return kmock.Response(status=code, payload=json.dumps(out).encode(),
                                  headers={"Content-Type": "application/json"})
        return super()._route(method, path, q, request)

    def _identity(self, method: str, coll: str, name: str | None, body, q: dict,
                  request: kmock.Request) -> Any:
        name = name or ((body or {}).get("metadata") or {}).get("name")
        key = f"{coll}/{name}"
        res = RESOURCES[coll.rsplit("/", 1)[1]]
        if method == "GET":
            if key not in self.objects:
                return self._status(404, "NotFound", f'{res.qualified} "{name}" not found')
            return self._json(apiwrites._public(self.objects[key]))
        if method == "DELETE":
            self.deleted.append(("", key, q))
        if q.get("dryRun") == "All":
            self.dry_runs.append((method, key if method != "POST" else coll))
        ns = coll.split("/")[-2] if "/namespaces/" in coll else None
        code, out = apiwrites.write(self.objects, key, res, name, method, q, body,
                                    request.headers.get("Content-Type", ""),
                                    request.headers.get("User-Agent", ""), namespace=ns)
        return kmock.Response(status=code, payload=json.dumps(out).encode(),
                              headers={"Content-Type": "application/json"})

    async def _namespaces(self, req: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        for m, rx in self.forbid:
            if m in (req.method, "*") and rx.search(req.path):
                return self._refuse(403, "Forbidden", f'namespaces is forbidden: User "tester" '
                                                      f'cannot {req.method.lower()} resource '
                                                      f'"namespaces"')
        if req.method == "GET":
            return aiohttp.web.json_response({
                "kind": "NamespaceList", "apiVersion": "v1", "metadata": {},
                "items": [{"kind": "Namespace", "apiVersion": "v1",
                           "metadata": {"name": n, "labels": lb}}
                          for n, lb in self.namespaces.items()]})
        if req.method != "POST":
            return self._refuse(405, "MethodNotAllowed", "the server does not allow this method")
        body = await request_body(req)
        name = body["metadata"]["name"]
        if req.query.get("dryRun") == "All":
            self.dry_runs.append(("POST", req.path))
        code, out = self._namespace_store_write("POST", name, dict(req.query), body,
                                                req.headers.get("Content-Type", ""),
                                                req.headers.get("User-Agent", ""))
        return aiohttp.web.json_response(out, status=code)

    def _namespace_object(self, name: str) -> dict:
        obj = apiwrites._public(self.namespace_objects.get(name) or {
            "kind": "Namespace", "apiVersion": "v1", "metadata": {"name": name}})
        obj["metadata"] = {**obj["metadata"], "labels": dict(self.namespaces[name])}
        return obj

    def _namespace_store_write(self, method: str, name: str, q: dict, body, ctype: str,
                               ua: str) -> tuple[int, dict]:
        """Namespaces by apiwrites; `self.namespaces` (name -> labels) follows."""
        if name in self.namespaces and name not in self.namespace_objects:
            self.namespace_objects[name] = {
                "kind": "Namespace", "apiVersion": "v1",
                "metadata": {"name": name, "labels": dict(self.namespaces[name]),
                             "uid": str(uuid.uuid4()), "resourceVersion": "1",
                             "generation": 1},
                "_managers": {"kubectl-client-side-apply": {"op": "Update", "fields": [
                    f"metadata.labels.{k}" for k in self.namespaces[name]]}}}
        code, out = apiwrites.write(self.namespace_objects, name, apiwrites.Resource(
            "namespaces"), name, method, q, body, ctype, ua)
        if 200 <= code < 300 and q.get("dryRun") != "All":
            if name in self.namespace_objects:
                self.namespaces[name] = dict(
                    self.namespace_objects[name]["metadata"].get("labels") or {})
            else:
                self.namespaces.pop(name, None)
        return code, out

    def _namespace_write(self, method: str, name: str, q: dict, body, request) -> Any:
        if q.get("dryRun") == "All":
            self.dry_runs.append((method, f"/api/v1/namespaces/{name}"))
        code, out = self._namespace_store_write(method, name, q, body,
                                                request.headers.get("Content-Type", ""),
                                                request.headers.get("User-Agent", ""))
        return kmock.Response(status=code, payload=json.dumps(out).encode(),
                              headers={"Content-Type": "application/json"})

    def _run_daemonset(self, ns: str, ds: dict) -> None:
        """The DaemonSet controller: one pod per matching node, replacing older pods. A pod
        the probe namespace's admission policy denies is not created: the controller posts
        a FailedCreate Warning on the DaemonSet, worded as captures d01-d05 show."""
        tmpl = ds["spec"]["template"]
        sel = tmpl["spec"].get("nodeSelector") or {}
        for key, p in list(self.pods.items()):
            if key[0] == ns and any(o.get("kind") == "DaemonSet" and
                                    o.get("name") == ds["metadata"]["name"]
                                    for o in p["metadata"].get("ownerReferences") or ()):
                del self.pods[key]
        nodes = [name for name, node in self.nodes.items()
                 if all((node["metadata"].get("labels") or {}).get(k) == v
                        for k, v in sel.items())]
        denied = self._admission_denies(ns, ds, nodes[0]) if nodes else None
        for name in nodes:
            if denied:
                self._failed_create(ns, ds, denied)
            else:
                self.add_agent_pod(name, ns, phase=self.agent_pod_phase, template=tmpl)

    def resync_daemonsets(self) -> None:
        """The controller's next sync (a pod deleted, a node added): every DaemonSet again."""
        for (ns, _), ds in list(self.daemonsets.items()):
            self._run_daemonset(ns, ds)

    def _admission_denies(self, ns: str, ds: dict, node: str) -> tuple[str, str] | None:
        """(policy, first failing message) when a bound probe-namespace policy denies the pod
        the controller would create for `node`; None when admitted or none applies."""
        labels = self.namespaces.get(ns) or {}
        for (res, bname), b in self.admission.items():
            if res != "validatingadmissionpolicybindings":
                continue
            want = ((b.get("spec") or {}).get("matchResources") or {}).get(
                "namespaceSelector", {}).get("matchLabels") or {}
            pol = self.admission.get(("validatingadmissionpolicies",
                                      (b.get("spec") or {}).get("policyName")))
            if pol is None or not all(labels.get(k) == v for k, v in want.items()):
                continue
            rules = ((pol.get("spec") or {}).get("matchConstraints") or {}).get(
                "resourceRules") or ()
            if not any("pods" in (r.get("resources") or ()) for r in rules):
                continue
            from tests.packaging.test_admission_policy import from_daemonset
            pod = from_daemonset(ds, node)
            pod["metadata"]["namespace"] = ns
            ns_obj = self._namespace_object(ns)
            msgs = apiwrites.admission_denials(pol, pod, "system:serviceaccount:kube-system:"
                                               "daemon-set-controller", ns_obj)
            if msgs:
                return pol["metadata"]["name"], bname, msgs[0]
        return None

    def _failed_create(self, ns: str, ds: dict, denied) -> None:
        policy, binding, message = denied
        now = ts(__import__("datetime").datetime.now(__import__("datetime").timezone.utc))
        pod = f"{ds['metadata']['name']}-{uuid.uuid4().hex[:5]}"
        self.events.append({
            "kind": "Event", "apiVersion": "v1",
            "metadata": {"name": f"{ds['metadata']['name']}.{uuid.uuid4().hex[:16]}",
                         "namespace": ns},
            "involvedObject": {"kind": "DaemonSet", "namespace": ns,
                               "name": ds["metadata"]["name"],
                               "uid": ds["metadata"].get("uid"), "apiVersion": "apps/v1"},
            "reason": "FailedCreate",
            "message": f'Error creating: pods "{pod}" is forbidden: ValidatingAdmissionPolicy '
                       f"'{policy}' with binding '{binding}' denied request: {message}",
            "source": {"component": "daemonset-controller"}, "firstTimestamp": now,
            "lastTimestamp": now, "count": 1, "type": "Warning", "eventTime": None,
            "reportingComponent": "daemonset-controller", "reportingInstance": ""})

    def _ds_status(self, key: tuple[str, str], ds: dict) -> dict:
        out = json.loads(json.dumps(ds))
        sel = ",".join(f"{k}={v}" for k, v in ds["spec"]["selector"]["matchLabels"].items())
        pods = [p for (ns, _), p in self.pods.items()
                if ns == key[0] and _match_labels(p["metadata"].get("labels") or {}, sel)]
        ready = sum(1 for p in pods if p["status"].get("phase") == "Running")
        out["status"] = {"currentNumberScheduled": len(pods), "desiredNumberScheduled": len(pods),
                         "numberReady": ready, "numberAvailable": ready,
                         "numberMisscheduled": 0, "observedGeneration": 1,
                         "updatedNumberScheduled": len(pods)}
        return out

    # -- pods/exec over a websocket ------------------------------------------------------
    def _refuse(self, code: int, reason: str, message: str) -> aiohttp.web.Response:
        return aiohttp.web.json_response(status_body(code, reason, message), status=code)

    async def _exec(self, req: aiohttp.web.BaseRequest, ns: str, name: str
                    ) -> aiohttp.web.StreamResponse:
        q = req.query
        command = q.getall("command", [])
        container = q.get("container")
        record = {"namespace": ns, "pod": name, "container": container, "command": command,
                  "params": {k: v for k, v in q.items() if k != "command"},
                  "offered": req.headers.get("Sec-WebSocket-Protocol", ""), "protocol": None,
                  "outcome": None, "t": time.monotonic()}
        self.execs.append(record)
        for m, rx in self.forbid:
            if m in ("GET", "CREATE", "*") and rx.search(req.path):
                record["outcome"] = 403
                return self._refuse(403, "Forbidden",
                                    f'pods "{name}" is forbidden: User "tester" cannot create '
                                    f'resource "pods/exec" in API group "" in the namespace '
                                    f'"{ns}"')
        if req.headers.get("Upgrade", "").lower() != "websocket":
            record["outcome"] = 400
            return self._refuse(400, "BadRequest", "Upgrade request required")
        pod = self.pods.get((ns, name))
        if pod is None:
            record["outcome"] = 404
            return self._refuse(404, "NotFound", f'pods "{name}" not found')
        names = [c["name"] for c in pod["spec"]["containers"]]
        if container is None and len(names) == 1:
            container = names[0]
        if container not in names:
            record["outcome"] = 400
            return self._refuse(400, "BadRequest",
                                f"container {container} is not valid for pod {name}")
        if pod["status"].get("phase") != "Running":
            record["outcome"] = 400
            return self._refuse(400, "BadRequest",
                                f'unable to upgrade connection: container not found '
                                f'("{container}")')
        offered = [p.strip() for p in record["offered"].split(",") if p.strip()]
        chosen = next((p for p in offered if p in self.exec_protocols), None)
        if chosen is None:
            record["outcome"] = 400
            return self._refuse(400, "BadRequest",
                                f"requested protocol(s) are not supported: {offered}; "
                                f"supports {list(self.exec_protocols)}")
        ws = aiohttp.web.WebSocketResponse(protocols=(chosen,), autoping=True)
        await ws.prepare(req)
        record["protocol"] = ws.ws_protocol
        await ws.send_bytes(bytes([STDOUT]))  # "connection established"
        argv = self.exec_argv(list(command)) if self.exec_argv else list(command)
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env={**os.environ, **self.exec_env},
            start_new_session=True)
        self.exec_procs.append(proc)
        sent = {"stdout": 0}
        client_gone = asyncio.Event()

        async def watch_client() -> None:
            async for _msg in ws:  # stdin is off; only control frames and the close arrive
                pass
            client_gone.set()

        async def pump(stream: asyncio.StreamReader, channel: int) -> str | None:
            while True:
                data = await stream.read(65536)
                if not data:
                    return None
                if client_gone.is_set() or ws.closed:
                    continue  # CRI exec keeps running the process; its output goes nowhere
                if channel == STDOUT and self.exec_mode in ("gone", "cut") \
                        and sent["stdout"] + len(data) >= self.exec_cut_after:
                    keep = max(0, self.exec_cut_after - sent["stdout"])
                    if keep:
                        await ws.send_bytes(bytes([channel]) + data[:keep])
                    _kill(proc)  # the other pipe ends now too
                    return self.exec_mode
                await ws.send_bytes(bytes([channel]) + data)
                if channel == STDOUT:
                    sent["stdout"] += len(data)

        watcher = asyncio.ensure_future(watch_client())
        results = await asyncio.gather(pump(proc.stdout, STDOUT), pump(proc.stderr, STDERR))
        try:
            if "cut" in results:
                record["outcome"] = "cut"
                _kill(proc)
                req.transport.abort() if req.transport else None  # no close frame, no status
                return ws
            if "gone" in results:
                record["outcome"] = "gone"
                self.pods.pop((ns, name), None)  # deleted; the kubelet kills its processes
                self.list_cache.clear()
                _kill(proc)
                await proc.wait()
                await ws.send_bytes(bytes([ERROR]) + json.dumps(
                    exit_status(137, command)).encode())
                await ws.close()
                return ws
            rc = await proc.wait()
            record["outcome"] = rc
            if not ws.closed and not client_gone.is_set():
                st = success_status() if rc == 0 else exit_status(rc, command)
                await ws.send_bytes(bytes([ERROR]) + json.dumps(st).encode())
                await ws.close()
            return ws
        finally:
            watcher.cancel()


class _ListStore:
    """FakeCluster keeps ResourceQuotas in a list; this gives it dict access by (ns, name)."""

    def __init__(self, items: list[dict]) -> None:
        self.items = items

    def _find(self, key: tuple[str, str]) -> int | None:
        for i, o in enumerate(self.items):
            if (o["metadata"].get("namespace"), o["metadata"]["name"]) == key:
                return i
        return None

    def __contains__(self, key: tuple[str, str]) -> bool:
        return self._find(key) is not None

    def __getitem__(self, key: tuple[str, str]) -> dict:
        i = self._find(key)
        if i is None:
            raise KeyError(key)
        return self.items[i]

    def __setitem__(self, key: tuple[str, str], obj: dict) -> None:
        obj = json.loads(json.dumps(obj))
        obj["metadata"].setdefault("namespace", key[0])
        i = self._find(key)
        if i is None:
            self.items.append(obj)
        else:
            self.items[i] = obj

    def __delitem__(self, key: tuple[str, str]) -> None:
        i = self._find(key)
        if i is not None:
            del self.items[i]


def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def local_probe_argv(host_root: str, extra: tuple[str, ...] = ()) -> Callable[[list[str]], list[str]]:
    """Map the probe command the plugin sends into the agent onto this machine: this
    interpreter, the test's host root instead of /host."""
    def rewrite(cmd: list[str]) -> list[str]:
        out = list(cmd)
        if out[:1] == ["python3"]:
            out[0] = sys.executable
        return [host_root if a == "/host" else a for a in out] + list(extra)
    return rewrite

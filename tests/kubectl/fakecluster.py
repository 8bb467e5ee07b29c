"""An HTTP-level fake Kubernetes API server for the plugin's tests, built on kmock.

Why: there is no real API server here, and the plugin must be tested through the REAL
kubernetes client (auth headers, URL building, error bodies, streaming) — so the fake sits at
the HTTP boundary. kmock serves HTTP (aiohttp) and records every request; this module adds the
behaviour the plugin relies on: label and field selectors on lists, Status bodies for 404/403
exactly as the API server words them, a debug pod that becomes Running (or never starts, or
cannot pull its image) and whose log streams a recorded probe NDJSON cut at odd byte
boundaries, and the kubelet proxy paths (goroutine dump, healthz, configz).

The server runs in a background thread with its own event loop, so the code under test (sync
client, or the CLI in a subprocess) talks to it over real TCP.
"""
from __future__ import annotations

import asyncio
import base64
import bisect
import datetime as dt
import json
import re
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import aiohttp.web
import kmock

from . import apiwrites, fakewatch

NODE_PROXY = re.compile(r"^/api/v1/nodes/([^/]+)/proxy/(.*)$")
NODE = re.compile(r"^/api/v1/nodes/([^/]+)$")
NODE_STATUS = re.compile(r"^/api/v1/nodes/([^/]+)/status$")
NS_PODS = re.compile(r"^/api/v1/namespaces/([^/]+)/pods$")
POD = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)$")
POD_LOG = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/log$")
NS_EVENTS = re.compile(r"^/api/v1/namespaces/([^/]+)/events$")
LEASE = re.compile(r"^/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/([^/]+)$")
LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
NS_QUOTAS = re.compile(r"^/api/v1/namespaces/([^/]+)/resourcequotas$")
NAMESPACE = re.compile(r"^/api/v1/namespaces/([^/]+)$")
ADMISSION = re.compile(r"^/apis/admissionregistration\.k8s\.io/v1/"
                       r"(validatingadmissionpolicies|validatingadmissionpolicybindings)"
                       r"(?:/([^/]+))?$")
API_GROUP = re.compile(r"^/apis/([^/]+)$")
# a namespaced custom resource (a CRD's list or one object): /apis/GROUP/VERSION/namespaces/NS/PLURAL[/NAME]
CUSTOM = re.compile(r"^/apis/([^/]+)/([^/]+)/namespaces/([^/]+)/([^/]+)(?:/([^/]+))?$")


def ts(t: dt.datetime) -> str:
    return t.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


EXPIRED_CONTINUE = (
    "The provided continue parameter is too old to display a consistent list result. You can "
    "start a new list without the continue parameter, or use the continue token in this "
    "response to retrieve the remainder of the results. Continuing with the provided token "
    "results in an inconsistent list - objects that were created, modified, or deleted between "
    "the time the first chunk was returned and now may show up in the list.")


def status_body(code: int, reason: str, message: str, details: dict | None = None) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "details": details or {}, "code": code}


def _match_labels(labels: dict, selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k.strip()) != v.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _field(obj: dict, dotted: str) -> Any:
    cur: Any = obj
    for part in dotted.split("."):
        cur = (cur or {}).get(part) if isinstance(cur, dict) else None
    return cur


def _obj_key(obj: dict) -> str:
    md = obj.get("metadata") or {}
    return f"{md.get('namespace') or ''}/{md.get('name') or ''}"


def _match_fields(obj: dict, selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        neg = "!=" in term
        k, v = term.split("!=" if neg else "=", 1)
        val = _field(obj, k.strip())
        val = "" if val is None else str(val)
        if (val == v.strip()) == neg:
            return False
    return True


class ApiHandler(kmock.RawHandler):
    """kmock's handler, except the paths its path parser cannot take (cluster-scoped objects
    of another API group): ValidatingAdmissionPolicies and their bindings."""

    cluster: "FakeCluster"

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        m = ADMISSION.match(raw_request.path)
        if m:
            return await self.cluster._admission(raw_request, m.group(1), m.group(2))
        return await super().__call__(raw_request)


async def request_body(req: aiohttp.web.BaseRequest) -> Any:
    """The body as the API server reads it: JSON, or YAML for a server-side apply."""
    raw = await req.read()
    if not raw:
        return None
    if req.headers.get("Content-Type", "").startswith(apiwrites.APPLY):
        import yaml
        return yaml.safe_load(raw)
    return json.loads(raw)


class FakeCluster:
    def __init__(self) -> None:
        self.nodes: dict[str, dict] = {}
        self.pods: dict[tuple[str, str], dict] = {}
        self.events: list[dict] = []
        self.leases: dict[str, dict] = {}
        self.quotas: list[dict] = []  # ResourceQuota objects (status.used as given)
        # other cluster-wide lists by path, e.g. "/apis/resource.k8s.io/v1/resourceslices":
        # (kind of the list, items); a path absent here answers 404 as an unserved API does
        self.lists: dict[str, tuple[str, list[dict]]] = {}
        # single objects by path (a CRD's, e.g. a Kueue ClusterQueue), and the API groups the
        # server serves beyond the core ones: group -> (preferred version, other versions)
        self.objects: dict[str, dict] = {}
        self.api_groups: dict[str, tuple[str, tuple[str, ...]]] = {}
        # namespaced custom resources the server serves (CRDs installed):
        # (group, version, plural) -> {(namespace, name): object}; any other /apis/GROUP/...
        # path answers 404 as a real server does for an API it does not serve
        self.custom: dict[tuple[str, str, str], dict[tuple[str, str], dict]] = {}
        # name -> labels; "gpu-doctor" as deploy/rbac.yaml makes it (the probe namespace)
        self.namespaces: dict[str, dict] = {"default": {}, "gpu-doctor": {
            "gpu-doctor.io/probe-namespace": "true",
            "pod-security.kubernetes.io/enforce": "privileged"}}
        self.goroutines: dict[str, str | int] = {}   # node -> dump text or HTTP status
        self.healthz: dict[str, tuple[int, str]] = {}
        self.configz: dict[str, dict | int] = {}
        self.forbid: list[tuple[str, re.Pattern]] = []  # (method, path regex) -> 403
        # path -> a JSON document served (200) for any GET of it instead of the objects: a
        # hostile or broken API server's answer (wrong types, items that are not objects)
        self.answer: dict[str, Any] = {}
        # what happens to a created debug pod: "run", "pending", "imagepull"
        self.debug_pod_mode = "run"
        # debug_pod_mode "rejected": (status.reason, status.message) of the refusal
        self.reject_with = ("Evicted", "The node had condition: [DiskPressure]. ")
        # the node's / is a private mount: a pod propagating the host root from it cannot
        # start (containerd's CreateContainerError from the 1.35 capture)
        self.root_private = False
        self.log_chunks: list[bytes] = []
        self.log_chunk_delay_s = 0.0
        self.log_hang = False                # keep the log stream open after the chunks
        # per node: the log of a debug pod on that node (else log_chunks), and the nodes whose
        # debug pod log never ends (a node that does not answer)
        self.node_log_chunks: dict[str, list[bytes]] = {}
        self.node_log_hang: set[str] = set()
        self.pod_security_enforce: dict[str, str] = {}  # ns -> level (rejects privileged)
        # ValidatingAdmissionPolicies and bindings: (resource, name) -> object, written as a
        # real 1.35 API server writes them (apiwrites: 409/422, resourceVersions, apply)
        self.admission: dict[tuple[str, str], dict] = {}
        self.serves_admission_v1 = True      # False: an API server before 1.30
        self.dry_runs: list[tuple[str, str]] = []  # writes answered with dryRun=All
        self.slow: dict[str, float] = {}     # path -> seconds to wait before answering
        self.slow_reply: dict[str, float] = {}  # path -> act at once, answer this much later
        self.created: list[dict] = []
        self.deleted: list[tuple[str, str, dict]] = []  # (ns, name, query)
        self.list_cache: dict[tuple, bytes] = {}
        self.continue_expired = False  # answer every continue token with 410 Gone
        self.expire_tokens = 0         # answer the next N continue tokens with 410 Gone
        self.cut_page = 0              # the N-th page served (1-based) ends half way
        self.cut_kind_page: tuple[str, int] | None = None  # (kind, N): see cut_next_page
        self._kind_pages: dict[str, int] = {}  # pages served of each kind
        self.after_page: Any = None    # called with (kind, page number) as each page is made
        self.pages_served = 0
        self._sorted_memo: dict[tuple, tuple[list, list]] = {}  # only with cache_lists
        self.cache_lists = False  # bench: serve lists from pre-encoded bytes (a watch cache)
        # watch-lists (fakewatch.py): the WatchList gate; a stream cut, or ended by an ERROR
        # event, after N events; a stream that trickles; raw lines served instead
        self.watch_list = True
        self.watch_cut_after: int | None = None
        self.watch_error_after: int | None = None
        self.watch_trickle_s = 0.0
        self.watch_event_delay_s = 0.0
        self.watch_lines: Any = None   # an iterable of raw lines
        self.watch_cache: dict[tuple, bytes] = {}
        self.watches_served = self.watches_open = self.watch_left = self.watch_bytes_sent = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None
        self.handler: kmock.RawHandler | None = None
        self.url = ""

    # -- objects --------------------------------------------------------------------------
    def add_node(self, name: str, gpus: int = 8, ready: bool = True, labels: dict | None = None,
                 allocatable_gpus: int | None = None, extra_capacity: dict | None = None,
                 now: dt.datetime | None = None, lease_age_s: float = 5.0) -> dict:
        now = now or dt.datetime.now(dt.timezone.utc)
        cap = {"cpu": "96", "memory": "1056760516Ki", "pods": "110",
               "ephemeral-storage": "1844345660Ki"}
        alloc = {"cpu": "95800m", "memory": "1046172356Ki", "pods": "110",
                 "ephemeral-storage": "1699730862072"}
        if gpus:
            cap["nvidia.com/gpu"] = str(gpus)
            alloc["nvidia.com/gpu"] = str(gpus if allocatable_gpus is None else allocatable_gpus)
        for k, v in (extra_capacity or {}).items():
            cap[k] = alloc[k] = str(v)
        lbl = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}
        if gpus:
            lbl.update({"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": str(gpus),
                        "nvidia.com/gpu.product": "NVIDIA-H20"})
        lbl.update(labels or {})
        node = {
            "kind": "Node", "apiVersion": "v1",
            "metadata": {"name": name, "uid": str(uuid.uuid4()), "labels": lbl,
                         "creationTimestamp": ts(now - dt.timedelta(days=30)),
                         "resourceVersion": "1"},
            "spec": {"podCIDR": "10.244.0.0/24"},
            "status": {
                "capacity": cap, "allocatable": alloc,
                "conditions": [
                    {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"},
                    {"type": "DiskPressure", "status": "False", "reason": "KubeletHasNoDiskPressure"},
                    {"type": "PIDPressure", "status": "False", "reason": "KubeletHasSufficientPID"},
                    {"type": "Ready", "status": "True" if ready else "Unknown",
                     "reason": "KubeletReady" if ready else "NodeStatusUnknown",
                     "lastHeartbeatTime": ts(now - dt.timedelta(seconds=lease_age_s)),
                     "lastTransitionTime": ts(now - dt.timedelta(days=2))}],
                "nodeInfo": {"kubeletVersion": "v1.27.5", "containerRuntimeVersion":
                             "containerd://1.7.13", "kernelVersion": "5.15.0-1078-nvidia",
                             "osImage": "Ubuntu 22.04.5 LTS"},
                "addresses": [{"type": "InternalIP", "address": "10.188.52.1"}],
            },
        }
        self.nodes[name] = node
        self.leases[name] = {
            "kind": "Lease", "apiVersion": "coordination.k8s.io/v1",
            "metadata": {"name": name, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 40,
                     "renewTime": (now - dt.timedelta(seconds=lease_age_s)).strftime(
                         "%Y-%m-%dT%H:%M:%S.%fZ")}}
        return node

    def add_pod(self, namespace: str, name: str, node: str | None, phase: str = "Running",
                gpus: int = 0, age_s: float = 3600, scheduled_age_s: float | None = None,
                now: dt.datetime | None = None, events: str = "normal",
                memory_limit: str | None = "4Gi", deletion_overdue_s: float | None = None,
                extra_status: dict | None = None) -> dict:
        """events: 'normal' (scheduler + kubelet), 'scheduled-only', 'none'."""
        now = now or dt.datetime.now(dt.timezone.utc)
        uid = str(uuid.uuid4())
        created = now - dt.timedelta(seconds=age_s)
        sched = now - dt.timedelta(seconds=scheduled_age_s if scheduled_age_s is not None
                                   else age_s)
        res: dict = {"requests": {"cpu": "1", "memory": "1Gi"}}
        if memory_limit:
            res["limits"] = {"memory": memory_limit}
        if gpus:
            res.setdefault("limits", {})["nvidia.com/gpu"] = str(gpus)
            res["requests"]["nvidia.com/gpu"] = str(gpus)
        md: dict = {"name": name, "namespace": namespace, "uid": uid,
                    "creationTimestamp": ts(created), "resourceVersion": "1",
                    "labels": {"app": name.rsplit("-", 2)[0]}}
        if deletion_overdue_s is not None:
            md["deletionTimestamp"] = ts(now - dt.timedelta(seconds=deletion_overdue_s))
            md["deletionGracePeriodSeconds"] = 30
        status: dict = {"phase": phase, "qosClass": "Burstable"}
        if node:
            status["conditions"] = [{"type": "PodScheduled", "status": "True",
                                     "lastTransitionTime": ts(sched)}]
        if phase == "Running":
            status.update({"hostIP": "10.188.52.1", "podIP": "10.244.0.7",
                           "startTime": ts(sched)})
            status["conditions"] += [
                {"type": t, "status": "True", "lastTransitionTime": ts(sched)}
                for t in ("Initialized", "Ready", "ContainersReady")]
            status["containerStatuses"] = [{
                "name": "main", "ready": True, "restartCount": 0,
                "image": "registry.example/app:1", "imageID": "sha256:abc",
                "state": {"running": {"startedAt": ts(sched)}}}]
        status.update(extra_status or {})
        pod = {"kind": "Pod", "apiVersion": "v1", "metadata": md,
               "spec": {"nodeName": node, "containers": [{
                   "name": "main", "image": "registry.example/app:1", "resources": res}],
                   "restartPolicy": "Always", "schedulerName": "default-scheduler"},
               "status": status}
        if not node:
            del pod["spec"]["nodeName"]
        self.pods[(namespace, name)] = pod
        if node and events in ("normal", "scheduled-only"):
            self.add_event(pod, "Normal", "Scheduled",
                           f"Successfully assigned {namespace}/{name} to {node}",
                           "default-scheduler", sched)
        if node and events == "normal" and phase == "Running":
            for reason, msg in (("Pulled", "Container image already present on machine"),
                                ("Created", "Created container main"),
                                ("Started", "Started container main")):
                self.add_event(pod, "Normal", reason, msg, "kubelet", sched, host=node)
        return pod

    def serve(self, group: str, version: str, plural: str) -> dict:
        """Install a CRD: its list and objects are served from now on (empty at first)."""
        return self.custom.setdefault((group, version, plural), {})

    def add_custom(self, group: str, version: str, plural: str, obj: dict) -> dict:
        """A custom resource as its controller's API writes it (served from then on)."""
        md = obj.setdefault("metadata", {})
        md.setdefault("uid", str(uuid.uuid4()))
        md.setdefault("resourceVersion", "1")
        self.serve(group, version, plural)[(md["namespace"], md["name"])] = obj
        return obj

    def _custom(self, m: "re.Match", q: dict) -> Any:
        group, version, ns, plural, name = m.groups()
        objs = self.custom.get((group, version, plural))
        if objs is None:  # not installed: what a real server answers for an API it lacks
            return self._status(404, "NotFound", "the server could not find the requested "
                                                 "resource")
        if name is None:
            return self._list("List", lambda: [o for (n, _), o in objs.items() if n == ns], q)
        obj = objs.get((ns, name))
        if obj is None:
            return kmock.Response(status=404, payload=status_body(
                404, "NotFound", f'{plural}.{group} "{name}" not found',
                {"name": name, "group": group, "kind": plural}))
        return self._json(obj)

    def add_event(self, pod: dict, type_: str, reason: str, message: str, component: str,
                  when: dt.datetime, host: str | None = None) -> dict:
        md = pod["metadata"]
        ev = {"kind": "Event", "apiVersion": "v1",
              "metadata": {"name": f"{md['name']}.{uuid.uuid4().hex[:16]}",
                           "namespace": md["namespace"]},
              "involvedObject": {"kind": "Pod", "namespace": md["namespace"],
                                 "name": md["name"], "uid": md["uid"], "apiVersion": "v1"},
              "reason": reason, "message": message, "type": type_, "count": 1,
              "source": {"component": component, **({"host": host} if host else {})},
              "firstTimestamp": ts(when), "lastTimestamp": ts(when),
              "reportingComponent": component}
        self.events.append(ev)
        return ev

    def add_quota(self, namespace: str, name: str, hard: dict, used: dict) -> dict:
        q = {"kind": "ResourceQuota", "apiVersion": "v1",
             "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()),
                          "resourceVersion": "1"},
             "spec": {"hard": {k: str(v) for k, v in hard.items()}},
             "status": {"hard": {k: str(v) for k, v in hard.items()},
                        "used": {k: str(v) for k, v in used.items()}}}
        self.quotas.append(q)
        return q

    # -- requests seen ------------------------------------------------------------------------
    def requests(self) -> list[tuple[str, str, dict]]:
        assert self.handler is not None
        return [(str(r.method.value if hasattr(r.method, "value") else r.method).upper(),
                 r.url.path, dict(r.params)) for r in list(self.handler._requests)]

    def count(self, method: str, path_regex: str) -> int:
        rx = re.compile(path_regex)
        return sum(1 for m, p, _ in self.requests() if m == method and rx.fullmatch(p))

    # -- serving -----------------------------------------------------------------------------
    def start(self) -> "FakeCluster":
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)

            async def main() -> None:
                self._stop = asyncio.Event()
                handler = self._make_handler()
                handler << self._dispatch
                self.handler = handler
                async with handler, kmock.Server(handler) as server:
                    self.url = str(server.url).rstrip("/")
                    ready.set()
                    await self._stop.wait()

            loop.run_until_complete(main())
            loop.close()

        self._thread = threading.Thread(target=run, name="fake-apiserver", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fake API server did not start")
        return self

    def _make_handler(self) -> kmock.RawHandler:
        """The kmock handler; subclasses (fakeexec.ExecCluster) intercept websocket paths."""
        h = ApiHandler()
        h.cluster = self
        return h

    async def _admission(self, req: aiohttp.web.BaseRequest, res: str, name: str | None
                         ) -> aiohttp.web.StreamResponse:
        """Cluster-scoped admission policies and bindings: create, get, replace, apply,
        delete, answered as the captures show (apiwrites)."""
        if not self.serves_admission_v1:  # what a 1.29 API server answers for a v1 resource
            return aiohttp.web.json_response(status_body(
                404, "NotFound", "the server could not find the requested resource"),
                status=404)
        for m, rx in self.forbid:
            if m in (req.method, "*") and rx.search(req.path):
                return aiohttp.web.json_response(status_body(
                    403, "Forbidden", f'{res}.admissionregistration.k8s.io is forbidden: User '
                                      f'"tester" cannot {req.method.lower()} resource'), status=403)
        body = await request_body(req) if req.method in ("POST", "PUT", "PATCH") else None
        key_name = name or ((body or {}).get("metadata") or {}).get("name")
        resource = apiwrites.VAP if res == apiwrites.VAP.plural else apiwrites.VAPB
        if req.method == "GET":
            if name is None:
                return aiohttp.web.json_response({
                    "kind": "List", "apiVersion": "admissionregistration.k8s.io/v1",
                    "metadata": {}, "items": [apiwrites._public(o) for (r, _), o in
                                              self.admission.items() if r == res]})
            obj = self.admission.get((res, name))
            if obj is None:
                return aiohttp.web.json_response(apiwrites.status(
                    404, "NotFound", f'{resource.qualified} "{name}" not found',
                    resource.details(name)), status=404)
            return aiohttp.web.json_response(apiwrites._public(obj))
        q = dict(req.query)
        if q.get("dryRun") == "All":
            self.dry_runs.append((req.method, req.path))
        code, out = apiwrites.write(self.admission, (res, key_name), resource, key_name,
                                    req.method, q, body, req.headers.get("Content-Type", ""),
                                    req.headers.get("User-Agent", ""))
        return aiohttp.web.json_response(out, status=code)

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)

    def kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "fake",
               "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
               "users": [{"name": "tester", "user": {"token": "fake-token"}}],
               "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "tester",
                                                          "namespace": namespace}}]}
        path.write_text(json.dumps(cfg))
        return path

    # -- routing -------------------------------------------------------------------------------
    def _dispatch(self, request: kmock.Request) -> Any:
        method = str(request.method.value if hasattr(request.method, "value")
                     else request.method).upper()
        path = request.url.path
        q = dict(request.params)
        fakewatch.REQUEST.set(request)
        for m, rx in self.forbid:
            if m in (method, "*") and rx.search(path):
                return self._status(403, "Forbidden",
                                    f'{path} is forbidden: User "tester" cannot {method.lower()} '
                                    f'resource at this path')
        if method == "GET" and path in self.answer:
            return self._json(self.answer[path])
        if path in self.slow:
            return self._later(self.slow[path], method, path, q, request)
        if path in self.slow_reply:
            return self._reply_later(self.slow_reply[path], method, path, q, request)
        try:
            return self._route(method, path, q, request)
        except KeyError as exc:
            return self._status(404, "NotFound", str(exc.args[0]))

    async def _later(self, delay: float, method: str, path: str, q: dict,
                     request: kmock.Request) -> Any:
        async def act() -> Any:
            await asyncio.sleep(delay)
            return self._route(method, path, q, request)
        # like a real API server, finish the request even if the client hangs up meanwhile
        return await asyncio.shield(asyncio.ensure_future(act()))

    async def _reply_later(self, delay: float, method: str, path: str, q: dict,
                           request: kmock.Request) -> Any:
        """The request takes effect now; its answer is lost in a slow network or webhook."""
        try:
            resp = self._route(method, path, q, request)
        except KeyError as exc:
            resp = self._status(404, "NotFound", str(exc.args[0]))
        await asyncio.sleep(delay)
        return resp

    def _status(self, code: int, reason: str, message: str) -> kmock.Response:
        return kmock.Response(status=code, payload=status_body(code, reason, message))

    def _json(self, doc: Any) -> kmock.Response:
        return kmock.Response(status=200, payload=json.dumps(doc).encode(),
                              headers={"Content-Type": "application/json"})

    def cut_next_page(self, kind: str, n: int) -> None:
        """The n-th page of a `kind` list (e.g. "PodList") served from now on ends half way,
        as a proxy that closed the stream early (other lists' pages are not counted)."""
        self.cut_kind_page = (kind, self._kind_pages.get(kind, 0) + n)

    def _list(self, kind: str, items: Callable[[], list[dict]], q: dict) -> kmock.Response:
        """`items`: what the list holds, built only when the answer is not cached (the bench
        serves 200 pages of 200,000 pods: a copy of the whole list per page was most of the
        fake's CPU, on the cores the CLI it times shares)."""
        if q.get("watch") in ("1", "true"):  # a watch (a streaming list): fakewatch.py
            return fakewatch.answer(self, kind, lambda: self._selected(items, q), q)
        key = (kind, tuple(sorted(q.items())))
        if self.cache_lists and key in self.list_cache:
            return kmock.Response(status=200, payload=self.list_cache[key],
                                  headers={"Content-Type": "application/json"})
        resp = self._list_uncached(kind, items, q)
        if self.cache_lists:
            self.list_cache[key] = resp.payload
        return resp

    def _selected(self, make: Callable[[], list[dict]], q: dict) -> list[dict]:
        """The list's items in key order, its selectors applied (what a watch streams)."""
        items = sorted(make(), key=_obj_key)
        if "labelSelector" in q:
            items = [i for i in items if _match_labels(
                (i.get("metadata") or {}).get("labels") or {}, q["labelSelector"])]
        if "fieldSelector" in q:
            items = [i for i in items if _match_fields(i, q["fieldSelector"])]
        return items

    def _list_uncached(self, kind: str, make: Callable[[], list[dict]],
                       q: dict) -> kmock.Response:
        def selected() -> list[dict]:
            items = make()
            if "labelSelector" in q:
                items = [i for i in items
                         if _match_labels((i.get("metadata") or {}).get("labels") or {},
                                          q["labelSelector"])]
            if "fieldSelector" in q:
                items = [i for i in items if _match_fields(i, q["fieldSelector"])]
            return items

        meta: dict = {"resourceVersion": "1000"}
        limit = int(q.get("limit") or 0)
        # Paging as the API server does it: `limit` pages in key order (namespace/name) with an
        # opaque `continue` token and remainingItemCount. resourceVersion=0 is served from the
        # watch cache, which (before ListFromCacheSnapshot) ignores `limit`: the whole list.
        if (limit > 0 or q.get("continue")) and q.get("resourceVersion") != "0":
            if q.get("continue") and (self.continue_expired or self.expire_tokens):
                # etcd compacted the token's revision: the real server's Status, with a new
                # token for an inconsistent remainder, which client-go's pager never follows
                # (it lists again from the start): handleCompactedErrorForPaging in
                # https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/
                # apiserver/pkg/storage/etcd3/errors.go
                self.expire_tokens = max(0, self.expire_tokens - 1)
                body = status_body(410, "Expired", EXPIRED_CONTINUE)
                del body["details"]
                body["metadata"] = {"continue": base64.b64encode(json.dumps(
                    {"v": "meta.k8s.io/v1", "rv": -1, "start": "inconsistent"}
                ).encode()).decode()}
                return kmock.Response(status=410, payload=body)
            memo_key = (kind, q.get("labelSelector"), q.get("fieldSelector"))
            memo = self._sorted_memo.get(memo_key) if self.cache_lists else None
            if memo is None:  # the bench pages 150,000 pods: sort once while lists are cached
                items = sorted(selected(), key=_obj_key)
                memo = (items, [_obj_key(i) for i in items])
                if self.cache_lists:
                    self._sorted_memo[memo_key] = memo
            items, keys = memo
            start = 0
            if q.get("continue"):
                try:
                    tok = json.loads(base64.b64decode(q["continue"]))
                    start = bisect.bisect_left(keys, tok["start"])
                except (ValueError, KeyError, TypeError):
                    return self._status(400, "BadRequest", "continue key is not valid")
            end = start + limit if limit > 0 else len(items)
            if end < len(items):
                meta["continue"] = base64.b64encode(json.dumps(
                    {"v": "meta.k8s.io/v1", "rv": 1000, "start": _obj_key(items[end])}
                ).encode()).decode()
                meta["remainingItemCount"] = len(items) - end
            items = items[start:end]
            self.pages_served += 1
            self._kind_pages[kind] = nth = self._kind_pages.get(kind, 0) + 1
            body = json.dumps({"kind": kind, "apiVersion": "v1", "metadata": meta,
                               "items": items}).encode()
            if self.after_page is not None:  # the cluster changes while the list is read
                self.after_page(kind, self.pages_served)
            if self.pages_served == self.cut_page or self.cut_kind_page == (kind, nth):
                body = body[:len(body) // 2]  # a proxy that closed the stream early
            return kmock.Response(status=200, payload=body,
                                  headers={"Content-Type": "application/json"})
        return self._json({"kind": kind, "apiVersion": "v1", "metadata": meta,
                           "items": selected()})

    def _route(self, method: str, path: str, q: dict, request: kmock.Request) -> Any:
        if method == "GET":
            if path == "/api/v1/nodes":
                return self._list("NodeList", lambda: list(self.nodes.values()), q)
            m = NODE.match(path)
            if m:
                if m.group(1) not in self.nodes:
                    return self._status(404, "NotFound", f'nodes "{m.group(1)}" not found')
                return self._json(self.nodes[m.group(1)])
            m = NODE_PROXY.match(path)
            if m:
                return self._proxy(m.group(1), m.group(2), q)
            if path == "/api/v1/pods":
                return self._list("PodList", lambda: list(self.pods.values()), q)
            m = NS_PODS.match(path)
            if m:
                return self._list("PodList", lambda: [p for (ns, _), p in self.pods.items()
                                              if ns == m.group(1)], q)
            m = POD.match(path)
            if m:
                pod = self.pods.get((m.group(1), m.group(2)))
                if pod is None:
                    return self._status(404, "NotFound", f'pods "{m.group(2)}" not found')
                self._advance(pod)
                return self._json(pod)
            m = POD_LOG.match(path)
            if m:
                if (m.group(1), m.group(2)) not in self.pods:
                    return self._status(404, "NotFound", f'pods "{m.group(2)}" not found')
                node = (self.pods[(m.group(1), m.group(2))].get("spec") or {}).get("nodeName")
                return kmock.Response(status=200, payload=self._log_stream(node),
                                      headers={"Content-Type": "text/plain"})
            if path == "/api/v1/events":
                return self._list("EventList", lambda: list(self.events), q)
            m = NS_EVENTS.match(path)
            if m:
                return self._list("EventList", lambda: [e for e in self.events
                                                if e["metadata"]["namespace"] == m.group(1)], q)
            m = NS_QUOTAS.match(path)
            if m:
                return self._list("ResourceQuotaList", lambda: [rq for rq in self.quotas if rq["metadata"]
                                                        ["namespace"] == m.group(1)], q)
            m = NAMESPACE.match(path)
            if m:
                if m.group(1) not in self.namespaces:
                    return self._status(404, "NotFound", f'namespaces "{m.group(1)}" not found')
                return self._json({"apiVersion": "v1", "kind": "Namespace", "metadata": {
                    "name": m.group(1), "labels": dict(self.namespaces[m.group(1)])}})
            if path == LEASES:
                return self._list("LeaseList", lambda: list(self.leases.values()), q)
            if path in self.lists:
                return self._list(self.lists[path][0], lambda: list(self.lists[path][1]), q)
            if path in self.objects:
                return self._json(self.objects[path])
            m = API_GROUP.match(path)
            if m and m.group(1) in self.api_groups:
                pref, more = self.api_groups[m.group(1)]
                gv = [{"groupVersion": f"{m.group(1)}/{v}", "version": v} for v in (pref, *more)]
                return self._json({"kind": "APIGroup", "apiVersion": "v1", "name": m.group(1),
                                   "versions": gv, "preferredVersion": gv[0]})
            m = LEASE.match(path)
            if m:
                if m.group(1) not in self.leases:
                    return self._status(404, "NotFound", f'leases "{m.group(1)}" not found')
                return self._json(self.leases[m.group(1)])
            m = CUSTOM.match(path)
            if m:
                return self._custom(m, q)
        if method in ("POST", "DELETE", "PATCH"):
            self.list_cache.clear()
        m = NODE_STATUS.match(path) or NODE.match(path)
        if method == "PATCH" and m:
            return self._patch_node(m.group(1), q, request, path.endswith("/status"))
        if method == "POST":
            m = NS_PODS.match(path)
            if m:
                return self._create_pod(m.group(1), request.data or json.loads(request.body))
        if method == "DELETE":
            m = POD.match(path)
            if m:
                key = (m.group(1), m.group(2))
                self.deleted.append((key[0], key[1], q))
                pod = self.pods.pop(key, None)
                if pod is None:
                    return self._status(404, "NotFound", f'pods "{key[1]}" not found')
                return self._json(pod)
        return self._status(404, "NotFound", f"the server could not find the requested "
                                             f"resource ({method} {path})")

    def _patch_node(self, name: str, q: dict, request: kmock.Request, status: bool) -> Any:
        """A patch of a node's conditions, as a real 1.35 API server applies it (apiwrites
        .patch_node: strategic merge by type, `$patch: delete`, JSON patch test/remove, 422)."""
        if name not in self.nodes:
            return self._status(404, "NotFound", f'nodes "{name}" not found')
        raw = request.body
        body = json.loads(raw) if raw else None
        manager = q.get("fieldManager") or apiwrites.manager_of(
            request.headers.get("User-Agent", ""))
        code, out = apiwrites.patch_node(self.nodes[name], request.headers.get(
            "Content-Type", ""), body, manager, status)
        return kmock.Response(status=code, payload=json.dumps(out).encode(),
                              headers={"Content-Type": "application/json"})

    def _proxy(self, node: str, sub: str, q: dict) -> Any:
        if node not in self.nodes:
            return self._status(404, "NotFound", f'nodes "{node}" not found')
        if sub == "debug/pprof/goroutine":
            dump = self.goroutines.get(node, 404)
            if isinstance(dump, int):
                return kmock.Response(status=dump, payload=b"404 page not found\n",
                                      headers={"Content-Type": "text/plain"})
            return kmock.Response(status=200, payload=dump.encode(),
                                  headers={"Content-Type": "text/plain; charset=utf-8"})
        if sub == "healthz":
            code, text = self.healthz.get(node, (200, "ok"))
            return kmock.Response(status=code, payload=text.encode(),
                                  headers={"Content-Type": "text/plain"})
        if sub == "configz":
            cfg = self.configz.get(node, 404)
            if isinstance(cfg, int):
                return kmock.Response(status=cfg, payload=b"404 page not found\n",
                                      headers={"Content-Type": "text/plain"})
            return self._json({"kubeletconfig": cfg})
        return kmock.Response(status=404, payload=b"404 page not found\n")

    def _create_pod(self, ns: str, body: dict) -> Any:
        if ns not in self.namespaces:
            return self._status(404, "NotFound", f'namespaces "{ns}" not found')
        level = self.pod_security_enforce.get(ns)
        if level and level != "privileged":
            name = body["metadata"]["name"]
            return self._status(
                403, "Forbidden",
                f'pods "{name}" is forbidden: violates PodSecurity "{level}:latest": '
                f'host namespaces (hostNetwork=true, hostPID=true), privileged '
                f'(container "probe" must not set securityContext.privileged=true), '
                f'hostPath volumes (volumes "host-root", "modules", "usr-src", "cgroup", '
                f'"dev", "debugfs")')
        self.created.append(body)
        now = dt.datetime.now(dt.timezone.utc)
        pod = json.loads(json.dumps(body))
        pod["metadata"].update({"uid": str(uuid.uuid4()), "creationTimestamp": ts(now),
                                "resourceVersion": "1"})
        pod["status"] = {"phase": "Pending", "qosClass": "Burstable"}
        pod["_created_mono"] = time.monotonic()
        self.pods[(ns, pod["metadata"]["name"])] = pod
        out = {k: v for k, v in pod.items() if not k.startswith("_")}
        return kmock.Response(status=201, payload=json.dumps(out).encode(),
                              headers={"Content-Type": "application/json"})

    def _advance(self, pod: dict) -> None:
        """The fake kubelet: move a created debug pod along according to debug_pod_mode."""
        if "_created_mono" not in pod:
            return
        age = time.monotonic() - pod["_created_mono"]
        name = pod["spec"]["containers"][0]["name"]
        image = pod["spec"]["containers"][0]["image"]
        if self.root_private and age > 0.2 and _propagates_host_root(pod):
            # containerd on a node whose / is a private mount, exactly as captured
            pod["status"] = json.loads(json.dumps(_private_root_status()))
            for cs in pod["status"]["containerStatuses"]:
                cs.update({"name": name, "image": image})
            return
        if self.debug_pod_mode == "run" and age > 0.2:
            pod["status"] = {"phase": "Running", "hostIP": "10.188.52.1",
                             "startTime": ts(dt.datetime.now(dt.timezone.utc)),
                             "containerStatuses": [{"name": name, "ready": True,
                                                    "restartCount": 0, "image": image,
                                                    "state": {"running": {"startedAt": ts(
                                                        dt.datetime.now(dt.timezone.utc))}}}]}
        elif self.debug_pod_mode == "imagepull" and age > 0.2:
            pod["status"] = {"phase": "Pending", "containerStatuses": [{
                "name": name, "ready": False, "restartCount": 0, "image": image,
                "state": {"waiting": {"reason": "ErrImagePull", "message":
                                      f'rpc error: code = NotFound desc = failed to pull and '
                                      f'unpack image "{image}": not found'}}}]}
        elif self.debug_pod_mode == "rejected" and age > 0.2:
            # kubelet admission refused it (eviction thresholds, OutOfcpu...): Failed, no
            # container status, as a real kubelet reports a nodeName-bound pod it rejects
            reason, message = self.reject_with
            pod["status"] = {"phase": "Failed", "reason": reason, "message": message,
                             "startTime": ts(dt.datetime.now(dt.timezone.utc))}
        # "pending": the wedged kubelet never touches it

    async def _log_stream(self, node: str | None = None):
        for chunk in self.node_log_chunks.get(node or "", self.log_chunks):
            if self.log_chunk_delay_s:
                await asyncio.sleep(self.log_chunk_delay_s)
            yield chunk
        while self.log_hang or node in self.node_log_hang:
            await asyncio.sleep(0.2)
            yield b""


CAPTURES = Path(__file__).resolve().parents[1] / "data" / "captures" / "k8s-1.35"


def _private_root_status() -> dict:
    return json.loads((CAPTURES / "debugpod-private-root-status.json").read_text())["status"]


def _propagates_host_root(pod: dict) -> bool:
    """Does the pod mount the host's / with mount propagation (which needs / shared/slave)?"""
    vols = {v["name"] for v in pod["spec"].get("volumes") or ()
            if (v.get("hostPath") or {}).get("path") == "/"}
    return any(m.get("name") in vols and m.get("mountPropagation") in ("HostToContainer",
                                                                      "Bidirectional")
               for c in pod["spec"].get("containers") or () for m in c.get("volumeMounts") or ())


def cut_odd(data: bytes, sizes=(7, 13, 1, 29, 3, 61, 2, 17)) -> list[bytes]:
    """Split bytes at odd boundaries (mid-line, mid-UTF-8) like a network would."""
    out, i, k = [], 0, 0
    while i < len(data):
        n = sizes[k % len(sizes)]
        out.append(data[i:i + n])
        i += n
        k += 1
    return out


def fatten(pod: dict) -> None:
    """Add the bulk real pods carry (managedFields, projected token volume, tolerations)."""
    md = pod["metadata"]
    md["annotations"] = {"kubectl.kubernetes.io/restartedAt": "2025-07-29T10:00:00Z",
                         "prometheus.io/scrape": "true", "prometheus.io/port": "9400"}
    md["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                              "name": md["name"].rsplit("-", 1)[0], "uid": str(uuid.uuid4()),
                              "controller": True, "blockOwnerDeletion": True}]
    md["managedFields"] = [{"manager": "kube-controller-manager", "operation": "Update",
                            "apiVersion": "v1", "time": md["creationTimestamp"],
                            "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {
                                "f:labels": {".": {}, "f:app": {}},
                                "f:ownerReferences": {".": {}}},
                                "f:spec": {"f:containers": {"k:{\"name\":\"main\"}": {
                                    ".": {}, "f:image": {}, "f:name": {}, "f:resources": {}}}}}},
                           {"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
                            "time": md["creationTimestamp"], "fieldsType": "FieldsV1",
                            "subresource": "status", "fieldsV1": {"f:status": {
                                "f:conditions": {}, "f:containerStatuses": {},
                                "f:hostIP": {}, "f:phase": {}, "f:podIP": {},
                                "f:startTime": {}}}}]
    spec = pod["spec"]
    spec["volumes"] = [{"name": "kube-api-access-x7k2p", "projected": {
        "defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt",
                           "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
                "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}]
    spec["tolerations"] = [
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
         "tolerationSeconds": 300},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
         "tolerationSeconds": 300},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    c = spec["containers"][0]
    c["env"] = [{"name": "MODEL", "value": "llama"}, {"name": "NCCL_DEBUG", "value": "WARN"},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    c["volumeMounts"] = [{"name": "kube-api-access-x7k2p", "readOnly": True,
                          "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]
    c["terminationMessagePath"] = "/dev/termination-log"
    c["terminationMessagePolicy"] = "File"
    c["imagePullPolicy"] = "IfNotPresent"
    spec.update({"dnsPolicy": "ClusterFirst", "serviceAccountName": "default",
                 "terminationGracePeriodSeconds": 30, "priority": 0,
                 "enableServiceLinks": True, "preemptionPolicy": "PreemptLowerPriority"})


def build_fleet(fc: "FakeCluster", nodes: int, pods: int, wedged: tuple[int, ...] = (),
                fat: bool = False, cpu_nodes: int = 0) -> list[str]:
    """`nodes` GPU nodes sharing `pods` running pods; nodes at index `wedged` are seed 000."""
    now = dt.datetime.now(dt.timezone.utc)
    names = [f"gpu-{i:04d}" for i in range(nodes)]
    for n in names:
        fc.add_node(n, now=now)
    for i in range(cpu_nodes):
        fc.add_node(f"cpu-{i:03d}", gpus=0, now=now)
    for i in range(pods):
        node = names[i % nodes]
        p = fc.add_pod(f"team-{i % 40}", f"job-{i:05d}-7d9c8b5f4-x{i % 97:02d}", node,
                       gpus=1 if i % 3 == 0 else 0, now=now,
                       events="normal" if i % 50 == 0 else "none")
        if fat:
            fatten(p)
    for w in wedged:
        n = names[w]
        for k in range(3):
            fc.add_pod("mck-test", f"neal-{w}-{k}", n, phase="Pending", gpus=1, age_s=600,
                       now=now, events="scheduled-only")
        fc.goroutines[n] = __import__("tests.kubectl.kubelet_dump", fromlist=["x"]) \
            .wedged_kubelet_dump(stuck=2, minutes=10)
    return names


# -- black holes (issue 32): a Ready node that rejects every GPU pod sent to it -------------------

# the kubelet's message for the pods ip-10-4-164-212 rejected, quoted in pytorch/ci-infra PR
# #1058 (https://github.com/pytorch/ci-infra/pull/1058; the PR breaks it over five lines for
# reading, the kubelet writes one)
LOST_GPU_ADMISSION = (
    "Allocate failed due to device plugin GetPreferredAllocation rpc failed with err: "
    "rpc error: code = Unknown desc = error getting list of preferred allocation devices: "
    "unable to get device link information: error getting NVLink for devices (0, 1): "
    "failed to get nvlink remote pci info: failed to get nvlink state: GPU is lost, "
    "which is unexpected")
_SUFFIX = "bcdfghjklmnpqrstvwxz2456789"  # generateName's alphabet (apimachinery util/rand)


def generated_name(prefix: str, i: int) -> str:
    s = "".join(_SUFFIX[(i // len(_SUFFIX) ** k) % len(_SUFFIX)] for k in range(5))
    return f"{prefix}-{s}"


def add_black_hole(fc: "FakeCluster", node: str, namespace: str, replicaset: str,
                   rejected: int, gone: int, elsewhere: list[str] = (),
                   message: str = LOST_GPU_ADMISSION, now: dt.datetime | None = None,
                   start: int = 0) -> list[dict]:
    """GPU pods of ReplicaSet `replicaset` that the kubelet on `node` rejected at admission:
    `rejected` still listed (Failed, UnexpectedAdmissionError, with the kubelet's event), `gone`
    more whose controller deleted them (only their events remain, as in PR #1058's 554), and
    one Running pod of the same ReplicaSet on each node of `elsewhere` (started within the
    hour). Rejections every 20 s, the last a minute ago."""
    now = now or dt.datetime.now(dt.timezone.utc)
    made = []
    owner = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": replicaset,
              "uid": str(uuid.uuid4()), "controller": True, "blockOwnerDeletion": True}]
    for k in range(rejected + gone):
        when = now - dt.timedelta(seconds=60 + 20 * k)
        name = generated_name(replicaset, start + k)
        if k < rejected:
            pod = fc.add_pod(namespace, name, node, phase="Failed", gpus=1,
                             age_s=(now - when).total_seconds(), now=now, events="none",
                             extra_status={"reason": "UnexpectedAdmissionError",
                                           "message": "Pod was rejected: " + message,
                                           "startTime": ts(when)})
            pod["metadata"]["ownerReferences"] = owner
            made.append(pod)
        else:  # deleted since: a pod dict only to address its events
            pod = {"metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4())}}
        fc.add_event(pod, "Warning", "UnexpectedAdmissionError", message, "kubelet", when,
                     host=node)
    for i, other in enumerate(elsewhere):
        pod = fc.add_pod(namespace, generated_name(replicaset, start + rejected + gone + i),
                         other, gpus=1, age_s=600, now=now, events="none")
        pod["metadata"]["ownerReferences"] = owner
        made.append(pod)
    return made

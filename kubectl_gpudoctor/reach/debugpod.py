"""The debug pod: its manifest, and a lifecycle that always ends with the pod deleted.

Why: the node probe needs the host's /proc, /dev, cgroups, kernel headers and tracefs, so it runs
in one short-lived privileged pod pinned to the node with `nodeName` (no scheduler: a node
whose GPU resources are broken still gets it). Everything a careful operator would demand is in
the manifest (DESIGN.md sections 2, 7, 9): no service-account token, a deadline the kubelet
enforces even if this client dies, small requests/limits, labels `cleanup` can find, and
read-only host mounts where the probe only reads.

While the pod starts we explain what blocks it (image pull, PodSecurity, RBAC, a kubelet that
never admits it), and the pod is deleted on every path: success, error, timeout, Ctrl-C, SIGTERM.
"""
from __future__ import annotations

import json
import secrets
import signal
import threading
import time
from typing import Any, Callable, Iterator, Mapping, Sequence

from node_probe.protocol.version import __version__

from .. import errors
from ..api.kube import Kube, seg
from .podspec import (APP_LABEL, APP_NAME, CONTAINER, DEFAULT_IMAGE, label_value, node_pod_spec,
                      probe_args, strip_none)

RUN_LABEL = "gpu-doctor/run-id"
NODE_LABEL = "gpu-doctor/node"
IMAGE_PULL_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                      "ErrImageNeverPull")
FATAL_WAIT_REASONS = ("CreateContainerConfigError", "CreateContainerError", "RunContainerError")
# wait_running's first pause; each next one doubles, up to its poll_s: a pod that runs within
# a second is seen within ~0.1-0.3 s of it (a 1 s poll saw it ~1 s after the create), and a
# pod that takes a minute costs 3 more GETs than a steady 1 s poll
FIRST_POLL_S = 0.1


def new_run_id() -> str:
    return secrets.token_hex(4)


def pod_name(node: str, run_id: str) -> str:
    base = "gpu-doctor-" + "".join(ch if ch.isalnum() or ch == "-" else "-"
                                   for ch in node.lower())
    return f"{base[:63 - len(run_id) - 1].rstrip('-')}-{run_id}"


def manifest(node: str, namespace: str, run_id: str, image: str = DEFAULT_IMAGE,
             timeout_s: float = 30.0, trace_s: float = 5.0, focus_pods: Sequence[str] = (),
             deadline_s: int | None = None, extra_args: Sequence[str] = (),
             propagation: str | None = None) -> dict:
    """The Pod manifest (a plain dict, validated against the API schema in tests)."""
    deadline = int(deadline_s or max(120, timeout_s * 3 + 60))
    spec = {"nodeName": node, "restartPolicy": "Never", "activeDeadlineSeconds": deadline,
            "terminationGracePeriodSeconds": 5}
    spec.update(node_pod_spec(image, probe_args(timeout_s, trace_s, node, focus_pods,
                                                extra_args), propagation=propagation))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(node, run_id),
            "namespace": namespace,
            "labels": {APP_LABEL: APP_NAME, RUN_LABEL: run_id, NODE_LABEL: label_value(node),
                       "app.kubernetes.io/component": "node-probe",
                       "app.kubernetes.io/version": __version__},
            "annotations": {"gpu-doctor/node": node,
                            "gpu-doctor/purpose": "read-only GPU node diagnosis; "
                                                  "deleted by the client when done"},
        },
        "spec": spec,
    }


class PodNeverStarted(Exception):
    """The pod stayed Pending (kubelet never admitted it) until the start timeout."""

    def __init__(self, waited_s: float, pod: Mapping[str, Any]) -> None:
        super().__init__(f"debug pod not started after {waited_s:.0f}s")
        self.waited_s = waited_s
        self.pod = pod


class PodRejected(PodNeverStarted):
    """The kubelet refused the pod at admission (phase Failed, no container created):
    DiskPressure/PIDPressure/MemoryPressure, OutOfcpu, OutOfmemory... A finding, not a crash."""


class DebugPod:
    """Create -> wait Running -> follow the log -> delete (always)."""

    def __init__(self, kube: Kube, body: Mapping[str, Any],
                 say: Callable[[str], None] = lambda s: None,
                 timed_say: Callable[..., None] | None = None) -> None:
        self.kube = kube
        self.body = strip_none(dict(body))
        self.namespace = self.body["metadata"]["namespace"]
        self.name = self.body["metadata"]["name"]
        self.node = self.body["spec"]["nodeName"]
        self.say = say
        # says a wait with its deadline (`deadline_s=`): the live status line shows the clock
        self.timed_say = timed_say or (lambda message, **_: say(message))
        self.created = False
        self.in_doubt = False  # POSTed, no answer (Ctrl-C, timeout): the pod may exist
        self.deleted = False
        self.last: dict = {}
        self.notes: list[str] = []  # fallbacks taken on the way (said, and kept for the report)

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{seg(self.namespace)}/pods/{seg(self.name)}"

    def create(self) -> None:
        self.in_doubt = True
        what = f"debug pod {self.namespace}/{self.name}"
        try:
            self.kube.post_json(f"/api/v1/namespaces/{seg(self.namespace)}/pods", self.body)
        except errors.GatewayTimeout as exc:  # no answer in time: the pod may exist (in doubt)
            raise exc.about(what, "create") from None
        except errors.Forbidden as exc:  # an answer: the pod was not created
            self.in_doubt = False
            msg = exc.message
            if "PodSecurity" in msg:
                from .probens import pod_security_hint
                raise errors.PodSecurityRejected(
                    f"Pod Security admission rejected the debug pod in namespace "
                    f"{self.namespace} ({_first_clause(msg)}); "
                    f"{pod_security_hint(self.namespace)}") from None
            raise errors.Forbidden(
                f"not allowed to create pods in namespace {self.namespace}: "
                f"{_first_clause(msg)}; the debug pod needs `create`, `get`, `delete` on "
                f"pods and `get` on pods/log", status=403,
                hint="the gpu-doctor-debug-pod Role grants it: `kubectl gpu-doctor rbac | "
                     "kubectl apply -f -` (by a cluster admin)") from None
        except errors.NotFound:
            self.in_doubt = False
            raise errors.NotFound(f"namespace {self.namespace} not found") from None
        except errors.Conflict:
            self.in_doubt = False
            raise errors.LaunchFailed(f"a pod named {self.name} already exists") from None
        except errors.ApiError as exc:
            self.in_doubt = False
            raise exc.about(what, "create") from None
        # created, whatever a DELETE sent meanwhile (from another thread) was told
        self.created, self.in_doubt, self.deleted = True, False, False
        self.say(f"created debug pod {self.namespace}/{self.name} on {self.node}")

    def wait_running(self, timeout_s: float, poll_s: float = 1.0,
                     cancelled: Callable[[], bool] = lambda: False) -> dict:
        """Poll until the container runs (or already ended). Explains what blocks it. The
        pauses start at FIRST_POLL_S and double up to poll_s."""
        start = time.monotonic()
        said: set[str] = set()
        pause = min(FIRST_POLL_S, poll_s)
        while True:
            try:
                pod = self.kube.get_json(self.path, timeout=10)
            except errors.NotFound:
                raise errors.LaunchFailed(
                    f"debug pod {self.name} disappeared before it ran (deleted, or evicted "
                    f"by activeDeadlineSeconds)") from None
            except errors.ApiError as exc:
                raise exc.about(f"debug pod {self.name}") from None
            self.last = pod
            st = pod.get("status") or {}
            phase = st.get("phase") or "Pending"
            if phase in ("Succeeded", "Failed"):
                cs = container_status(pod)
                if phase == "Failed" and not cs:  # refused at admission (readiness.py)
                    raise PodRejected(time.monotonic() - start, pod)
                return pod
            cs = container_status(pod)
            state = (cs or {}).get("state") or {}
            if "running" in state or "terminated" in state:
                return pod
            waiting = state.get("waiting") or {}
            reason = waiting.get("reason") or ""
            if reason in IMAGE_PULL_REASONS:
                image = self.body["spec"]["containers"][0]["image"]
                raise errors.ImagePullFailed(
                    f"the node cannot pull the probe image {image}: {reason}: "
                    f"{' '.join(str(waiting.get('message') or '').split())[:200]}",
                    hint="push it to a registry the node can reach and pass --image")
            if reason in FATAL_WAIT_REASONS and mount_refused(str(waiting.get("message") or "")) \
                    and self._recreate_without_propagation(str(waiting.get("message") or "")):
                start, pause = time.monotonic(), min(FIRST_POLL_S, poll_s)
                continue
            if reason in FATAL_WAIT_REASONS:
                raise errors.LaunchFailed(
                    f"debug pod cannot start: {reason}: "
                    f"{' '.join(str(waiting.get('message') or '').split())[:200]}")
            key = reason or phase
            if key not in said:
                said.add(key)
                self.timed_say(f"debug pod {self.name} {phase}"
                               f"{' (' + reason + ')' if reason else ''} on {self.node}",
                               deadline_s=timeout_s)
            waited = time.monotonic() - start
            if waited >= timeout_s:
                raise PodNeverStarted(waited, pod)
            if cancelled():
                raise errors.Interrupted("interrupted")
            time.sleep(min(pause, max(0.05, timeout_s - waited)))
            pause = min(poll_s, pause * 2)

    def _recreate_without_propagation(self, message: str) -> bool:
        """The runtime refused the host mount's propagation: delete the pod and create it
        again without propagation (say so). False if there was none to drop."""
        body = without_propagation(self.body)
        if body is None:
            return False
        text = " ".join(message.split())
        text = text[text.find('path "'):] if 'path "' in text else text[-160:]
        note = (f"the node refused mount propagation on the host root ({text[:160]}); "
                f"recreated the debug pod without it")
        self.say(note)
        self.notes.append(note)
        if not self.delete():
            raise errors.LaunchFailed(f"could not delete debug pod {self.name} to recreate it "
                                      f"without mount propagation")
        body["metadata"]["name"] = f"{self.name[:60].rstrip('-')}-np"
        self.body, self.name = body, body["metadata"]["name"]
        self.created = self.deleted = False
        self.create()
        return True

    def follow_log(self, read_timeout_s: float) -> Iterator[bytes]:
        try:
            yield from self.kube.stream(
                f"{self.path}/log", [("container", CONTAINER), ("follow", "true")],
                read_timeout=read_timeout_s)
        except errors.Forbidden as exc:
            raise errors.Forbidden(
                f"not allowed to read the debug pod's log: {_first_clause(exc.message)}; "
                f"the plugin needs `get` on pods/log") from None
        except errors.ApiError as exc:
            raise exc.about(f"log of debug pod {self.name}") from None

    def terminated_reason(self) -> str:
        """Why the container ended (for a log that stopped without a summary); "" if unknown."""
        try:
            p = self.kube.get_json(self.path, timeout=5)
        except errors.GpuDoctorError:
            return ""
        cs = container_status(p) or {}
        t = (cs.get("state") or {}).get("terminated") or {}
        if t:
            return f"container {t.get('reason', 'terminated')}, exit code {t.get('exitCode')}"
        st = p.get("status") or {}
        return str(st.get("reason") or "")

    def delete(self, timeout_s: float = 5.0) -> bool:
        """Delete with grace 0. Idempotent; never raises (it runs in finally and handlers).
        Also sent when the create was never answered: the pod may exist (404 = it does not)."""
        if self.deleted or not (self.created or self.in_doubt):
            return self.deleted
        # A second Ctrl-C must not cut the DELETE short: hold SIGINT/SIGTERM (main thread)
        # until it is sent; they are delivered right after, and still end the run.
        masked = threading.current_thread() is threading.main_thread()
        if masked:
            old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            self.kube.request("DELETE", self.path, [("gracePeriodSeconds", "0")],
                              timeout=timeout_s)
            self.deleted = True
        except errors.NotFound:
            self.deleted = True
        except Exception:  # noqa: BLE001 - reported by the caller via `deleted`
            self.deleted = False
        finally:
            if masked:
                signal.pthread_sigmask(signal.SIG_SETMASK, old)
        return self.deleted


def mount_refused(message: str) -> bool:
    """The runtime refused a mount's propagation (the host path is not a shared/slave mount)."""
    m = message.lower()
    return "not a shared or slave mount" in m or "not a shared mount" in m


def without_propagation(body: Mapping[str, Any]) -> dict | None:
    """A copy of the pod body with no mountPropagation, or None if it had none."""
    new = json.loads(json.dumps(body))
    found = False
    for c in new["spec"].get("containers") or ():
        for m in c.get("volumeMounts") or ():
            if m.pop("mountPropagation", None):
                found = True
    return new if found else None


def container_status(pod: Mapping[str, Any]) -> dict | None:
    for cs in (pod.get("status") or {}).get("containerStatuses") or ():
        if cs.get("name") == CONTAINER:
            return cs
    return None


def _first_clause(msg: str) -> str:
    text = " ".join(str(msg).split())
    return text[:240]


def list_leftovers(kube: Kube, namespace: str | None) -> list[dict]:
    path = "/api/v1/pods" if namespace is None else f"/api/v1/namespaces/{seg(namespace)}/pods"
    try:
        doc = kube.get_json(path, [("labelSelector", f"{APP_LABEL}={APP_NAME},{RUN_LABEL}")])
    except errors.ApiError as exc:
        raise exc.about("gpu-doctor pods", "list") from None
    return list(doc.get("items") or ())


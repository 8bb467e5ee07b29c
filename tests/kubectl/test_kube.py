"""The raw client wrapper: statuses, timeouts and dead servers become the right errors."""
from __future__ import annotations

import pytest

import json
import re

from node_probe.protocol import ExitStatus

from kubectl_gpudoctor import errors
from kubectl_gpudoctor.api.kube import Kube


def test_status_bodies_and_namespace(cluster, kubeconfig):
    cluster.add_node("gpu-1")
    k = Kube(str(kubeconfig))
    assert k.default_namespace == "default"
    assert k.get_json("/api/v1/nodes/gpu-1")["metadata"]["name"] == "gpu-1"
    with pytest.raises(errors.NotFound) as ei:
        k.get_json("/api/v1/nodes/nope")
    assert ei.value.status == 404 and ei.value.message == 'nodes "nope" not found'
    assert ei.value.path == "/api/v1/nodes/nope" and ei.value.reason
    assert ei.value.about("node nope").one_line() == "node nope not found"


def test_slow_kubelet_proxy_is_a_504_not_a_dead_api_server(cluster, kubeconfig):
    cluster.add_node("gpu-1")
    cluster.goroutines["gpu-1"] = "goroutine 1 [running]:\n"
    path = "/api/v1/nodes/gpu-1/proxy/debug/pprof/goroutine"
    cluster.slow[path] = 3.0
    k = Kube(str(kubeconfig))
    with pytest.raises(errors.GatewayTimeout) as ei:
        k.get_text(path, [("debug", "2")], timeout=0.5)
    assert ei.value.status == 504 and "no complete answer within 0.5s" in ei.value.message
    assert k.get_json("/api/v1/nodes/gpu-1")  # the connection pool still works


def test_silent_log_stream_is_stream_broken(cluster, kubeconfig):
    cluster.add_pod("default", "p", "gpu-1")
    cluster.log_chunks = [b'{"a":1}\n']
    cluster.log_hang = True
    k = Kube(str(kubeconfig))
    chunks = []
    with pytest.raises(errors.StreamBroken):
        for c in k.stream("/api/v1/namespaces/default/pods/p/log", [("follow", "true")],
                          read_timeout=2.0):  # the first chunk must beat it on a loaded machine
            chunks.append(c)
    assert b"".join(chunks) == b'{"a":1}\n'


def test_forbidden_from_the_real_server_is_typed_and_worded_for_the_object(cluster, kubeconfig):
    cluster.add_node("gpu-1")
    cluster.forbid.append(("GET", re.compile(r"^/api/v1/nodes/gpu-1$")))
    k = Kube(str(kubeconfig))
    with pytest.raises(errors.Forbidden) as ei:
        k.get_json("/api/v1/nodes/gpu-1")
    exc = ei.value
    assert exc.status == 403 and "cannot get" in exc.message
    worded = exc.about("node gpu-1")
    assert isinstance(worded, errors.Forbidden) and worded.status == 403
    assert worded.one_line().startswith("forbidden to get node gpu-1: ")
    assert errors.exit_status_of(worded) == ExitStatus.CLUSTER_ERROR


@pytest.mark.parametrize("status,cls", [
    (400, errors.BadRequest), (401, errors.Unauthorized), (403, errors.Forbidden),
    (404, errors.NotFound), (409, errors.Conflict), (410, errors.Gone), (422, errors.Invalid),
    (429, errors.TooManyRequests), (500, errors.InternalServerError),
    (503, errors.ServiceUnavailable), (504, errors.GatewayTimeout), (502, errors.ServerError),
    (418, errors.ClientError)])
def test_api_error_is_typed_once_by_status(status, cls):
    body = json.dumps({"kind": "Status", "message": "the message", "code": status})
    exc = errors.api_error(status, "Reason", body, "/api/v1/x")
    assert type(exc) is cls and exc.status == status and exc.message == "the message"
    assert isinstance(exc, errors.ApiError) and isinstance(exc, errors.ClusterError)
    assert isinstance(exc, errors.ServerError if status >= 500 else errors.ClientError)
    assert exc.body == body and exc.path == "/api/v1/x"
    assert type(exc.about("pod a/b")) is cls


def test_api_error_message_from_a_non_status_body():
    exc = errors.api_error(500, "Internal Server Error", "[-]syncloop failed\nhealthz check "
                           "failed\n", "/healthz")
    assert exc.message == "[-]syncloop failed" and "healthz check failed" in exc.body
    assert errors.api_error(503, "Service Unavailable", "", "/x").message == \
        "Service Unavailable"
    assert errors.api_error(401, "Unauthorized", "", "/x").about("node n").one_line() == (
        "unauthorized to get node n (401): Unauthorized; check your kubeconfig credentials")

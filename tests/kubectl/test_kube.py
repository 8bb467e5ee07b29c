"""The raw client wrapper: statuses, timeouts and dead servers become the right errors."""
from __future__ import annotations

import pytest

from kubectl_gpudoctor import errors
from kubectl_gpudoctor.kube import ApiStatus, Kube


def test_status_bodies_and_namespace(cluster, kubeconfig):
    cluster.add_node("gpu-1")
    k = Kube(str(kubeconfig))
    assert k.default_namespace == "default"
    assert k.get_json("/api/v1/nodes/gpu-1")["metadata"]["name"] == "gpu-1"
    with pytest.raises(ApiStatus) as ei:
        k.get_json("/api/v1/nodes/nope")
    assert ei.value.status == 404 and ei.value.message == 'nodes "nope" not found'


def test_slow_kubelet_proxy_is_a_504_not_a_dead_api_server(cluster, kubeconfig):
    cluster.add_node("gpu-1")
    cluster.goroutines["gpu-1"] = "goroutine 1 [running]:\n"
    path = "/api/v1/nodes/gpu-1/proxy/debug/pprof/goroutine"
    cluster.slow[path] = 3.0
    k = Kube(str(kubeconfig))
    with pytest.raises(ApiStatus) as ei:
        k.get_text(path, [("debug", "2")], timeout=0.5)
    assert ei.value.status == 504 and "no answer within 0.5s" in ei.value.message
    assert k.get_json("/api/v1/nodes/gpu-1")  # the connection pool still works


def test_silent_log_stream_is_stream_broken(cluster, kubeconfig):
    cluster.add_pod("default", "p", "gpu-1")
    cluster.log_chunks = [b'{"a":1}\n']
    cluster.log_hang = True
    k = Kube(str(kubeconfig))
    chunks = []
    with pytest.raises(errors.StreamBroken):
        for c in k.stream("/api/v1/namespaces/default/pods/p/log", [("follow", "true")],
                          read_timeout=0.5):
            chunks.append(c)
    assert b"".join(chunks) == b'{"a":1}\n'

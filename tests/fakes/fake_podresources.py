"""A real gRPC server for the kubelet's pod-resources API v1 (PodResourcesLister) on a socket.

Why: the probe reads which pod/container holds which device from the kubelet's
<kubelet-dir>/pod-resources/kubelet.sock; tests serve the real API there with chosen pods.
Use `serve(socket_path, pods)` in-process (returns the grpc server; call .stop(0)), or run it:

    python tests/fakes/fake_podresources.py --socket PATH --pods '[{"namespace": "ml",
        "pod": "train-0", "container": "main", "resource": "nvidia.com/gpu",
        "device_ids": ["GPU-a"]}]' [--hang]

`pods` rows have the "podresources" fact shape; --hang makes List never answer (a wedged
kubelet), to test the deadline.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from concurrent import futures
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import grpc  # noqa: E402

from node_probe.kubeletapi import podresources_v1_pb2 as pb  # noqa: E402
from node_probe.kubeletapi import podresources_v1_pb2_grpc as pbg  # noqa: E402


class FakeLister(pbg.PodResourcesListerServicer):
    def __init__(self, rows: list[dict], hang: bool = False) -> None:
        self.rows = rows
        self.hang = hang
        self.stop = threading.Event()

    def List(self, request, context):
        if self.hang:
            self.stop.wait(60)
        pods: dict[tuple[str, str], pb.PodResources] = {}
        for r in self.rows:
            key = (r["namespace"], r["pod"])
            pod = pods.get(key)
            if pod is None:
                pod = pods[key] = pb.PodResources(name=r["pod"], namespace=r["namespace"])
            cont = next((c for c in pod.containers if c.name == r["container"]), None)
            if cont is None:
                cont = pod.containers.add(name=r["container"])
            cont.devices.add(resource_name=r["resource"], device_ids=r["device_ids"])
        return pb.ListPodResourcesResponse(pod_resources=list(pods.values()))

    def GetAllocatableResources(self, request, context):
        by_res: dict[str, list[str]] = {}
        for r in self.rows:
            by_res.setdefault(r["resource"], []).extend(r["device_ids"])
        return pb.AllocatableResourcesResponse(devices=[
            pb.ContainerDevices(resource_name=k, device_ids=v) for k, v in by_res.items()])


def serve(socket_path: str | os.PathLike, rows: list[dict], hang: bool = False):
    Path(socket_path).parent.mkdir(parents=True, exist_ok=True)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    lister = FakeLister(rows, hang)
    pbg.add_PodResourcesListerServicer_to_server(lister, server)
    server.add_insecure_port(f"unix:{socket_path}")
    server.start()
    orig_stop = server.stop

    def stop(grace=None):
        lister.stop.set()
        return orig_stop(grace)

    server.stop = stop
    return server


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--pods", default="[]")
    ap.add_argument("--hang", action="store_true")
    a = ap.parse_args(argv)
    server = serve(a.socket, json.loads(a.pods), a.hang)
    signal.signal(signal.SIGTERM, lambda *_: server.stop(0))
    print("READY", os.getpid(), flush=True)
    server.wait_for_termination()
    return 0


if __name__ == "__main__":
    sys.exit(main())

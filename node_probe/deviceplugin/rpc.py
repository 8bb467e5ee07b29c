"""The kubelet's side of the device plugin conversation, read-only and with deadlines.

Why: the kubelet calls GetPreferredAllocation with no timeout, so a plugin stuck inside it wedges
pod admission for the whole node (seed 000), silently. The probe makes the same calls the
kubelet makes (GetDevicePluginOptions, the first ListAndWatch reply, GetPreferredAllocation for
a request like the kubelet's), each with a deadline, and reports which one did not answer and
after how long. Never Allocate or PreStartContainer: those change what the plugin hands out.
grpcio is imported lazily so node_probe imports without it.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any

CHANNEL_OPTIONS = (
    ("grpc.enable_http_proxy", 0),          # a unix socket; never via $http_proxy
    ("grpc.max_receive_message_length", 16 << 20),
    ("grpc.enable_retries", 0),
)


def load_grpc():
    """(grpc, pb2, pb2_grpc) for the device plugin API; raises ImportError without grpcio."""
    import grpc  # noqa: F401  (lazy: optional at import time of node_probe)

    from ..kubeletapi import deviceplugin_v1beta1_pb2 as pb
    from ..kubeletapi import deviceplugin_v1beta1_pb2_grpc as pbg
    return grpc, pb, pbg


@dataclasses.dataclass
class RpcOutcome:
    rpc: str
    status: str              # ok | timeout | unavailable | unimplemented | error | skipped
    duration_s: float
    deadline_s: float
    code: str | None = None  # gRPC status code name
    detail: str = ""
    value: Any = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict:
        d = {"rpc": self.rpc, "status": self.status, "duration_s": round(self.duration_s, 3),
             "deadline_s": round(self.deadline_s, 3)}
        if self.code:
            d["code"] = self.code
        if self.detail:
            d["detail"] = self.detail[:300]
        return d


def _classify(grpc, exc) -> tuple[str, str | None, str]:
    code = exc.code() if hasattr(exc, "code") else None
    name = code.name if code is not None else None
    detail = exc.details() if hasattr(exc, "details") else str(exc)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return "timeout", name, detail or ""
    if code == grpc.StatusCode.UNAVAILABLE:
        return "unavailable", name, detail or ""
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return "unimplemented", name, detail or ""
    return "error", name, detail or ""


def unix_channel(grpc, socket_path: str):
    return grpc.insecure_channel("unix:" + socket_path, options=list(CHANNEL_OPTIONS))


def device_dict(dev) -> dict:
    d = {"id": dev.ID, "health": dev.health}
    numa = [n.ID for n in dev.topology.nodes] if dev.HasField("topology") else []
    if numa:
        d["numa"] = numa
    return d


class PluginClient:
    """One plugin socket. Every method returns an RpcOutcome and never raises for RPC errors."""

    def __init__(self, socket_path: str) -> None:
        self.grpc, self.pb, pbg = load_grpc()
        self.socket = socket_path
        self.channel = unix_channel(self.grpc, socket_path)
        self.stub = pbg.DevicePluginStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "PluginClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, name: str, deadline_s: float, fn) -> RpcOutcome:
        t0 = time.monotonic()
        try:
            value = fn(deadline_s)
            return RpcOutcome(name, "ok", time.monotonic() - t0, deadline_s, value=value)
        except self.grpc.RpcError as exc:
            status, code, detail = _classify(self.grpc, exc)
            return RpcOutcome(name, status, time.monotonic() - t0, deadline_s, code, detail)
        except StopIteration:
            return RpcOutcome(name, "error", time.monotonic() - t0, deadline_s, None,
                              "stream ended without a reply")

    def options(self, deadline_s: float) -> RpcOutcome:
        def fn(t):
            o = self.stub.GetDevicePluginOptions(self.pb.Empty(), timeout=t)
            return {"pre_start_required": o.pre_start_required,
                    "get_preferred_allocation_available": o.get_preferred_allocation_available}
        return self._call("GetDevicePluginOptions", deadline_s, fn)

    def first_list(self, deadline_s: float) -> RpcOutcome:
        """The first ListAndWatch reply (the device list), then the stream is cancelled."""
        def fn(t):
            stream = self.stub.ListAndWatch(self.pb.Empty(), timeout=t)
            try:
                first = next(stream)
            finally:
                stream.cancel()
            return [device_dict(d) for d in first.devices]
        return self._call("ListAndWatch", deadline_s, fn)

    def preferred_allocation(self, available: list[str], size: int, deadline_s: float,
                             must_include: list[str] = ()) -> RpcOutcome:
        def fn(t):
            req = self.pb.PreferredAllocationRequest(container_requests=[
                self.pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available),
                    must_include_deviceIDs=list(must_include), allocation_size=size)])
            resp = self.stub.GetPreferredAllocation(req, timeout=t)
            return [list(c.deviceIDs) for c in resp.container_responses]
        return self._call("GetPreferredAllocation", deadline_s, fn)


def plausible_request(devices: list[dict]) -> tuple[list[str], int] | None:
    """What the kubelet would send for a one-device container: every healthy device is
    available, one is wanted. None when the plugin lists no healthy device."""
    healthy = [d["id"] for d in devices if d.get("health") == "Healthy"]
    if not healthy:
        return None
    return healthy, 1

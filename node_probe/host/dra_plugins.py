"""kubelet plugin registrations (plugins_registry) and read-only calls to DRA plugins.

Why: a DRA driver's kubelet plugin registers through a socket in <kubelet-dir>/plugins_registry
and serves NodePrepareResources on the endpoint it names (usually
<kubelet-dir>/plugins/<driver>/dra.sock). When that process hangs or is gone, the kubelet's
Prepare calls time out and pods stay ContainerCreating (or block admission). The probe asks only
what the kubelet asks at registration (`GetInfo` of pluginregistration v1) and a gRPC health
check on the endpoint; any answer, even UNIMPLEMENTED, proves the server is serving. Never
Prepare/Unprepare. The two tiny messages are encoded by hand (protobuf wire format), so no
generated stubs are needed.
"""
from __future__ import annotations

import dataclasses
import os
import stat
import time
from pathlib import Path

GET_INFO = "/pluginregistration.Registration/GetInfo"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
CHANNEL_OPTIONS = (("grpc.enable_http_proxy", 0), ("grpc.enable_retries", 0),
                   ("grpc.max_receive_message_length", 1 << 20))
MAX_SOCKETS = 64
DEFAULT_KUBELET_DIR = "/var/lib/kubelet"


def _varint(data: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if i >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


def decode_fields(data: bytes) -> dict[int, list]:
    """Protobuf wire format -> {field number: [values]} (length-delimited values as bytes)."""
    out: dict[int, list] = {}
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            v, i = _varint(data, i)
        elif wire == 2:
            n, i = _varint(data, i)
            if i + n > len(data):
                raise ValueError("truncated field")
            v, i = data[i:i + n], i + n
        elif wire == 1:
            v, i = data[i:i + 8], i + 8
        elif wire == 5:
            v, i = data[i:i + 4], i + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        out.setdefault(field, []).append(v)
    return out


def decode_plugin_info(data: bytes) -> dict:
    """pluginregistration.PluginInfo: type=1, name=2, endpoint=3, repeated supported_versions=4."""
    f = decode_fields(data)

    def s(v) -> str:
        return v.decode("utf-8", "replace") if isinstance(v, bytes) else ""

    return {"type": s((f.get(1) or [b""])[-1]), "name": s((f.get(2) or [b""])[-1]),
            "endpoint": s((f.get(3) or [b""])[-1]),
            "supported_versions": [s(v) for v in f.get(4) or ()][:16]}


def decode_health(data: bytes) -> str:
    """grpc.health.v1.HealthCheckResponse.status (field 1, enum)."""
    v = (decode_fields(data).get(1) or [0])[-1]
    return {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}.get(v, str(v))


@dataclasses.dataclass
class Call:
    status: str                  # ok | timeout | unavailable | unimplemented | error
    duration_s: float
    code: str | None = None
    detail: str = ""
    value: object = None

    @property
    def answered(self) -> bool:
        return self.status in ("ok", "unimplemented")

    def to_dict(self) -> dict:
        d = {"status": self.status, "duration_s": round(self.duration_s, 3)}
        if self.code:
            d["code"] = self.code
        if self.detail:
            d["detail"] = self.detail[:200]
        return d


def call(socket: Path, method: str, request: bytes, timeout_s: float, decode) -> Call:
    """One unary call over a unix socket with a deadline; never raises for RPC failures."""
    import grpc

    t0 = time.monotonic()
    channel = grpc.insecure_channel(f"unix://{socket}", options=CHANNEL_OPTIONS)
    try:
        fn = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        raw = fn(request, timeout=timeout_s)
        try:
            return Call("ok", time.monotonic() - t0, value=decode(raw))
        except ValueError as exc:
            return Call("error", time.monotonic() - t0, detail=f"bad reply: {exc}")
    except grpc.RpcError as exc:
        code = exc.code() if hasattr(exc, "code") else None
        name = code.name if code is not None else None
        status = {"DEADLINE_EXCEEDED": "timeout", "UNAVAILABLE": "unavailable",
                  "UNIMPLEMENTED": "unimplemented"}.get(name or "", "error")
        detail = exc.details() if hasattr(exc, "details") else str(exc)
        return Call(status, time.monotonic() - t0, name, detail or "")
    finally:
        channel.close()


def get_info(socket: Path, timeout_s: float) -> Call:
    return call(socket, GET_INFO, b"", timeout_s, decode_plugin_info)


def health(socket: Path, timeout_s: float) -> Call:
    return call(socket, HEALTH_CHECK, b"", timeout_s, decode_health)


def registration_sockets(kubelet_dir: Path) -> list[Path]:
    d = kubelet_dir / "plugins_registry"
    try:
        names = sorted(os.listdir(d))[:MAX_SOCKETS]
    except OSError:
        return []
    out = []
    for n in names:
        try:
            if stat.S_ISSOCK(os.lstat(d / n).st_mode):
                out.append(d / n)
        except OSError:
            continue
    return out


def endpoint_path(endpoint: str, host_root: Path, kubelet_dir: Path) -> Path:
    """The plugin's endpoint (a host path) as the probe sees it: under --kubelet-dir when it is
    below the kubelet's default directory, else under --host-root."""
    ep = endpoint.strip()
    if ep.startswith(DEFAULT_KUBELET_DIR + "/"):
        return kubelet_dir / ep[len(DEFAULT_KUBELET_DIR) + 1:]
    if not ep.startswith("/"):
        return kubelet_dir / "plugins_registry" / ep  # relative: as the kubelet resolves it
    return host_root / ep.lstrip("/")


def plugin_sockets(kubelet_dir: Path) -> list[Path]:
    """Sockets one level below <kubelet-dir>/plugins/<name>/ (DRA and CSI plugins serve there)."""
    d = kubelet_dir / "plugins"
    out: list[Path] = []
    try:
        subdirs = sorted(os.listdir(d))[:MAX_SOCKETS]
    except OSError:
        return out
    for sub in subdirs:
        try:
            names = sorted(os.listdir(d / sub))[:MAX_SOCKETS]
        except OSError:
            continue
        for n in names:
            try:
                if stat.S_ISSOCK(os.lstat(d / sub / n).st_mode):
                    out.append(d / sub / n)
            except OSError:
                continue
    return out[:MAX_SOCKETS]

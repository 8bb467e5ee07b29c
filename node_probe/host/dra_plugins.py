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

from node_probe.host import hostfs, protowire

GET_INFO = "/pluginregistration.Registration/GetInfo"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
CHANNEL_OPTIONS = (("grpc.enable_http_proxy", 0), ("grpc.enable_retries", 0),
                   ("grpc.max_receive_message_length", 1 << 20))
MAX_SOCKETS = 64
MAX_STRING = 256   # a plugin's name/endpoint/version as kept for evidence
DEFAULT_KUBELET_DIR = "/var/lib/kubelet"


def decode_fields(data: bytes) -> dict[int, list]:
    """Protobuf wire format -> {field number: [values]} (length-delimited values as bytes)."""
    out: dict[int, list] = {}
    for num, _, v in protowire.fields(data):
        out.setdefault(num, []).append(v)
    return out


def decode_plugin_info(data: bytes) -> dict:
    """pluginregistration.PluginInfo: type=1, name=2, endpoint=3, repeated supported_versions=4."""
    f = decode_fields(data)

    def s(v) -> str:
        return v[:MAX_STRING].decode("utf-8", "replace") if isinstance(v, bytes) else ""

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


def endpoint_path(endpoint: str, host_root: Path, kubelet_dir: Path) -> Path | None:
    """The plugin's endpoint (a host path the plugin chose) as the probe sees it: under
    --kubelet-dir when it is below the kubelet's default directory, else under --host-root;
    symlinks resolved inside that root (hostfs). None when there is no socket there: the probe
    never connects to a path outside the host's root."""
    ep = endpoint.strip()
    if ep.startswith(DEFAULT_KUBELET_DIR + "/"):
        base, rel = kubelet_dir, ep[len(DEFAULT_KUBELET_DIR) + 1:]
    elif not ep.startswith("/"):
        base, rel = kubelet_dir, f"plugins_registry/{ep}"  # relative: as the kubelet resolves it
    else:
        base, rel = host_root, ep.lstrip("/")
    real = hostfs.resolve(base, rel) if rel.strip("/") else None
    try:
        return real if real is not None and stat.S_ISSOCK(os.lstat(real).st_mode) else None
    except OSError:
        return None


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

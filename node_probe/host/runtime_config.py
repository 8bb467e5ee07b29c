"""Container runtime configuration (containerd, CRI-O) and CDI specs, read from the host.

Why: a GPU pod needs two pieces of wiring below Kubernetes: a runtime handler that injects the
GPUs (the `nvidia` handler the GPU Operator's RuntimeClass names, backed by
nvidia-container-runtime) or CDI enabled in the runtime, and CDI specs whose device and library
paths match the driver that is loaded now. Both are plain files on the host; this module reads
them (bounded, never leaving --host-root) and returns what they say, without judging.

Which config the runtime really loaded is host.layout's answer: the runtime process that is the
host's own and serves its CRI socket (identified by the socket's inode, host.unix_sockets), with
its own `--config`; never a process by its name alone: any tenant can name a process
`containerd` and hand the probe another config to judge.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import re
import tomllib
from pathlib import Path
from typing import Any

from node_probe.host import hostfs, procfs

MAX_CONFIG_BYTES = 1 << 20
MAX_CDI_BYTES = 4 << 20
MAX_FILES = 64
CONTAINERD_CONFIGS = ("etc/containerd/config.toml",
                      "var/lib/rancher/rke2/agent/etc/containerd/config.toml",
                      "var/lib/rancher/k3s/agent/etc/containerd/config.toml")
CRIO_CONFIGS = ("etc/crio/crio.conf",)
CRIO_DROPINS = ("etc/crio/crio.conf.d",)
CDI_DIRS = ("etc/cdi", "var/run/cdi", "run/cdi")
# containerd CRI plugin tables: config version 2 (1.x) and 3 (2.x)
CRI_V2 = "io.containerd.grpc.v1.cri"
CRI_V3 = "io.containerd.cri.v1.runtime"
NVIDIA_BINARY = "nvidia-container-runtime"


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    runtime: str                      # containerd | cri-o
    files: tuple[str, ...]            # host paths read, main config first
    handlers: dict[str, str]          # handler name -> binary / runtime path ("" unknown)
    default_handler: str | None
    cdi_enabled: bool | None          # None: the config does not say (runtime default)
    errors: tuple[str, ...] = ()

    @property
    def nvidia_handlers(self) -> list[str]:
        return sorted(n for n, b in self.handlers.items()
                      if n.startswith("nvidia") or NVIDIA_BINARY in b)

    def to_dict(self) -> dict[str, Any]:
        return {"runtime": self.runtime, "files": list(self.files),
                "handlers": dict(self.handlers), "default_handler": self.default_handler,
                "cdi_enabled": self.cdi_enabled, "errors": list(self.errors)}


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _glob(root: Path, pattern: str, rel_to: str) -> list[str]:
    """Host paths matching an import pattern (absolute, or relative to the config's dir)."""
    pat = pattern if pattern.startswith("/") else f"{rel_to}/{pattern}"
    d, base = os.path.split(pat)
    real = hostfs.resolve(root, d)
    if real is None or not real.is_dir():
        return []
    return [f"{d}/{n}" for n in sorted(os.listdir(real))[:MAX_FILES] if fnmatch.fnmatch(n, base)]


def _read_toml(root: Path, rel: str) -> tuple[dict | None, str | None]:
    text = hostfs.read_text(root, rel, limit=MAX_CONFIG_BYTES)
    if text is None:
        return None, None
    try:
        return tomllib.loads(text), None
    except tomllib.TOMLDecodeError as exc:
        return None, f"/{rel.lstrip('/')}: {exc}"


def containerd_config_paths(root: Path, proc: Path = procfs.PROC) -> list[str]:
    """The config host.layout's runtime resolver found: the live containerd's own (--config, or
    containerd's default /etc/containerd/config.toml), read alone -- a running containerd uses
    that file or its built-in defaults, never another; without a live containerd, that config
    (its distribution's default: k3s, RKE2, k0s, microk8s), then the usual places."""
    from node_probe.host import layout   # layout imports this module's neighbours; not at import
    rt = layout.runtime(root, proc)
    out = [rt.config.lstrip("/")] if rt.name == "containerd" and rt.config else []
    if out and rt.pid is not None:
        return out
    return list(dict.fromkeys(out + [p for p in CONTAINERD_CONFIGS if p not in out]))


def containerd(root: Path, proc: Path = procfs.PROC) -> RuntimeConfig | None:
    for rel in containerd_config_paths(root, proc):
        doc, err = _read_toml(root, rel)
        if doc is None and err is None:
            continue
        files, errors = ["/" + rel], [err] if err else []
        doc = doc or {}
        for pattern in doc.get("imports") or ():
            for imp in _glob(root, str(pattern), os.path.dirname("/" + rel)):
                sub, e = _read_toml(root, imp)
                files.append(imp)
                if e:
                    errors.append(e)
                if sub:
                    doc = _merge(doc, sub)
        plugins = doc.get("plugins") or {}
        cri = plugins.get(CRI_V3) or plugins.get(CRI_V2) or {}
        ctd = cri.get("containerd") or {}
        handlers = {}
        for name, spec in (ctd.get("runtimes") or {}).items():
            opts = (spec or {}).get("options") or {}
            handlers[name] = str(opts.get("BinaryName") or (spec or {}).get("runtime_path") or "")
        cdi = cri.get("enable_cdi")
        return RuntimeConfig("containerd", tuple(files), handlers,
                             ctd.get("default_runtime_name"), None if cdi is None else bool(cdi),
                             tuple(errors))
    return None


def crio(root: Path, proc: Path = procfs.PROC) -> RuntimeConfig | None:
    files: list[str] = []
    errors: list[str] = []
    doc: dict = {}
    from node_probe.host import layout
    rt = layout.runtime(root, proc)
    ours = rt.name == "cri-o"
    given = [rt.config.lstrip("/")] if ours and rt.config else []
    for rel in (given or CRIO_CONFIGS):
        sub, e = _read_toml(root, rel)
        if sub is not None or e:
            files.append("/" + rel)
        if e:
            errors.append(e)
        doc = _merge(doc, sub or {})
    for d in ((rt.config_dir.lstrip("/"),) if ours and rt.config_dir else CRIO_DROPINS):
        for imp in _glob(root, "*.conf", "/" + d):
            sub, e = _read_toml(root, imp)
            files.append(imp)
            if e:
                errors.append(e)
            doc = _merge(doc, sub or {})
    if not files:
        return None
    rt = (doc.get("crio") or {}).get("runtime") or {}
    handlers = {n: str((s or {}).get("runtime_path") or "")
                for n, s in (rt.get("runtimes") or {}).items()}
    # CRI-O always resolves CDI devices (cdi_spec_dirs); it has no switch for it
    return RuntimeConfig("cri-o", tuple(files), handlers, rt.get("default_runtime") or "crun",
                         True, tuple(errors))


# -- CDI ------------------------------------------------------------------------------------

_KIND = re.compile(r"""^\s*["']?kind["']?\s*:\s*["']?([^"'\s,]+)""", re.M)
_HOSTPATH = re.compile(r"""["']?hostPath["']?\s*:\s*["']?([^"'\s,}\]]+)""")
_PATH = re.compile(r"""["']?path["']?\s*:\s*["']?(/[^"'\s,}\]]+)""")
_SO_VERSION = re.compile(r"\.so\.(\d{3}\.\d+(?:\.\d+)?)$")
_FW_VERSION = re.compile(r"/firmware/nvidia/(\d{3}\.\d+(?:\.\d+)?)/")
NVIDIA_KINDS = ("nvidia.com/", "management.nvidia.com/", "gpu.nvidia.com", "k8s.gpu.nvidia.com/")


@dataclasses.dataclass(frozen=True)
class CdiSpec:
    path: str
    kind: str | None
    host_paths: tuple[str, ...]
    driver_versions: tuple[str, ...]   # versions named by driver library / firmware paths

    @property
    def is_nvidia(self) -> bool:
        return bool(self.kind) and any(self.kind.startswith(k) for k in NVIDIA_KINDS)


def parse_cdi(path: str, text: str) -> CdiSpec:
    """What a CDI spec (YAML or JSON) says: its kind and the host files it mounts/hooks.
    YAML is read with patterns (the probe carries no YAML parser); JSON is parsed."""
    kind, paths = None, []
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
            kind = doc.get("kind")
            paths = re.findall(r'"hostPath"\s*:\s*"([^"]+)"', text)
            paths += [p for p in re.findall(r'"path"\s*:\s*"(/[^"]+)"', text)]
        except (json.JSONDecodeError, AttributeError):
            pass
    if kind is None:
        m = _KIND.search(text)
        kind = m.group(1) if m else None
        paths = _HOSTPATH.findall(text) + _PATH.findall(text)
    uniq = list(dict.fromkeys(paths))
    versions = {v for v in map(driver_version_of_path, uniq) if v}
    return CdiSpec(path, kind, tuple(uniq), tuple(sorted(versions)))


def driver_version_of_path(p: str) -> str | None:
    """`/usr/lib/.../libcuda.so.570.158.01` or `/lib/firmware/nvidia/570.158.01/gsp.bin` ->
    the driver version; None for files not tied to a driver version."""
    m = _SO_VERSION.search(p) or _FW_VERSION.search(p)
    return m.group(1) if m else None


def cdi_specs(root: Path) -> list[CdiSpec]:
    out: list[CdiSpec] = []
    seen: set[Path] = set()
    for d in CDI_DIRS:
        real = hostfs.resolve(root, d)
        if real is None or not real.is_dir() or real in seen:
            continue
        seen.add(real)  # /var/run is usually a link to /run
        for name in sorted(os.listdir(real))[:MAX_FILES]:
            if not name.endswith((".yaml", ".yml", ".json")):
                continue
            text = hostfs.read_text(root, f"{d}/{name}", limit=MAX_CDI_BYTES)
            if text is not None:
                out.append(parse_cdi(f"/{d}/{name}", text))
    return out

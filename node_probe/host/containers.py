"""Which Kubernetes containers run on this node, found from their cgroups, and which are GPU ones.

Why: the device cgroup audit (seeds 001, 002) must name the pod and container whose device
rules lost `/dev/nvidia-uvm`, and it must do so on a node where the API server may be slow or
the kubelet wedged. Every container the kubelet starts lives in a cgroup whose path encodes its
pod UID, QoS class and runtime container id; that is read straight from the cgroup filesystem:

    cgroupfs driver:  kubepods[/burstable|/besteffort]/pod<uid>/<id>            (crio-<id>)
    systemd driver:   kubepods.slice[/kubepods-burstable.slice]/
                      kubepods-burstable-pod<uid_with_underscores>.slice/
                      cri-containerd-<id>.scope | crio-<id>.scope | docker-<id>.scope

(guaranteed pods have no QoS level). cgroup v1 is read in the devices hierarchy, v2 in the
unified one. Names come from the runtime's OCI bundle annotations when readable; GPU
assignment from pod-resources (device ids per container) or, when that is absent, from
`NVIDIA_VISIBLE_DEVICES` in the environment of the container's processes (read through
procfs.read_environ, which returns NVIDIA_* keys only). The parsing is pure functions over
paths so it is unit-tested on captured layouts.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from node_probe.host import hostfs, procfs

MAX_DEPTH = 10          # kubepods may be nested (kind: /kubelet.slice/kubelet-kubepods.slice)
MAX_PIDS = 64           # environ of a few processes is enough to see NVIDIA_VISIBLE_DEVICES
QOS_CLASSES = ("burstable", "besteffort")

# pod<uid>: a 36-char UUID, or a 32-hex hash for static pods; systemd escapes '-' as '_'
_UID = r"[0-9a-fA-F][0-9a-fA-F_-]{7,63}"
_POD_CGROUPFS = re.compile(rf"^pod({_UID})$")
_POD_SYSTEMD = re.compile(rf"^(?:[\w.-]*-)?kubepods(?:-(burstable|besteffort))?-pod({_UID})\.slice$")
_QOS_SYSTEMD = re.compile(r"^(?:[\w.-]*-)?kubepods-(burstable|besteffort)\.slice$")
# container level: cri-containerd-<id>.scope, crio-<id>.scope, docker-<id>.scope, <id>, crio-<id>
_CONTAINER = re.compile(
    r"^(?:(cri-containerd|crio|docker|containerd|cri-o)-)?([0-9a-f]{12,64})(\.scope)?$")
_RUNTIMES = {"cri-containerd": "containerd", "containerd": "containerd", "crio": "cri-o",
             "cri-o": "cri-o", "docker": "docker"}


@dataclasses.dataclass(frozen=True)
class CgroupRef:
    """What a cgroup path says about a container."""

    pod_uid: str
    container_id: str
    qos: str                # guaranteed | burstable | besteffort | unknown (see below)
    driver: str             # cgroupfs | systemd
    runtime: str | None     # containerd | cri-o | docker | None (bare id: containerd or docker)
    rel: str                # the container's cgroup path relative to the hierarchy root


def normalize_uid(raw: str) -> str:
    return raw.replace("_", "-").lower()


def parse_cgroup_path(rel: str) -> CgroupRef | None:
    """Parse a cgroup path (relative to its hierarchy root, as in /proc/PID/cgroup) into the
    pod and container it belongs to. Paths below the container level (a container that makes
    its own sub-cgroups) map to their container. Returns None for anything that is not a
    container of a kubelet pod (pod-level cgroups, conmon scopes, system services).
    A path read from inside another cgroup namespace (the debug pod's, on cgroup v2) starts
    with '..' and may hide the kubepods and QoS levels: the pod is then found below the last
    '..', and the QoS is 'unknown' unless a QoS level is still visible."""
    parts = [p for p in rel.strip("/").split("/") if p]
    root_i = next((i for i, p in enumerate(parts) if "kubepods" in p), None)
    qos = "guaranteed"
    if root_i is None and parts[:1] == [".."]:
        root_i = max(i for i, p in enumerate(parts) if p == "..")
        qos = "unknown"
    if root_i is None:
        return None
    driver, pod_i, uid = None, None, None
    for i in range(root_i, len(parts)):
        p = parts[i]
        m = _POD_SYSTEMD.match(p)
        if m:
            driver, pod_i, uid = "systemd", i, m.group(2)
            qos = m.group(1) or "guaranteed"    # the pod slice's own name has its QoS
            break
        m = _POD_CGROUPFS.match(p)
        if m and i > root_i:
            driver, pod_i, uid = "cgroupfs", i, m.group(1)
            between = parts[root_i + 1:i]
            if between and between[-1] in QOS_CLASSES:
                qos = between[-1]
            break
        if i > root_i and driver is None:
            m = _QOS_SYSTEMD.match(p)
            if m:
                qos = m.group(1)
    if pod_i is None or pod_i + 1 >= len(parts):
        return None
    cpart = parts[pod_i + 1]
    if cpart.startswith(("crio-conmon-", "conmon-")):
        return None
    m = _CONTAINER.match(cpart)
    if not m:
        return None
    prefix, cid, scope = m.groups()
    if driver == "systemd" and not scope and prefix:
        return None
    runtime = _RUNTIMES.get(prefix or "")
    return CgroupRef(pod_uid=normalize_uid(uid), container_id=cid, qos=qos, driver=driver,
                     runtime=runtime, rel="/" + "/".join(parts[:pod_i + 2]))


def pod_of_pid(pid: int, proc: Path = procfs.PROC) -> CgroupRef | None:
    """The pod container a process runs in, from /proc/PID/cgroup (None outside pods)."""
    for path in procfs.read_cgroups(pid, proc).values():
        ref = parse_cgroup_path(path)
        if ref is not None:
            return ref
    return None


# -- where the hierarchy is ---------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Hierarchy:
    """The cgroup hierarchy that decides device access: v1 `devices` or v2 unified."""

    version: int            # 1 or 2
    root: Path


def is_cgroup2_root(p: Path) -> bool:
    return (p / "cgroup.controllers").is_file()


def find_hierarchy(cgroup_dir: Path) -> Hierarchy | None:
    """v1: <cgroup-root>/devices; v2: <cgroup-root> itself when it is cgroup2, or
    <cgroup-root>/unified on hybrid hosts. When both exist the v1 devices controller is the one
    the runtime writes rules to, so it wins (BPF device programs on the unified hierarchy are
    still enforced by the kernel; the access helper would see them)."""
    cgroup_dir = Path(cgroup_dir)
    if (cgroup_dir / "devices" / "devices.list").is_file():
        return Hierarchy(1, cgroup_dir / "devices")
    if (cgroup_dir / "devices.list").is_file():          # --cgroup-root pointing at devices
        return Hierarchy(1, cgroup_dir)
    if is_cgroup2_root(cgroup_dir):
        return Hierarchy(2, cgroup_dir)
    if is_cgroup2_root(cgroup_dir / "unified"):
        return Hierarchy(2, cgroup_dir / "unified")
    return None


def walk_container_cgroups(h: Hierarchy, max_depth: int = MAX_DEPTH) -> Iterator[tuple[CgroupRef, Path]]:
    """Every container cgroup under the hierarchy (a scandir walk that only descends into
    kubepods subtrees once it has found one, and stops at the container level)."""
    def walk(d: Path, rel: str, depth: int, inside: bool) -> Iterator[tuple[CgroupRef, Path]]:
        if depth > max_depth:
            return
        try:
            entries = [e for e in os.scandir(d) if e.is_dir(follow_symlinks=False)]
        except OSError:
            return
        for e in entries:
            sub = f"{rel}/{e.name}"
            ref = parse_cgroup_path(sub) if inside or "kubepods" in e.name else None
            if ref is not None:
                if ref.rel == sub:
                    yield ref, Path(e.path)
                continue   # do not descend into a container's own sub-cgroups
            yield from walk(Path(e.path), sub, depth + 1, inside or "kubepods" in e.name)

    yield from walk(h.root, "", 0, False)


def read_pids(cgroup: Path, limit: int = MAX_PIDS) -> list[int]:
    """Pids in a container's cgroup and its sub-cgroups (cgroup.procs, as seen from our pid
    namespace, which is the host's in the debug pod)."""
    out: list[int] = []
    for d, dirs, files in os.walk(cgroup):
        text = procfs.read_str(Path(d) / "cgroup.procs", 4 << 20)
        if text is None:
            continue
        out.extend(int(x) for x in text.split() if x.isdigit())
        if len(out) >= limit:
            break
    return out[:limit]


# -- names from the runtime's OCI bundle ----------------------------------------------------

# (path under the host root, format) in order; {id} is the container id.
BUNDLE_CONFIGS = (
    ("run/containerd/io.containerd.runtime.v2.task/k8s.io/{id}/config.json", "oci"),
    ("run/containerd/io.containerd.runtime.v1.linux/k8s.io/{id}/config.json", "oci"),
    ("run/containers/storage/overlay-containers/{id}/userdata/config.json", "oci"),
    ("var/lib/containers/storage/overlay-containers/{id}/userdata/config.json", "oci"),
    ("var/lib/docker/containers/{id}/config.v2.json", "docker"),
)
_ANNOTATIONS = {
    "pod": ("io.kubernetes.cri.sandbox-name", "io.kubernetes.pod.name"),
    "namespace": ("io.kubernetes.cri.sandbox-namespace", "io.kubernetes.pod.namespace"),
    "container": ("io.kubernetes.cri.container-name", "io.kubernetes.container.name"),
    "pod_uid": ("io.kubernetes.cri.sandbox-uid", "io.kubernetes.pod.uid"),
    "container_type": ("io.kubernetes.cri.container-type", "io.kubernetes.docker.type"),
}


def parse_bundle_config(text: str, fmt: str = "oci") -> dict:
    """Pod/container names and the spec's device entries from an OCI config.json (or docker's
    config.v2.json). Never returns the environment or anything else from the spec: config.json
    holds the container's secrets."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):   # not JSON, or nested past the parser's limit
        return {}
    if not isinstance(doc, dict):
        return {}
    if fmt == "docker":
        ann = (doc.get("Config") or {}).get("Labels") or {}
    else:
        ann = doc.get("annotations") or {}
    out: dict[str, Any] = {}
    for key, names in _ANNOTATIONS.items():
        for n in names:
            if isinstance(ann.get(n), str) and ann[n]:
                out[key] = ann[n]
                break
    if fmt == "oci":
        linux = doc.get("linux") or {}
        devs = linux.get("devices")
        if isinstance(devs, list):
            out["spec_devices"] = [
                {"path": d.get("path"), "type": d.get("type"), "major": d.get("major"),
                 "minor": d.get("minor")} for d in devs if isinstance(d, dict)]
        hooks = doc.get("hooks")
        if isinstance(hooks, dict):   # nvidia-container-runtime's legacy prestart hook
            out["spec_nvidia_hook"] = any(
                isinstance(h, dict) and "nvidia" in f'{h.get("path")} {h.get("args")}'.lower()
                for stage in hooks.values() if isinstance(stage, list) for h in stage)
        rules = (linux.get("resources") or {}).get("devices")
        if isinstance(rules, list):
            out["spec_device_rules"] = [
                {"allow": bool(r.get("allow")), "type": r.get("type", "a"),
                 "major": r.get("major"), "minor": r.get("minor"), "access": r.get("access", "")}
                for r in rules if isinstance(r, dict)]
    return out


def read_bundle_meta(host_root: Path, container_id: str,
                     first: Sequence[tuple[str, str]] = ()) -> dict:
    """Names and spec devices from the container's OCI bundle: `first` (where the runtime
    resolver says this runtime keeps them, host.layout.Runtime.bundle_configs), then the usual
    places."""
    for pattern, fmt in dict.fromkeys((*first, *BUNDLE_CONFIGS)):
        try:
            text = hostfs.read_under(host_root, pattern.format(id=container_id), 8 << 20).text
        except OSError:
            continue
        meta = parse_bundle_config(text, fmt)
        if meta:
            meta["bundle_config"] = "/" + pattern.format(id=container_id)
            return meta
    return {}


# -- which containers have GPUs -----------------------------------------------------------

GPU_RESOURCE_PREFIXES = ("nvidia.com/",)
_NO_GPU_VALUES = ("", "void", "none")


def gpu_ids_from_env(value: str | None) -> list[str] | None:
    """NVIDIA_VISIBLE_DEVICES as the NVIDIA container runtime reads it: None when it gives no
    GPU (unset, empty, `void`, `none`), ["all"], or the listed ids (UUIDs GPU-.../MIG-...,
    indices `0`, MIG indices `0:1`). A path value (device-list-strategy volume-mounts) means
    GPUs are passed another way: ["?"]."""
    if value is None:
        return None
    v = value.strip()
    if v.lower() in _NO_GPU_VALUES:
        return None
    if v.lower() == "all":
        return ["all"]
    if v.startswith("/"):
        return ["?"]
    return [x.strip() for x in v.split(",") if x.strip()]


@dataclasses.dataclass(frozen=True)
class Container:
    ref: CgroupRef
    cgroup_path: Path
    cgroup_version: int
    pids: list[int]
    meta: dict = dataclasses.field(default_factory=dict)
    env: dict = dataclasses.field(default_factory=dict)
    gpu_source: str | None = None       # podresources | environ | None
    gpu_ids: list[str] = dataclasses.field(default_factory=list)
    gpu_resources: list[str] = dataclasses.field(default_factory=list)
    # device specs the plugin returned from Allocate (kubelet checkpoint); None = unknown
    alloc_devices: list[str] | None = None

    @property
    def is_gpu(self) -> bool:
        return self.gpu_source is not None

    @property
    def pod_label(self) -> str:
        if self.meta.get("pod"):
            return f"{self.meta.get('namespace', '?')}/{self.meta['pod']}"
        return f"uid {self.ref.pod_uid}"

    @property
    def container_label(self) -> str:
        return self.meta.get("container") or self.ref.container_id[:13]

    @property
    def subject(self) -> str:
        return f"pod {self.pod_label} container {self.container_label}"

    def to_fact(self) -> dict:
        d = {"pod_uid": self.ref.pod_uid, "container_id": self.ref.container_id,
             "cgroup_path": str(self.cgroup_path), "cgroup_rel": self.ref.rel,
             "cgroup_version": self.cgroup_version, "qos": self.ref.qos,
             "cgroup_driver": self.ref.driver, "runtime": self.ref.runtime,
             "pids": list(self.pids), "namespace": self.meta.get("namespace"),
             "pod": self.meta.get("pod"), "container": self.meta.get("container"),
             "gpu": self.is_gpu, "gpu_source": self.gpu_source, "gpu_ids": list(self.gpu_ids),
             "allocate_device_specs": self.alloc_devices}
        nv = {k: v for k, v in self.env.items() if k.startswith("NVIDIA_")}
        if nv:
            d["nvidia_env"] = nv
        return d


def container_env(pids: Sequence[int], proc: Path = procfs.PROC) -> dict[str, str]:
    """NVIDIA_* (and the other allowed keys) of the first container process that has any."""
    for pid in pids:
        env = procfs.read_environ(pid, proc)
        if any(k.startswith("NVIDIA_") for k in env):
            return env
    return {}


def podresources_index(podres: Iterable[Mapping] | None) -> dict[tuple[str, str, str], list[dict]]:
    idx: dict[tuple[str, str, str], list[dict]] = {}
    for e in podres or ():
        try:
            key = (e["namespace"], e["pod"], e["container"])
        except (KeyError, TypeError):
            continue
        idx.setdefault(key, []).append(dict(e))
    return idx


def assign_gpus(c: Container, podres_idx: Mapping | None,
                ckpt_idx: Mapping | None = None) -> Container:
    """The container with its GPUs decided: pod-resources when it names the container (it is
    what the kubelet allocated), else the kubelet's device checkpoint (pod UID + container
    name), else NVIDIA_VISIBLE_DEVICES from its processes. Also records the device specs the
    plugin's Allocate returned for it, when the checkpoint has them."""
    ck = [e for e in (ckpt_idx or {}).get((c.ref.pod_uid, c.meta.get("container") or ""), ())
          if e.resource.startswith(GPU_RESOURCE_PREFIXES)]
    allocs = [e.alloc for e in ck if e.alloc is not None]
    if allocs:
        c = dataclasses.replace(c, alloc_devices=[
            str(d.get("host_path") or d.get("container_path"))
            for a in allocs for d in a.get("devices") or ()])
    if podres_idx is not None and c.meta.get("pod") and c.meta.get("container"):
        key = (c.meta.get("namespace"), c.meta["pod"], c.meta["container"])
        entries = [e for e in podres_idx.get(key, [])
                   if str(e.get("resource", "")).startswith(GPU_RESOURCE_PREFIXES)]
        ids = [str(i) for e in entries for i in e.get("device_ids") or ()]
        if ids:
            return dataclasses.replace(c, gpu_source="podresources", gpu_ids=ids,
                                       gpu_resources=sorted({str(e["resource"])
                                                             for e in entries}))
        if key in podres_idx:
            # pod-resources knows the container and gave it no NVIDIA device: an image default
            # NVIDIA_VISIBLE_DEVICES=all (CUDA base images set it) is not an allocation.
            return c
    if ck:
        return dataclasses.replace(c, gpu_source="checkpoint",
                                   gpu_ids=[i for e in ck for i in e.device_ids],
                                   gpu_resources=sorted({e.resource for e in ck}))
    ids = gpu_ids_from_env(c.env.get("NVIDIA_VISIBLE_DEVICES"))
    if ids:
        return dataclasses.replace(c, gpu_source="environ", gpu_ids=ids)
    return c


def discover(cgroup_dir: Path, host_root: Path, proc: Path = procfs.PROC,
             focus_pods: Sequence[str] = (), want_meta=None,
             bundles: Sequence[tuple[str, str]] = ()
             ) -> tuple[Hierarchy | None, list[Container]]:
    """All kubelet containers on the node with pids, the NVIDIA_* environment and names.
    `want_meta(ref, env) -> bool` limits which containers' OCI bundles are read (a big node
    has hundreds; only GPU candidates need names)."""
    h = find_hierarchy(cgroup_dir)
    if h is None:
        return None, []
    focus = {normalize_uid(u) for u in focus_pods}
    out = []
    for ref, path in walk_container_cgroups(h):
        if focus and ref.pod_uid not in focus:
            continue
        pids = read_pids(path)
        env = container_env(pids, proc)
        meta = (read_bundle_meta(host_root, ref.container_id, bundles)
                if want_meta is None or want_meta(ref, env) else {})
        c = Container(ref=ref, cgroup_path=path, cgroup_version=h.version, pids=pids,
                      meta=meta, env=env)
        out.append(c)
    return h, out

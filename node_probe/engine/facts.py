"""Every fact one check hands to another, declared once as a typed key.

Why: checks run concurrently and some need each other's discoveries (the tracer needs the device
plugin's pid, the cgroup audit needs the containers and the NVML GPU list). With bare string keys
only producers were declared and consumers guessed names and shapes. Here each fact is a
`FactKey` with a name and a payload type; a check declares `provides=`, `needs=` (its producer is
pulled into the run) and `uses=` (read if its producer runs) with these keys, the registry refuses
an unknown key, `publish` refuses a payload of the wrong type, and `ProbeContext.fact` is the one
way to read a fact.

Payload types live here too, so a consumer reads attributes, not guessed dict keys. Facts whose
payload is a raw reader record (kubelet config, pod-resources rows, the trace window's results)
are typed as read-only mappings; their keys are documented on the FactKey.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Generic, Iterable, TypeVar

from node_probe.host.containers import Container, Hierarchy
from node_probe.host.xid import XidGroup

T = TypeVar("T")


class UnknownFact(LookupError):
    """A check named a fact key that is not declared in this module."""


@dataclasses.dataclass(frozen=True, eq=False)
class FactKey(Generic[T]):
    """A named, typed, one-shot value shared between checks."""

    name: str
    type: type                       # isinstance() check of the payload
    item: type | None = None         # payload is a tuple of these (lists are converted)
    doc: str = ""

    def check(self, value: Any) -> Any:
        """The payload as stored (lists become tuples); TypeError if it has the wrong type."""
        if self.item is not None and isinstance(value, list):
            value = tuple(value)
        if not isinstance(value, self.type):
            raise TypeError(f"fact {self.name}: expected {self.type.__name__}, "
                            f"got {type(value).__name__}")
        if self.item is not None:
            bad = [type(v).__name__ for v in value if not isinstance(v, self.item)]
            if bad:
                raise TypeError(f"fact {self.name}: items must be {self.item.__name__}, "
                                f"got {bad[0]}")
        return value

    def __repr__(self) -> str:
        return f"FactKey({self.name!r})"


_DECLARED: dict[str, FactKey] = {}


def declare(name: str, type: type, *, item: type | None = None, doc: str = "") -> FactKey:
    """Declare a fact key (idempotent for the same name and type)."""
    old = _DECLARED.get(name)
    if old is not None:
        if old.type is not type or old.item is not item:
            raise ValueError(f"fact {name!r} declared twice with different types")
        return old
    key = FactKey(name, type, item, doc)
    _DECLARED[name] = key
    return key


def resolve(key: FactKey | str) -> FactKey:
    """The declared key for a FactKey or its name; UnknownFact otherwise."""
    if isinstance(key, FactKey):
        if _DECLARED.get(key.name) is not key:
            raise UnknownFact(f"fact key {key.name!r} is not declared in node_probe.engine.facts")
        return key
    if isinstance(key, str) and key in _DECLARED:
        return _DECLARED[key]
    raise UnknownFact(f"unknown fact {key!r} (declared: {', '.join(sorted(_DECLARED))})")


def resolve_all(keys: Iterable[FactKey | str]) -> tuple[FactKey, ...]:
    return tuple(resolve(k) for k in keys)


def declared() -> list[FactKey]:
    return sorted(_DECLARED.values(), key=lambda k: k.name)


# -- payloads ----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class MigDevice:
    index: int | None
    uuid: str | None
    profile: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclasses.dataclass(frozen=True)
class Gpu:
    """One GPU as NVML reports it: the fields every consumer reads, typed; `record` is the NVML
    child's whole record (read-only), for fields only one check reads (fabric, processes...)."""

    index: int | None
    uuid: str | None
    name: str = ""
    minor: int | None = None
    mig_mode: bool = False
    mig_devices: tuple[MigDevice, ...] = ()
    ecc_uncorrected_volatile: int | None = None
    remapped_rows: Mapping[str, Any] | None = None
    pci_bus_id: str | None = None
    lost: bool = False               # NVML_ERROR_GPU_IS_LOST on a query
    mig_pending_mode: bool | None = None   # None: not reported
    record: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False,
                                                  repr=False)

    @classmethod
    def from_record(cls, g: Mapping[str, Any]) -> "Gpu":
        return cls(index=g.get("index"), uuid=g.get("uuid"), name=g.get("name") or "",
                   minor=g.get("minor"), mig_mode=bool(g.get("mig_mode")),
                   mig_devices=tuple(MigDevice(
                       index=m.get("index"), uuid=m.get("uuid"), profile=m.get("profile"),
                       gpu_instance_id=m.get("gpu_instance_id"),
                       compute_instance_id=m.get("compute_instance_id"))
                       for m in g.get("mig_devices") or ()),
                   ecc_uncorrected_volatile=g.get("ecc_uncorrected_volatile"),
                   remapped_rows=g.get("remapped_rows"), pci_bus_id=g.get("pci_bus_id"),
                   lost=bool(g.get("lost")),
                   mig_pending_mode=(None if g.get("mig_pending_mode") is None
                                     else bool(g["mig_pending_mode"])),
                   record=MappingProxyType(dict(g)))

    def to_dict(self) -> dict:
        """The NVML child's record (built from the typed fields when there is none)."""
        if self.record:
            return dict(self.record)
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "record"}
        d["mig_devices"] = [dataclasses.asdict(m) for m in self.mig_devices]
        return {k: v for k, v in d.items() if v is not None}


@dataclasses.dataclass(frozen=True)
class NvmlInventory:
    """What the nvml check learned. status: ok | hang | error | unavailable. `record`: the
    nvml check's whole record (read-only), for fields only one check reads."""

    status: str
    library: str | None = None
    library_version: str | None = None
    kernel_module_version: str | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    nvml_version: str | None = None
    gpus: tuple[Gpu, ...] = ()
    lost_gpus: tuple[Mapping[str, Any], ...] = ()   # GPUs NVML reports as lost (index, uuid...)
    record: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False,
                                                  repr=False)

    @classmethod
    def from_record(cls, d: Mapping[str, Any]) -> "NvmlInventory":
        return cls(status=d.get("status") or "unavailable", library=d.get("library"),
                   library_version=d.get("library_version"),
                   kernel_module_version=d.get("kernel_module_version"),
                   driver_version=d.get("driver_version"), cuda_version=d.get("cuda_version"),
                   nvml_version=d.get("nvml_version"),
                   gpus=tuple(Gpu.from_record(g) for g in d.get("gpus") or ()),
                   lost_gpus=tuple(d.get("lost_gpus") or ()),
                   record=MappingProxyType(dict(d)))

    @property
    def version(self) -> str | None:
        """The best driver version known: NVML's, else the library file's, else the module's."""
        return self.driver_version or self.library_version or self.kernel_module_version

    def gpu_records(self) -> list[dict]:
        """The GPU list as plain records (for readers shared with the client, and evidence)."""
        return [g.to_dict() for g in self.gpus]

    def to_dict(self) -> dict:
        """The nvml check's record, GPU list included (the shape before typed facts)."""
        d = dict(self.record) if self.record else {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "record"}
        d["gpus"] = self.gpu_records()
        d["lost_gpus"] = [dict(g) for g in self.lost_gpus]
        return d


@dataclasses.dataclass(frozen=True)
class PluginTargetInfo:
    """A device-plugin socket and the process serving it (deviceplugin.discovery)."""

    socket: str
    pid: int | None = None
    comm: str = ""
    resource: str | None = None
    resource_source: str | None = None
    pod_uid: str | None = None
    nvml_library: str | None = None

    @classmethod
    def of(cls, t: Any) -> "PluginTargetInfo":
        """From a deviceplugin.discovery.PluginTarget."""
        return cls(socket=t.socket, pid=t.pid, comm=t.comm, resource=t.resource,
                   resource_source=t.resource_source, pod_uid=t.pod_uid,
                   nvml_library=t.nvml_library)

    @property
    def is_nvidia_resource(self) -> bool:
        """Serves nvidia.com/* (or its resource is not known yet)."""
        return not self.resource or self.resource.startswith("nvidia.com/")

    def to_dict(self) -> dict:
        d = {"pid": self.pid, "comm": self.comm, "resource": self.resource,
             "socket": self.socket, "pod_uid": self.pod_uid,
             "resource_source": self.resource_source}
        if self.nvml_library and self.pid:
            d["nvml_library"] = self.nvml_library
            d["nvml_library_host_path"] = f"/proc/{self.pid}/root{self.nvml_library}"
        return d


@dataclasses.dataclass(frozen=True)
class ContainerList:
    """The kubelet's containers on this node (host.containers), GPUs assigned."""

    hierarchy: Hierarchy | None
    items: tuple[Container, ...] = ()

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    @property
    def gpu(self) -> tuple[Container, ...]:
        """The containers that have GPUs (pod-resources, checkpoint or NVIDIA_VISIBLE_DEVICES)."""
        return tuple(c for c in self.items if c.is_gpu)

    def by_pid(self, pid: int) -> Container | None:
        return next((c for c in self.items if pid in c.pids), None)

    def by_cgroup(self, cgroup: str | None) -> Container | None:
        """The container whose cgroup is this path (relative to the hierarchy, or absolute)."""
        if not cgroup or cgroup == "/":
            return None
        for c in self.items:
            for rel in (c.ref.rel, str(c.cgroup_path)):
                rel = str(rel or "").rstrip("/")
                if rel and rel != "/" and (cgroup == rel or cgroup.endswith(rel)
                                           or rel.endswith(cgroup)):
                    return c
        return None


# -- the facts ----------------------------------------------------------------------------------

NVML: FactKey[NvmlInventory] = declare(
    "nvml", NvmlInventory, doc="driver library, init status, versions and the GPU list (nvml)")
CONTAINERS: FactKey[ContainerList] = declare(
    "containers", ContainerList, doc="kubelet containers with pids, names and GPUs (containers)")
DEVICEPLUGIN_TARGETS: FactKey[tuple[PluginTargetInfo, ...]] = declare(
    "deviceplugin.targets", tuple, item=PluginTargetInfo,
    doc="device-plugin sockets and their serving processes (deviceplugin)")
PODRESOURCES: FactKey[tuple[Mapping[str, Any], ...]] = declare(
    "podresources", tuple, item=Mapping,
    doc="kubelet pod-resources List rows: namespace, pod, container, resource, device_ids "
        "(deviceplugin)")
KUBELET_CONFIG: FactKey[Mapping[str, Any]] = declare(
    "kubelet.config", Mapping,
    doc="host.kubeletconfig.load(): path, source, pid, cpuManagerPolicy, cgroupDriver, flags, "
        "error (kubelet)")
TRACE_READY: FactKey[Mapping[str, Any]] = declare(
    "trace.ready", Mapping,
    doc="eBPF programs attached: available, probes, target_pids, reason (trace)")
TRACE_RESULTS: FactKey[Mapping[str, Any]] = declare(
    "trace.results", Mapping,
    doc="one trace window: available, nvml_calls, futex_waits, ioctls, ioctls_inflight, "
        "opens, cgroup_writes, bpf_attaches, ... (trace)")
KMSG_LOG: FactKey[Mapping[str, Any]] = declare(
    "kmsg.log", Mapping,
    doc="what the one read of the kernel log gives other checks: source, lost (full bus id -> "
        "xid79, off_the_bus, aer_fatal), xid_lines (the newest Xid lines: uptime_s, pci, xid, "
        "text) (kmsg)")
KMSG_XIDS: FactKey[tuple[XidGroup, ...]] = declare(
    "kmsg.xids", tuple, item=XidGroup,
    doc="Xid lines of the kernel log grouped per (GPU bus id, code) by host.xid.group (kmsg)")

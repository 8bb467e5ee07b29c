"""The device nodes a GPU container needs, with the major:minor numbers the kernel checks.

Why: a device cgroup allows or denies by (type, major, minor), not by path, and the numbers are
not all fixed: `nvidiactl` is 195:255 and `nvidiaN` is 195:N, but `nvidia-uvm` and
`nvidia-caps` get dynamic majors (read from the host's proc/devices), and N is the GPU's
device minor, which is not its NVML index in general (read from NVML or from
proc/driver/nvidia/gpus/*/information). CUDA needs nvidiactl + nvidia-uvm + its nvidiaN;
MIG also needs the nvidia-caps access nodes of its GPU and compute instance.
"""
from __future__ import annotations

import dataclasses
import os
import re
import stat
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from node_probe.host import hostfs

NVIDIA_MAJOR = 195
CTL_MINOR = 255
UVM_MINOR, UVM_TOOLS_MINOR = 0, 1


@dataclasses.dataclass(frozen=True)
class Device:
    name: str           # nvidiactl, nvidia-uvm, nvidia0, nvidia-caps/nvidia-cap12
    major: int
    minor: int
    required: bool = True   # False: denial is a warning (uvm-tools, MIG monitor/config)
    kind: str = "c"

    @property
    def path(self) -> str:
        return f"/dev/{self.name}"

    @property
    def majmin(self) -> str:
        return f"{self.major}:{self.minor}"

    def to_dict(self) -> dict:
        return {"device": self.path, "major": self.major, "minor": self.minor,
                "type": self.kind}


@dataclasses.dataclass
class GpuInfo:
    uuid: str | None
    minor: int | None
    index: int | None = None
    mig: list[dict] = dataclasses.field(default_factory=list)   # uuid, index, gi, ci


@dataclasses.dataclass
class Inventory:
    """What the host has: driver majors, GPUs and MIG capability minors."""

    majors: dict[str, int]
    gpus: list[GpuInfo]
    mig_minors: dict[str, int]          # "gpu0/gi1/access" -> minor, "config" -> minor
    source: str                         # nvml | procfs | nvml+procfs | none

    @property
    def uvm_major(self) -> int | None:
        return self.majors.get("nvidia-uvm")

    @property
    def caps_major(self) -> int | None:
        return self.majors.get("nvidia-caps")

    def by_uuid(self, uuid: str) -> GpuInfo | None:
        u = uuid.lower()
        return next((g for g in self.gpus if g.uuid and g.uuid.lower() == u), None)

    def by_index(self, index: int) -> GpuInfo | None:
        return next((g for g in self.gpus if g.index == index), None)

    def mig_parent(self, mig_uuid: str) -> tuple[GpuInfo, dict] | None:
        u = mig_uuid.lower()
        for g in self.gpus:
            for m in g.mig:
                if str(m.get("uuid", "")).lower() == u:
                    return g, m
        return None


# -- reading the host ---------------------------------------------------------------------

_INFO_RE = re.compile(r"^\s*([^:]+?)\s*:\s*(.*?)\s*$")


def parse_gpu_information(text: str) -> dict[str, str]:
    """proc/driver/nvidia/gpus/<bus>/information: 'Key:   value' lines."""
    out = {}
    for line in text.splitlines():
        m = _INFO_RE.match(line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def procfs_gpus(host_root: Path) -> list[GpuInfo]:
    """GPUs from proc/driver/nvidia/gpus/*/information, in PCI bus order (NVML's index order
    when CUDA_DEVICE_ORDER is unset, so the index is a reasonable fallback)."""
    base = hostfs.resolve(host_root, "proc/driver/nvidia/gpus")
    if base is None:
        return []
    out = []
    for i, d in enumerate(sorted(p for p in base.iterdir() if p.is_dir())):
        text = hostfs.read_text(d, "information", 1 << 16)
        if text is None:
            continue
        info = parse_gpu_information(text)
        minor = info.get("Device Minor")
        out.append(GpuInfo(uuid=info.get("GPU UUID") or None,
                           minor=int(minor) if minor and minor.isdigit() else None, index=i))
    return out


def parse_mig_minors(text: str) -> dict[str, int]:
    """proc/driver/nvidia-caps/mig-minors: 'config 1', 'monitor 2', 'gpu0/gi1/access 12',
    'gpu0/gi1/ci0/access 13'."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def inventory(host_root: Path, nvml: Mapping | None) -> Inventory:
    majors = hostfs.proc_devices(host_root)
    nv_majors = {k: v for k, v in majors.items() if k.startswith("nvidia")}
    pgpus = procfs_gpus(host_root)
    gpus: list[GpuInfo] = []
    source = "none"
    if nvml and nvml.get("status") == "ok" and nvml.get("gpus"):
        source = "nvml"
        for g in nvml["gpus"]:
            minor = g.get("minor")
            if minor is None and g.get("uuid"):       # fill in from procfs by UUID
                p = next((x for x in pgpus if x.uuid and x.uuid.lower() == g["uuid"].lower()),
                         None)
                if p is not None:
                    minor, source = p.minor, "nvml+procfs"
            gpus.append(GpuInfo(
                uuid=g.get("uuid"), minor=minor, index=g.get("index"),
                mig=[{"uuid": m.get("uuid"), "index": m.get("index"),
                      "gi": m.get("gpu_instance_id"), "ci": m.get("compute_instance_id")}
                     for m in g.get("mig_devices") or ()]))
    elif pgpus:
        gpus, source = pgpus, "procfs"
    mig_text = hostfs.read_text(host_root, "proc/driver/nvidia-caps/mig-minors") or ""
    return Inventory(majors=nv_majors, gpus=gpus, mig_minors=parse_mig_minors(mig_text),
                     source=source)


# -- what a container needs ----------------------------------------------------------------

@dataclasses.dataclass
class Expectation:
    devices: list[Device]
    notes: list[str]            # what could not be resolved (so evidence says so)
    gpus: list[str]             # how each assigned id was resolved, for evidence


_MIG_OLD = re.compile(r"^MIG-(GPU-[0-9a-fA-F-]+)/(\d+)/(\d+)$")
_MIG_IDX = re.compile(r"^(\d+):(\d+)$")


def _gpu_device(g: GpuInfo) -> Device | None:
    if g.minor is None:
        return None
    return Device(f"nvidia{g.minor}", NVIDIA_MAJOR, g.minor)


def _caps_devices(inv: Inventory, gpu_minor: int | None, gi, ci) -> list[Device]:
    if inv.caps_major is None or gpu_minor is None or gi is None or ci is None:
        return []
    out = []
    for key in (f"gpu{gpu_minor}/gi{gi}/access", f"gpu{gpu_minor}/gi{gi}/ci{ci}/access"):
        minor = inv.mig_minors.get(key)
        if minor is not None:
            out.append(Device(f"nvidia-caps/nvidia-cap{minor}", inv.caps_major, minor))
    return out


def expected_devices(gpu_ids: Sequence[str], inv: Inventory,
                     env: Mapping[str, str] | None = None) -> Expectation:
    """Devices a container with these assigned GPU ids needs, as (major, minor)."""
    env = env or {}
    devs: list[Device] = [Device("nvidiactl", NVIDIA_MAJOR, CTL_MINOR)]
    notes: list[str] = []
    resolved: list[str] = []
    if inv.uvm_major is not None:
        devs.append(Device("nvidia-uvm", inv.uvm_major, UVM_MINOR))
        devs.append(Device("nvidia-uvm-tools", inv.uvm_major, UVM_TOOLS_MINOR, required=False))
    else:
        notes.append("nvidia-uvm is not in proc/devices (module not loaded): not checked")

    def add(d: Device | None) -> None:
        if d is not None and all(x.majmin != d.majmin for x in devs):
            devs.append(d)

    for raw in gpu_ids:
        gid = raw.split("::", 1)[0].strip()      # time-slicing replicas: GPU-x::3
        if gid == "all":
            if not inv.gpus:
                notes.append("NVIDIA_VISIBLE_DEVICES=all but no GPU inventory (NVML, procfs)")
            for g in inv.gpus:
                add(_gpu_device(g))
            resolved.append("all")
            continue
        if gid == "?":
            notes.append("GPUs passed as volume mounts: per-GPU nodes not checked")
            continue
        m_old = _MIG_OLD.match(gid)
        m_idx = _MIG_IDX.match(gid)
        g = mig = None
        if gid.upper().startswith("GPU-"):
            g = inv.by_uuid(gid)
        elif gid.upper().startswith("MIG-") and m_old:
            g = inv.by_uuid(m_old.group(1))
            mig = {"gi": int(m_old.group(2)), "ci": int(m_old.group(3))}
        elif gid.upper().startswith("MIG-"):
            found = inv.mig_parent(gid)
            if found:
                g, mig = found
        elif m_idx:
            g = inv.by_index(int(m_idx.group(1)))
            if g is not None:
                mig = next((m for m in g.mig if m.get("index") == int(m_idx.group(2))), None)
                if mig is None:
                    notes.append(f"{gid}: MIG device index not found in NVML inventory")
        elif gid.isdigit():
            g = inv.by_index(int(gid))
        if g is None or g.minor is None:
            notes.append(f"{gid}: GPU not found in the inventory ({inv.source}); "
                         f"its /dev/nvidiaN was not checked")
            continue
        add(_gpu_device(g))
        resolved.append(f"{gid} -> /dev/nvidia{g.minor}")
        if mig is not None or gid.upper().startswith("MIG-") or m_idx:
            caps = _caps_devices(inv, g.minor, (mig or {}).get("gi"), (mig or {}).get("ci"))
            if caps:
                for d in caps:
                    add(d)
            else:
                notes.append(f"{gid}: MIG capability nodes not resolved (nvidia-caps major "
                             f"or proc/driver/nvidia-caps/mig-minors missing)")
    for var, key in (("NVIDIA_MIG_CONFIG_DEVICES", "config"),
                     ("NVIDIA_MIG_MONITOR_DEVICES", "monitor")):
        if env.get(var, "").strip().lower() == "all" and inv.caps_major is not None:
            minor = inv.mig_minors.get(key)
            if minor is not None:
                add(Device(f"nvidia-caps/nvidia-cap{minor}", inv.caps_major, minor,
                           required=False))
    return Expectation(devs, notes, resolved)


def host_nvidia_nodes(host_root: Path) -> list[Device]:
    """NVIDIA character devices present in <host-root>/dev (nvidia*, nvidia-caps/*)."""
    out = []
    dev = Path(host_root) / "dev"
    cands: list[tuple[str, Path]] = []
    try:
        for e in os.scandir(dev):
            if e.name.startswith("nvidia") and e.name != "nvidia-caps":
                cands.append((e.name, Path(e.path)))
    except OSError:
        return []
    try:
        for e in os.scandir(dev / "nvidia-caps"):
            cands.append((f"nvidia-caps/{e.name}", Path(e.path)))
    except OSError:
        pass
    for name, p in sorted(cands):
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode):
            out.append(Device(name, os.major(st.st_rdev), os.minor(st.st_rdev)))
    return out


def missing_dev_char_links(host_root: Path, nodes: Iterable[Device]) -> list[Device]:
    """NVIDIA nodes without /dev/char/<major>:<minor>: systemd resolves DeviceAllow= entries
    through these links, so on systemd-driver nodes a missing link means the rule is dropped
    the next time systemd re-applies the unit's device policy (daemon-reload)."""
    base = Path(host_root) / "dev" / "char"
    return [d for d in nodes if not os.path.lexists(base / d.majmin)]


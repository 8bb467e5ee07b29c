"""Where things are on this node: one resolver per question, each saying how it decided.

Why: GPU nodes come in many layouts (kubeadm, GPU Operator, GKE COS, EKS AL2023 and
Bottlerocket, AKS, OpenShift/CRI-O, k3s/RKE2, microk8s, k0s, Talos) and a check that guesses a
path on its own disagrees with the next one (`nvml` found the GPU Operator's driver while
`runtime_cdi` said there was none). Every check asks here instead:

- kubelet_dir: the running kubelet's --root-dir (a kubelet process whose socket in that dir it
  serves itself), then the documented defaults whose sockets exist.
- runtime: containerd or CRI-O, from its own process (the host's own, serving the socket its
  --address/--listen flag or its config's grpc.address / [crio.api] listen names, the kubelet's
  --container-runtime-endpoint choosing among several), then the process serving a known CRI
  socket; its own --config / --state / --root flags and config file (CRI-O's drop-ins too) say
  where its OCI bundles (config.json) are.
- driver_root: where libnvidia-ml.so.1 lives: what the NVIDIA device plugin was told
  (NVIDIA_DRIVER_ROOT / --nvidia-driver-root), the host, the GPU Operator's /run/nvidia/driver,
  GKE's /home/kubernetes/bin/nvidia, Bottlerocket's /usr/lib/nvidia/tesla/<version>.
- cgroups: version, hierarchy and driver (kubelet config, then the containers' cgroup paths,
  then kubepods.slice vs kubepods/).

Processes are identified by the sockets they serve (socket inode, deviceplugin.discovery), never
by name alone, and what a tenant can write never counts as the host's (host.host_owned): a
kubelet's --root-dir is believed only from a process that is the host's own (its root is the host
root, it runs in no pod's cgroup), and a driver library is loaded only from a path that is the
host's own (in no pod volume, container root or runtime dir; root-owned, not writable by others,
from the host root down). Results are cached per (host root, /proc, override) for the run.

This module is where the checks ask (the cached answers, and cgroups); each resolver is a
module of its own: kubelet_root_dir.py, runtime_layout.py, driver_libs.py, reading the host's
daemons through daemon_args.py, with one cache (run_cache.py).

Documented paths: https://docs.k0sproject.io/head/directories/ and
https://raw.githubusercontent.com/k0sproject/k0s/main/docs/runtime.md (k0s),
https://microk8s.io/docs/configuring-services (microk8s: ${SNAP_COMMON}/var/lib/kubelet,
${SNAP_COMMON}/run/containerd.sock), https://docs.k3s.io/advanced (k3s containerd
/run/k3s/containerd, /var/lib/rancher/k3s/agent/etc/containerd/config.toml),
https://docs.rke2.io/advanced (RKE2: /var/lib/rancher/rke2/agent/etc/containerd/config.toml,
/run/k3s/containerd/containerd.sock), GKE: container-engine-accelerators' driver installer
(/home/kubernetes/bin/nvidia), GPU Operator: NVIDIA_DRIVER_ROOT=/run/nvidia/driver,
Bottlerocket: bottlerocket-kernel-kit kmod-*-nvidia.spec (%{_cross_libdir}/nvidia/tesla/<ver>),
Talos: siderolabs/extensions#476 and #940 (/usr/local/glibc/usr/lib/libnvidia-ml.so.1).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from node_probe.host import host_owned, procfs
from node_probe.host.driver_libs import DriverRoot, resolve_driver_root
from node_probe.host.kubelet_root_dir import kubelet_dir
from node_probe.host.run_cache import cached
from node_probe.host.runtime_layout import Runtime, resolve_runtime
from node_probe.host.unix_sockets import find_owners, list_sockets
# the checks ask here for every answer and the constants they compare it with
from node_probe.host.driver_libs import GKE_DRIVER_ROOT, LIB, TALOS_DRIVER_ROOT  # noqa: F401


@dataclasses.dataclass(frozen=True)
class Cgroups:
    version: int | None
    hierarchy: str | None
    driver: str | None              # systemd | cgroupfs | None
    how: str

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def resolve_cgroups(cgroup_dir: Path, kubelet_cfg: dict | None = None,
                    observed: str | None = None) -> Cgroups:
    """`observed`: the driver the containers' own cgroup paths show (host.containers)."""
    from node_probe.host import containers   # containers imports nothing of this module
    h = containers.find_hierarchy(cgroup_dir)
    if h is None:
        return Cgroups(None, None, None, f"no devices (v1) or cgroup2 hierarchy under {cgroup_dir}")
    ver = f"cgroup v{h.version} at {h.root}"
    drv = str((kubelet_cfg or {}).get("cgroupDriver") or "").lower() or None
    if drv:
        return Cgroups(h.version, str(h.root), drv, f"{ver}; driver from the kubelet config")
    if observed:
        return Cgroups(h.version, str(h.root), observed, f"{ver}; driver from the containers' "
                       "cgroup paths")
    if (h.root / "kubepods.slice").is_dir():
        return Cgroups(h.version, str(h.root), "systemd", f"{ver}; kubepods.slice exists")
    if (h.root / "kubepods").is_dir():
        return Cgroups(h.version, str(h.root), "cgroupfs", f"{ver}; kubepods/ exists")
    return Cgroups(h.version, str(h.root), None, f"{ver}; driver unknown (no kubepods yet)")


def tenant_areas(host_root: Path, proc: Path = procfs.PROC,
                 kubelet: Path | None = None) -> host_owned.TenantAreas:
    """The areas tenants write on this node (host.host_owned), with this node's own kubelet
    dir and runtime state and storage dirs added to the known ones."""
    def resolve() -> host_owned.TenantAreas:
        kdir = kubelet or kubelet_dir(host_root, proc).path
        try:
            krel = str(Path(kdir).relative_to(host_root))
        except ValueError:
            krel = None
        rt = runtime(host_root, proc)
        return host_owned.tenant_areas(host_root, proc, (krel,), (rt.state_dir, rt.root_dir))
    return cached(("areas", str(host_root), str(proc), str(kubelet)), resolve)


def runtime(host_root: Path, proc: Path = procfs.PROC) -> Runtime:
    return cached(("runtime", str(host_root), str(proc)),
                  lambda: resolve_runtime(host_root, proc))


def driver_root(host_root: Path, proc: Path = procfs.PROC,
                kubelet: Path | None = None) -> DriverRoot:
    """The driver root; the device plugins serving sockets in the kubelet dir are asked first."""
    def resolve() -> DriverRoot:
        kdir = kubelet or kubelet_dir(host_root, proc).path
        owners = find_owners(list_sockets(kdir), proc)
        pids = sorted({o[0] for o in owners.values()})
        return resolve_driver_root(host_root, proc, pids, tenant_areas(host_root, proc, kdir))
    return cached(("driver", str(host_root), str(proc), str(kubelet)), resolve)

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
import os
import stat
import threading
import time
import tomllib
from pathlib import Path
from typing import Callable

from node_probe.host.unix_sockets import find_owners, list_sockets
from node_probe.host import host_owned, hostfs, procfs

# --- kubelet dir ---------------------------------------------------------------------------
KUBELET_DEFAULTS = (
    ("var/lib/kubelet", "the default (kubeadm, EKS, GKE, AKS, OpenShift, k3s, RKE2, Talos)"),
    ("var/lib/k0s/kubelet", "k0s's default (<data-dir>/kubelet)"),
    ("var/snap/microk8s/common/var/lib/kubelet", "microk8s's default"),
)
KUBELET_SOCKETS = ("device-plugins/kubelet.sock", "pod-resources/kubelet.sock")
# processes that run a kubelet: kubelet itself, microk8s's kubelite, k3s/k0s agents
KUBELET_COMMS = ("kubelet", "kubelite", "k3s-server", "k3s-agent", "k3s", "k0s")
MAX_PROCS_SEEN = 16
MAX_SHOWN = 200          # characters of a tenant-chosen path kept in `tried`

# --- runtime -------------------------------------------------------------------------------
CONTAINERD_SOCKETS = (
    ("run/containerd/containerd.sock", "run/containerd", "var/lib/containerd",
     "etc/containerd/config.toml"),
    ("var/run/containerd/containerd.sock", "run/containerd", "var/lib/containerd",
     "etc/containerd/config.toml"),
    ("run/k3s/containerd/containerd.sock", "run/k3s/containerd",
     "var/lib/rancher/k3s/agent/containerd", "var/lib/rancher/k3s/agent/etc/containerd/config.toml"),
    ("run/k0s/containerd.sock", "run/k0s/containerd", "var/lib/k0s/containerd",
     "etc/k0s/containerd.toml"),
    ("var/snap/microk8s/common/run/containerd.sock", "var/snap/microk8s/common/run/containerd",
     "var/snap/microk8s/common/var/lib/containerd",
     "var/snap/microk8s/current/args/containerd.toml"),
)
RKE2_CONTAINERD_CONFIG = "var/lib/rancher/rke2/agent/etc/containerd/config.toml"
CRIO_SOCKETS = ("run/crio/crio.sock", "var/run/crio/crio.sock")
CRIO_DEFAULTS = ("var/lib/containers/storage", "run/containers/storage", "etc/crio/crio.conf")
CRIO_CONFIG_DIR = "etc/crio/crio.conf.d"
# the runtimes' own processes, and their compiled-in defaults when neither a flag nor the config
# names a value: containerd's `containerd --help`/docs/man/containerd-config.toml.5.md
# (/run/containerd/containerd.sock, /etc/containerd/config.toml), CRI-O's crio.conf(5)
# ([crio.api] listen = /var/run/crio/crio.sock; --config-dir /etc/crio/crio.conf.d)
RUNTIME_COMMS = {"containerd": "containerd", "crio": "cri-o"}
MAX_DROPINS = 64
MAX_CONFIG_BYTES = 1 << 20

# --- driver root ---------------------------------------------------------------------------
LIB = "libnvidia-ml.so.1"
LIB_SUBDIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64", "usr/lib",
               "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu", "lib64",
               "usr/local/nvidia/lib64")
GKE_DRIVER_ROOT = "home/kubernetes/bin/nvidia"
TALOS_DRIVER_ROOT = "usr/local/glibc"
DRIVER_ROOTS = (
    ("", "the host"),
    ("run/nvidia/driver", "the GPU Operator's driver container"),
    (GKE_DRIVER_ROOT, "GKE's driver installer"),
    (TALOS_DRIVER_ROOT, "Talos's NVIDIA extension (its glibc subroot)"),
)
# Where a driver's libraries live, as paths under a root: every driver root's library dirs
# (checks/nvml, and tracing/libs for the libraries uprobes attach to in a process's root).
LIB_DIRS = tuple(f"{r}/{d}".lstrip("/") for r, _why in DRIVER_ROOTS
                 for d in LIB_SUBDIRS + (("lib64",) if r else ()))
BOTTLEROCKET_LIBS = "usr/lib/nvidia/tesla"    # <version>/libnvidia-ml.so.1
MAX_VERSIONS = 8
PLUGIN_ROOT_ENV = "NVIDIA_DRIVER_ROOT"
PLUGIN_ROOT_FLAGS = ("--nvidia-driver-root", "--driver-root")


@dataclasses.dataclass(frozen=True)
class KubeletDir:
    path: Path
    how: str
    pid: int | None = None          # the kubelet serving its sockets (None: down or unknown)
    served: bool = False
    tried: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"path": str(self.path), "how": self.how, "pid": self.pid, "served": self.served,
                "tried": list(self.tried)}


@dataclasses.dataclass(frozen=True)
class Runtime:
    name: str | None                # containerd | cri-o | None
    how: str
    pid: int | None = None
    socket: str | None = None       # host path ("/run/containerd/containerd.sock")
    config: str | None = None
    state_dir: str | None = None    # containerd --state / CRI-O runroot (host path)
    root_dir: str | None = None
    tried: tuple[str, ...] = ()
    config_dir: str | None = None   # CRI-O's drop-in dir (--config-dir), host path

    def bundle_configs(self) -> tuple[tuple[str, str], ...]:
        """(OCI config.json path under the host root with {id}, format) for this runtime."""
        def esc(d: str) -> str:   # a path from a config file; the pattern is str.format()ted
            return d.strip("/").replace("{", "{{").replace("}", "}}")
        if self.name == "containerd" and self.state_dir:
            s = esc(self.state_dir)
            return ((f"{s}/io.containerd.runtime.v2.task/k8s.io/{{id}}/config.json", "oci"),
                    (f"{s}/io.containerd.runtime.v1.linux/k8s.io/{{id}}/config.json", "oci"))
        if self.name == "cri-o" and self.state_dir:
            out = [(f"{esc(self.state_dir)}/overlay-containers/{{id}}/userdata/config.json",
                    "oci")]
            if self.root_dir:
                out.append((f"{esc(self.root_dir)}/overlay-containers/{{id}}/userdata/"
                            "config.json", "oci"))
            return tuple(out)
        return ()

    def to_dict(self) -> dict:
        return {"name": self.name, "how": self.how, "pid": self.pid, "socket": self.socket,
                "config": self.config, "config_dir": self.config_dir,
                "state_dir": self.state_dir, "root_dir": self.root_dir, "tried": list(self.tried)}


@dataclasses.dataclass(frozen=True)
class DriverRoot:
    root: str | None                # "" (the host), "run/nvidia/driver", ...; None: not found
    library: Path | None            # libnvidia-ml.so.1 as the probe can open it
    how: str
    kernel_module: bool = False     # proc/driver/nvidia/version exists
    device_nodes: bool = False      # dev/nvidiactl under the host or the driver root
    tried: tuple[str, ...] = ()
    refused: tuple[tuple[str, str], ...] = ()   # (library, why it is not the host's own)

    @property
    def present(self) -> bool:
        """Is there an NVIDIA driver on this node at all (library, module or devices)."""
        return self.library is not None or self.kernel_module or self.device_nodes

    def to_dict(self) -> dict:
        return {"root": None if self.root is None else "/" + self.root,
                "library": str(self.library) if self.library else None, "how": self.how,
                "kernel_module": self.kernel_module, "device_nodes": self.device_nodes,
                "tried": list(self.tried),
                "refused": [{"library": lib, "why": why} for lib, why in self.refused]}


@dataclasses.dataclass(frozen=True)
class Cgroups:
    version: int | None
    hierarchy: str | None
    driver: str | None              # systemd | cgroupfs | None
    how: str

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# --- helpers -------------------------------------------------------------------------------
def _is_socket(p: Path | None) -> bool:
    try:
        return p is not None and stat.S_ISSOCK(os.lstat(p).st_mode)
    except OSError:
        return False


def _flag(argv: list[str], *names: str) -> str | None:
    """--name=value / --name value / -n value (last one wins)."""
    val = None
    for i, a in enumerate(argv):
        for n in names:
            if a.startswith(n + "="):
                val = a[len(n) + 1:]
            elif a == n and i + 1 < len(argv):
                val = argv[i + 1]
    return val


def _procs(comms: tuple[str, ...], proc: Path, host_root: Path, refused: list | None = None,
           keep: Callable[[int, list[str]], bool] | None = None) -> list[tuple[int, list[str]]]:
    """(pid, argv) of the first MAX_PROCS_SEEN processes named in `comms` that are the host's
    own (host_owned.process_refusal) and that `keep` keeps (one that names nothing to look at
    is of no use). Any other is passed over without taking a slot: sixteen decoys named
    `kubelet` (prctl(PR_SET_NAME) in a tenant's container) started before the kubelet once
    filled the slots and hid it (audit round 5, HK-01). The scan goes on through every process
    until the slots are full. The first MAX_PROCS_SEEN refusals go to `refused` as (pid,
    argv, why)."""
    out = []
    for pid in procfs.pids(proc):
        if procfs.read_comm(pid, proc) not in comms:
            continue
        no = host_owned.process_refusal(pid, proc, host_root)
        if no:
            if refused is not None and len(refused) < MAX_PROCS_SEEN:
                refused.append((pid, procfs.read_cmdline(pid, proc), no))
            continue
        argv = procfs.read_cmdline(pid, proc)
        if keep is not None and not keep(pid, argv):
            continue
        out.append((pid, argv))
        if len(out) >= MAX_PROCS_SEEN:
            break
    return out


def _toml(root: Path, rel: str) -> dict:
    text = hostfs.read_text(root, rel.lstrip("/"), limit=MAX_CONFIG_BYTES)
    if not text:
        return {}
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return {}


# --- resolvers -----------------------------------------------------------------------------
def resolve_kubelet_dir(host_root: Path, proc: Path = procfs.PROC,
                        override: Path | None = None) -> KubeletDir:
    if override is not None:
        return KubeletDir(Path(override), "given with --kubelet-dir")
    host_root = Path(host_root)
    cands: list[tuple[str, str, int | None]] = []      # (rel, why, pid that named it)
    refused: list[str] = []
    areas = host_owned.tenant_areas(host_root, proc)
    decoys: list = []
    for pid, argv, no in [(pid, argv, None) for pid, argv in
                          _procs(KUBELET_COMMS, proc, host_root, decoys,
                                 keep=lambda _pid, argv: bool(_root_dir(argv)))] + decoys:
        d = _root_dir(argv)
        if d and d.startswith("/"):
            why = f"--root-dir of pid {pid} ({(argv[0] if argv else '?')[:MAX_SHOWN]})"
            no = no or _kubelet_dir_refusal(d, pid, host_root, proc, areas)
            if no:
                refused.append(f"{d[:MAX_SHOWN]} ({why}: not believed: {no})")
                continue
            cands.append((d.strip("/"), why, pid))
    cands += [(rel, why, None) for rel, why in KUBELET_DEFAULTS]
    seen: dict[str, tuple[str, int | None]] = {}
    for rel, why, pid in cands:
        seen.setdefault(rel, (why, pid))
    tried = tuple("/" + rel for rel in seen) + tuple(refused)
    socks = {rel: [host_root / rel / s for s in KUBELET_SOCKETS
                   if _is_socket(host_root / rel / s)] for rel in seen}
    owners = find_owners([s for ss in socks.values() for s in ss], proc)
    for rel, (why, pid) in seen.items():          # a kubelet serves its sockets here
        served = [owners[s][0] for s in socks[rel] if s in owners]
        if served and (pid is None or pid in served):
            return KubeletDir(host_root / rel, f"{why}; its sockets are served by pid "
                              f"{served[0]}", served[0], True, tried)
    for rel, (why, _pid) in seen.items():         # sockets left by a kubelet that is down
        if socks[rel]:
            return KubeletDir(host_root / rel, f"{why}; {socks[rel][0].name} there, but no "
                              "process serves it (the kubelet is down)", None, False, tried)
    for rel, (why, _pid) in seen.items():         # a device plugin still serves its socket
        plugin_owners = find_owners(list_sockets(host_root / rel), proc)
        if plugin_owners:
            pid = next(iter(plugin_owners.values()))[0]
            return KubeletDir(host_root / rel, f"{why}; a device plugin (pid {pid}) serves its "
                              "socket there but no kubelet socket exists (the kubelet is down)",
                              None, False, tried)
    for rel, (why, _pid) in seen.items():
        if (host_root / rel / "device-plugins").is_dir() or (host_root / rel / "pods").is_dir():
            return KubeletDir(host_root / rel, f"{why}; it has device-plugins/ or pods/, no "
                              "kubelet socket", None, False, tried)
    return KubeletDir(host_root / KUBELET_DEFAULTS[0][0], "no kubelet found: the default",
                      None, False, tried)


def _root_dir(argv: list[str]) -> str | None:
    d = _flag(argv, "--root-dir", "--kubelet-root-dir")
    if d is None:   # k3s/RKE2: --kubelet-arg=root-dir=/x
        for a in argv:
            v = a.split("=", 1)[1] if a.startswith("--kubelet-arg=") else None
            if v and v.startswith("root-dir="):
                d = v.split("=", 1)[1]
    return d


def _kubelet_dir_refusal(d: str, pid: int, host_root: Path, proc: Path,
                         areas: host_owned.TenantAreas) -> str | None:
    """Why the --root-dir `d` of process `pid` is not the host kubelet's (None: it may be):
    only a process of the host's own names the kubelet dir, and never one a tenant writes."""
    no = host_owned.process_refusal(pid, proc, host_root)
    if no:
        return no
    area = areas.holding(d)
    return f"it lies in /{area}, {areas.why.get(area)}" if area else None


def _str(v) -> str | None:
    return v if isinstance(v, str) and v else None


def _containerd_dirs(root: Path, pid: int | None, proc: Path, default: tuple,
                     sock_how: str = "") -> Runtime:
    sock, state, croot, cfg = default
    argv = procfs.read_cmdline(pid, proc) if pid else []
    cfg_arg = _flag(argv, "--config", "-c")
    cfg = cfg_arg.lstrip("/") if cfg_arg else cfg
    if not cfg_arg and not (root / cfg).is_file() and (root / RKE2_CONTAINERD_CONFIG).is_file():
        cfg = RKE2_CONTAINERD_CONFIG
    doc = _toml(root, cfg)
    state_v = _flag(argv, "--state") or _str(doc.get("state"))
    root_v = _flag(argv, "--root") or _str(doc.get("root"))
    how = []
    if pid:
        how.append(f"pid {pid} serves /{sock}" + sock_how)
    how.append(f"config /{cfg}" + (" (--config)" if cfg_arg else ""))
    how.append("state " + ("from " + ("--state" if _flag(argv, "--state") else "config")
                           if state_v else "default"))
    return Runtime("containerd", "; ".join(how), pid, "/" + sock, "/" + cfg,
                   state_v or "/" + state, root_v or "/" + croot)


def _crio_doc(root: Path, argv: list[str]) -> tuple[str, str, dict]:
    """(config, drop-in dir, the [crio] table of the config with its drop-ins merged in name
    order, as CRI-O merges them)."""
    cfg = (_flag(argv, "--config", "-c") or CRIO_DEFAULTS[2]).lstrip("/")
    cdir = (_flag(argv, "--config-dir", "-d") or CRIO_CONFIG_DIR).lstrip("/")
    doc = dict(_toml(root, cfg).get("crio") or {})
    real = hostfs.resolve(root, cdir)
    names = sorted(os.listdir(real))[:MAX_DROPINS] if real is not None and real.is_dir() else []
    for n in names:
        if n.endswith(".conf"):
            for k, v in (_toml(root, f"{cdir}/{n}").get("crio") or {}).items():
                doc[k] = {**doc[k], **v} if isinstance(v, dict) and isinstance(doc.get(k), dict) \
                    else v
    return cfg, cdir, doc


def _crio(root: Path, pid: int | None, proc: Path, sock: str, sock_how: str = "") -> Runtime:
    sroot, runroot, _ = CRIO_DEFAULTS
    argv = procfs.read_cmdline(pid, proc) if pid else []
    cfg, cdir, doc = _crio_doc(root, argv)
    runroot_v = _flag(argv, "--runroot") or _str(doc.get("runroot"))
    root_v = _flag(argv, "--root") or _str(doc.get("root"))
    how = (f"pid {pid} serves /{sock}{sock_how}; " if pid else "") + f"config /{cfg}"
    return Runtime("cri-o", how, pid, "/" + sock, "/" + cfg, runroot_v or "/" + runroot,
                   root_v or "/" + sroot, config_dir="/" + cdir)


def _address(root: Path, name: str, argv: list[str]) -> tuple[str, str]:
    """(the CRI socket a runtime process listens on, host-relative; how it was decided): its
    flag, else its config (containerd `[grpc] address`, CRI-O `[crio.api] listen`), else the
    runtime's own default."""
    if name == "containerd":
        a = _flag(argv, "--address", "-a")
        if a:
            return a.strip("/"), " (--address)"
        cfg = (_flag(argv, "--config", "-c") or CONTAINERD_SOCKETS[0][3]).lstrip("/")
        a = _str((_toml(root, cfg).get("grpc") or {}).get("address"))
        if a:
            return a.strip("/"), f" (grpc.address in /{cfg})"
        return CONTAINERD_SOCKETS[0][0], " (containerd's default address)"
    a = _flag(argv, "--listen")
    if a:
        return a.strip("/"), " (--listen)"
    cfg, _cdir, doc = _crio_doc(root, argv)
    a = _str((doc.get("api") or {}).get("listen"))
    if a:
        return a.strip("/"), f" ([crio.api] listen in /{cfg} or its drop-ins)"
    return CRIO_SOCKETS[1], " (CRI-O's default listen)"


def _kubelet_endpoint(root: Path, proc: Path) -> str | None:
    """The CRI socket the kubelet uses (host-relative): its --container-runtime-endpoint, else
    containerRuntimeEndpoint in its config (KubeletConfiguration, v1.27+)."""
    from node_probe.host import kubeletconfig
    kd = kubelet_dir(root, proc)
    if kd.pid is None:
        return None
    ep = _flag(procfs.read_cmdline(kd.pid, proc), "--container-runtime-endpoint") or \
        _str(kubeletconfig.load(root, kd.path, proc).get("containerRuntimeEndpoint"))
    return ep.removeprefix("unix://").strip("/") if ep else None


def _from_processes(root: Path, proc: Path) -> list[Runtime]:
    """The containerd and CRI-O processes that are the host's own and serve the CRI socket their
    own flags and config name: decided from the running process, wherever its socket is."""
    out = []
    serving: dict[int, tuple[str, str, str]] = {}   # pid: (runtime, socket, how it was named)

    def serves(pid: int, argv: list[str]) -> bool:
        name = RUNTIME_COMMS.get(procfs.read_comm(pid, proc))
        if name is None:
            return False
        sock, why = _address(root, name, argv)
        p = root / sock
        if not _is_socket(p) or find_owners([p], proc).get(p, (None,))[0] != pid:
            return False
        serving[pid] = (name, sock, why)
        return True

    for pid, _argv in _procs(tuple(RUNTIME_COMMS), proc, root, keep=serves):
        name, sock, why = serving[pid]
        out.append(_containerd_dirs(root, pid, proc, (sock, *CONTAINERD_SOCKETS[0][1:]), why)
                   if name == "containerd" else _crio(root, pid, proc, sock, why))
    return out


def resolve_runtime(host_root: Path, proc: Path = procfs.PROC) -> Runtime:
    root = Path(host_root)
    cands = [("containerd", d[0], d) for d in CONTAINERD_SOCKETS] + \
            [("cri-o", s, None) for s in CRIO_SOCKETS]
    live = _from_processes(root, proc)
    tried = tuple(dict.fromkeys([*(r.socket for r in live), *("/" + c[1] for c in cands)]))
    if live:
        ep = _kubelet_endpoint(root, proc) if len(live) > 1 else None
        pick = next((r for r in live if ep and r.socket == "/" + ep), live[0])
        why = (f"; the kubelet's runtime endpoint is /{ep}" if ep and pick.socket == "/" + ep
               else "")
        others = [f"{r.name} (pid {r.pid}, {r.socket})" for r in live if r is not pick]
        return dataclasses.replace(
            pick, how=pick.how + why + (f"; also running: {', '.join(others)}" if others else ""),
            tried=tried)
    files = {c[1]: root / c[1] for c in cands if _is_socket(root / c[1])}
    owners = find_owners(list(dict.fromkeys(files.values())), proc)
    for served in (True, False):
        for name, sock, default in cands:
            p = files.get(sock)
            if p is None or (p in owners) != served:
                continue
            pid = owners[p][0] if served else None
            rt = (_containerd_dirs(root, pid, proc, default) if name == "containerd"
                  else _crio(root, pid, proc, sock))
            if not served:
                rt = dataclasses.replace(rt, how=rt.how + "; socket present but nobody serves it")
            return dataclasses.replace(rt, tried=tried)
    for name, sock, default in cands:       # no socket (an offline capture): state dirs
        if name == "containerd" and (root / default[1] / "io.containerd.runtime.v2.task/k8s.io"
                                     ).is_dir():
            rt = _containerd_dirs(root, None, proc, default)
            return dataclasses.replace(rt, how=rt.how + "; no socket, its state dir exists",
                                       tried=tried)
        if name == "cri-o" and (root / "etc/crio").is_dir() and \
                (root / CRIO_DEFAULTS[1] / "overlay-containers").is_dir():
            rt = _crio(root, None, proc, sock)
            return dataclasses.replace(rt, how=rt.how + "; no socket, its runroot exists",
                                       tried=tried)
    return Runtime(None, "no containerd or CRI-O socket or state dir found", tried=tried)


def _library_under(root: Path, droot: str) -> Path | None:
    for d in LIB_SUBDIRS + (("lib64",) if droot else ()):
        p = hostfs.resolve(root, f"{droot}/{d}/{LIB}".lstrip("/"))
        if p is not None and p.is_file():
            return p
    return None


def _plugin_driver_roots(proc: Path, plugin_pids) -> list[tuple[str, str]]:
    """(driver root, how) the NVIDIA device plugins were told (env or flag)."""
    out = []
    for pid in plugin_pids:
        v = procfs.read_environ(pid, proc).get(PLUGIN_ROOT_ENV)
        src = f"{PLUGIN_ROOT_ENV}={v} in the device plugin (pid {pid})"
        if not v:
            v = _flag(procfs.read_cmdline(pid, proc), *PLUGIN_ROOT_FLAGS)
            src = f"the device plugin's (pid {pid}) driver-root flag {v}"
        if v and v.startswith("/"):
            out.append((v.strip("/"), src))
    return out


def resolve_driver_root(host_root: Path, proc: Path = procfs.PROC, plugin_pids=(),
                        areas: host_owned.TenantAreas | None = None) -> DriverRoot:
    """The first driver root whose libnvidia-ml.so.1 is the host's own (host.host_owned); a
    library found where a tenant can write is never loaded: it is listed in `refused`."""
    root = Path(host_root)
    areas = areas if areas is not None else host_owned.tenant_areas(root, proc)
    kmod = hostfs.resolve(root, "proc/driver/nvidia/version") is not None
    told = _plugin_driver_roots(proc, plugin_pids)
    cands = told + list(DRIVER_ROOTS)
    tried: list[str] = []
    refused: list[tuple[str, str]] = []
    devs = hostfs.resolve(root, "dev/nvidiactl") is not None

    def trusted(lib: Path | None) -> Path | None:
        no = None if lib is None else host_owned.path_refusal(lib, root, areas)
        if no:
            tried[-1] += f" ({LIB} there is not the host's own: not loaded)"
            refused.append(("/" + str(lib.relative_to(root)).lstrip("/"), no))
            return None
        return lib

    def found(droot: str, lib: Path, how: str) -> DriverRoot:
        return DriverRoot(droot, lib, how, kmod, devs, tuple(tried), tuple(refused))

    for droot, why in cands:
        tried.append("/" + droot[:MAX_SHOWN])
        lib = trusted(_library_under(root, droot))
        if droot and hostfs.resolve(root, f"{droot}/dev/nvidiactl") is not None:
            devs = True
        if lib is not None:
            return found(droot, lib, f"{LIB} under /{droot} ({why})")
    bdir = hostfs.resolve(root, BOTTLEROCKET_LIBS)
    tried.append("/" + BOTTLEROCKET_LIBS + "/<version>")
    if bdir is not None and bdir.is_dir():
        for v in sorted(os.listdir(bdir), reverse=True)[:MAX_VERSIONS]:
            p = hostfs.resolve(root, f"{BOTTLEROCKET_LIBS}/{v}/{LIB}")
            if p is not None and p.is_file() and trusted(p) is not None:
                return found("", p, f"{LIB} in /{BOTTLEROCKET_LIBS}/{v} (Bottlerocket)")
    how = ("no " + LIB + " found" + (" that is the host's own" if refused else "")
           + ("; the kernel module is loaded" if kmod else "")
           + ("; NVIDIA device nodes exist" if devs else ""))
    return DriverRoot(None, None, how, kmod, devs, tuple(tried), tuple(refused))


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


# --- per-run cache -------------------------------------------------------------------------
# One run asks each question once; a long-lived process (a watch loop) asks again after
# CACHE_TTL_S, since kubelets restart and drivers get reinstalled.
CACHE_TTL_S = 30.0
MAX_CACHED = 64
_lock = threading.Lock()
_cache: dict[tuple, tuple[float, object]] = {}


def _cached(key: tuple, fn):
    now = time.monotonic()
    with _lock:
        hit = _cache.get(key)
        if hit is not None and now - hit[0] < CACHE_TTL_S:
            return hit[1]
    val = fn()
    with _lock:
        if len(_cache) >= MAX_CACHED:
            _cache.clear()
        _cache[key] = (now, val)
        return val


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
    return _cached(("areas", str(host_root), str(proc), str(kubelet)), resolve)


def kubelet_dir(host_root: Path, proc: Path = procfs.PROC,
                override: Path | None = None) -> KubeletDir:
    return _cached(("kubelet", str(host_root), str(proc), str(override)),
                   lambda: resolve_kubelet_dir(host_root, proc, override))


def runtime(host_root: Path, proc: Path = procfs.PROC) -> Runtime:
    return _cached(("runtime", str(host_root), str(proc)),
                   lambda: resolve_runtime(host_root, proc))


def driver_root(host_root: Path, proc: Path = procfs.PROC,
                kubelet: Path | None = None) -> DriverRoot:
    """The driver root; the device plugins serving sockets in the kubelet dir are asked first."""
    def resolve() -> DriverRoot:
        kdir = kubelet or kubelet_dir(host_root, proc).path
        owners = find_owners(list_sockets(kdir), proc)
        pids = sorted({o[0] for o in owners.values()})
        return resolve_driver_root(host_root, proc, pids, tenant_areas(host_root, proc, kdir))
    return _cached(("driver", str(host_root), str(proc), str(kubelet)), resolve)

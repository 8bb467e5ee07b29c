"""Which container runtime runs this node's pods (containerd or CRI-O) and where it keeps them:
its socket, state and root dirs, and where its OCI bundles (config.json) are.

Why a module of its own: distributions move the runtime (k3s/RKE2 under /run/k3s, microk8s under
the snap, k0s, CRI-O's drop-ins), and the answer is in the runtime's own process: its
--address / --listen / --config / --state / --root flags and its config file, the kubelet's
--container-runtime-endpoint choosing among several. layout.runtime asks this once per run.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from node_probe.host.unix_sockets import find_owners
from node_probe.host import hostfs, procfs

from node_probe.host.daemon_args import as_str, flag, host_procs, is_socket, read_toml
from node_probe.host.kubelet_root_dir import kubelet_dir


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


def _containerd_dirs(root: Path, pid: int | None, proc: Path, default: tuple,
                     sock_how: str = "") -> Runtime:
    sock, state, croot, cfg = default
    argv = procfs.read_cmdline(pid, proc) if pid else []
    cfg_arg = flag(argv, "--config", "-c")
    cfg = cfg_arg.lstrip("/") if cfg_arg else cfg
    if not cfg_arg and not (root / cfg).is_file() and (root / RKE2_CONTAINERD_CONFIG).is_file():
        cfg = RKE2_CONTAINERD_CONFIG
    doc = read_toml(root, cfg)
    state_v = flag(argv, "--state") or as_str(doc.get("state"))
    root_v = flag(argv, "--root") or as_str(doc.get("root"))
    how = []
    if pid:
        how.append(f"pid {pid} serves /{sock}" + sock_how)
    how.append(f"config /{cfg}" + (" (--config)" if cfg_arg else ""))
    how.append("state " + ("from " + ("--state" if flag(argv, "--state") else "config")
                           if state_v else "default"))
    return Runtime("containerd", "; ".join(how), pid, "/" + sock, "/" + cfg,
                   state_v or "/" + state, root_v or "/" + croot)


def _crio_doc(root: Path, argv: list[str]) -> tuple[str, str, dict]:
    """(config, drop-in dir, the [crio] table of the config with its drop-ins merged in name
    order, as CRI-O merges them)."""
    cfg = (flag(argv, "--config", "-c") or CRIO_DEFAULTS[2]).lstrip("/")
    cdir = (flag(argv, "--config-dir", "-d") or CRIO_CONFIG_DIR).lstrip("/")
    doc = dict(read_toml(root, cfg).get("crio") or {})
    real = hostfs.resolve(root, cdir)
    names = sorted(os.listdir(real))[:MAX_DROPINS] if real is not None and real.is_dir() else []
    for n in names:
        if n.endswith(".conf"):
            for k, v in (read_toml(root, f"{cdir}/{n}").get("crio") or {}).items():
                doc[k] = {**doc[k], **v} if isinstance(v, dict) and isinstance(doc.get(k), dict) \
                    else v
    return cfg, cdir, doc


def _crio(root: Path, pid: int | None, proc: Path, sock: str, sock_how: str = "") -> Runtime:
    sroot, runroot, _ = CRIO_DEFAULTS
    argv = procfs.read_cmdline(pid, proc) if pid else []
    cfg, cdir, doc = _crio_doc(root, argv)
    runroot_v = flag(argv, "--runroot") or as_str(doc.get("runroot"))
    root_v = flag(argv, "--root") or as_str(doc.get("root"))
    how = (f"pid {pid} serves /{sock}{sock_how}; " if pid else "") + f"config /{cfg}"
    return Runtime("cri-o", how, pid, "/" + sock, "/" + cfg, runroot_v or "/" + runroot,
                   root_v or "/" + sroot, config_dir="/" + cdir)


def _address(root: Path, name: str, argv: list[str]) -> tuple[str, str]:
    """(the CRI socket a runtime process listens on, host-relative; how it was decided): its
    flag, else its config (containerd `[grpc] address`, CRI-O `[crio.api] listen`), else the
    runtime's own default."""
    if name == "containerd":
        a = flag(argv, "--address", "-a")
        if a:
            return a.strip("/"), " (--address)"
        cfg = (flag(argv, "--config", "-c") or CONTAINERD_SOCKETS[0][3]).lstrip("/")
        a = as_str((read_toml(root, cfg).get("grpc") or {}).get("address"))
        if a:
            return a.strip("/"), f" (grpc.address in /{cfg})"
        return CONTAINERD_SOCKETS[0][0], " (containerd's default address)"
    a = flag(argv, "--listen")
    if a:
        return a.strip("/"), " (--listen)"
    cfg, _cdir, doc = _crio_doc(root, argv)
    a = as_str((doc.get("api") or {}).get("listen"))
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
    ep = flag(procfs.read_cmdline(kd.pid, proc), "--container-runtime-endpoint") or \
        as_str(kubeletconfig.load(root, kd.path, proc).get("containerRuntimeEndpoint"))
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
        if not is_socket(p) or find_owners([p], proc).get(p, (None,))[0] != pid:
            return False
        serving[pid] = (name, sock, why)
        return True

    for pid, _argv in host_procs(tuple(RUNTIME_COMMS), proc, root, keep=serves):
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
    files = {c[1]: root / c[1] for c in cands if is_socket(root / c[1])}
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

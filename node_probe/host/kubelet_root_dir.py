"""Where the kubelet keeps its state on this node: the running kubelet's --root-dir, believed
only from a kubelet that is the host's own and serves its sockets in that dir itself, then the
documented defaults (kubeadm, k3s/RKE2, microk8s, k0s) whose sockets exist.

Why a module of its own: every path a check reads under the kubelet (device-plugin and
pod-resources sockets, the device checkpoint, pod volumes) hangs on this one answer, and the
runtime resolver (runtime_layout.py) asks it too; layout.py names it to the checks.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from node_probe.host.unix_sockets import find_owners, list_sockets
from node_probe.host import host_owned, procfs

from node_probe.host.daemon_args import MAX_SHOWN, flag, host_procs, is_socket
from node_probe.host.run_cache import cached


# --- kubelet dir ---------------------------------------------------------------------------
KUBELET_DEFAULTS = (
    ("var/lib/kubelet", "the default (kubeadm, EKS, GKE, AKS, OpenShift, k3s, RKE2, Talos)"),
    ("var/lib/k0s/kubelet", "k0s's default (<data-dir>/kubelet)"),
    ("var/snap/microk8s/common/var/lib/kubelet", "microk8s's default"),
)
KUBELET_SOCKETS = ("device-plugins/kubelet.sock", "pod-resources/kubelet.sock")
# processes that run a kubelet: kubelet itself, microk8s's kubelite, k3s/k0s agents
KUBELET_COMMS = ("kubelet", "kubelite", "k3s-server", "k3s-agent", "k3s", "k0s")


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
                          host_procs(KUBELET_COMMS, proc, host_root, decoys,
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
                   if is_socket(host_root / rel / s)] for rel in seen}
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
    d = flag(argv, "--root-dir", "--kubelet-root-dir")
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


def kubelet_dir(host_root: Path, proc: Path = procfs.PROC,
                override: Path | None = None) -> KubeletDir:
    return cached(("kubelet", str(host_root), str(proc), str(override)),
                  lambda: resolve_kubelet_dir(host_root, proc, override))

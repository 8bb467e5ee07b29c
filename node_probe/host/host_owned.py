"""What counts as the host's own: the processes, directories and libraries the probe may trust.

Why: the probe runs as root and dlopens the driver's libnvidia-ml.so.1 in a child; the kubelet it
believes decides which plugin sockets, pod-resources socket and driver root it uses. A tenant
with root in its own container can name a process `kubelet`, give it any `--root-dir`, and write
files owned by uid 0 with mode 0755 into its container's root and its pod's volumes, which are
directories of the host (under the kubelet's pods/ and the runtime's snapshot and state dirs).
So neither a name, nor a flag, nor ownership alone proves anything (security audit round 4,
HL-01). Here:

- a process is the host's when its filesystem root is the host root and it runs in no pod's
  cgroup: a container's process has its own root, a tenant cannot leave its pod's cgroup;
- a path is the host's when it lies in none of the areas tenants write (`TenantAreas`: every
  kubelet dir's pods/, the container runtimes' state and storage dirs, and, from the host's
  mount table, the root of every overlay mount and its upper and work dirs) and every
  directory from the host root down to it, and the file itself, is owned by root and not
  writable by group or others.

The well-known driver roots (the GPU Operator's /run/nvidia/driver is the root of its driver
container, an overlay) are mounted there by privileged host software, never by a tenant: they
stay trusted at exactly that path (`TRUSTED_MOUNTS`), not below any other overlay.
"""
from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

from node_probe.host import hostfs, procfs

# The kubelet dirs of every distribution the layouts know (host.kubelet_root_dir.KUBELET_DEFAULTS),
# whose pods/ hold every pod's volumes.
KUBELET_DIRS = ("var/lib/kubelet", "var/lib/k0s/kubelet", "var/snap/microk8s/common/var/lib/kubelet")
# Container runtimes' state (task bundles, mounted rootfs) and storage (snapshots, layers) dirs:
# containerd, k3s/RKE2, k0s and microk8s's containerd, CRI-O/podman, docker.
RUNTIME_DIRS = ("run/containerd", "var/lib/containerd", "run/k3s/containerd",
                "var/lib/rancher/k3s/agent/containerd", "var/lib/rancher/rke2/agent/containerd",
                "run/k0s/containerd", "var/lib/k0s/containerd",
                "var/snap/microk8s/common/run/containerd",
                "var/snap/microk8s/common/var/lib/containerd", "run/containers/storage",
                "var/lib/containers/storage", "var/lib/docker", "run/docker")
# Overlay mount points placed by privileged host software at a fixed path, trusted there.
TRUSTED_MOUNTS = ("run/nvidia/driver",)
MOUNTINFO_CAP = 8 << 20      # a node with ~40k mounts; beyond it the table is read in part
MAX_AREAS = 20_000


@dataclasses.dataclass(frozen=True)
class TenantAreas:
    """Directories (host-relative, no leading '/') a tenant can write into."""

    rels: frozenset[str]
    why: dict = dataclasses.field(default_factory=dict, compare=False, hash=False)
    mount_table: str = "not read"

    def holding(self, rel: str) -> str | None:
        """The area that `rel` (host-relative) lies in or is, or None."""
        parts = [p for p in rel.strip("/").split("/") if p]
        for i in range(len(parts), 0, -1):
            cand = "/".join(parts[:i])
            if cand in self.rels:
                return cand
        return None


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as \\ooo (proc_pid_mountinfo(5))."""
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        code = field[i + 1:i + 4]
        if field[i] == "\\" and len(code) == 3 and all(c in "01234567" for c in code):
            out.append(chr(int(code, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def overlay_areas(mountinfo: str, limit: int = MAX_AREAS) -> dict[str, str]:
    """Host-relative dirs of overlay mounts in a mountinfo table: each mount point (a
    container's root) and its upperdir and workdir (where its writes land), with why."""
    out: dict[str, str] = {}
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, rfields = left.split(" "), right.split(" ")
        if len(fields) < 5 or len(rfields) < 3 or rfields[0] != "overlay":
            continue
        point = _unescape(fields[4]).strip("/")
        if point and point not in TRUSTED_MOUNTS:
            out.setdefault(point, "an overlay mount (a container's root)")
        for opt in rfields[2].split(","):
            key, eq, val = opt.partition("=")
            if eq and key in ("upperdir", "workdir") and val.startswith("/"):
                out.setdefault(_unescape(val).strip("/"), f"an overlay {key}")
        if len(out) >= limit:
            break
    return out


def tenant_areas(host_root: Path, proc: Path = procfs.PROC, kubelet_dirs=(),
                 runtime_dirs=()) -> TenantAreas:
    """The areas tenants write on this node: the known and the given kubelet dirs' pods/,
    the known and the given runtime dirs, and the overlays of the host's mount table (pid 1's,
    the host's init, as the probe runs with the host's pid namespace)."""
    why: dict[str, str] = {}
    for k in (*KUBELET_DIRS, *(str(d).strip("/") for d in kubelet_dirs if d)):
        why.setdefault(f"{k}/pods", "a kubelet dir's pods/ (pod volumes)")
    for d in (*RUNTIME_DIRS, *(str(d).strip("/") for d in runtime_dirs if d)):
        why.setdefault(d, "a container runtime's state or storage (container roots, layers)")
    try:
        blob = hostfs.read_pseudo(Path(proc) / "1" / "mountinfo", MOUNTINFO_CAP)
        table = "read in part (over the cap)" if blob.truncated else "read"
        for rel, w in overlay_areas(blob.text).items():
            why.setdefault(rel, w)
    except OSError as exc:
        table = f"unreadable ({exc.strerror or exc})"
    return TenantAreas(frozenset(why), why, table)


def same_root(pid: int, proc: Path, where: Path) -> bool:
    """Whether process `pid`'s filesystem root is the directory `where` (dev and inode)."""
    try:
        a, b = os.stat(Path(proc) / str(pid) / "root"), os.stat(where)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def process_refusal(pid: int, proc: Path, host_root: Path) -> str | None:
    """Why process `pid` is not the host's own (None when it is): its root is not the host
    root (a container), or it runs in a pod's cgroup."""
    if not same_root(pid, proc, Path(host_root)):
        return f"pid {pid}'s root is not the host's (a container's process)"
    from node_probe.host import containers   # not at import: the NVML child needs only paths
    for path in procfs.read_cgroups(pid, proc).values():
        if "kubepods" in path or containers.parse_cgroup_path(path) is not None:
            return f"pid {pid} runs in a pod's cgroup"
    return None


def _chain_refusal(host_root: Path, parts: list[str]) -> str | None:
    """Every directory from the host root down, and the last component, owned by root and not
    writable by group or others (nothing but root can swap what lies below)."""
    cur = Path(host_root)
    for name in ["", *parts]:
        cur = cur / name if name else cur
        try:
            st = os.lstat(cur)
        except OSError as exc:
            return f"/{'/'.join(parts)}: {exc.strerror or exc}"
        shown = "/" + str(cur.relative_to(host_root)).lstrip(".")
        if stat.S_ISLNK(st.st_mode):
            return f"{shown} is a symlink"
        if st.st_uid != 0:
            return f"{shown} is owned by uid {st.st_uid}, not root"
        if st.st_mode & 0o022:
            return f"{shown} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def path_refusal(path: Path, host_root: Path, areas: TenantAreas) -> str | None:
    """Why `path` (a real path under the host root, symlinks resolved: hostfs.resolve) is not
    provably the host's own (None when it is)."""
    try:
        rel = Path(path).relative_to(host_root)
    except ValueError:
        return f"{path} is outside the host root"
    parts = [p for p in rel.parts if p not in ("", ".")]
    if ".." in parts:
        return f"{path} climbs out with '..'"
    area = areas.holding("/".join(parts))
    if area is not None:
        return f"/{'/'.join(parts)} lies in /{area}, {areas.why.get(area, 'a tenant area')}"
    return _chain_refusal(Path(host_root), parts)

"""Host daemons by name (nv-fabricmanager, nvidia-persistenced, containerd) and the versions
their packages or logs declare.

Why: several GPU failures are "a host daemon is not running" or "it is another driver
version than the kernel module". The probe runs with hostPID, so live processes are read from
/proc; package versions come from the host's dpkg database (bounded read) and the fabric
manager's own log, never from running a host binary.
"""
from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

from node_probe.host import hostfs, layout, procfs

COMM_LEN = 15  # the kernel truncates /proc/PID/comm to 15 characters
MAX_DPKG_BYTES = 16 << 20
MAX_LOG_TAIL = 256 << 10
MAX_PACKAGES = 16      # matching packages kept per call (a container's dpkg database is its own)
MAX_FIELD = 128        # characters of a package name or version kept
# Where the driver's user space may live on any node: the host itself, or the GPU Operator's
# driver container. driver_roots() adds the one host.layout resolved for this node.
DRIVER_ROOTS = ("", "run/nvidia/driver")
# Talos runs each extension service (nvidia-persistenced, nvidia-fabricmanager) as a container
# whose root is /usr/local/lib/containers/<service name>, inside Talos's read-only rootfs.
TALOS_SERVICES = "usr/local/lib/containers"


@dataclasses.dataclass(frozen=True)
class Daemon:
    pid: int
    comm: str
    exe_name: str


def find(names: tuple[str, ...] | list[str], proc: Path = procfs.PROC,
         limit: int = 50) -> list[Daemon]:
    """Live processes whose executable name (argv[0] basename, or comm) is one of `names`."""
    want = {n: n[:COMM_LEN] for n in names}
    out: list[Daemon] = []
    for pid in procfs.pids(proc):
        comm = procfs.read_comm(pid, proc)
        if not comm or comm not in want.values():
            continue
        argv = procfs.read_cmdline(pid, proc)
        exe = os.path.basename(argv[0]) if argv else comm
        if exe in want or (comm in want.values() and not argv):
            out.append(Daemon(pid, comm, exe))
        elif any(comm == short and exe.startswith(short) for short in want.values()):
            out.append(Daemon(pid, comm, exe))
        if len(out) >= limit:
            break
    return out


def on_host(pid: int, proc: Path, host_root: Path,
            subroots: tuple[str, ...] = DRIVER_ROOTS) -> bool:
    """Whether process `pid` runs in the host's filesystem: its root is the host root, or
    one of `subroots` of it (by default the GPU Operator's driver container, whose root the
    operator mounts at run/nvidia/driver; driver_roots() gives this node's). A name is what a
    tenant chooses; a root is not: a container process called nvidia-persistenced has its own
    root and keeps no host driver initialised."""
    try:
        st = os.stat(proc / str(pid) / "root")
    except OSError:
        return False
    for sub in subroots:
        # resolved inside the host root, as the host follows its own symlinks (/home -> /var/home)
        where = hostfs.resolve(host_root, sub) if sub else host_root
        if where is None:
            continue
        try:
            want = os.stat(where)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (want.st_dev, want.st_ino):
            return True
    return False


def driver_roots(host_root: Path, proc: Path = procfs.PROC,
                 service: str | None = None) -> tuple[str, ...]:
    """Sub-roots of the host root ("" = the host) that hold the NVIDIA driver's user space on
    this node, and so its daemons, packages and logs: the host, the driver root host.layout
    resolved (the one answer nvml, runtime_cdi and fabric use: GKE's installer directory,
    Talos's glibc subroot, what the device plugin was told), and the GPU Operator's driver
    container. On Talos the daemon itself runs in its extension service's root, so `service`
    (that service's name) adds /usr/local/lib/containers/<service> there."""
    drv = layout.driver_root(host_root, proc).root
    talos = (f"{TALOS_SERVICES}/{service}",) if service and drv == layout.TALOS_DRIVER_ROOT \
        else ()
    return tuple(dict.fromkeys(("", drv or "", *DRIVER_ROOTS, *talos)))


def of_driver(found: list[Daemon], proc: Path, host_root: Path,
              service: str | None = None) -> tuple[list[Daemon], tuple[str, ...]]:
    """(the processes of `found` that are the driver's daemon, the roots that counted): a
    process whose root is one of driver_roots(). Anything else that bears the name runs in
    some container root a tenant chose and keeps no driver state."""
    roots = driver_roots(host_root, proc, service)
    return [d for d in found if on_host(d.pid, proc, host_root, roots)], roots


def process_root(pid: int, proc: Path, host_root: Path) -> Path:
    """The filesystem root a process sees, as a path the probe can read under: --host-root for
    a process whose root is the probe's own / (probe and process share the host's root, as in
    `local`), else /proc/PID/root (the host seen from the debug pod, or a container's root such
    as the GPU Operator's driver container)."""
    try:
        a, b = os.stat(proc / str(pid) / "root"), os.stat("/")
        if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino):
            return host_root
    except OSError:
        return host_root
    return proc / str(pid) / "root"


def dpkg_versions(root: Path, prefix: str,
                  subroots: tuple[str, ...] = DRIVER_ROOTS) -> dict[str, str]:
    """{package: version} of installed dpkg packages whose name starts with `prefix`, read
    from var/lib/dpkg/status under each of `subroots` of `root` (by default the host and the
    GPU Operator's driver container). At most MAX_PACKAGES, names and versions cut to MAX_FIELD:
    a root may be a container's, whose database says whatever its owner wrote."""
    out: dict[str, str] = {}
    for droot in subroots:
        rel = f"{droot}/var/lib/dpkg/status".lstrip("/")
        text = hostfs.read_text(root, rel, limit=MAX_DPKG_BYTES)
        if not text:
            continue
        for block in text.split("\n\n"):
            fields = dict(_fields(block))
            name = fields.get("Package", "")
            if (name.startswith(prefix) and "installed" in fields.get("Status", "")
                    and fields.get("Version")):
                name = name[:MAX_FIELD]
                out[name if not droot else f"{name} ({droot})"] = fields["Version"][:MAX_FIELD]
                if len(out) >= MAX_PACKAGES:
                    return out
    return out


def _fields(block: str):
    for line in block.splitlines():
        if line[:1].isspace() or ":" not in line:
            continue
        k, _, v = line.partition(":")
        yield k.strip(), v.strip()


_DRIVER_VERSION = re.compile(r"(\d{3}\.\d+(?:\.\d+)?)")


def driver_version_of(package_version: str) -> str | None:
    """`570.158.01-1ubuntu1` / `1:570.158.01-1` -> `570.158.01`."""
    m = _DRIVER_VERSION.search(package_version.split(":", 1)[-1])
    return m.group(1) if m else None


FM_LOG = "var/log/fabricmanager.log"
_FM_LOG_VERSION = re.compile(r"Fabric ?Manager version is\s*:?\s*(\d+\.\d+(?:\.\d+)?)", re.I)


def tail(root: Path, rel: str, limit: int = MAX_LOG_TAIL) -> str | None:
    """The last `limit` bytes of a regular host file inside `root` (logs grow without bound);
    None when it is missing or not a regular file (a FIFO must not block the probe)."""
    try:
        fd = hostfs.open_under(root, rel)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            os.lseek(fd, size - limit, os.SEEK_SET)
        return hostfs.read_fd(fd, limit).data.decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def fabricmanager_log_version(root: Path, subroots: tuple[str, ...] = DRIVER_ROOTS
                              ) -> tuple[str | None, str | None]:
    """(version from the newest start banner in the fabric manager's log, log path)."""
    for droot in subroots:
        rel = f"{droot}/{FM_LOG}".lstrip("/")
        text = tail(root, rel)
        if text:
            found = _FM_LOG_VERSION.findall(text)
            if found:
                return found[-1], "/" + rel
    return None, None

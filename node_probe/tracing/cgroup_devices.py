"""Loader for bpf/cgroup_devices.bpf.c: device cgroup rule writes and cgroup device programs.

Why: returns, as plain dicts, every write to a devices.allow / devices.deny file (rule text,
writer pid/comm, the cgroup it targets, the result) and every bpf() attach/detach of a
BPF_CGROUP_DEVICE program with the cgroup it targets. Opens of those files come from the
shared fd tracker; paths are resolved when the event is read: relative ones against the
writer's cwd or directory fd (best effort, the writer may be gone). Also snapshots which v1
device cgroups grant the NVIDIA major at attach time (rules read by host/cgroup_rules, the one
grammar), so the verdict can tell a GPU container's rules from any other's.
"""
from __future__ import annotations

import errno as errno_mod
import os
import re
import time
from pathlib import Path

from node_probe.host import procfs
from node_probe.host.cgroup_rules import RuleSet
from node_probe.host.nvidia_devices import NVIDIA_MAJOR
from .abi import Constants
from .bundle import cstr, mono_to_wall, who, TracepointSet
from .fdtrack import FdTracker
from .loader import Emit, LoaderBase, Targets, TraceConfig

C = Constants("cgroup_devices")
TRACEPOINTS = (
    ("sys_enter_write", "cgdev_enter_write"), ("sys_exit_write", "cgdev_exit_write"),
    ("sys_enter_bpf", "cgdev_enter_bpf"), ("sys_exit_bpf", "cgdev_exit_bpf"),
)
REQUIRED = ("sys_enter_write", "sys_exit_write")
MAX_WAITING = 4096      # distinct opens whose writes wait for the open's event
_DEVICES_ROOT_RE = re.compile(r"/cgroup/(?:[^/]*,)?devices(?:,[^/]*)?(?=/|$)")


def devices_relpath(dir_path: str) -> str | None:
    """'/sys/fs/cgroup/devices/kubepods/x' -> '/kubepods/x' (None if not under a v1 devices
    hierarchy we can recognise)."""
    m = None
    for m in _DEVICES_ROOT_RE.finditer(dir_path):
        pass
    if m is None:
        return None
    rest = dir_path[m.end():]
    return rest or "/"


def grants_gpus(devices_list: str) -> bool:
    """Does this devices.list let a GPU container open NVIDIA devices, by an exception of its
    own? (A default-allow cgroup, the root or a privileged container, is not evidence that a
    container is a GPU container.)"""
    try:
        rs = RuleSet.parse(devices_list)
    except ValueError:
        return False
    return not rs.default_allow and rs.allows_major("c", NVIDIA_MAJOR)


def snapshot_gpu_cgroups(cgroup_dir: Path, budget_s: float = 0.3) -> dict[str, str]:
    """{relpath: devices.list} for v1 device cgroups whose list grants the NVIDIA major."""
    root = Path(cgroup_dir) / "devices"
    out: dict[str, str] = {}
    if not (root / "devices.list").is_file():
        return out
    deadline = time.monotonic() + budget_s
    for dirpath, dirnames, _files in os.walk(root):
        if time.monotonic() > deadline:
            break
        text = procfs.read_str(Path(dirpath, "devices.list"), 1 << 20)
        if text is None:
            continue
        if grants_gpus(text):
            rel = "/" + os.path.relpath(dirpath, root)
            out["/" if rel == "/." else rel] = text
    return out


def read_devices_list(cgroup_dir: Path, relpath: str) -> str | None:
    return procfs.read_str(Path(cgroup_dir) / "devices" / relpath.lstrip("/") / "devices.list",
                           1 << 20)


class CgroupDevices(LoaderBase):
    name = "cgroup_devices"
    uses_fds = True

    def __init__(self, cfg: TraceConfig, emit: Emit, fds: FdTracker | None) -> None:
        super().__init__(cfg, emit, fds)
        self.cgroup_dir = Path(cfg.cgroup_dir)
        self.which = {C.FDT_KIND_CG_ALLOW: "allow", C.FDT_KIND_CG_DENY: "deny"}
        self.bpf_cmds = {C.CGDEV_BPF_PROG_ATTACH: "BPF_PROG_ATTACH",
                         C.CGDEV_BPF_PROG_DETACH: "BPF_PROG_DETACH",
                         C.CGDEV_BPF_LINK_CREATE: "BPF_LINK_CREATE"}
        self.opens: dict[tuple[int, int], dict] = {}   # (pid, open_id) -> open
        self.writes: list[dict] = []
        # writes whose open is still in the fd tracker's ring: the two rings are drained in no
        # fixed order, so a write can be read before the open that names its file
        self.waiting: dict[tuple[int, int], list[dict]] = {}
        self.attaches: list[dict] = []
        self.gpu_cgroups_at_attach: dict[str, str] = {}
        fds.subscribe(self.which, self._on_open)

    def attach(self, b, tps: TracepointSet, targets: Targets) -> bool:
        self.b = b
        b[b"cgdev_events"].open_ring_buffer(self._on_ring)
        tps.attach(TRACEPOINTS, required=REQUIRED)
        self.gpu_cgroups_at_attach = snapshot_gpu_cgroups(self.cgroup_dir)
        return True

    def _resolve(self, pid: int, dfd: int, path: str) -> tuple[str, bool]:
        if path.startswith("/"):
            return os.path.normpath(path), True
        link = "cwd" if dfd == C.FDT_AT_FDCWD else f"fd/{dfd}"
        try:
            base = os.readlink(self.proc / str(pid) / link)
        except OSError:
            return path, False
        return os.path.normpath(os.path.join(base, path)), True

    def _on_open(self, e) -> None:
        path, resolved = self._resolve(e.pid, e.dfd, cstr(e.path))
        self.opens[(e.pid, e.ts)] = {
            "pid": e.pid, "comm": cstr(e.comm), "path": path, "resolved": resolved,
            "which": self.which.get(e.kind, "?"), "ret": e.ret, "ts": mono_to_wall(e.ts)}
        for rec in self.waiting.pop((e.pid, e.ts), ()):
            self._place(rec, path)

    def _place(self, rec: dict, path: str) -> None:
        """Give a write its file and target cgroup, then report it."""
        path = path or rec.pop("_fd_path", "")
        rec.pop("_fd_path", None)
        rec["path"] = path
        rec["cgroup"] = devices_relpath(os.path.dirname(path)) if path else None
        self.emit("write", rec)

    def _on_ring(self, ctx, data, size) -> None:
        e = self.b[b"cgdev_events"].event(data)
        if e.kind == C.CGDEV_EV_WRITE:
            text = bytes(e.text)[:min(e.len, len(e.text))].decode("utf-8", "replace")
            err = -e.ret if e.ret < 0 else 0
            rec = {**who(e), "path": "",
                   "which": self.which.get(e.which, "?"), "text": text.rstrip("\n"),
                   "ret": e.ret, "errno": err,
                   "errno_name": errno_mod.errorcode.get(err) if err else None,
                   "cgroup": None,
                   "writer_cgroup": procfs.read_cgroups(e.pid, self.proc).get("devices"),
                   "ts": mono_to_wall(e.ts)}
            self.writes.append(rec)   # ring buffer order: the order the writes were made
            key = (e.pid, e.open_id)
            op = self.opens.get(key)
            if op is not None:
                self._place(rec, op["path"])
                return
            try:     # the open not seen (yet, or seeded before attach): the fd, while it lasts
                rec["_fd_path"] = os.readlink(self.proc / str(e.pid) / "fd" / str(e.fd))
            except OSError:
                rec["_fd_path"] = ""
            if e.open_id and len(self.waiting) < MAX_WAITING:
                self.waiting.setdefault(key, []).append(rec)
            else:
                self._place(rec, "")
        elif e.kind == C.CGDEV_EV_BPF:
            try:
                target = os.readlink(self.proc / str(e.pid) / "fd" / str(e.fd))
            except OSError:
                target = None
            err = -e.ret if e.ret < 0 else 0
            rec = {**who(e),
                   "cmd": self.bpf_cmds.get(e.bpf_cmd, str(e.bpf_cmd)),
                   "attach_type": "BPF_CGROUP_DEVICE", "target_fd": e.fd, "cgroup": target,
                   "flags": e.flags, "ret": e.ret, "errno": err, "ts": mono_to_wall(e.ts)}
            self.attaches.append(rec)
            self.emit("bpf_attach", rec)

    def collect(self, out: dict, now_ns: int) -> None:
        for recs in self.waiting.values():    # opens never read: what the fd said at the time
            for rec in recs:
                self._place(rec, "")
        self.waiting.clear()
        out.update({"cgroup_writes": list(self.writes), "bpf_attaches": list(self.attaches),
                    "cgroup_devices": {"gpu_cgroups_at_attach": sorted(self.gpu_cgroups_at_attach)}})

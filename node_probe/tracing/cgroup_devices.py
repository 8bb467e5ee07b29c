"""Loader for bpf/cgroup_devices.bpf.c: device cgroup rule writes and cgroup device programs.

Why: returns, as plain dicts, every write to a devices.allow / devices.deny file (rule text,
writer pid/comm, the cgroup it targets, the result) and every bpf() attach/detach of a
BPF_CGROUP_DEVICE program with the cgroup it targets. Paths are resolved when the event is
read: relative ones against the writer's cwd or directory fd (best effort, the writer may be
gone). Also snapshots which v1 device cgroups allow the NVIDIA major (195) at attach time, so
the verdict can tell a GPU container's rules from any other's.
"""
from __future__ import annotations

import errno as errno_mod
import os
import re
import time
from pathlib import Path
from typing import Callable

from node_probe.host import procfs
from .bundle import cstr, mono_to_wall, TracepointSet

NAME = "cgroup_devices"
EV_OPEN, EV_WRITE, EV_BPF = 1, 2, 3
WHICH = {1: "allow", 2: "deny"}
BPF_CMDS = {8: "BPF_PROG_ATTACH", 9: "BPF_PROG_DETACH", 28: "BPF_LINK_CREATE"}
AT_FDCWD = -100
NVIDIA_MAJOR = 195
TRACEPOINTS = (   # (syscall tracepoint, program): one program may serve several
    ("sys_enter_openat", "cgdev_enter_open"), ("sys_exit_openat", "cgdev_exit_open"),
    ("sys_enter_openat2", "cgdev_enter_open"), ("sys_exit_openat2", "cgdev_exit_open"),
    ("sys_enter_open", "cgdev_enter_open_legacy"), ("sys_exit_open", "cgdev_exit_open"),
    ("sys_enter_dup", "cgdev_enter_dup"), ("sys_exit_dup", "cgdev_exit_dup"),
    ("sys_enter_dup2", "cgdev_enter_dup2"), ("sys_exit_dup2", "cgdev_exit_dup"),
    ("sys_enter_dup3", "cgdev_enter_dup2"), ("sys_exit_dup3", "cgdev_exit_dup"),
    ("sys_enter_fcntl", "cgdev_enter_fcntl"), ("sys_exit_fcntl", "cgdev_exit_dup"),
    ("sys_enter_close", "cgdev_enter_close"),
    ("sys_enter_write", "cgdev_enter_write"), ("sys_exit_write", "cgdev_exit_write"),
    ("sys_enter_bpf", "cgdev_enter_bpf"), ("sys_exit_bpf", "cgdev_exit_bpf"),
)
REQUIRED = ("sys_enter_openat", "sys_exit_openat", "sys_enter_write", "sys_exit_write")
_DEVICES_ROOT_RE = re.compile(r"/cgroup/(?:[^/]*,)?devices(?:,[^/]*)?(?=/|$)")
_RULE_RE = re.compile(r"^\s*([abc])(?:\s+(\*|\d+):(\*|\d+)(?:\s+([rwm]+))?)?\s*$")


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


def parse_rules(text: str) -> list[dict]:
    """'c 195:* rwm' -> [{"type": "c", "major": 195, "minor": None, "access": "rwm"}];
    'a' and 'a *:* rwm' -> type 'a'. Unparseable lines are kept with type None."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _RULE_RE.match(line)
        if not m:
            out.append({"type": None, "text": line.strip()})
            continue
        typ, major, minor, access = m.groups()
        out.append({"type": typ, "major": None if major in (None, "*") else int(major),
                    "minor": None if minor in (None, "*") else int(minor),
                    "access": access or "rwm", "text": line.strip()})
    return out


def allows_major(rules: list[dict], major: int) -> bool:
    """Explicit allow of a char device with this major (not the blanket 'a')."""
    return any(r.get("type") == "c" and r.get("major") == major for r in rules)


def snapshot_gpu_cgroups(cgroup_dir: Path, budget_s: float = 0.3,
                         major: int = NVIDIA_MAJOR) -> dict[str, str]:
    """{relpath: devices.list} for v1 device cgroups whose list allows `major` explicitly."""
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
        if allows_major(parse_rules(text), major):
            rel = "/" + os.path.relpath(dirpath, root)
            out["/" if rel == "/." else rel] = text
    return out


def read_devices_list(cgroup_dir: Path, relpath: str) -> str | None:
    return procfs.read_str(Path(cgroup_dir) / "devices" / relpath.lstrip("/") / "devices.list",
                           1 << 20)


class CgroupDevices:
    name = NAME

    def __init__(self, cgroup_dir: Path, self_tgid: int | None = None,
                 proc: Path = procfs.PROC,
                 on_event: Callable[[str, dict], None] | None = None) -> None:
        self.cgroup_dir = Path(cgroup_dir)
        self.self_tgid = os.getpid() if self_tgid is None else self_tgid
        self.proc = proc
        self.on_event = on_event or (lambda kind, data: None)
        self.b = None
        self.opens: dict[tuple[int, int], dict] = {}   # (pid, open_id) -> open
        self.writes: list[dict] = []
        self.attaches: list[dict] = []
        self.gpu_cgroups_at_attach: dict[str, str] = {}

    def cflags(self) -> list[str]:
        return [f"-DCGDEV_SELF_TGID={self.self_tgid}"]

    def attach(self, b, tps: TracepointSet) -> None:
        self.b = b
        b[b"cgdev_events"].open_ring_buffer(self._on_ring)
        tps.attach(TRACEPOINTS, required=REQUIRED)
        self.gpu_cgroups_at_attach = snapshot_gpu_cgroups(self.cgroup_dir)

    def _resolve(self, pid: int, dfd: int, path: str) -> tuple[str, bool]:
        if path.startswith("/"):
            return os.path.normpath(path), True
        link = "cwd" if dfd == AT_FDCWD else f"fd/{dfd}"
        try:
            base = os.readlink(self.proc / str(pid) / link)
        except OSError:
            return path, False
        return os.path.normpath(os.path.join(base, path)), True

    def _on_ring(self, ctx, data, size) -> None:
        e = self.b[b"cgdev_events"].event(data)
        comm = cstr(e.comm)
        if e.kind == EV_OPEN:
            path, resolved = self._resolve(e.pid, e.dfd, cstr(e.text))
            self.opens[(e.pid, e.open_id)] = {
                "pid": e.pid, "comm": comm, "path": path, "resolved": resolved,
                "which": WHICH.get(e.which, "?"), "ret": e.ret, "ts": mono_to_wall(e.ts)}
        elif e.kind == EV_WRITE:
            op = self.opens.get((e.pid, e.open_id)) or {}
            path = op.get("path", "")
            if not path:  # open not seen (fd seeded? never): try the fd itself
                try:
                    path = os.readlink(self.proc / str(e.pid) / "fd" / str(e.fd))
                except OSError:
                    path = ""
            text = bytes(e.text)[:min(e.len, len(e.text))].decode("utf-8", "replace")
            err = -e.ret if e.ret < 0 else 0
            cg = devices_relpath(os.path.dirname(path)) if path else None
            rec = {"pid": e.pid, "tid": e.tid, "comm": comm, "path": path,
                   "which": WHICH.get(e.which, "?"), "text": text.rstrip("\n"),
                   "rules": parse_rules(text), "ret": e.ret, "errno": err,
                   "errno_name": errno_mod.errorcode.get(err) if err else None,
                   "cgroup": cg, "writer_cgroup": procfs.read_cgroups(e.pid, self.proc).get("devices"),
                   "ts": mono_to_wall(e.ts)}
            self.writes.append(rec)   # ring buffer order: the order the writes were made
            self.on_event("write", rec)
        elif e.kind == EV_BPF:
            try:
                target = os.readlink(self.proc / str(e.pid) / "fd" / str(e.fd))
            except OSError:
                target = None
            err = -e.ret if e.ret < 0 else 0
            rec = {"pid": e.pid, "tid": e.tid, "comm": comm,
                   "cmd": BPF_CMDS.get(e.bpf_cmd, str(e.bpf_cmd)),
                   "attach_type": "BPF_CGROUP_DEVICE", "target_fd": e.fd, "cgroup": target,
                   "flags": e.flags, "ret": e.ret, "errno": err, "ts": mono_to_wall(e.ts)}
            self.attaches.append(rec)
            self.on_event("bpf_attach", rec)

    def collect(self) -> dict:
        return {"cgroup_writes": list(self.writes), "bpf_attaches": list(self.attaches),
                "cgroup_devices": {"gpu_cgroups_at_attach": sorted(self.gpu_cgroups_at_attach)}}

"""Fixtures for the device cgroup audit: real kubepods-shaped cgroups, real processes in them,
and a temp host root with mknod'ed NVIDIA device nodes and the proc files the probe reads.

Everything a test creates is removed even when it fails: processes are killed and reaped,
then the cgroups are removed bottom-up. Each tree lives under a test-unique prefix
(kubepods-gdtest-<pid>-<random>) so concurrent runs and other engineers' tests never collide, and a
session-start sweep removes empty leftovers of crashed runs with that prefix only.
"""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

CGROUP = Path("/sys/fs/cgroup")
V1_DEVICES = CGROUP / "devices"
V2_UNIFIED = CGROUP / "unified"
PREFIX = "kubepods-gdtest-"

NV_MAJOR, UVM_MAJOR, CAPS_MAJOR = 195, 237, 236
GPU0_UUID = "GPU-11111111-2222-3333-4444-555555555555"
GPU1_UUID = "GPU-66666666-7777-8888-9999-000000000000"

PROC_DEVICES = f"""Character devices:
  1 mem
  5 /dev/tty
 10 misc
136 pts
{NV_MAJOR} nvidia-frontend
{UVM_MAJOR} nvidia-uvm
{CAPS_MAJOR} nvidia-caps

Block devices:
  7 loop
"""


def _rm_tree(top: Path) -> None:
    """rmdir a cgroup tree bottom-up (cgroup dirs hold only kernel files)."""
    if not top.exists():
        return
    for d, dirs, _ in sorted(os.walk(top), key=lambda t: -t[0].count("/")):
        try:
            os.rmdir(d)
        except OSError:
            pass


def _owner_alive(name: str) -> bool:
    """kubepods-gdtest-<pid>-<hex>: is the test process that made it still running? (Parallel
    workers share the hierarchy: a tree just made, with no process in it yet, is not litter.)"""
    pid = name[len(PREFIX):].split("-", 1)[0]
    return pid.isdigit() and os.path.exists(f"/proc/{pid}")


def _sweep(root: Path) -> None:
    try:
        names = [n for n in os.listdir(root) if n.startswith(PREFIX) and not _owner_alive(n)]
    except OSError:
        return
    for n in names:
        _rm_tree(root / n)   # only empty ones go; a live run's tree keeps its processes


@pytest.fixture(scope="session", autouse=True)
def _sweep_leftovers():
    for r in (V1_DEVICES, V2_UNIFIED):
        _sweep(r)
    yield


def need_root():
    if os.geteuid() != 0:
        pytest.skip("needs root: creates cgroups and device nodes")


class CgroupTree:
    """A kubepods-shaped tree under one hierarchy root, with processes placed in it."""

    def __init__(self, hroot: Path) -> None:
        self.hroot = hroot
        self.top = hroot / f"{PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        self.top.mkdir()
        self.procs: list[subprocess.Popen] = []

    def container(self, pod_uid: str, cid: str, qos: str = "burstable",
                  layout: str = "cgroupfs") -> Path:
        if layout == "cgroupfs":
            parts = ([qos] if qos != "guaranteed" else []) + [f"pod{pod_uid}", cid]
        else:  # systemd naming, nested under our unique top dir
            u = pod_uid.replace("-", "_")
            q = "" if qos == "guaranteed" else f"-{qos}"
            parts = ([f"kubepods-{qos}.slice"] if qos != "guaranteed" else []) + \
                    [f"kubepods{q}-pod{u}.slice", f"cri-containerd-{cid}.scope"]
        p = self.top.joinpath(*parts)
        p.mkdir(parents=True)
        return p

    def spawn(self, cgroup: Path, env: dict | None = None, pass_fds: tuple[int, ...] = (),
              seconds: int = 120) -> subprocess.Popen:
        """A real long-running process placed in `cgroup` before it execs (holding `pass_fds`
        open, alive for `seconds`)."""
        procs_file = str(cgroup / "cgroup.procs")

        def join():
            fd = os.open(procs_file, os.O_WRONLY)
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)

        p = subprocess.Popen(["/bin/sleep", str(seconds)],
                             env={"PATH": "/bin:/usr/bin", **(env or {})}, pass_fds=pass_fds,
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, preexec_fn=join)
        self.procs.append(p)
        return p

    def spawn_with_private_dev(self, cgroup: Path, env: dict, nodes) -> subprocess.Popen:
        """A process in its own mount namespace whose /dev is a tmpfs holding only `nodes`
        ((name, major, minor)): a device plugin container that started before some node
        existed (seed 002). Its view is /proc/PID/root/dev, as the probe reads it."""
        mk = " && ".join(f"mknod /dev/{n} c {ma} {mi}" for n, ma, mi in nodes) or "true"
        return self.spawn_script(
            cgroup, ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
                     f"mount -t tmpfs gdtest-dev /dev && {mk} && exec /bin/sleep 120"],
            {"PATH": "/bin:/usr/bin:/sbin:/usr/sbin", **env}, "private-/dev process")

    def spawn_script(self, cgroup: Path, argv: list[str], env: dict,
                     what: str = "process") -> subprocess.Popen:
        """`argv` (a shell that ends in `exec /bin/sleep 120`) placed in `cgroup` before it
        execs; returns once the shell has exec'd sleep (its setup done)."""
        procs_file = str(cgroup / "cgroup.procs")

        def join():
            fd = os.open(procs_file, os.O_WRONLY)
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)

        p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, preexec_fn=join)
        self.procs.append(p)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:   # until the shell has exec'd sleep
            try:
                if os.readlink(f"/proc/{p.pid}/exe").endswith("sleep"):
                    return p
            except OSError:
                pass
            time.sleep(0.02)
        raise RuntimeError(f"{what} did not start")

    def cleanup(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        # the kernel frees a cgroup's last task asynchronously; retry briefly
        for _ in range(50):
            _rm_tree(self.top)
            if not self.top.exists():
                return
            time.sleep(0.05)


def deny_all_then_allow(cgroup: Path, rules: list[str]) -> None:
    """What runc does on v1: `a` to devices.deny, then each allow rule."""
    (cgroup / "devices.deny").write_text("a")
    for r in rules:
        (cgroup / "devices.allow").write_text(r)


@pytest.fixture
def v1_tree():
    need_root()
    if not (V1_DEVICES / "devices.list").is_file():
        pytest.skip("no cgroup v1 devices controller at /sys/fs/cgroup/devices")
    t = CgroupTree(V1_DEVICES)
    try:
        yield t
    finally:
        t.cleanup()


@pytest.fixture
def v2_tree():
    need_root()
    if not (V2_UNIFIED / "cgroup.controllers").is_file():
        pytest.skip("no cgroup2 hierarchy at /sys/fs/cgroup/unified")
    t = CgroupTree(V2_UNIFIED)
    try:
        yield t
    finally:
        t.cleanup()


def make_host_root(base: Path, gpus=((0, GPU0_UUID),), uvm: bool = True,
                   dev_char: bool | None = None) -> Path:
    """A host root with proc/devices, proc/driver/nvidia/gpus/*/information and real char
    device nodes (mknod) for nvidiactl, nvidiaN, nvidia-uvm(-tools)."""
    need_root()
    root = base / "host"
    (root / "proc/driver/nvidia/gpus").mkdir(parents=True)
    (root / "dev").mkdir()
    text = PROC_DEVICES if uvm else PROC_DEVICES.replace(f"{UVM_MAJOR} nvidia-uvm\n", "")
    (root / "proc/devices").write_text(text)
    nodes = [("nvidiactl", NV_MAJOR, 255)]
    for i, (minor, uid) in enumerate(gpus):
        d = root / f"proc/driver/nvidia/gpus/0000:{0x3b + i:02x}:00.0"
        d.mkdir()
        d.joinpath("information").write_text(
            f"Model: \t\t NVIDIA H20\nIRQ:   \t\t 100\nGPU UUID: \t {uid}\n"
            f"Video BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\nDevice Minor: \t {minor}\n")
        nodes.append((f"nvidia{minor}", NV_MAJOR, minor))
    if uvm:
        nodes += [("nvidia-uvm", UVM_MAJOR, 0), ("nvidia-uvm-tools", UVM_MAJOR, 1)]
    for name, ma, mi in nodes:
        os.mknod(root / "dev" / name, 0o666 | 0o020000, os.makedev(ma, mi))
    if dev_char is not None:
        (root / "dev/char").mkdir()
        if dev_char:
            for name, ma, mi in nodes:
                os.symlink(f"../{name}", root / "dev/char" / f"{ma}:{mi}")
    return root


def new_uid() -> str:
    return str(uuid.uuid4())


def new_cid() -> str:
    return secrets.token_hex(32)

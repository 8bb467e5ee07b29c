"""cgroup v2: device access is decided by BPF_CGROUP_DEVICE programs, so the audit asks the
kernel through a helper placed in the container's cgroup. Here a real program that denies
major 195 is attached (with BCC) to a real child of /sys/fs/cgroup/unified."""
import errno
import os
import tempfile
from pathlib import Path

import pytest

from node_probe.host import cgroup_rules
from tests.cgroups.conftest import GPU0_UUID, UVM_MAJOR, make_host_root, new_cid, new_uid
from tests.probe_run import run_probe

pytestmark = [pytest.mark.root, pytest.mark.bcc]

DENY_195 = r"""
#include <linux/bpf.h>
int deny_nvidia(struct bpf_cgroup_dev_ctx *ctx) {
    if (ctx->major == 195)
        return 0;
    return 1;
}
"""


class DeviceProgram:
    def __init__(self):
        try:
            from bcc import BPF, BPFAttachType
        except ImportError as exc:
            pytest.skip(f"BCC (python3-bpfcc) not importable: {exc}")
        self.BPF, self.T = BPF, BPFAttachType
        try:
            self.b = BPF(text=DENY_195.encode())
            self.fn = self.b.load_func(b"deny_nvidia", BPF.CGROUP_DEVICE)
        except Exception as exc:  # noqa: BLE001 - any BCC failure means: cannot run here
            pytest.skip(f"cannot load a BPF_CGROUP_DEVICE program here: {exc}")
        self.attached = []

    def attach(self, cgroup: Path):
        fd = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
        try:
            self.BPF.attach_func(self.fn, fd, self.T.CGROUP_DEVICE)
        except Exception as exc:  # noqa: BLE001
            os.close(fd)
            pytest.skip(f"cannot attach a device program to {cgroup}: {exc}")
        self.attached.append(fd)

    def detach_all(self):
        for fd in self.attached:
            try:
                self.BPF.detach_func(self.fn, fd, self.T.CGROUP_DEVICE)
            except Exception:  # noqa: BLE001
                pass
            os.close(fd)
        self.attached = []


@pytest.fixture(scope="module")
def _compiled():
    p = DeviceProgram()      # compiling costs seconds: once per module
    try:
        yield p
    finally:
        p.detach_all()
        p.b.cleanup()


@pytest.fixture
def deny195(_compiled):
    try:
        yield _compiled
    finally:
        _compiled.detach_all()


def procs(cg: Path) -> list[int]:
    return [int(x) for x in (cg / "cgroup.procs").read_text().split()]


@pytest.mark.serial    # asserts that no gpu-doctor-devnodes-* dir is left in the machine's /tmp
def test_helper_reports_eperm_for_denied_and_enxio_for_allowed(v2_tree, deny195, tmp_path):
    host = make_host_root(tmp_path)
    cg = v2_tree.container(new_uid(), new_cid())
    deny195.attach(cg)
    devs = [(195, 255, [host / "dev/nvidiactl"]), (UVM_MAJOR, 0, [host / "dev/nvidia-uvm"])]
    opened = cgroup_rules.check_access(cg, devs, timeout_s=10, mode="open")
    assert opened.ok, opened.reason
    assert opened.errnos == {"195:255": errno.EPERM, f"{UVM_MAJOR}:0": errno.ENXIO}
    assert opened.allowed("195:255") is False and opened.allowed(f"{UVM_MAJOR}:0") is True
    # the default mode runs the same kernel check without entering a driver
    checked = cgroup_rules.check_access(cg, devs, timeout_s=10)
    assert checked.errnos == {"195:255": errno.EPERM, f"{UVM_MAJOR}:0": 0}
    # nothing left behind: the helper really ran in the cgroup, and is gone
    assert opened.helper_pid and not opened.left_behind and procs(cg) == []
    assert not os.path.exists(f"/proc/{opened.helper_pid}") or \
        str(cg.name) not in Path(f"/proc/{opened.helper_pid}/cgroup").read_text()
    # a node the host lacks is made with mknod in a private dir (and removed)
    gone = cgroup_rules.check_access(cg, [(195, 7, [host / "dev/nvidia7"])], timeout_s=10)
    assert gone.errnos == {"195:7": errno.EPERM}
    assert not list(Path(tempfile.gettempdir()).glob("gpu-doctor-devnodes-*"))


def test_probe_finds_the_denial_on_cgroup_v2(v2_tree, deny195, tmp_path):
    host = make_host_root(tmp_path)
    uid_bad, uid_ok = new_uid(), new_uid()
    bad = v2_tree.container(uid_bad, new_cid())
    deny195.attach(bad)
    p = v2_tree.spawn(bad, {"NVIDIA_VISIBLE_DEVICES": GPU0_UUID})
    ok = v2_tree.container(uid_ok, new_cid(), layout="systemd")
    v2_tree.spawn(ok, {"NVIDIA_VISIBLE_DEVICES": "all"})
    run = run_probe("--host-root", str(host), "--cgroup-root", "/sys/fs/cgroup/unified",
                    "--only", "cgroup.devices", "--trace-seconds", "0",
                    "--focus-pod", uid_bad, "--focus-pod", uid_ok)
    assert run.summary["complete"], run.stdout
    found = run.findings("cgroup.device_denied")
    assert len(found) == 1, run.stdout
    ev = found[0]["evidence"]
    assert ev["pod_uid"] == uid_bad and ev["cgroup_version"] == 2
    assert {d["device"] for d in ev["denied"]} == {"/dev/nvidiactl", "/dev/nvidia0"}
    assert ev["errno_by_device"]["195:255"] == errno.EPERM
    assert ev["errno_by_device"][f"{UVM_MAJOR}:0"] == 0
    assert ev["helper"]["left_behind"] is False
    assert procs(bad) == [p.pid]   # only the container's own process remains
    assert not [r for r in run.findings() if r["evidence"].get("pod_uid") == uid_ok]

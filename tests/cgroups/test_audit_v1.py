"""The device cgroup audit end to end on real cgroup v1 devices cgroups (seeds 001, 002).

A GPU "container" is a real process in a kubepods-shaped cgroup under the real devices
controller, with NVIDIA_VISIBLE_DEVICES in its environment; its device rules are written the
way runc writes them. The probe runs as a user runs it (`python -m node_probe ...`).
"""
import errno
import json
import os
import subprocess
import sys

import pytest

from tests.cgroups.conftest import (GPU0_UUID, UVM_MAJOR, deny_all_then_allow, make_host_root,
                                    new_cid, new_uid)
from tests.probe_run import run_probe

pytestmark = pytest.mark.root

# runc's default allow-list (abridged) + what nvidia-container-runtime adds for GPU 0, minus uvm
BASE = ["c 1:3 rwm", "c 1:5 rwm", "c 1:8 rwm", "c 1:9 rwm", "c 5:0 rwm", "c 5:2 rwm",
        "c 136:* rwm", "c *:* m", "b *:* m"]
GPU0_NO_UVM = BASE + ["c 195:255 rw", "c 195:0 rw"]


def probe(host, *uids, extra=()):
    args = ["--host-root", str(host), "--cgroup-root", "/sys/fs/cgroup",
            "--only", "cgroup.devices", "--trace-seconds", "0", *extra]
    for u in uids:
        args += ["--focus-pod", u]
    return run_probe(*args)


def open_from(cgroup, paths):
    """errno of open(O_RDWR) of each path by a fresh process inside `cgroup` (0 = opened)."""
    code = ("import os,sys\nfor p in sys.argv[1:]:\n    try:\n"
            "        os.close(os.open(p, os.O_RDWR|os.O_NONBLOCK)); print(0)\n"
            "    except OSError as e: print(e.errno)\n")
    procs = str(cgroup / "cgroup.procs")

    def join():
        with open(procs, "w") as f:
            f.write(str(os.getpid()))
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code, *map(str, paths)], env={},
                         capture_output=True, text=True, timeout=20, preexec_fn=join)
    assert out.returncode == 0, out.stderr
    return [int(x) for x in out.stdout.split()]


def test_uvm_denied_is_found_and_the_kernel_agrees(v1_tree, tmp_path):
    host = make_host_root(tmp_path)
    uid_gpu, uid_all, uid_plain = new_uid(), new_uid(), new_uid()
    cid_gpu = new_cid()
    gpu_cg = v1_tree.container(uid_gpu, cid_gpu)
    deny_all_then_allow(gpu_cg, GPU0_NO_UVM)
    gpu_proc = v1_tree.spawn(gpu_cg, {"NVIDIA_VISIBLE_DEVICES": GPU0_UUID})
    # a GPU container whose cgroup allows everything (privileged): no finding
    all_cg = v1_tree.container(uid_all, new_cid(), qos="guaranteed")
    v1_tree.spawn(all_cg, {"NVIDIA_VISIBLE_DEVICES": "all"})
    # a non-GPU container with a strict list: no finding
    plain_cg = v1_tree.container(uid_plain, new_cid(), qos="besteffort")
    deny_all_then_allow(plain_cg, BASE)
    v1_tree.spawn(plain_cg, {"NVIDIA_VISIBLE_DEVICES": "void"})

    run = probe(host, uid_gpu, uid_all, uid_plain)
    assert run.summary["complete"], run.stdout
    denied = run.findings("cgroup.device_denied")
    assert len(denied) == 1, json.dumps(denied, indent=1)
    f = denied[0]
    ev = f["evidence"]
    assert f["severity"] == "critical"
    assert ev["pod_uid"] == uid_gpu and ev["container_id"] == cid_gpu
    assert ev["device"] == "/dev/nvidia-uvm" and (ev["major"], ev["minor"]) == (UVM_MAJOR, 0)
    assert {d["device"] for d in ev["denied"]} == {"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
    assert {d["device"] for d in ev["allowed"]} == {"/dev/nvidiactl", "/dev/nvidia0"}
    assert "c 195:255 rw" in ev["rules"] and ev["cgroup_version"] == 1
    assert ev["gpu_source"] == "environ" and ev["pids"] == [gpu_proc.pid]
    assert "/dev/nvidia-uvm" in f["title"]
    assert run.returncode == 1

    # tie the finding to the kernel: from inside that cgroup, uvm is EPERM, the others are
    # let through to a node with no driver behind it (ENXIO)
    errs = open_from(gpu_cg, [host / "dev/nvidia-uvm", host / "dev/nvidiactl",
                              host / "dev/nvidia0"])
    assert errs == [errno.EPERM, errno.ENXIO, errno.ENXIO]


def test_all_devices_allowed_and_non_gpu_give_no_finding(v1_tree, tmp_path):
    host = make_host_root(tmp_path)
    uid1, uid2 = new_uid(), new_uid()
    ok_cg = v1_tree.container(uid1, new_cid())
    deny_all_then_allow(ok_cg, GPU0_NO_UVM + [f"c {UVM_MAJOR}:0 rw", f"c {UVM_MAJOR}:1 rw"])
    v1_tree.spawn(ok_cg, {"NVIDIA_VISIBLE_DEVICES": GPU0_UUID})
    nogpu = v1_tree.container(uid2, new_cid())
    deny_all_then_allow(nogpu, BASE)
    v1_tree.spawn(nogpu, {})
    run = probe(host, uid1, uid2)
    assert run.returncode == 0, run.stdout
    assert not run.findings()
    assert run.summary["complete"]


def test_other_gpu_is_not_required(v1_tree, tmp_path):
    """A container that was given GPU 1 does not need nvidia0 (and 195:1 is checked)."""
    gpu1 = "GPU-66666666-7777-8888-9999-000000000000"
    host = make_host_root(tmp_path, gpus=((0, GPU0_UUID), (1, gpu1)))
    uid = new_uid()
    cg = v1_tree.container(uid, new_cid())
    deny_all_then_allow(cg, BASE + ["c 195:255 rw", "c 195:0 rw", f"c {UVM_MAJOR}:* rw"])
    v1_tree.spawn(cg, {"NVIDIA_VISIBLE_DEVICES": gpu1})
    run = probe(host, uid)
    f = run.findings("cgroup.device_denied")
    assert len(f) == 1
    assert [d["device"] for d in f[0]["evidence"]["denied"]] == ["/dev/nvidia1"]
    assert errno.EPERM == open_from(cg, [host / "dev/nvidia1"])[0]

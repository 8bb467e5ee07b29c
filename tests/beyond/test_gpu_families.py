"""Fabric manager, persistence, lost GPUs, GPU memory held by nobody, MIG mode pending: each on
a broken node (fires) and on a healthy one (no warning). A real probe process, the gcc-built
stand-in libnvidia-ml.so.1 driven by pynvml in the NVML child, real host daemons."""
from __future__ import annotations

import subprocess
import time

import pytest

from tests.beyond.conftest import healthy_gpus, make_host
from tests.cgroups.conftest import new_cid, new_uid, v1_tree  # noqa: F401 (fixture)
from tests.deviceplugin.conftest import host, start_plugin  # noqa: F401 (fixtures)
from tests.fakes.nvml import FakeGpu
from tests.probe_run import run_probe

FAMILIES = ("fabric", "persistence", "gpu_lost", "gpu_memory", "mig_pending")


def probe(root, kfile, *only, extra=()):
    sel = [a for c in (("nvml",) + (only or FAMILIES)) for a in ("--only", c)]
    return run_probe("--host-root", str(root), "--kmsg-file", str(kfile), "--trace-seconds", "0",
                     "--kubelet-dir", str(root / "var/lib/kubelet"), *sel, *extra)


def _comm(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return None


def warnings(run):
    return [f for f in run.findings() if f["severity"] in ("warning", "critical")]


def test_healthy_hgx_node_is_quiet(tmp_path, chrooted):
    gpus = healthy_gpus(2, fabric_state=3, fabric_status=0)
    root, kfile = make_host(tmp_path, gpus, nvswitches=4)
    (root / "var/log").mkdir(parents=True)
    (root / "var/log/fabricmanager.log").write_text(
        "[Jun 10 2025 11:08:01] [INFO] [tid 1] Fabric Manager version is : 570.172.08\n")
    chrooted(root, "nv-fabricmanager")   # the host's daemon: its root is the host root
    run = probe(root, kfile)
    assert not warnings(run), warnings(run)
    assert run.returncode == 0, run.stderr
    checks = {c["check"]: c["status"] for c in run.records if c.get("kind") == "progress"
              and c.get("phase") == "check"}
    assert all(checks.get(c) == "ok" for c in FAMILIES), checks


def test_fabric_manager_not_running_on_nvswitch_board(tmp_path):
    gpus = healthy_gpus(2, fabric_state=1, fabric_status=0)
    root, kfile = make_host(tmp_path, gpus, nvswitches=4)
    run = probe(root, kfile, "fabric")
    f = run.findings("fabric.not_ready")
    assert f and f[0]["severity"] == "critical", run.findings()
    ev = f[0]["evidence"]
    assert ev["nvswitch_count"] == 4 and ev["fabricmanager_pids"] == []
    assert {g["state"] for g in ev["gpus_not_registered"]} == {"not_started"}
    assert "802" in f[0]["title"] and "not running" in f[0]["title"]


def test_fabric_manager_version_differs_from_driver(tmp_path, chrooted):
    gpus = healthy_gpus(1, fabric_state=2, fabric_status=0)
    root, kfile = make_host(tmp_path, gpus, nvswitches=2)
    status = root / "var/lib/dpkg/status"
    status.parent.mkdir(parents=True)
    status.write_text("Package: bash\nStatus: install ok installed\nVersion: 5.2\n\n"
                      "Package: nvidia-fabricmanager-570\nStatus: install ok installed\n"
                      "Version: 570.158.01-1\nArchitecture: amd64\n")
    chrooted(root, "nv-fabricmanager")
    run = probe(root, kfile, "fabric")
    f = run.findings("fabric.not_ready")
    # it failed once under load with no finding at all: say what the run saw
    assert f and f[0]["severity"] == "critical", (run.records, run.stderr[-2000:])
    ev = f[0]["evidence"]
    assert ev["fabricmanager_versions"] == ["570.158.01"] and ev["driver_version"] == "570.172.08"
    assert ev["fabricmanager_packages"] == {"nvidia-fabricmanager-570": "570.158.01-1"}
    assert "differs from driver 570.172.08" in f[0]["title"]


def test_a_tenant_process_named_nv_fabricmanager_does_not_hide_a_missing_one(tmp_path, chrooted):
    """A container's process may bear any name: only a fabric manager rooted where this node's
    driver lives counts (as for nvidia-persistenced)."""
    gpus = healthy_gpus(2, fabric_state=1, fabric_status=0)
    root, kfile = make_host(tmp_path, gpus, nvswitches=4)
    pid = chrooted(tmp_path / "tenant-container-rootfs", "nv-fabricmanager")
    run = probe(root, kfile, "fabric")
    (f,) = run.findings("fabric.not_ready")
    assert f["severity"] == "critical" and "nv-fabricmanager is not running" in f["title"]
    ev = f["evidence"]
    assert ev["fabricmanager_pids"] == [] and pid in ev["not_host_pids"]
    assert "/" in ev["daemon_roots"] and "/run/nvidia/driver" in ev["daemon_roots"]


def test_no_nvswitch_no_fabric_finding(tmp_path):
    root, kfile = make_host(tmp_path, healthy_gpus(1))
    run = probe(root, kfile, "fabric")
    assert not run.findings("fabric.not_ready")


def test_persistence_off_without_daemon(tmp_path):
    gpus = healthy_gpus(2, persistence=False)
    root, kfile = make_host(tmp_path, gpus)
    run = probe(root, kfile, "persistence")
    f = run.findings("persistence.off")
    assert f and f[0]["severity"] == "warning"
    assert [g["uuid"] for g in f[0]["evidence"]["gpus_persistence_off"]] == [g.uuid for g in gpus]


def test_persistence_off_but_persistenced_running_is_quiet(tmp_path, chrooted):
    root, kfile = make_host(tmp_path, healthy_gpus(2, persistence=False))
    chrooted(root)  # the host's daemon: its root is the host root (daemons.on_host)
    run = probe(root, kfile, "persistence")
    assert not run.findings("persistence.off")


def test_lost_gpu_named_from_nvml_xid_and_procfs(tmp_path):
    ok, lost_handle, lost_query = (
        FakeGpu("GPU-ok", minor=0, pci_bus_id="00000000:1A:00.0"),
        FakeGpu("GPU-gone", minor=1, pci_bus_id="00000000:3B:00.0", lost=1),
        FakeGpu("GPU-half", minor=2, pci_bus_id="00000000:5C:00.0", lost=2))
    kmsg = ("[  812.441104] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, "
            "GPU has fallen off the bus.\n"
            "[  812.441190] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.\n")
    # the driver still lists a fourth GPU that NVML does not enumerate at all
    root, kfile = make_host(tmp_path, [ok, lost_handle, lost_query], kmsg=kmsg,
                            procfs_gpus=["0000:1a:00.0", "0000:3b:00.0", "0000:5c:00.0",
                                         "0000:9d:00.0"])
    run = probe(root, kfile, "gpu_lost")
    by_subject = {f["subject"]: f for f in run.findings("gpu.lost")}
    # one finding per lost GPU, each named by its PCI bus id; the healthy one is not named
    assert set(by_subject) == {"pci 0000:3b:00.0", "pci 0000:5c:00.0", "pci 0000:9d:00.0"}, \
        list(by_subject)
    xid = by_subject["pci 0000:3b:00.0"]
    assert xid["severity"] == "critical"
    assert xid["evidence"]["xid79_count"] == 1
    # NVML could not open index 1 at all: its bus id comes from the driver's list, by order
    assert xid["evidence"]["sources"] == ["xid_79", "nvml_gpu_is_lost"]
    assert xid["evidence"]["nvml_index"] == 1 and xid["evidence"]["pci_bus_id_inferred"] is True
    assert xid["evidence"]["uuid"] == "GPU-gone"
    assert "GetPreferredAllocation" in xid["title"]
    assert "nvml_gpu_is_lost" in by_subject["pci 0000:5c:00.0"]["evidence"]["sources"]
    assert by_subject["pci 0000:5c:00.0"]["evidence"]["uuid"] == "GPU-half"
    assert by_subject["pci 0000:9d:00.0"]["evidence"]["sources"] == ["missing_from_nvml"]


def test_orphaned_gpu_memory(tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()
    host_pid = subprocess.Popen(["sleep", "60"])
    try:
        gpus = [FakeGpu("GPU-orph", minor=0, memory_used_mib=4096,
                        processes=((gone.pid, 3 << 30), (host_pid.pid, 1 << 30))),
                FakeGpu("GPU-noproc", minor=1, memory_used_mib=8192),
                FakeGpu("GPU-idle", minor=2, memory_used_mib=4)]
        root, kfile = make_host(tmp_path, gpus)
        (root / "var/lib/kubelet/pods").mkdir(parents=True)
        run = probe(root, kfile, "gpu_memory")
    finally:
        host_pid.kill()
        host_pid.wait()
    found = {(f["subject"], f["severity"]): f for f in run.findings("gpu.memory_orphaned")}
    orph = found[("GPU-orph", "warning")]["evidence"]
    assert [(o["pid"], o["state"]) for o in orph["orphans"]] == [(gone.pid, "gone")]
    assert orph["orphaned_bytes"] == 3 << 30
    host = orph["host_processes"]
    assert [(h["pid"], h["state"], h["comm"]) for h in host] == [(host_pid.pid, "host", "sleep")]
    assert found[("GPU-noproc", "warning")]["evidence"]["orphaned_bytes"] == 8192 << 20
    assert not [k for k in found if k[0] == "GPU-idle"]


def test_orphaned_gpu_memory_evidence_is_bounded(tmp_path):
    """Many dead contexts on one GPU: the evidence names a bounded few, the counts are whole."""
    pids = [4_194_304 + 1000 + i for i in range(16)]   # above any pid_max: never alive
    root, kfile = make_host(tmp_path, [FakeGpu("GPU-many", minor=0, memory_used_mib=16384,
                                               processes=tuple((p, 1 << 30) for p in pids))])
    run = probe(root, kfile, "gpu_memory")
    (f,) = run.findings("gpu.memory_orphaned")
    ev = f["evidence"]
    assert ev["orphan_count"] == 16 and ev["orphaned_bytes"] == 16 << 30
    assert [o["pid"] for o in ev["orphans"]] == pids[:10]
    assert "16 process(es)" in f["title"]


def test_mig_mode_pending(tmp_path):
    gpus = [FakeGpu("GPU-pend", minor=0, mig=False, mig_pending=True, processes=((1, 1 << 20),)),
            FakeGpu("GPU-same", minor=1, mig=True, mig_pending=True,
                    mig_devices=(("MIG-1", "3g.40gb", 1, 0),))]
    root, kfile = make_host(tmp_path, gpus)
    run = probe(root, kfile, "mig_pending")
    f = run.findings("mig.mode_pending")
    assert [x["subject"] for x in f] == ["GPU-pend"]
    ev = f[0]["evidence"]
    assert ev["mig_mode_current"] is False and ev["mig_mode_pending"] is True
    assert ev["processes"] == 1 and "block the reset" in f[0]["title"]


def test_families_say_nothing_without_nvidia(tmp_path):
    root = tmp_path / "empty"
    root.mkdir()
    kfile = tmp_path / "k.log"
    kfile.write_text("")
    run = probe(root, kfile)
    assert not warnings(run), warnings(run)


def test_checks_that_need_nvml_say_they_could_not_look(tmp_path):
    root = tmp_path / "empty"
    root.mkdir()
    kfile = tmp_path / "k.log"
    kfile.write_text("")
    run = probe(root, kfile)
    status = {c["id"]: c for c in run.summary["checks"]}
    for cid in FAMILIES:
        assert status[cid]["status"] == "skipped" and "NVML" in status[cid]["reason"], status[cid]
    assert run.summary["complete"] is True and run.returncode == 0


@pytest.mark.root
def test_gpu_memory_of_live_and_deleted_pods(tmp_path, v1_tree):
    """Real processes in real kubepods-shaped cgroups: the one whose pod the kubelet still has
    is quiet, the one whose pod is gone from <kubelet-dir>/pods is held memory."""
    live_uid, gone_uid = new_uid(), new_uid()
    live = v1_tree.spawn(v1_tree.container(live_uid, new_cid()))
    orphan = v1_tree.spawn(v1_tree.container(gone_uid, new_cid()))
    gpus = [FakeGpu("GPU-pods", minor=0, memory_used_mib=6144,
                    processes=((live.pid, 2 << 30), (orphan.pid, 4 << 30)))]
    root, kfile = make_host(tmp_path, gpus)
    (root / "var/lib/kubelet/pods" / live_uid).mkdir(parents=True)
    run = probe(root, kfile, "gpu_memory")
    f = run.findings("gpu.memory_orphaned")
    assert len(f) == 1 and f[0]["severity"] == "warning", run.findings()
    orphans = f[0]["evidence"]["orphans"]
    assert [(o["pid"], o["state"], o["pod_uid"]) for o in orphans] == \
        [(orphan.pid, "pod_gone", gone_uid)]
    assert f[0]["evidence"]["host_processes"] == []


@pytest.mark.root
def test_gpu_memory_of_live_pods_is_quiet(tmp_path, v1_tree):
    uid = new_uid()
    p = v1_tree.spawn(v1_tree.container(uid, new_cid()))
    root, kfile = make_host(tmp_path, [FakeGpu("GPU-busy", memory_used_mib=2048,
                                               processes=((p.pid, 2 << 30),))])
    (root / "var/lib/kubelet/pods" / uid).mkdir(parents=True)
    run = probe(root, kfile, "gpu_memory")
    assert not run.findings("gpu.memory_orphaned"), run.findings()


def test_lost_gpu_names_the_nvidia_device_plugin_it_breaks(host, start_plugin):
    """A real gRPC device plugin on the kubelet's socket: the lost-GPU finding names it."""
    plugin = start_plugin()
    gpus = [FakeGpu("GPU-ok", minor=0, pci_bus_id="00000000:1A:00.0"),
            FakeGpu("GPU-half", minor=1, pci_bus_id="00000000:5C:00.0", lost=2)]
    _, kfile = make_host(host.root / "k", gpus, root=host.root)
    run = run_probe(*host.args("--kmsg-file", str(kfile), "--trace-seconds", "0",
                               "--only", "nvml", "--only", "gpu_lost", "--only", "deviceplugin"))
    f = run.findings("gpu.lost")
    assert f, run.findings()
    assert f[0]["evidence"]["nvidia_device_plugins"][0]["pid"] == plugin.pid
    assert f"pid {plugin.pid}" in f[0]["title"]


@pytest.mark.root
def test_fabric_manager_in_a_driver_container_judged_by_its_own_root(tmp_path):
    """The fabric manager runs in its own root (as in the GPU Operator's driver container): its
    version is what that root has installed, not what the host's dpkg says."""
    gpus = healthy_gpus(1, fabric_state=2)
    root, kfile = make_host(tmp_path, gpus, nvswitches=2)
    ctr = root / "run/nvidia/driver"    # where the GPU Operator mounts its driver container
    (ctr / "usr/bin").mkdir(parents=True)
    src = tmp_path / "pause.c"
    src.write_text("#include <unistd.h>\nint main(void){for(;;)pause();}\n")
    # gcc and libc6-dev (libc.a) are installed by scripts/setup.sh: a missing one is a failure
    subprocess.run(["gcc", "-static", "-O1", "-o", str(ctr / "usr/bin/nv-fabricmanager"),
                    str(src)], check=True, capture_output=True, timeout=60)
    (ctr / "var/lib/dpkg").mkdir(parents=True)
    (ctr / "var/lib/dpkg/status").write_text(
        "Package: nvidia-fabricmanager-570\nStatus: install ok installed\nVersion: 570.124.06-1\n")
    (root / "var/lib/dpkg").mkdir(parents=True)  # the host has the right one installed
    (root / "var/lib/dpkg/status").write_text(
        "Package: nvidia-fabricmanager-570\nStatus: install ok installed\nVersion: 570.172.08-1\n")
    fm = subprocess.Popen(["unshare", "--mount", f"--root={ctr}", "/usr/bin/nv-fabricmanager"])
    try:
        # Popen returns once `unshare` runs; the probe must not look before unshare has
        # exec'd the daemon (same pid) inside its own root
        deadline = time.monotonic() + 30
        while _comm(fm.pid) != "nv-fabricmanager"[:15] and fm.poll() is None:  # comm: 15 chars
            assert time.monotonic() < deadline, "unshare never exec'd the stand-in daemon"
            time.sleep(0.02)
        assert fm.poll() is None, f"unshare exited {fm.returncode}"
        run = probe(root, kfile, "fabric")
    finally:
        fm.kill()
        fm.wait()
    f = run.findings("fabric.not_ready")
    assert f and f[0]["severity"] == "critical", run.findings()
    ev = f[0]["evidence"]
    assert ev["fabricmanager_pids"] and ev["fabricmanager_versions"] == ["570.124.06"]
    assert "differs from driver 570.172.08" in f[0]["title"]

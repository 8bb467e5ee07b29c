"""hami (node side): libvgpu.so isolation inside real container roots, and the plugin log.

Container roots are real directories; the end-to-end cases run real processes chrooted into
them, so the check reads them through /proc/PID/root exactly as it does on a node."""
from __future__ import annotations

from pathlib import Path

import pytest

from node_probe.checks import hami
from node_probe.host import containers
from tests.hami.conftest import HAMI_ENV, UUID_A
from tests.probe_run import run_probe


# -- audit of a root directory --------------------------------------------------------------

def test_complete_isolation_passes(container_root):
    r = container_root().add_vgpu()
    res = hami.audit_root(r.path, HAMI_ENV)
    assert res["problems"] == [] and hami.verdict(res) is None
    assert res["preloaded_libs"] == ["/usr/local/vgpu/libvgpu.so"]
    assert res["lib_present"] == {"/usr/local/vgpu/libvgpu.so": True}
    assert res["shared_cache_dir"] == "/usr/local/vgpu"


def test_missing_preload_is_critical(container_root):
    r = container_root().add_vgpu(preload=False)
    sev, title = hami.verdict(hami.audit_root(r.path, HAMI_ENV))
    assert sev == "critical" and "/etc/ld.so.preload is missing" in title


def test_preload_without_libvgpu(container_root):
    r = container_root().add_vgpu(preload_text="/usr/lib/libjemalloc.so.2\n")
    sev, title = hami.verdict(hami.audit_root(r.path, HAMI_ENV))
    assert sev == "critical" and "does not name libvgpu.so" in title


def test_preload_names_a_library_that_is_not_there(container_root):
    r = container_root().add_vgpu(lib=False)
    res = hami.audit_root(r.path, HAMI_ENV)
    sev, title = hami.verdict(res)
    assert sev == "critical" and "is not in the container" in title


def test_absolute_symlinks_resolve_inside_the_root(container_root):
    # /etc/ld.so.preload -> /usr/local/vgpu/ld.so.preload: must be read from the container's
    # /usr/local, not the host's (which has no such file)
    r = container_root().add_vgpu(preload_symlink=True)
    assert not Path("/usr/local/vgpu/ld.so.preload").exists()
    res = hami.audit_root(r.path, HAMI_ENV)
    assert res["problems"] == [] and res["preloaded_libs"] == ["/usr/local/vgpu/libvgpu.so"]


def test_custom_hook_path_from_the_shared_cache(container_root):
    env = dict(HAMI_ENV, CUDA_DEVICE_MEMORY_SHARED_CACHE="/opt/hami/vgpu/1.cache")
    r = container_root().add_vgpu(hook="/opt/hami")
    res = hami.audit_root(r.path, env)
    assert res["hook_path"] == "/opt/hami" and res["problems"] == []


def test_missing_cache_dir_is_a_warning(container_root):
    env = dict(HAMI_ENV, CUDA_DEVICE_MEMORY_SHARED_CACHE="/tmp/vgpu/1.cache")
    r = container_root().add_vgpu()
    sev, title = hami.verdict(hami.audit_root(r.path, env))
    assert sev == "warning" and "/tmp/vgpu is missing" in title


def test_disable_control_is_reported(container_root):
    r = container_root()
    sev, title = hami.verdict(hami.audit_root(r.path, dict(HAMI_ENV, CUDA_DISABLE_CONTROL="true")))
    assert sev == "warning" and "CUDA_DISABLE_CONTROL" in title
    # set but false: HAMi ignores it, so a missing preload is still missing
    sev, _ = hami.verdict(hami.audit_root(r.path, dict(HAMI_ENV, CUDA_DISABLE_CONTROL="false")))
    assert sev == "critical"


def test_hami_env_detection():
    assert hami.is_hami_env(HAMI_ENV)
    assert hami.is_hami_env({"CUDA_DEVICE_SM_LIMIT": "50"})
    assert not hami.is_hami_env({"NVIDIA_VISIBLE_DEVICES": UUID_A, "CUDA_VERSION": "12.4"})


# -- end to end: real processes in those roots -----------------------------------------------

@pytest.mark.root
def test_probe_reads_real_container_roots(container_root, chrooted):
    good = container_root().add_vgpu()
    bare = container_root()                               # HAMi env, no ld.so.preload
    nolib = container_root().add_vgpu(lib=False)
    plain = container_root()                              # a plain NVIDIA container
    p_good = chrooted.start(good, HAMI_ENV)
    p_bare = chrooted.start(bare, HAMI_ENV)
    p_nolib = chrooted.start(nolib, HAMI_ENV)
    off = container_root()
    p_off = chrooted.start(off, dict(HAMI_ENV, CUDA_DISABLE_CONTROL="true"))
    p_plain = chrooted.start(plain, {"NVIDIA_VISIBLE_DEVICES": UUID_A, "CUDA_VERSION": "12.4"})
    for p, r in ((p_good, good), (p_bare, bare), (p_nolib, nolib), (p_off, off), (p_plain, plain)):
        chrooted.wait_rooted(p, r)
    run = run_probe("--only", "hami", "--trace-seconds", "0")
    assert run.summary["complete"] is True
    # hami needs the container list: its producer joins the run (and nothing else does)
    assert {c["id"] for c in run.summary["checks"]} == {"hami", "containers"}
    by_pid = {}
    for f in run.findings("hami.isolation_missing"):
        for pid in f["evidence"]["pids"]:
            by_pid[pid] = f
    assert p_good.pid not in by_pid and p_plain.pid not in by_pid
    assert by_pid[p_bare.pid]["severity"] == "critical"
    assert "/etc/ld.so.preload is missing" in by_pid[p_bare.pid]["title"]
    assert by_pid[p_bare.pid]["subject"] == f"pid {p_bare.pid} (sleep)"
    assert by_pid[p_bare.pid]["evidence"]["root"] == f"/proc/{p_bare.pid}/root"
    assert "CUDA_DEVICE_SM_LIMIT" in by_pid[p_bare.pid]["evidence"]["hami_env"]
    assert "not in the container" in by_pid[p_nolib.pid]["title"]
    assert by_pid[p_off.pid]["severity"] == "warning"


# -- plugin log -------------------------------------------------------------------------------

PLUGIN_LOG = """\
I0514 07:00:01.000000       1 register.go:131] Successfully registered annotation. Next check in 30s seconds...
I0514 07:05:10.123456       1 server.go:585] Allocate pod name is default/infer-0, annotation is map[...]
E0514 07:05:10.123999       1 server.go:612] device number not matched [{GPU-03f69c50-207a-2038-9b45-23cac89cb67d NVIDIA 3000 30}] [GPU-03f69c50-207a-2038-9b45-23cac89cb67d-0 GPU-03f69c50-207a-2038-9b45-23cac89cb67d-1]
E0514 07:06:10.100000       1 server.go:612] device number not matched [{...}] [...]
E0514 07:07:00.000000       1 register.go:120] patch node error nodes "gpu-1" is forbidden: User "system:serviceaccount:kube-system:hami-device-plugin" cannot patch resource "nodes"
E0514 07:07:05.000000       1 nodelock.go:201] "Failed to release node lock" err="node gpu-1 has been locked within 5m0s"
E0514 07:08:00.000000       1 util.go:88] no binding pod found on node gpu-1
F0514 07:09:00.000000       1 main.go:60] GRPC server for 'nvidia.com/gpu' has repeatedly crashed recently. Quitting
"""


def test_scan_plugin_log_patterns():
    found = {f.subject: f for f in hami.scan_plugin_log(PLUGIN_LOG.splitlines())}
    f = found["hami-device-plugin:device_number_not_matched"]
    assert f.severity.value == "critical" and f.evidence["count"] == 2
    assert f.evidence["last_klog_time"] == "0514 07:06:10.100000"
    assert found["hami-device-plugin:register_failed"].severity.value == "warning"
    assert found["hami-device-plugin:node_lock"].evidence["count"] == 1
    assert found["hami-device-plugin:pending_pod_not_found"].severity.value == "critical"
    assert found["hami-device-plugin:grpc_failed"].severity.value == "critical"
    assert found["hami-device-plugin:fatal"].evidence["count"] == 1
    assert "hami-device-plugin:nvml_failed" not in found


def test_healthy_log_has_no_findings():
    assert hami.scan_plugin_log(PLUGIN_LOG.splitlines()[:2]) == []


def test_kubectl_timestamps_prefix_is_understood():
    line = ("2024-05-14T07:05:10.123999Z E0514 07:05:10.123999 1 server.go:612] nvml Init err: "
            "ERROR_LIBRARY_NOT_FOUND")
    (f,) = hami.scan_plugin_log([line])
    assert f.subject == "hami-device-plugin:nvml_failed"
    assert f.evidence["last_klog_time"] == "0514 07:05:10.123999"


def test_probe_scans_the_plugin_log_file(tmp_path):
    log = tmp_path / "hami-device-plugin.log"
    log.write_text(PLUGIN_LOG)
    run = run_probe("--only", "hami", "--plugin-log", str(log), "--trace-seconds", "0")
    subjects = {f["subject"] for f in run.findings("hami.plugin_log_error")}
    assert "hami-device-plugin:device_number_not_matched" in subjects
    assert run.returncode == 1 and run.summary["complete"] is True


def test_log_tail_drops_partial_first_line(tmp_path):
    log = tmp_path / "big.log"
    log.write_text("x" * 100 + "\n" + "E0514 07:05:10.1 1 a.go:1] device number not matched\n")
    assert hami.read_log_tail(log, limit=60) == ["E0514 07:05:10.1 1 a.go:1] device number not matched"]


@pytest.mark.root
def test_containers_fact_labels_and_focus(container_root, chrooted):
    bare = container_root()
    p = chrooted.start(bare, HAMI_ENV)
    chrooted.wait_rooted(p, bare)
    uid = "6f1c0a6e-1b2c-4d3e-8f90-123456789abc"
    ref = containers.parse_cgroup_path(f"/kubepods/burstable/pod{uid}/{'c0ffee' * 10}abcd")
    fact = [containers.Container(ref=ref, cgroup_path=Path("/sys/fs/cgroup/devices" + ref.rel),
                                 cgroup_version=1, pids=[p.pid],
                                 meta={"namespace": "ml", "pod": "infer-0", "container": "main"})]
    groups = [g for g in hami.discover(Path("/proc"), fact) if p.pid in g["pids"]]
    assert len(groups) == 1 and groups[0]["pod_uid"] == uid
    assert hami._subject(groups[0], Path("/proc")) == "pod ml/infer-0 container main"
    assert [g for g in hami.discover(Path("/proc"), fact, focus_pods=("other-uid",))
            if p.pid in g["pids"]] == []
    assert [g for g in hami.discover(Path("/proc"), fact, focus_pods=(uid,))
            if p.pid in g["pids"]]


def test_a_container_whose_first_pid_joined_after_the_fact_keeps_its_pod(tmp_path):
    """Two processes share one root; the first (lowest pid) started after the containers fact
    was taken and its cgroup names no pod. The group still gets the pod of the pid the fact
    knows, so `pod Y` (focus) keeps it."""
    proc, rootfs = tmp_path / "proc", tmp_path / "rootfs"
    rootfs.mkdir()
    env = b"\0".join(f"{k}={v}".encode() for k, v in HAMI_ENV.items()) + b"\0"
    for pid in (100, 200):
        d = proc / str(pid)
        d.mkdir(parents=True)
        (d / "environ").write_bytes(env)
        (d / "root").symlink_to(rootfs)
        (d / "cgroup").write_text("0::/\n")
    uid = "6f1c0a6e-1b2c-4d3e-8f90-123456789abc"
    ref = containers.parse_cgroup_path(f"/kubepods/burstable/pod{uid}/{'c0ffee' * 10}abcd")
    fact = [containers.Container(ref=ref, cgroup_path=Path("/sys/fs/cgroup/devices" + ref.rel),
                                 cgroup_version=1, pids=[200],
                                 meta={"namespace": "ml", "pod": "infer-0", "container": "main"})]
    (g,) = hami.discover(proc, fact)
    assert sorted(g["pids"]) == [100, 200] and g["pod_uid"] == uid
    assert hami.discover(proc, fact, focus_pods=(uid,)) != []

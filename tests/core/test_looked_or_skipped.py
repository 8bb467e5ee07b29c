"""`ok` means the check looked: driver, kmsg, memory, hami and nvml end `skipped` with the
reason when they could not (no driver, unreadable kernel log, no /proc signal, no access to
process environments, an NVML helper that died), and stay `ok` and quiet on a healthy host."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

import node_probe.checks  # noqa: F401  (registers the checks)
from node_probe.engine import registry
from node_probe.engine.context import ProbeOptions
from node_probe.engine.runner import Runner
from tests.probe_run import REPO, run_probe

LIBDIR = "usr/lib/x86_64-linux-gnu"
KMOD_VERSION = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.158.01  Tue May 13 "
                "16:04:00 UTC 2025\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")


def statuses(run) -> dict[str, dict]:
    return {c["id"]: c for c in run.summary["checks"]}


def run_in_process(ids: tuple[str, ...], **opts):
    checks = [c for c in registry.all_checks() if c.id in ids]
    res = Runner(checks, ProbeOptions(trace_s=0, timeout_s=10, **opts), lambda rec: None).run()
    return {c.id: c for c in res.checks}, res.findings


# -- driver -------------------------------------------------------------------------------------

def test_driver_on_a_host_without_a_driver_is_skipped_with_the_reason(tmp_path):
    root = tmp_path / "host"
    root.mkdir()
    run = run_probe("--host-root", str(root), "--only", "nvml", "--only", "driver",
                    "--trace-seconds", "0")
    c = statuses(run)["driver"]
    assert c["status"] == "skipped", c
    assert "no NVIDIA driver version" in c["reason"] and "no libnvidia-ml.so.1" in c["reason"]
    assert not run.actionable() and run.returncode == 0


def test_driver_with_only_the_kernel_module_still_looks(tmp_path):
    root = tmp_path / "host"
    (root / "proc/driver/nvidia").mkdir(parents=True)
    (root / "proc/driver/nvidia/version").write_text(KMOD_VERSION)
    run = run_probe("--host-root", str(root), "--only", "nvml", "--only", "driver",
                    "--trace-seconds", "0")
    assert statuses(run)["driver"]["status"] == "ok"
    (bad,) = run.findings("driver.known_bad")
    assert bad["evidence"]["driver_version"] == "570.158.01"


# -- nvml ---------------------------------------------------------------------------------------

def test_nvml_helper_that_dies_is_skipped_not_ok(tmp_path):
    """A library whose load kills the helper process: NVML was never asked."""
    root = tmp_path / "host"
    (root / LIBDIR).mkdir(parents=True)
    src = tmp_path / "die.c"
    src.write_text("#include <unistd.h>\n"
                   "__attribute__((constructor)) static void die(void) { _exit(3); }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(root / LIBDIR / "libnvidia-ml.so.1"),
                    str(src)], check=True, timeout=60)
    run = run_probe("--host-root", str(root), "--only", "nvml", "--trace-seconds", "0")
    c = statuses(run)["nvml"]
    assert c["status"] == "skipped" and "NVML helper process failed (exit 3)" in c["reason"], c
    assert run.findings("nvml.init_error")


# -- kmsg ---------------------------------------------------------------------------------------

def test_unreadable_kernel_log_is_skipped(tmp_path):
    root = tmp_path / "host"
    (root / "dev/kmsg").mkdir(parents=True)     # not a character device: reading it fails
    run = run_probe("--host-root", str(root), "--only", "kmsg", "--trace-seconds", "0")
    c = statuses(run)["kmsg"]
    assert c["status"] == "skipped" and "cannot read the kernel log" in c["reason"], c


def test_unreadable_kernel_log_file_is_skipped_not_an_error(tmp_path):
    checks, _ = run_in_process(("kmsg",), kmsg_file=tmp_path / "gone.log")
    assert checks["kmsg"].status == "skipped" and "gone.log" in checks["kmsg"].reason


def test_healthy_kernel_log_is_ok_and_quiet(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("[    1.000000] Linux version 6.1\n[    2.5] nvidia: loading out-of-tree module\n")
    run = run_probe("--kmsg-file", str(log), "--only", "kmsg", "--trace-seconds", "0")
    assert statuses(run)["kmsg"]["status"] == "ok" and not run.findings()


# -- memory -------------------------------------------------------------------------------------

def test_memory_without_any_proc_signal_is_skipped(tmp_path):
    empty = tmp_path / "proc"
    empty.mkdir()
    checks, findings = run_in_process(("memory",), proc_root=empty)
    assert checks["memory"].status == "skipped", checks["memory"]
    assert "no memory signal" in checks["memory"].reason and not findings


def test_memory_on_the_real_proc_looks():
    checks, findings = run_in_process(("memory",))
    assert checks["memory"].status == "ok"
    assert [f.id for f in findings] == ["memory.pressure"]


# -- hami ---------------------------------------------------------------------------------------

@pytest.fixture
def nobody_pythonpath():
    """A PYTHONPATH from which user nobody can import node_probe: the checkout itself, or a copy
    in a directory of its own when a parent of the checkout is closed to others (a clone in
    `mktemp -d`, mode 0700)."""
    if all(os.stat(d).st_mode & 0o001 for d in (REPO, *REPO.parents)):
        yield str(REPO)
        return
    import shutil
    import tempfile
    d = pathlib.Path(tempfile.mkdtemp(prefix="gpu-doctor-nobody-"))
    try:
        shutil.copytree(REPO / "node_probe", d / "node_probe",
                        ignore=shutil.ignore_patterns("__pycache__"))
        os.chmod(d, 0o755)
        yield str(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.root
def test_hami_without_access_to_process_environments_is_skipped(nobody_pythonpath):
    if os.geteuid() != 0:
        pytest.skip("needs root to drop to nobody")
    env = dict(os.environ, PYTHONPATH=nobody_pythonpath)
    p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                        sys.executable, "-m", "node_probe", "-o", "json",
                        "--only", "hami", "--trace-seconds", "0"],
                       capture_output=True, text=True, timeout=60, env=env, cwd="/")
    checks = {c["id"]: c for c in json.loads(p.stdout)["checks"]}
    assert checks["hami"]["status"] == "skipped", (checks, p.stderr[-500:])
    assert "cannot read other processes' environments" in checks["hami"]["reason"]


def test_hami_on_a_host_without_hami_looks_and_is_quiet():
    checks, findings = run_in_process(("hami",))
    assert checks["hami"].status == "ok" and not findings

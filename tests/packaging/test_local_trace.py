"""`kubectl gpu-doctor local` from a krew install and from a pip install traces on a host without
kernel headers (issue 29, item 4).

Before: the frozen plugin never bundled bcc and had no header set, and a wheel had no set
either, so `local` on a headerless host (COS, Bottlerocket, Talos, Flatcar, a laptop-less SSH
session on a driver-container node) skipped eBPF. Now both carry the header set for the host's
machine (the archive at _internal/kheaders, the wheel at node_probe/kheaders/<machine>/) and
import the host's python3-bpfcc when their Python has no bcc (node_probe/tracing/hostbcc.py).

Each test runs the built artifact as a user would, as root, in a private mount namespace where
tmpfs hides /lib/modules and /usr/src (tests/tracing's HIDE_HEADERS; this kernel has no
/sys/kernel/kheaders.tar.xz), and rewrites a GPU container's device rules during the window: the
report must say the headers came from that artifact's bundle and name the writer."""
from __future__ import annotations

import os
import queue
import subprocess
import sys
import tempfile
import threading
import zipfile
from pathlib import Path

import pytest

from tests.packaging.conftest import REPO, run_script
from tests.tracing.conftest import (HIDE_HEADERS, ProbeRun, bcc_ready,  # noqa: F401 (fixtures)
                                    devices_cgroup, findings)

pytestmark = pytest.mark.slow


class LocalRun(ProbeRun):
    """`<plugin> local -o jsonl ...` as a child, records read as they come (ProbeRun's reader),
    with no PYTHONPATH: the installed code must be what runs, not this checkout's."""

    def __init__(self, argv: list[str], cwd: Path) -> None:
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "BCC_KERNEL_SOURCE", "GPU_DOCTOR_KHEADERS_DIR",
                            "VIRTUAL_ENV")}
        env["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"
        self.proc = subprocess.Popen([*HIDE_HEADERS, *argv], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, cwd=str(cwd), env=env,
                                     start_new_session=True)
        self.records: list[dict] = []
        self._q: "queue.Queue[dict | None]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()


@pytest.fixture()
def krew_plugin(plugin_archive: Path, tmp_path: Path) -> tuple[list[str], Path]:
    """The archive unpacked as krew installs it: (command, its bundled header dir)."""
    store = tmp_path / "store"
    store.mkdir()
    subprocess.run(["tar", "-xzf", str(plugin_archive), "-C", str(store)], check=True, timeout=120)
    return [str(store / "kubectl-gpu_doctor")], store / "_internal" / "kheaders"


@pytest.fixture(scope="session")
def wheel_file() -> Path:
    return Path(run_script(["bash", "scripts/build-wheel.sh"], timeout_s=600))


@pytest.fixture()
def pip_plugin(wheel_file: Path, tmp_path: Path) -> tuple[list[str], Path]:
    """The wheel pip-installed into a fresh venv without system site packages (so no bcc):
    (its kubectl-gpu_doctor console script, the installed header dir). The runtime
    dependencies come from the plugin's build venv through a .pth file, so no index is needed;
    the project itself is only the installed wheel."""
    deps_venv = Path(run_script(["bash", "scripts/build-plugin.sh", "--venv-only"], 600))
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True, timeout=300)
    r = subprocess.run([str(venv / "bin/pip"), "install", "-q", "--no-index", "--no-deps",
                        str(wheel_file)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (site,) = (venv / "lib").glob("python3*/site-packages")
    (deps,) = (deps_venv / "lib").glob("python3*/site-packages")
    (site / "gpu_doctor_test_deps.pth").write_text(f"{deps}\n")
    assert subprocess.run([str(venv / "bin/python"), "-c", "import bcc"],
                          capture_output=True).returncode != 0, "the venv must have no bcc"
    return [str(venv / "bin/kubectl-gpu_doctor")], site / "node_probe" / "kheaders" / os.uname().machine


def _traces_without_host_headers(argv: list[str], bundled: Path, bundle: str, devices_cgroup,
                                 tmp_path: Path) -> None:
    gpu = devices_cgroup("localtrace-gpu")      # a GPU container's rules: deny all, allow 195
    (gpu / "devices.deny").write_text("a")
    for rule in ("c 1:3 rwm", "c 195:* rwm"):
        (gpu / "devices.allow").write_text(rule)
    run = LocalRun([*argv, "local", "--only", "trace", "--trace-seconds", "4", "--timeout", "60",
                    "-o", "jsonl"], cwd=tmp_path)
    try:
        attached = run.wait_attached(timeout=60)
        w = subprocess.Popen(["sh", "-c", f"echo a > {gpu}/devices.deny; "
                                          f"echo 'c 1:3 rwm' > {gpu}/devices.allow"])
        assert w.wait(10) == 0
        recs = run.finish(timeout=90)
    finally:
        run.kill()
    hdr = attached["kernel_headers"]
    assert hdr["source"] == "bundled" and hdr["bundle"] == bundle, hdr
    assert Path(hdr["path"]) == bundled and hdr["machine"] == os.uname().machine, hdr
    assert f"bundled Linux {hdr['kernel_version']} headers from the {bundle} (" \
        in attached["message"]
    assert attached["probes"], attached
    assert not findings(recs, "probe.ebpf_unavailable"), findings(recs, "probe.ebpf_unavailable")
    summary = recs[-1]
    assert summary["kind"] == "summary" and summary["complete"] is True, summary
    assert [c["status"] for c in summary["checks"] if c["id"] == "trace"] == ["ok"], summary
    used = [r["message"] for r in recs if r.get("kind") == "log" and "no bcc module" in r.get("message", "")]
    assert used and "/bcc" in used[0], "the report does not say the host's bcc was used"
    rewritten = {f["evidence"]["cgroup"]: f for f in findings(recs, "cgroup.device_rules_rewritten")}
    ev = rewritten["/" + gpu.name]["evidence"]
    assert ev["writers"] == [{"pid": w.pid, "comm": "sh"}]


@pytest.mark.root
@pytest.mark.bcc
def test_krew_archive_local_traces_without_host_headers(bcc_ready, krew_plugin, devices_cgroup,
                                                       tmp_path):
    argv, bundled = krew_plugin
    _traces_without_host_headers(argv, bundled, "plugin artifact", devices_cgroup, tmp_path)


@pytest.mark.root
@pytest.mark.bcc
def test_pip_install_local_traces_without_host_headers(bcc_ready, pip_plugin, devices_cgroup,
                                                      tmp_path):
    argv, bundled = pip_plugin
    _traces_without_host_headers(argv, bundled, "wheel", devices_cgroup, tmp_path)


@pytest.mark.serial     # builds into dist/, like the other packaging builds
def test_wheel_carries_a_header_set_per_machine(wheel_file: Path):
    """Both machines' sets, each complete by its manifest (build-kheaders.py check)."""
    with zipfile.ZipFile(wheel_file) as z, tempfile.TemporaryDirectory(prefix="gd-wheel-") as tmp:
        z.extractall(tmp, [n for n in z.namelist() if n.startswith("node_probe/kheaders/")])
        for machine in ("x86_64", "aarch64"):
            r = subprocess.run([sys.executable, str(REPO / "scripts/build-kheaders.py"), "check",
                                str(Path(tmp) / "node_probe/kheaders" / machine)],
                               capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, (machine, r.stderr)

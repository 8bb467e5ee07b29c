"""The built plugin archive, installed the way krew installs it (files[] applied into a store
directory, a symlink in a bin directory on PATH), dispatched by the real kubectl."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from node_probe import __version__
from tests.packaging import krew_rules
from tests.packaging.conftest import REPO

pytestmark = pytest.mark.slow


@pytest.fixture()
def krew_root(unpacked_plugin: Path, tmp_path: Path) -> Path:
    """$KREW_ROOT after `kubectl krew install gpu-doctor`: store/<name>/<version>/ + bin/ symlink."""
    plugin = yaml.safe_load((REPO / "krew-manifest.yaml").read_text())
    [platform] = [p for p in plugin["spec"]["platforms"]
                  if p["selector"]["matchLabels"] == {"os": "linux", "arch": "amd64"}]
    root = tmp_path / "krew"
    store = root / "store" / "gpu-doctor" / plugin["spec"]["version"]
    binary = krew_rules.install_platform(unpacked_plugin, platform, store)
    (root / "bin").mkdir()
    # krew names the link after the plugin with '-' -> '_' (kubectl's plugin name mapping)
    (root / "bin" / "kubectl-gpu_doctor").symlink_to(binary)
    return root


def kubectl(krew_root: Path, *args: str, timeout_s: float = 60,
            env: dict | None = None) -> subprocess.CompletedProcess:
    kubectl_bin = shutil.which("kubectl")
    if kubectl_bin is None:
        pytest.skip("kubectl is not installed")
    path = f"{krew_root / 'bin'}:{os.path.dirname(kubectl_bin)}:/usr/bin:/bin"
    env = {"PATH": path, "HOME": str(krew_root), "KUBECONFIG": str(krew_root / "no-kubeconfig"),
           **(env or {})}
    return subprocess.run([kubectl_bin, *args], capture_output=True, text=True, env=env,
                          timeout=timeout_s, cwd=krew_root)


def test_kubectl_dispatches_version_to_the_installed_plugin(krew_root: Path):
    r = kubectl(krew_root, "gpu-doctor", "version")
    assert r.returncode == 0, r.stderr
    assert f"kubectl gpu-doctor {__version__}" in r.stdout
    assert f"gpu-doctor-probe:{__version__}" in r.stdout  # the image tag equals the plugin version


def test_kubectl_plugin_list_shows_it(krew_root: Path):
    r = kubectl(krew_root, "plugin", "list")
    assert str(krew_root / "bin" / "kubectl-gpu_doctor") in r.stdout, r.stdout + r.stderr
    assert "kubectl-gpu_doctor" not in r.stderr  # no "not executable"/"overshadowed" warning for it


def test_frozen_plugin_runs_the_same_node_checks_as_the_source_tree(krew_root: Path):
    """`local` re-enters the frozen executable to run node_probe: every check module must be
    in the bundle (node_probe discovers node_probe.checks.* with pkgutil at run time)."""
    # what the source tree runs on this host (--list-checks also lists the checks that run
    # only on their input, such as `offline` with --nvidia-smi-file)
    source = subprocess.run([sys.executable, "-m", "node_probe", "--trace-seconds", "0",
                             "-o", "json"], cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    want = sorted(c["id"] for c in json.loads(source.stdout)["checks"])
    assert len(want) > 20, source.stderr
    r = kubectl(krew_root, "gpu-doctor", "local", "--trace-seconds", "0", "-o", "json", timeout_s=120)
    assert r.returncode in (0, 1), r.stderr
    doc = json.loads(r.stdout)
    assert doc["summary"]["complete"] is True
    assert sorted(c["id"] for c in doc["checks"]) == want


def test_archive_layout(unpacked_plugin: Path):
    top = sorted(os.listdir(unpacked_plugin))
    assert top == ["LICENSE", "_internal", "kubectl-gpu_doctor"]
    internal = unpacked_plugin / "_internal"
    bundled = sorted(p.name for p in (internal / "bpf").glob("*.bpf.c"))
    assert bundled and bundled == sorted(p.name for p in (REPO / "bpf").glob("*.bpf.c"))
    assert not (internal / "bcc").exists()  # bcc is the host's (libbcc + kernel headers), never bundled
    assert list(internal.glob("libpython3*.so*"))  # carries its own interpreter: no system Python needed
    # the kernel header set for this machine (hosts without headers; test_local_trace.py)
    meta = json.loads((internal / "kheaders" / "metadata.json").read_text())
    assert meta["machine"] == os.uname().machine and (internal / "kheaders/include/linux/kconfig.h").is_file()


def test_frozen_plugin_runs_the_probes_child_processes(krew_root: Path, tmp_path: Path):
    """node_probe runs NVML in a child (`python -m node_probe.host.nvml_child`); frozen, that child is
    the executable re-entered with `__run_module`. With a real (fake-driver) libnvidia-ml.so.1
    under --host-root, the frozen plugin must reach the same verdict as the source tree."""
    from tests.fakes.nvml import H20_MIXED, build_fake_nvml

    host = tmp_path / "host"
    build_fake_nvml(host / "usr/lib/x86_64-linux-gnu", driver_version="570.158.01", gpus=H20_MIXED)
    args = ["--host-root", str(host), "--only", "nvml", "--only", "driver", "-o", "json"]
    source = subprocess.run([sys.executable, "-m", "node_probe", *args], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    frozen = kubectl(krew_root, "gpu-doctor", "local", "--trace-seconds", "0", *args, timeout_s=120)
    want, got = json.loads(source.stdout), json.loads(frozen.stdout)

    def verdict(doc: dict) -> tuple:
        return (sorted((f["id"], f["severity"]) for f in doc["findings"]),
                sorted((c["id"], c["status"]) for c in doc["checks"]))

    assert ("driver.known_bad", "critical") in verdict(want)[0]  # the fixture really is seed 000
    assert verdict(got) == verdict(want), frozen.stderr


def test_frozen_plugin_explains_a_finding_offline(krew_root: Path, tmp_path: Path):
    """`kubectl gpu-doctor explain ID` from the installed krew archive, in a network namespace
    with no interface up (no network at all), from a directory with no checkout: the page comes
    from the bundle and reads as the source tree renders it."""
    from kubectl_gpudoctor.commands import explain
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1) for a network namespace")
    exe = krew_root / "bin" / "kubectl-gpu_doctor"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "COLUMNS": "100",
           "KUBECONFIG": str(tmp_path / "none")}
    r = subprocess.run(["unshare", "--net", str(exe), "explain", "kubelet.admission_stalled"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout == explain.page("kubelet.admission_stalled", 100)
    bundled = sorted(p.stem for p in (krew_root / "store").rglob("_internal/docs/findings/*.md"))
    from node_probe.protocol.catalog import CATALOG
    assert bundled == sorted(CATALOG)
    r = subprocess.run(["unshare", "--net", str(exe), "explain", "not_ready"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert r.returncode == 2 and "node.not_ready" in r.stderr and r.stdout == ""


def test_frozen_plugin_runs_the_list_page_parser(unpacked_plugin: Path):
    """`nodes` parses big list pages in child processes (kubectl_gpudoctor.api.pageparse); frozen,
    a child is the executable re-entered with `__run_module`, which allows that module and no
    other module of the client. Pod pages are decoded there by msgspec, which the bundle
    carries."""
    import marshal
    import struct
    binary = str(unpacked_plugin / "kubectl-gpu_doctor")
    page = json.dumps({"metadata": {"continue": "t"}, "items": [
        {"metadata": {"name": "a", "managedFields": [{}]}}]}).encode()
    r = subprocess.run([binary, "__run_module", "kubectl_gpudoctor.api.pageparse"],
                       input=struct.pack("!BQ", 0, len(page)) + page, capture_output=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    status, n = struct.unpack("!BQ", r.stdout[:9])
    assert status == 0 and marshal.loads(r.stdout[9:9 + n]) == ([{"metadata": {"name": "a"}}],
                                                                 "t")
    # a pod page, which the frozen child decodes with msgspec (api/typedpods.py): the bundle
    # carries it, the child has loaded it once it answers, and the answer is the stdlib path's
    from kubectl_gpudoctor.api import pageparse, shape
    from tests.kubectl.fakecluster import FakeCluster, build_fleet
    fc = FakeCluster()
    build_fleet(fc, 2, 6, wedged=(1,), fat=True)
    page = json.dumps({"metadata": {"continue": "t"}, "items": list(fc.pods.values())}).encode()
    kind = pageparse.KIND_PODS | shape.schema_id("/api/v1/pods") << pageparse.KIND_BITS
    child = subprocess.Popen([binary, "__run_module", "kubectl_gpudoctor.api.pageparse"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        child.stdin.write(struct.pack("!BQ", kind, len(page)) + page)
        child.stdin.flush()
        status, n = struct.unpack("!BQ", child.stdout.read(9))
        answer = child.stdout.read(n)
        loaded = Path(f"/proc/{child.pid}/maps").read_text()
    finally:
        child.stdin.close()
        child.wait(60)
    assert status == 0 and "msgspec/_core" in loaded
    assert marshal.loads(answer) == pageparse.parse_page(page, pageparse._each(kind)[0])
    bad = subprocess.run([binary, "__run_module", "kubectl_gpudoctor.cli"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode != 0 and "refusing to run module" in bad.stderr


ARM64 = REPO / "dist" / f"kubectl-gpu_doctor-{__version__}-linux-arm64.tar.gz"


@pytest.mark.arm64
@pytest.mark.skipif(not ARM64.exists(), reason="no linux/arm64 archive in dist/: it is a release step "
                    "(sudo scripts/build-plugin-arm64.sh builds it under qemu: 6-14 min once for the arm64 builder, 4-11 min per build), not CI")
def test_linux_arm64_archive(tmp_path: Path):
    """The archive scripts/build-plugin-arm64.sh made: same layout, an aarch64 executable, and
    (where binfmt_misc runs aarch64 binaries through qemu) kubectl dispatches `version` to it."""
    unpacked = tmp_path / "archive"
    unpacked.mkdir()
    subprocess.run(["tar", "-xzf", str(ARM64), "-C", str(unpacked)], check=True, timeout=120)
    assert sorted(os.listdir(unpacked)) == ["LICENSE", "_internal", "kubectl-gpu_doctor"]
    header = (unpacked / "kubectl-gpu_doctor").read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == 183  # EM_AARCH64
    meta = json.loads((unpacked / "_internal/kheaders/metadata.json").read_text())
    assert (meta["arch"], meta["machine"]) == ("arm64", "aarch64")   # arm64's headers, not ours
    if not Path("/proc/sys/fs/binfmt_misc/qemu-aarch64").exists():
        pytest.skip("cannot run aarch64 binaries here (no qemu-aarch64 binfmt handler)")
    cache = Path(os.environ.get("GPU_DOCTOR_CACHE", "/var/cache/gpu-doctor"))
    sysroots = sorted(p.parent.parent for p in cache.glob("arm64-builder-*/lib/ld-linux-aarch64.so.1"))
    if not sysroots:
        pytest.skip("no arm64 glibc to run it with (scripts/build-plugin-arm64.sh leaves one in the cache)")
    plugin = yaml.safe_load((REPO / "krew-manifest.yaml").read_text())
    [platform] = [p for p in plugin["spec"]["platforms"]
                  if p["selector"]["matchLabels"] == {"os": "linux", "arch": "arm64"}]
    root = tmp_path / "krew"
    binary = krew_rules.install_platform(unpacked, platform, root / "store" / "gpu-doctor" / "v")
    (root / "bin").mkdir()
    (root / "bin" / "kubectl-gpu_doctor").symlink_to(binary)
    # the frozen binary uses the target's glibc; qemu finds the arm64 one under QEMU_LD_PREFIX
    r = kubectl(root, "gpu-doctor", "version", timeout_s=300, env={"QEMU_LD_PREFIX": str(sysroots[-1])})
    assert r.returncode == 0, r.stderr
    assert f"kubectl gpu-doctor {__version__}" in r.stdout


def _local_verdict(exe: str, root: Path, env: dict | None = None) -> dict:
    args = ["local", "--host-root", str(root), "--kmsg-file", str(root / "kmsg"), "--skip", "trace",
            "--timeout", "120", "-o", "json"]
    r = subprocess.run([exe, *args], capture_output=True, text=True, timeout=300,
                       env={**os.environ, **(env or {})}, cwd=root)
    assert r.returncode == 1, r.stderr[-2000:]         # 1: findings at/above --fail-on
    doc = json.loads(r.stdout)
    assert doc["summary"]["complete"] is True
    # memory.pressure and hami.* judge this machine's memory and processes at that moment
    return {"checks": sorted((c["id"], c["status"]) for c in doc["checks"]),
            "findings": sorted((f["id"], f["severity"], f["subject"]) for f in doc["findings"]
                               if f["id"] != "memory.pressure" and not f["id"].startswith("hami."))}


@pytest.mark.arm64
@pytest.mark.skipif(not ARM64.exists(), reason="no linux/arm64 archive in dist/ (sudo "
                    "scripts/build-plugin-arm64.sh), not CI")
def test_linux_arm64_archive_runs_local_like_amd64(unpacked_plugin: Path, tmp_path: Path):
    """`local` from the frozen arm64 plugin, under qemu-user against a Grace-like host root
    (aarch64 stand-in NVML: the NVML child is the arm64 executable re-entered), reaches the
    amd64 archive's verdict on the same node built for x86_64 (test_arm64_smoke.py's roots)."""
    from tests.packaging.test_arm64_smoke import CC, grace_like_root
    if not Path("/proc/sys/fs/binfmt_misc/qemu-aarch64").exists() or not shutil.which(CC["aarch64"]):
        pytest.skip("needs the qemu-aarch64 binfmt handler and gcc-aarch64-linux-gnu")
    cache = Path(os.environ.get("GPU_DOCTOR_CACHE", "/var/cache/gpu-doctor"))
    sysroots = sorted(p.parent.parent for p in cache.glob("arm64-builder-*/lib/ld-linux-aarch64.so.1"))
    if not sysroots:
        pytest.skip("no arm64 glibc to run it with (scripts/build-plugin-arm64.sh leaves one in the cache)")
    arm = tmp_path / "arm"
    arm.mkdir()
    subprocess.run(["tar", "-xzf", str(ARM64), "-C", str(arm)], check=True, timeout=120)
    got = _local_verdict(str(arm / "kubectl-gpu_doctor"), grace_like_root(tmp_path / "arm-root", "aarch64"),
                         {"QEMU_LD_PREFIX": str(sysroots[-1])})
    want = _local_verdict(str(unpacked_plugin / "kubectl-gpu_doctor"),
                          grace_like_root(tmp_path / "amd-root", "x86_64"))
    assert got == want
    assert ("driver.known_bad", "critical") in {f[:2] for f in got["findings"]}
    assert ("nvml", "ok") in got["checks"]


def test_frozen_plugin_prints_its_manifests(unpacked_plugin: Path):
    """A krew user has no deploy/: `kubectl gpu-doctor rbac` prints them from the bundle."""
    r = subprocess.run([str(unpacked_plugin / "kubectl-gpu_doctor"), "rbac", "all",
                        "nodes-proxy", "agent"],
                       capture_output=True, text=True, timeout=60, cwd="/")
    assert r.returncode == 0, r.stderr
    for name in ("rbac.yaml", "rbac-nodes-proxy.yaml", "agent-rbac.yaml",
                 "admission-policy.yaml"):
        assert (REPO / "deploy" / name).read_text().strip() in r.stdout


def test_frozen_plugin_serves_mcp(krew_root: Path, tmp_path: Path):
    """`mcp` from the installed krew archive, the SDK frozen in, driven by the SDK's own stdio
    client from a directory with no checkout: it lists its six tools, `node` answers what the
    frozen `node -o json` prints for the same (fake) cluster -- so its per-call run re-enters
    the frozen executable -- and `explain` reads the bundled pages."""
    pytest.importorskip("mcp")
    import time
    from tests.kubectl.fakecluster import FakeCluster
    from tests.kubectl.mcpclient import assert_same_document, calls, text
    exe = str(krew_root / "bin" / "kubectl-gpu_doctor")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    fc = FakeCluster().start()
    try:
        fc.add_node("gpu-1")
        fc.add_pod("ml", "train-0", "gpu-1", gpus=1)
        kc = f"--kubeconfig={fc.kubeconfig(tmp_path / 'kubeconfig')}"
        t0 = time.monotonic()
        r = subprocess.run([exe, "node", "gpu-1", "--no-probe", "-o", "json", kc],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
        assert r.returncode == 0, r.stderr
        listed, got, err = calls([exe, "mcp", kc], [("node", {"name": "gpu-1"}),
                                                     ("explain", {"id": "node.not_ready"})],
                                 env=env, cwd=tmp_path)
        assert sorted(t.name for t in listed.tools) == ["explain", "history", "job", "node",
                                                        "nodes", "pod", "replay"]
        assert not got[0].is_error, text(got[0]) + err
        assert_same_document(got[0].structured_content, json.loads(r.stdout),
                             time.monotonic() - t0)
        assert not got[1].is_error and got[1].structured_content["id"] == "node.not_ready"
    finally:
        fc.stop()

"""The probe image, built offline by scripts/build-image.sh and run for real with podman the way
the debug pod runs it: privileged, host PID and network, host / at /host, /lib/modules and
/usr/src read-only. The probe inside must print a complete NDJSON stream ending in a summary,
and its BCC programs must compile and attach (no probe.ebpf_unavailable)."""
from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from node_probe import __version__
from tests.deviceplugin.conftest import GPU_A, host, podres, start_plugin  # noqa: F401 - fixtures
from tests.fakes.nvml import build_fake_nvml
from tests.packaging.conftest import REPO

pytestmark = [pytest.mark.image, pytest.mark.slow, pytest.mark.root, pytest.mark.bcc]

IMAGE = f"localhost/gpu-doctor-probe:{__version__}"
# podman on this host: runc (crun 1.8 refuses the hybrid cgroup layout) and explicit ulimits
# (the defaults fail with EPERM) -- DESIGN.md section 10.
RUN = ["podman", "run", "--rm", "--runtime", "runc", "--privileged", "--pid=host", "--net=host",
       "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=32768:32768",
       "-v", "/:/host:ro", "-v", "/lib/modules:/lib/modules:ro", "-v", "/usr/src:/usr/src:ro",
       "-v", "/sys/kernel/debug:/sys/kernel/debug"]


def podman_run(*args: str, entrypoint: str | None = None, timeout_s: float = 120) -> subprocess.CompletedProcess:
    name = f"gpu-doctor-test-{secrets.token_hex(4)}"
    argv = RUN + ["--name", name] + (["--entrypoint", entrypoint] if entrypoint else []) + [IMAGE, *args]
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    finally:
        subprocess.run(["podman", "rm", "-f", "--time", "0", name], capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def image(probe_image_archive: Path) -> Path:
    if not Path("/sys/kernel/debug/tracing").exists() and not Path("/sys/kernel/tracing/events").exists():
        pytest.skip("no tracefs on the host (scripts/setup.sh mounts it)")
    return probe_image_archive


def test_archive_is_an_oci_image_with_the_probe_entrypoint(image: Path):
    r = subprocess.run(["skopeo", "inspect", "--config", f"oci-archive:{image}"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    config = json.loads(r.stdout)["config"]
    assert config["Entrypoint"] == ["python3", "-m", "node_probe"]
    assert "PYTHONPATH=/opt/gpu-doctor" in config["Env"]
    assert config["Labels"]["org.opencontainers.image.version"] == __version__
    assert image.name == f"gpu-doctor-probe-{__version__}-{_arch()}.oci.tar"


def test_archive_alone_runs_offline_from_an_empty_image_store(image: Path, tmp_path: Path):
    """Air-gapped: the OCI archive is all a node needs. Loaded into an empty store it carries the
    name the plugin pulls by default, and runs with no network and no pull."""
    from kubectl_gpudoctor.reach.podspec import DEFAULT_IMAGE

    runroot = Path(tempfile.mkdtemp(prefix="gd-run-"))  # podman wants a runroot under 50 chars
    store = ["podman", "--root", str(tmp_path / "root"), "--runroot", str(runroot)]
    try:
        r = subprocess.run(store + ["load", "-q", "-i", str(image)], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert DEFAULT_IMAGE in r.stdout
        r = subprocess.run(store + ["run", "--rm", "--runtime", "runc", "--network", "none", "--pull", "never",
                                    "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=32768:32768",
                                    DEFAULT_IMAGE, "--version"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == ["gpu-doctor-probe", __version__]
    finally:
        subprocess.run(store + ["rmi", "-a", "-f"], capture_output=True, timeout=120)
        shutil.rmtree(runroot, ignore_errors=True)


def test_image_holds_the_probe_and_bpf_sources_and_nothing_else(image: Path):
    r = podman_run("-c", "import json, os; print(json.dumps(sorted(os.listdir('/opt/gpu-doctor')))); "
                   "print(json.dumps(sorted(os.path.relpath(os.path.join(d, f), '/opt/gpu-doctor/bpf') "
                   "for d, _, fs in os.walk('/opt/gpu-doctor/bpf') for f in fs)))", entrypoint="python3")
    assert r.returncode == 0, r.stderr
    top, bpf = (json.loads(line) for line in r.stdout.splitlines())
    assert top == ["bpf", "kheaders", "node_probe"]
    # every program and the shared headers under bpf/include, nothing else
    assert bpf == sorted(str(p.relative_to(REPO / "bpf")) for p in (REPO / "bpf").rglob("*") if p.is_file())
    assert any(name.startswith("include/") for name in bpf)


def test_bcc_compiles_and_attaches_inside_the_image(image: Path):
    """BCC itself, independent of the probe's programs: kernel headers from the host's
    /lib/modules + /usr/src, a tracepoint through the host's tracefs."""
    code = ("from bcc import BPF\n"
            "b = BPF(text='TRACEPOINT_PROBE(syscalls, sys_enter_getpid) { return 0; }')\n"
            "print('tracepoints', b.num_open_tracepoints())\n"
            "import grpc, google.protobuf, pynvml\n"
            "print('grpc', grpc.__version__, 'protobuf', google.protobuf.__version__)\n")
    r = podman_run("-c", code, entrypoint="python3")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "tracepoints 1" in r.stdout


def test_probe_in_the_image_streams_a_complete_run_with_ebpf(image: Path):
    r = podman_run("--host-root", "/host", "-o", "jsonl", "--trace-seconds", "2", "--timeout", "60")
    assert r.returncode in (0, 1), r.stderr[-2000:]  # 1 = findings at/above --fail-on
    lines = [line for line in r.stdout.splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every stdout line is a record
    assert all(rec["schema"] == "gpu-doctor/v1" for rec in records)
    summary = records[-1]
    assert summary["kind"] == "summary" and summary["complete"] is True
    assert [rec for rec in records if rec["kind"] == "summary"] == [summary]
    checks = {c["id"]: c["status"] for c in summary["checks"]}
    assert checks.get("trace") == "ok", summary["checks"]
    findings = [rec for rec in records if rec["kind"] == "finding"]
    assert "probe.ebpf_unavailable" not in {f["id"] for f in findings}, \
        [f for f in findings if f["id"] == "probe.ebpf_unavailable"]
    attached = [rec for rec in records if rec["kind"] == "progress" and rec.get("phase") == "trace"]
    assert attached and attached[0]["probes"], "the trace check reported no compiled BCC programs"
    assert all(c in checks for c in ("nvml", "driver", "kmsg", "trace"))


def test_image_compiles_ebpf_with_its_bundled_headers_when_the_node_has_none(image: Path):
    """A node without kernel headers (COS, Bottlerocket, Talos): no /lib/modules or /usr/src
    mounted, no --host-root with headers. The image's own set (/opt/gpu-doctor/kheaders)
    compiles the programs and the report says so."""
    name = f"gpu-doctor-test-{secrets.token_hex(4)}"
    argv = ["podman", "run", "--rm", "--runtime", "runc", "--privileged", "--pid=host",
            "--net=host", "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=32768:32768",
            "-v", "/sys/kernel/debug:/sys/kernel/debug"]   # RUN without / , /lib/modules, /usr/src
    try:
        r = subprocess.run(argv + ["--name", name, IMAGE, "-o", "jsonl", "--only", "trace",
                                   "--trace-seconds", "1", "--timeout", "60"],
                           capture_output=True, text=True, timeout=120)
    finally:
        subprocess.run(["podman", "rm", "-f", "--time", "0", name], capture_output=True, timeout=60)
    records = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    assert records and records[-1]["kind"] == "summary", r.stderr[-2000:]
    assert {c["id"]: c["status"] for c in records[-1]["checks"]} == {"trace": "ok"}, records[-1]
    (attached,) = [x for x in records if x.get("phase") == "trace"]
    hdr = attached["kernel_headers"]
    assert hdr["source"] == "bundled" and hdr["path"] == "/opt/gpu-doctor/kheaders", hdr
    assert hdr["kernel_version"].startswith("6.1.") and attached["probes"]


def _arch() -> str:
    out = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else os.uname().machine


def test_image_diagnoses_seed_000_with_all_bcc_programs(image: Path, host, start_plugin, podres, tmp_path: Path):
    """Seed 000 on this host, diagnosed by the image: a real gRPC device plugin whose
    GetPreferredAllocation calls nvmlInit_v2 of a libnvidia-ml.so.1 that blocks on a futex
    (driver 570.158.01, MIG beside a full GPU). The probe in the container must compile and
    attach every BCC program (uprobes on the plugin's NVML included) and name the stuck thread."""
    host.driver_version("570.158.01")
    lib = build_fake_nvml(tmp_path / "plugin-lib", init="block")
    plugin = start_plugin("nvidia-gpu.sock", mode="nvml-block", nvml_lib=lib,
                          devices=(GPU_A, "MIG-e76cc178-e1f3-5596-a9e1-84fa6bffa030"))
    podres([])
    r = podman_run("--host-root", f"/host{host.root}", "--only", "deviceplugin", "--only", "trace",
                   "--timeout", "25", "-o", "jsonl")
    records = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    assert records and records[-1]["kind"] == "summary" and records[-1]["complete"], r.stderr[-2000:]
    (attached,) = [rec for rec in records if rec["kind"] == "progress" and rec.get("phase") == "trace"]
    assert set(attached["probes"]) >= {"nvidia_dev", "cgroup_devices", "futex_wait", "nvml_calls"}
    assert attached["target_pids"] == [plugin.pid]
    findings = {rec["id"]: rec for rec in records if rec["kind"] == "finding"}
    assert "probe.ebpf_unavailable" not in findings
    blocked = findings["deviceplugin.blocked_in_nvml"]
    assert blocked["severity"] == "critical" and blocked["evidence"]["pid"] == plugin.pid
    (thread,) = blocked["evidence"]["threads"]
    assert "ebpf uprobe" in thread["sources"] and thread["func"] == "nvmlInit_v2"
    assert "Allocate" not in plugin.calls()  # read-only RPCs only


def test_the_plugins_debug_pod_manifest_runs_the_image(image: Path, tmp_path: Path):
    """The Pod kubectl_gpudoctor creates (command, host mounts, privileged, memory limit), run by
    `podman kube play` with the built image: the probe must complete within the pod's limits.
    (podman 4.3's kube play keeps its own PID namespace despite hostPID; the podman run test
    above covers --pid=host.)"""
    import yaml

    from kubectl_gpudoctor.reach import debugpod
    from kubectl_gpudoctor.reach import podspec

    if shutil.which("catatonit") is None:
        pytest.skip("podman kube play needs catatonit (scripts/build-image.sh installs it)")
    pod = debugpod.manifest(os.uname().nodename, "gpu-doctor", secrets.token_hex(4), image=IMAGE,
                            timeout_s=60, trace_s=2)
    spec_file = tmp_path / "pod.yaml"
    spec_file.write_text(yaml.safe_dump(pod))
    conf = tmp_path / "containers.conf"
    conf.write_text('[containers]\ndefault_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]\n'
                    '[engine]\nruntime = "runc"\n')
    env = {**os.environ, "CONTAINERS_CONF": str(conf)}
    container = f"{pod['metadata']['name']}-{podspec.CONTAINER}"
    try:
        r = subprocess.run(["podman", "kube", "play", str(spec_file)], capture_output=True,
                           text=True, env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            state = subprocess.run(["podman", "inspect", "--format", "{{.State.Status}}", container],
                                   capture_output=True, text=True, timeout=30).stdout.strip()
            if state in ("exited", "stopped"):
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"the debug pod's probe did not finish in 90 s (state {state!r})")
        limit = subprocess.run(["podman", "inspect", "--format", "{{.HostConfig.Memory}}", container],
                               capture_output=True, text=True, timeout=30).stdout.strip()
        assert int(limit) == 384 * 2**20  # the pod's memory limit was applied
        logs = subprocess.run(["podman", "logs", container], capture_output=True, text=True, timeout=60)
        records = [json.loads(line) for line in logs.stdout.splitlines() if line.startswith("{")]
        assert records and records[-1]["kind"] == "summary" and records[-1]["complete"] is True, \
            logs.stdout[-2000:] + logs.stderr[-2000:]
        assert "probe.ebpf_unavailable" not in {rec.get("id") for rec in records}
        code = subprocess.run(["podman", "inspect", "--format", "{{.State.ExitCode}}", container],
                              capture_output=True, text=True, timeout=30).stdout.strip()
        assert code in ("0", "1")  # not OOM-killed (137), not crashed
    finally:
        subprocess.run(["podman", "kube", "down", str(spec_file)], capture_output=True, env=env, timeout=120)


ARM64_IMAGE = REPO / "dist" / f"gpu-doctor-probe-{__version__}-arm64.oci.tar"


@pytest.mark.arm64
@pytest.mark.skipif(not ARM64_IMAGE.exists(), reason="no arm64 image archive in dist/: it is a release "
                    "step (sudo GPU_DOCTOR_ARCH=arm64 scripts/build-image.sh, under qemu), not CI")
def test_arm64_image_archive(tmp_path: Path):
    """The arm64 archive: an arm64 image named like the amd64 one; where qemu-aarch64 is
    registered, it runs (emulated) and its Python has grpc, protobuf, pynvml and bcc. BCC
    programs are not compiled under emulation: that needs a real arm64 kernel."""
    from kubectl_gpudoctor.reach.podspec import DEFAULT_IMAGE

    r = subprocess.run(["skopeo", "inspect", "--config", f"oci-archive:{ARM64_IMAGE}"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    config = json.loads(r.stdout)
    assert config["architecture"] == "arm64" and config["os"] == "linux"
    assert config["config"]["Entrypoint"] == ["python3", "-m", "node_probe"]
    if not Path("/proc/sys/fs/binfmt_misc/qemu-aarch64").exists():
        pytest.skip("cannot run arm64 containers here (no qemu-aarch64 binfmt handler)")
    runroot = Path(tempfile.mkdtemp(prefix="gd-run-"))
    store = ["podman", "--root", str(tmp_path / "root"), "--runroot", str(runroot)]
    run = store + ["run", "--rm", "--arch", "arm64", "--runtime", "runc", "--network", "none",
                   "--pull", "never", "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=32768:32768"]
    try:
        r = subprocess.run(store + ["load", "-q", "-i", str(ARM64_IMAGE)], capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0 and DEFAULT_IMAGE in r.stdout, r.stderr
        r = subprocess.run(run + ["--entrypoint", "python3", DEFAULT_IMAGE, "-c",
                                  "import platform, grpc, google.protobuf, pynvml, bcc; print(platform.machine())"],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stdout.strip() == "aarch64"
        r = subprocess.run(run + [DEFAULT_IMAGE, "--list-checks"], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and "trace" in r.stdout, r.stderr[-2000:]
    finally:
        subprocess.run(store + ["rmi", "-a", "-f"], capture_output=True, timeout=120)
        shutil.rmtree(runroot, ignore_errors=True)

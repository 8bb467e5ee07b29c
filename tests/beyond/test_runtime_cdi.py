"""Runtime handler and CDI wiring on the node: real config files under a temp host root, parsed
with the probe's readers, judged by a real probe run."""
from __future__ import annotations

from pathlib import Path

from node_probe.host import runtime_config
from tests.beyond.conftest import healthy_gpus, make_host
from tests.probe_run import run_probe

CONTAINERD_V2_NVIDIA = """version = 2
[plugins."io.containerd.grpc.v1.cri"]
  enable_cdi = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
        BinaryName = "/usr/local/nvidia/toolkit/nvidia-container-runtime"
"""
CONTAINERD_V3_PLAIN = """version = 3
imports = ["/etc/containerd/conf.d/*.toml"]
[plugins."io.containerd.cri.v1.runtime".containerd]
  default_runtime_name = "runc"
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
"""
DROPIN_NVIDIA = """version = 3
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia.options]
    BinaryName = "/usr/bin/nvidia-container-runtime"
"""


def cdi_yaml(version: str) -> str:
    lib = "/usr/lib/x86_64-linux-gnu"
    return f"""---
cdiVersion: 0.5.0
containerEdits:
  deviceNodes:
  - path: /dev/nvidiactl
  hooks:
  - args:
    - nvidia-cdi-hook
    - create-symlinks
    - --link
    - libcuda.so.1::{lib}/libcuda.so
    hookName: createContainer
    path: /usr/bin/nvidia-cdi-hook
  mounts:
  - containerPath: {lib}/libcuda.so.{version}
    hostPath: {lib}/libcuda.so.{version}
    options: [ro, nosuid, nodev, bind]
  - containerPath: {lib}/libnvidia-ml.so.{version}
    hostPath: {lib}/libnvidia-ml.so.{version}
    options: [ro, nosuid, nodev, bind]
  - containerPath: /lib/firmware/nvidia/{version}/gsp_ga10x.bin
    hostPath: /lib/firmware/nvidia/{version}/gsp_ga10x.bin
    options: [ro, nosuid, nodev, bind]
  - containerPath: {lib}/libnvidia-egl-wayland.so.1.1.13
    hostPath: {lib}/libnvidia-egl-wayland.so.1.1.13
    options: [ro, nosuid, nodev, bind]
devices:
- containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
  name: "0"
kind: nvidia.com/gpu
"""


def write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def install_driver_files(root: Path, version: str) -> None:
    lib = "usr/lib/x86_64-linux-gnu"
    for f in (f"{lib}/libcuda.so.{version}", f"{lib}/libnvidia-egl-wayland.so.1.1.13",
              f"lib/firmware/nvidia/{version}/gsp_ga10x.bin"):
        write(root, f, "")
    # libnvidia-ml.so.<version> is the stand-in library itself under its real name
    (root / lib / f"libnvidia-ml.so.{version}").symlink_to("libnvidia-ml.so.1")


def probe(root, kfile):
    return run_probe("--host-root", str(root), "--kmsg-file", str(kfile), "--trace-seconds", "0",
                     "--only", "nvml", "--only", "runtime_cdi")


def test_healthy_containerd_and_cdi_are_quiet(tmp_path):
    root, kfile = make_host(tmp_path, healthy_gpus(1), driver_version="570.172.08")
    write(root, "etc/containerd/config.toml", CONTAINERD_V2_NVIDIA)
    write(root, "var/run/cdi/nvidia.yaml", cdi_yaml("570.172.08"))
    install_driver_files(root, "570.172.08")
    run = probe(root, kfile)
    assert not [f for f in run.findings() if f["severity"] in ("warning", "critical")], \
        run.findings()
    assert not run.findings("runtime.handler_missing")
    assert not run.findings("cdi.spec_version_mismatch")
    assert run.returncode == 0


def test_handler_found_through_containerd_imports(tmp_path):
    root, _ = make_host(tmp_path, healthy_gpus(1))
    write(root, "etc/containerd/config.toml", CONTAINERD_V3_PLAIN)
    write(root, "etc/containerd/conf.d/99-nvidia.toml", DROPIN_NVIDIA)
    cfg = runtime_config.containerd(root)
    assert cfg.nvidia_handlers == ["nvidia"]
    assert cfg.files == ("/etc/containerd/config.toml", "/etc/containerd/conf.d/99-nvidia.toml")


def test_containerd_without_nvidia_handler_and_no_cdi_warns(tmp_path):
    root, kfile = make_host(tmp_path, healthy_gpus(1))
    write(root, "etc/containerd/config.toml", CONTAINERD_V3_PLAIN)  # drop-in dir is empty
    run = probe(root, kfile)
    f = run.findings("runtime.handler_missing")
    assert f and f[0]["severity"] == "warning", run.findings()
    ev = f[0]["evidence"]
    assert ev["runtime"] == "containerd" and ev["handlers"] == {"runc": ""}
    assert 'no runtime for "nvidia" is configured' in f[0]["title"]


def test_crio_dropins_override_and_missing_handler(tmp_path):
    root, kfile = make_host(tmp_path, healthy_gpus(1))
    write(root, "etc/crio/crio.conf", '[crio.runtime]\ndefault_runtime = "nvidia"\n'
          '[crio.runtime.runtimes.nvidia]\nruntime_path = "/usr/bin/nvidia-container-runtime"\n')
    write(root, "etc/crio/crio.conf.d/10-crun.conf", '[crio.runtime]\ndefault_runtime = "crun"\n')
    cfg = runtime_config.crio(root)
    assert cfg.default_handler == "crun" and cfg.nvidia_handlers == ["nvidia"]
    write(root, "etc/crio/crio.conf", '[crio.runtime.runtimes.crun]\nruntime_path = "/usr/bin/crun"\n')
    write(root, "var/run/cdi/nvidia.yaml", cdi_yaml("570.172.08"))
    run = probe(root, kfile)
    f = run.findings("runtime.handler_missing")
    # CDI specs exist and CRI-O resolves CDI: only runtimeClassName: nvidia pods are affected
    assert f and f[0]["severity"] == "info" and f[0]["evidence"]["runtime"] == "cri-o"


def test_cdi_spec_of_the_previous_driver(tmp_path):
    root, kfile = make_host(tmp_path, healthy_gpus(1), driver_version="570.172.08")
    write(root, "etc/containerd/config.toml", CONTAINERD_V2_NVIDIA)
    install_driver_files(root, "570.172.08")
    write(root, "etc/cdi/nvidia.yaml", cdi_yaml("570.158.01"))
    run = probe(root, kfile)
    f = run.findings("cdi.spec_version_mismatch")
    assert f and f[0]["severity"] == "critical", run.findings()
    ev = f[0]["evidence"]
    assert ev["spec_driver_versions"] == ["570.158.01"]
    assert ev["loaded_driver_version"] == "570.172.08"
    assert ev["missing_count"] == 3  # libcuda, libnvidia-ml, firmware of 570.158.01
    assert f[0]["subject"] == "/etc/cdi/nvidia.yaml"


def test_cdi_json_spec_parsed():
    spec = runtime_config.parse_cdi("/etc/cdi/x.json", '{"cdiVersion": "0.6.0", "kind": '
                                    '"management.nvidia.com/gpu", "containerEdits": {"mounts": '
                                    '[{"hostPath": "/usr/lib64/libcuda.so.550.54.15"}]}}')
    assert spec.is_nvidia and spec.driver_versions == ("550.54.15",)


def test_not_a_gpu_node_is_quiet(tmp_path):
    root = tmp_path / "h"
    write(root, "etc/containerd/config.toml", CONTAINERD_V3_PLAIN)
    kfile = tmp_path / "k"
    kfile.write_text("")
    run = probe(root, kfile)
    assert not run.findings("runtime.handler_missing")
    check = next(c for c in run.summary["checks"] if c["id"] == "runtime_cdi")
    assert check["status"] == "skipped" and "no NVIDIA driver" in check["reason"], check

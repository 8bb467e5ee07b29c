"""The layout matrix: every distribution's node, healthy and with a fault, through the full probe.

Each layout is a fake host root built from the distribution's documented paths (SOURCES below,
one line per fact used) with real processes for its daemons: a "kubelet" (or kubelite / k3s
agent) serving the kubelet's registration socket with its real flags, the container runtime
serving its CRI socket with its flags and config file, and a real gRPC device plugin (its
environment as the distribution's chart/service sets it). The driver is the C stand-in
libnvidia-ml.so.1 at the distribution's library path. `python -m node_probe --host-root ROOT`
runs every check (no --kubelet-dir: the resolvers must find it); the test asserts what the
`layout` check found, that the healthy variant has no critical finding (and no warning but the
host's own memory pressure), and that the injected fault is found.
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

from tests.beyond.conftest import healthy_gpus
from tests.fakes.nvml import build_fake_nvml
from tests.layouts.conftest import write
from tests.probe_run import REPO, run_probe

FAKE_PLUGIN = REPO / "tests" / "fakes" / "fake_device_plugin.py"
DRIVER = "570.172.08"

SOURCES = {
    "kubeadm-ubuntu": [
        "https://kubernetes.io/docs/setup/production-environment/container-runtimes/#containerd"
        " (/run/containerd/containerd.sock, /etc/containerd/config.toml)",
        "https://kubernetes.io/docs/reference/command-line-tools-reference/kubelet/"
        " (--root-dir default /var/lib/kubelet)",
        "https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html"
        " (nvidia-ctk runtime configure --set-as-default; driver libs in /usr/lib/x86_64-linux-gnu)"],
    "gpu-operator": [
        "https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/getting-started.html"
        " (driver container root /run/nvidia/driver, toolkit configures containerd)",
        "https://github.com/NVIDIA/k8s-device-plugin/issues/1427 (NVIDIA_DRIVER_ROOT=/run/nvidia/"
        "driver mounted at /driver-root in the plugin)"],
    "gke-cos": [
        "https://raw.githubusercontent.com/GoogleCloudPlatform/container-engine-accelerators/"
        "stable/nvidia-driver-installer/cos/daemonset-preloaded.yaml (/home/kubernetes/bin/nvidia)",
        "https://pkg.go.dev/github.com/GoogleCloudPlatform/container-engine-accelerators/cmd/"
        "nvidia_gpu (GKE's plugin mounts the driver dir itself; no NVIDIA runtime)"],
    "eks-al2023": [
        "https://github.com/awslabs/amazon-eks-ami (AL2023 accelerated: containerd "
        "/etc/containerd/config.toml with the nvidia runtime as default, driver in /usr/lib64)"],
    "bottlerocket": [
        "https://github.com/bottlerocket-os/bottlerocket/pull/4418 (nvidia-k8s-device-plugin "
        "host service with /etc/nvidia-k8s-device-plugin/settings.yaml)",
        "bottlerocket-os/bottlerocket-kernel-kit kmod-6.1-nvidia.spec (libraries in "
        "%{_cross_libdir}/nvidia/tesla/<version>)"],
    "aks-ubuntu": [
        "https://learn.microsoft.com/en-us/azure/aks/gpu-cluster (driver on the node, "
        "containerd with nvidia-container-runtime as default, /var/lib/kubelet)"],
    "openshift-crio": [
        "https://docs.openshift.com/container-platform/latest/hardware_enablement/"
        "nvidia-gpu-architecture-overview.html (CRI-O /var/run/crio/crio.sock, "
        "/etc/crio/crio.conf.d drop-ins, GPU Operator /run/nvidia/driver)"],
    "k3s": [
        "https://docs.k3s.io/advanced#nvidia-container-runtime-support (k3s adds an nvidia "
        "runtime to /var/lib/rancher/k3s/agent/etc/containerd/config.toml; containerd at "
        "/run/k3s/containerd/containerd.sock)"],
    "rke2": [
        "https://docs.rke2.io/advanced#deploy-nvidia-operator (containerd config "
        "/var/lib/rancher/rke2/agent/etc/containerd/config.toml, socket "
        "/run/k3s/containerd/containerd.sock, GPU Operator driver /run/nvidia/driver)"],
    "microk8s": [
        "https://microk8s.io/docs/configuring-services (kubelite; ${SNAP_COMMON}/var/lib/kubelet"
        ", ${SNAP_COMMON}/run/containerd.sock, ${SNAP}/args/containerd.toml)"],
    "k0s": [
        "https://docs.k0sproject.io/head/directories/ (kubelet root <data-dir>/kubelet = "
        "/var/lib/k0s/kubelet)",
        "https://raw.githubusercontent.com/k0sproject/k0s/main/docs/runtime.md (containerd "
        "--root=/var/lib/k0s/containerd --state=/run/k0s/containerd "
        "--address=/run/k0s/containerd.sock --config=/etc/k0s/containerd.toml)"],
    "talos": [
        "https://github.com/siderolabs/extensions/issues/940 (/usr/local/glibc/usr/lib/"
        "libnvidia-ml.so.1)",
        "https://github.com/siderolabs/extensions/pull/476 (the NVIDIA extension's glibc "
        "subroot; GPU Operator toolkit; CDI mode)"],
    # Grace (arm64) nodes: the same kubelet/containerd layout as x86, the driver's libraries in
    # Debian/Ubuntu's aarch64 multiarch dir, and only the open kernel modules
    "gh200-ubuntu": [
        "https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/platform-support.html"
        " (arm64 platforms: GH200 and GB200 on Ubuntu 22.04/24.04)",
        "https://github.com/NVIDIA/nvidia-container-toolkit/blob/main/pkg/lookup/library.go "
        "(the toolkit's library search paths: /usr/lib/aarch64-linux-gnu beside "
        "/usr/lib/x86_64-linux-gnu and /usr/lib64)",
        "https://developer.nvidia.com/blog/nvidia-transitions-fully-towards-open-source-gpu-kernel-"
        "modules/ (Grace Hopper and Blackwell: the open GPU kernel modules only)",
        "https://github.com/NVIDIA/open-gpu-kernel-modules/blob/595.45.04/utils.mk "
        "(GENERATE_NVIDSTRING: 'NVIDIA UNIX Open Kernel Module for $(TARGET_ARCH)  <version>', "
        "printed after 'NVRM version: ' by kernel-open/nvidia/nv-procfs.c)"],
    "gb200-gpu-operator": [
        "https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/platform-support.html"
        " (GB200 NVL on arm64 with the driver container: /run/nvidia/driver)",
        "https://github.com/NVIDIA/nvidia-container-toolkit/blob/main/pkg/lookup/library.go "
        "(/usr/lib/aarch64-linux-gnu under the driver root)",
        "https://docs.nvidia.com/multi-node-nvlink-systems/imex-guide/imexchannels.html "
        "(/dev/nvidia-caps-imex-channels/channelN, major from /proc/devices)",
        "https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/index.html "
        "(a GPU is usable once its NVLink fabric registration is completed: "
        "nvmlDeviceGetGpuFabricInfo)"],
}


def containerd_toml(default: str = "nvidia", nvidia: bool = True, cdi: bool = False,
                    extra_top: str = "") -> str:
    out = [f"version = 2\n{extra_top}",
           '[plugins."io.containerd.grpc.v1.cri"]',
           f"  enable_cdi = {'true' if cdi else 'false'}",
           '[plugins."io.containerd.grpc.v1.cri".containerd]',
           f'  default_runtime_name = "{default}"',
           '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]',
           '  runtime_type = "io.containerd.runc.v2"']
    if nvidia:
        out += ['[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]',
                '  runtime_type = "io.containerd.runc.v2"',
                '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]',
                '  BinaryName = "/usr/bin/nvidia-container-runtime"']
    return "\n".join(out) + "\n"


def cdi_spec(version: str, lib: str) -> str:
    return (f"---\ncdiVersion: 0.5.0\nkind: nvidia.com/gpu\ncontainerEdits:\n  mounts:\n"
            f"  - containerPath: /{lib}/libnvidia-ml.so.{version}\n"
            f"    hostPath: /{lib}/libnvidia-ml.so.{version}\n"
            "devices:\n- name: \"0\"\n  containerEdits:\n    deviceNodes:\n"
            "    - path: /dev/nvidia0\n")


@dataclasses.dataclass
class Layout:
    name: str
    kubelet_dir: str
    kubelet: tuple                # (comm, flags...)
    runtime: str                  # containerd | cri-o
    runtime_socket: str
    runtime_flags: tuple
    runtime_files: dict           # rel path -> text
    state_dir: str
    driver_root: str              # as the layout check reports it ("/" = the host)
    libdir: str                   # where libnvidia-ml.so.1 is, under the host root
    plugin_env: dict = dataclasses.field(default_factory=dict)
    fault: str = ""               # finding id the faulty variant must produce
    faulty: dict = dataclasses.field(default_factory=dict)   # what the fault changes
    arch: str = "x86_64"          # the kernel module's (/proc/driver/nvidia/version)
    gpu: dict = dataclasses.field(default_factory=dict)      # FakeGpu fields (name, fabric)


NVIDIA_DEFAULT = containerd_toml()
RUNC_ONLY = containerd_toml(default="runc", nvidia=False)

LAYOUTS = [
    Layout("kubeadm-ubuntu", "var/lib/kubelet", ("kubelet", "--config=/var/lib/kubelet/config.yaml"),
           "containerd", "run/containerd/containerd.sock", ("--config", "/etc/containerd/config.toml"),
           {"etc/containerd/config.toml": NVIDIA_DEFAULT}, "/run/containerd", "/",
           "usr/lib/x86_64-linux-gnu",
           fault="runtime.handler_missing",
           faulty={"files": {"etc/containerd/config.toml": RUNC_ONLY}}),
    Layout("gpu-operator", "var/lib/kubelet", ("kubelet",), "containerd",
           "run/containerd/containerd.sock", (),
           {"etc/containerd/config.toml": containerd_toml(cdi=True)}, "/run/containerd",
           "/run/nvidia/driver", "run/nvidia/driver/usr/lib/x86_64-linux-gnu",
           plugin_env={"NVIDIA_DRIVER_ROOT": "/run/nvidia/driver"},
           fault="cdi.spec_version_mismatch",
           faulty={"files": {"var/run/cdi/nvidia.yaml": cdi_spec("550.54.15", "usr/lib/x86_64-linux-gnu")}}),
    Layout("gke-cos", "var/lib/kubelet", ("kubelet",), "containerd",
           "run/containerd/containerd.sock", (), {"etc/containerd/config.toml": RUNC_ONLY},
           "/run/containerd", "/home/kubernetes/bin/nvidia", "home/kubernetes/bin/nvidia/lib64",
           fault="deviceplugin.missing", faulty={"no_plugin": True}),
    Layout("eks-al2023", "var/lib/kubelet", ("kubelet",), "containerd",
           "run/containerd/containerd.sock", (), {"etc/containerd/config.toml": NVIDIA_DEFAULT},
           "/run/containerd", "/", "usr/lib64",
           fault="driver.version_mismatch", faulty={"kmod": "570.158.01"}),
    Layout("bottlerocket", "var/lib/kubelet", ("kubelet",), "containerd",
           "run/containerd/containerd.sock", ("--config", "/etc/containerd/config.toml"),
           {"etc/containerd/config.toml": NVIDIA_DEFAULT}, "/run/containerd", "/",
           f"usr/lib/nvidia/tesla/{DRIVER}",
           fault="kubelet.down", faulty={"no_kubelet": True}),
    Layout("aks-ubuntu", "var/lib/kubelet", ("kubelet",), "containerd",
           "run/containerd/containerd.sock", (),
           {"etc/containerd/config.toml": containerd_toml(default="nvidia-container-runtime")
            .replace("runtimes.nvidia", "runtimes.nvidia-container-runtime")},
           "/run/containerd", "/", "usr/lib/x86_64-linux-gnu",
           fault="runtime.handler_missing",
           faulty={"files": {"etc/containerd/config.toml": RUNC_ONLY}}),
    Layout("openshift-crio", "var/lib/kubelet", ("kubelet",), "cri-o", "var/run/crio/crio.sock", (),
           {"etc/crio/crio.conf": '[crio]\nrunroot = "/run/containers/storage"\n'
                                  '[crio.runtime.runtimes.crun]\nruntime_path = "/usr/bin/crun"\n',
            "etc/crio/crio.conf.d/99-nvidia.conf":
                '[crio.runtime]\ndefault_runtime = "nvidia"\n[crio.runtime.runtimes.nvidia]\n'
                'runtime_path = "/usr/bin/nvidia-container-runtime"\n'},
           "/run/containers/storage", "/run/nvidia/driver",
           "run/nvidia/driver/usr/lib64", plugin_env={"NVIDIA_DRIVER_ROOT": "/run/nvidia/driver"},
           fault="runtime.handler_missing",
           faulty={"files": {"etc/crio/crio.conf.d/99-nvidia.conf": ""}}),
    Layout("k3s", "var/lib/kubelet", ("k3s-agent",), "containerd",
           "run/k3s/containerd/containerd.sock",
           ("-c", "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
            "-a", "/run/k3s/containerd/containerd.sock", "--state", "/run/k3s/containerd",
            "--root", "/var/lib/rancher/k3s/agent/containerd"),
           {"var/lib/rancher/k3s/agent/etc/containerd/config.toml": containerd_toml(default="runc")},
           "/run/k3s/containerd", "/", "usr/lib/x86_64-linux-gnu",
           fault="kubelet.down", faulty={"no_kubelet": True}),
    Layout("rke2", "var/lib/kubelet", ("kubelet", "--root-dir=/var/lib/kubelet"), "containerd",
           "run/k3s/containerd/containerd.sock",
           ("-c", "/var/lib/rancher/rke2/agent/etc/containerd/config.toml",
            "--state", "/run/k3s/containerd"),
           {"var/lib/rancher/rke2/agent/etc/containerd/config.toml": containerd_toml(cdi=True)},
           "/run/k3s/containerd", "/run/nvidia/driver", "run/nvidia/driver/usr/lib/x86_64-linux-gnu",
           plugin_env={"NVIDIA_DRIVER_ROOT": "/run/nvidia/driver"},
           fault="cdi.spec_version_mismatch",
           faulty={"files": {"etc/cdi/nvidia.yaml": cdi_spec("550.54.15", "usr/lib/x86_64-linux-gnu")}}),
    Layout("microk8s", "var/snap/microk8s/common/var/lib/kubelet", ("kubelite",), "containerd",
           "var/snap/microk8s/common/run/containerd.sock",
           ("--config", "/var/snap/microk8s/current/args/containerd.toml",
            "--root", "/var/snap/microk8s/common/var/lib/containerd",
            "--state", "/var/snap/microk8s/common/run/containerd"),
           {"var/snap/microk8s/current/args/containerd.toml": NVIDIA_DEFAULT},
           "/var/snap/microk8s/common/run/containerd", "/", "usr/lib/x86_64-linux-gnu",
           fault="deviceplugin.missing", faulty={"no_plugin": True}),
    Layout("k0s", "var/lib/k0s/kubelet", ("kubelet", "--root-dir=/var/lib/k0s/kubelet"),
           "containerd", "run/k0s/containerd.sock",
           ("--root=/var/lib/k0s/containerd", "--state=/run/k0s/containerd",
            "--address=/run/k0s/containerd.sock", "--config=/etc/k0s/containerd.toml"),
           {"etc/k0s/containerd.toml": NVIDIA_DEFAULT}, "/run/k0s/containerd", "/",
           "usr/lib/x86_64-linux-gnu",
           fault="driver.version_mismatch", faulty={"kmod": "570.158.01"}),
    Layout("talos", "var/lib/kubelet", ("kubelet",), "containerd",
           "run/containerd/containerd.sock", ("--config", "/etc/cri/containerd.toml"),
           {"etc/cri/containerd.toml": containerd_toml(default="runc", cdi=True),
            "var/run/cdi/nvidia.yaml": cdi_spec(DRIVER, "usr/local/glibc/usr/lib")},
           "/run/containerd", "/usr/local/glibc", "usr/local/glibc/usr/lib",
           fault="deviceplugin.missing", faulty={"no_plugin": True}),
    # Grace Hopper: NVIDIA's driver packages on Ubuntu arm64 (sbsa), containerd configured by
    # nvidia-ctk; the open kernel module for aarch64
    Layout("gh200-ubuntu", "var/lib/kubelet", ("kubelet", "--config=/var/lib/kubelet/config.yaml"),
           "containerd", "run/containerd/containerd.sock", ("--config", "/etc/containerd/config.toml"),
           {"etc/containerd/config.toml": NVIDIA_DEFAULT}, "/run/containerd", "/",
           "usr/lib/aarch64-linux-gnu", arch="aarch64", gpu={"name": "NVIDIA GH200 480GB"},
           fault="driver.version_mismatch", faulty={"kmod": "570.158.01"}),
    # GB200 NVL72 compute tray: the GPU Operator's driver container, CDI, an IMEX channel, and
    # GPUs registered with the rack's NVLink fabric (no NVSwitch on the tray itself)
    Layout("gb200-gpu-operator", "var/lib/kubelet", ("kubelet",), "containerd",
           "run/containerd/containerd.sock", (),
           {"etc/containerd/config.toml": containerd_toml(cdi=True),
            "dev/nvidia-caps-imex-channels/channel0": ""}, "/run/containerd",
           "/run/nvidia/driver", "run/nvidia/driver/usr/lib/aarch64-linux-gnu",
           plugin_env={"NVIDIA_DRIVER_ROOT": "/run/nvidia/driver"}, arch="aarch64",
           gpu={"name": "NVIDIA GB200", "fabric_state": 3},
           fault="fabric.not_ready", faulty={"gpu": {"fabric_state": 1}}),
]


# /proc/driver/nvidia/version as each driver flavour prints it: the proprietary x86_64 module,
# and the open module (the only one on Grace; NVIDIA/open-gpu-kernel-modules utils.mk)
NVRM = {"x86_64": "NVIDIA UNIX x86_64 Kernel Module  {v}  Tue Jun 10 11:07:42 UTC 2025",
        "aarch64": "NVIDIA UNIX Open Kernel Module for aarch64  {v}  Release Build  "
                   "(dvs-builder@U22-I3-AE18-09-3)  Tue Jun 10 11:07:42 UTC 2025"}


def install_driver(root, libdir: str, gpus, kmod: str, arch: str = "x86_64") -> None:
    build_fake_nvml(root / libdir, driver_version=DRIVER, gpus=gpus)
    drv = root / "proc/driver/nvidia"
    drv.mkdir(parents=True, exist_ok=True)
    (drv / "version").write_text(f"NVRM version: {NVRM[arch].format(v=kmod)}\n"
                                 "GCC version:  gcc 12.2.0\n")
    for g in gpus:
        bus = g.bus_id[4:].lower()
        d = drv / "gpus" / bus
        d.mkdir(parents=True, exist_ok=True)
        (d / "information").write_text(f"Model: \t\t {g.name}\nGPU UUID: \t {g.uuid}\n"
                                       f"Bus Location: \t {bus}\n")


@pytest.fixture
def plugins():
    made = []

    def start(sock, devices, env):
        sock.parent.mkdir(parents=True, exist_ok=True)
        p = subprocess.Popen([sys.executable, str(FAKE_PLUGIN), "--socket", str(sock),
                              "--devices", ",".join(devices)], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, env={**os.environ, **env})
        made.append(p)
        assert p.stdout.readline().startswith(b"READY"), "fake device plugin did not start"
        return p

    yield start
    for p in made:
        p.kill()
        p.wait(10)


def build(tmp_path, lay: Layout, daemons, plugins, faulty: bool):
    root = tmp_path / "h"
    f = lay.faulty if faulty else {}
    gpus = [dataclasses.replace(g, **{**lay.gpu, **f.get("gpu", {})}) for g in healthy_gpus(2)]
    install_driver(root, lay.libdir, gpus, f.get("kmod", DRIVER), lay.arch)
    for rel, text in {**lay.runtime_files, **f.get("files", {})}.items():
        write(root, rel, text)
    kdir = root / lay.kubelet_dir
    (kdir / "device-plugins").mkdir(parents=True, exist_ok=True)
    if not f.get("no_kubelet"):
        daemons(lay.kubelet[0], [kdir / "device-plugins/kubelet.sock"], *lay.kubelet[1:])
    rt_comm = "containerd" if lay.runtime == "containerd" else "crio"
    rt = daemons(rt_comm, [root / lay.runtime_socket], *lay.runtime_flags)
    plugin = None
    if not f.get("no_plugin"):
        plugin = plugins(kdir / "device-plugins/nvidia-gpu.sock", [g.uuid for g in gpus],
                         lay.plugin_env)
    kfile = tmp_path / "kmsg"
    kfile.write_text("")
    return root, kfile, rt, plugin


@pytest.mark.slow
@pytest.mark.parametrize("faulty", [False, True], ids=["healthy", "fault"])
@pytest.mark.parametrize("lay", LAYOUTS, ids=[x.name for x in LAYOUTS])
def test_layout(tmp_path, daemons, plugins, lay, faulty):
    assert SOURCES[lay.name]                  # every layout cites where its paths come from
    root, kfile, rt, plugin = build(tmp_path, lay, daemons, plugins, faulty)
    run = run_probe("--host-root", str(root), "--kmsg-file", str(kfile), "--trace-seconds", "0",
                    "--timeout", "40", timeout=90)
    assert run.records and run.records[-1]["kind"] == "summary", run.stderr[-2000:]
    (where,) = [r for r in run.records if r.get("phase") == "layout"]
    assert where["kubelet_dir"]["path"] == str(root / lay.kubelet_dir), where["kubelet_dir"]
    assert (where["runtime"]["name"], where["runtime"]["pid"], where["runtime"]["state_dir"]) == \
        (lay.runtime, rt.pid, lay.state_dir), where["runtime"]
    assert where["driver_root"]["root"] == lay.driver_root, where["driver_root"]
    assert where["driver_root"]["library"].startswith(str(root / lay.libdir))
    status = {c["id"]: c["status"] for c in run.summary["checks"]}
    assert status["nvml"] == "ok" and status["layout"] == "ok", run.summary
    assert "error" not in status.values(), run.summary
    if not faulty:
        # hami.* judge every process under the real /proc, where other test sessions on this
        # shared machine start HAMi-like processes: not part of this layout
        false = [x for x in run.actionable() if not x["id"].startswith("hami.")]
        assert false == [], false
        assert status["runtime_cdi"] == "ok" and status["deviceplugin"] == "ok", run.summary
        return
    found = run.findings(lay.fault)
    assert found and found[0]["severity"] in ("warning", "critical"), \
        [(x["id"], x["severity"], x["title"]) for x in run.findings()]

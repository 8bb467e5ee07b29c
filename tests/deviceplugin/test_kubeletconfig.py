"""The kubelet config reader: the small YAML subset kubelet configs use, JSON, flags over the
file, and finding the right kubelet process (a real process whose comm is `kubelet`)."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from node_probe.host import kubeletconfig as kc

KUBEADM_STYLE = """\
apiVersion: kubelet.config.k8s.io/v1beta1
authentication:
  anonymous:
    enabled: false
  webhook:
    cacheTTL: 0s
    enabled: true
  x509:
    clientCAFile: /etc/kubernetes/pki/ca.crt
cgroupDriver: systemd
clusterDNS:
- 10.96.0.10
cpuManagerPolicy: static   # seed 001
cpuManagerPolicyOptions:
  full-pcpus-only: "true"
evictionHard:
  memory.available: "100Mi"
  nodefs.available: 10%
featureGates:
  KubeletPodResourcesGet: true
kind: KubeletConfiguration
maxPods: 110
reservedSystemCPUs: "0,1"
staticPodPath: /etc/kubernetes/manifests
systemReserved: {cpu: 500m, memory: 1Gi}
tlsCipherSuites: [TLS_AES_128_GCM_SHA256, TLS_AES_256_GCM_SHA384]
"""


def test_kubeadm_style_config():
    doc = kc.parse_config(KUBEADM_STYLE)
    assert doc["cpuManagerPolicy"] == "static"
    assert doc["cgroupDriver"] == "systemd"
    assert doc["authentication"]["webhook"] == {"cacheTTL": "0s", "enabled": True}
    assert doc["authentication"]["anonymous"]["enabled"] is False
    assert doc["clusterDNS"] == ["10.96.0.10"]
    assert doc["cpuManagerPolicyOptions"] == {"full-pcpus-only": "true"}
    assert doc["evictionHard"] == {"memory.available": "100Mi", "nodefs.available": "10%"}
    assert doc["featureGates"] == {"KubeletPodResourcesGet": True}
    assert doc["maxPods"] == 110 and doc["reservedSystemCPUs"] == "0,1"
    assert doc["systemReserved"] == {"cpu": "500m", "memory": "1Gi"}
    assert doc["tlsCipherSuites"] == ["TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384"]


def test_indented_lists_urls_and_block_scalars():
    doc = kc.parse_yaml("a:\n  - x\n  - 'y z'\nserver: https://10.0.0.1:6443\n"
                        "note: |\n  line one\n  line two\nafter: 1\n---\n")
    assert doc == {"a": ["x", "y z"], "server": "https://10.0.0.1:6443",
                   "note": "line one\nline two", "after": 1}


def test_json_config():
    assert kc.parse_config('{"cpuManagerPolicy": "none", "kind": "KubeletConfiguration"}') \
        == {"cpuManagerPolicy": "none", "kind": "KubeletConfiguration"}


@pytest.mark.parametrize("bad", ["a: 1\n   b: 2\n", "just text\n", "a:\n\t- x\n", "a: &x 1\n"])
def test_malformed_yaml_raises(bad):
    with pytest.raises(kc.YamlError):
        kc.parse_yaml(bad)


def test_unparseable_yaml_still_yields_top_level_scalars():
    doc = kc.parse_config("cpuManagerPolicy: static\nodd: &anchor 1\ncgroupDriver: cgroupfs\n")
    assert doc["cpuManagerPolicy"] == "static" and doc["cgroupDriver"] == "cgroupfs"
    assert "_parse_error" in doc


def test_fallback_survives_a_value_it_cannot_read():
    doc = kc.parse_config("cpuManagerPolicy: static\nodd: 'unterminated\ncgroupDriver: systemd\n")
    assert doc["cpuManagerPolicy"] == "static" and doc["cgroupDriver"] == "systemd"
    assert "_parse_error" in doc


def test_flag_values():
    argv = ["/usr/bin/kubelet", "--config=/a.yaml", "--v", "2", "--config", "/b.yaml",
            "--feature-gates=A=true,B=false"]
    assert kc.flag_value(argv, "--config") == "/b.yaml"
    assert kc.flag_value(argv, "--v") == "2"
    assert kc.flag_value(argv, "--root-dir") is None


KUBELET_SCRIPT = """\
import os, socket, sys, time
path = os.environ.get("SERVE_SOCKET")
if path:
    if os.path.lexists(path):
        os.unlink(path)
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.listen(8)
print("ready", flush=True)
time.sleep(120)
"""


@pytest.fixture
def fake_kubelet(tmp_path):
    """A real process whose comm is `kubelet` (a script named kubelet) with kubelet flags;
    with `serve=`, it listens on that socket as the kubelet does on device-plugins/kubelet.sock
    (that is what makes it the kubelet: the name alone does not)."""
    procs = []

    def start(*args, serve: Path | None = None):
        script = tmp_path / "bin" / "kubelet"
        script.parent.mkdir(exist_ok=True)
        script.write_text(f"#!{sys.executable}\n{KUBELET_SCRIPT}")
        script.chmod(0o755)
        p = subprocess.Popen([str(script), *args], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "SERVE_SOCKET": str(serve or "")})
        procs.append(p)
        assert p.stdout.readline().strip() == "ready"
        for _ in range(100):
            try:
                if open(f"/proc/{p.pid}/comm").read().strip() == "kubelet":
                    break
            except OSError:
                pass
            time.sleep(0.02)
        return p

    yield start
    for p in procs:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()


def test_config_from_the_running_kubelets_flags(host, fake_kubelet):
    etc = host.root / "etc/kubernetes"
    etc.mkdir(parents=True)
    (etc / "kubelet-config.yaml").write_text("cpuManagerPolicy: none\ncgroupDriver: systemd\n")
    (host.kubelet / "config.yaml").write_text("cpuManagerPolicy: none\n")  # not this one
    p = fake_kubelet("--root-dir=/var/lib/kubelet", "--config=/etc/kubernetes/kubelet-config.yaml",
                     "--cpu-manager-policy", "static",
                     serve=host.kubelet / "device-plugins/kubelet.sock")
    fact = kc.load(host.root, host.kubelet)
    assert fact["pid"] == p.pid and fact["source"] == "kubelet --config"
    assert fact["path"] == "/etc/kubernetes/kubelet-config.yaml"
    assert fact["cgroupDriver"] == "systemd"
    assert fact["cpuManagerPolicy"] == "static"  # the flag overrides the file
    assert fact["flags"] == {"--cpu-manager-policy": "static"}
    assert fact["error"] is None


def test_kubelet_of_another_root_dir_is_ignored(host, fake_kubelet):
    fake_kubelet("--root-dir=/elsewhere", "--config=/nope.yaml")
    fake_kubelet("--root-dir=/elsewhere2")
    (host.kubelet / "config.yaml").write_text("cpuManagerPolicy: static\n")
    fact = kc.load(host.root, host.kubelet)
    assert fact["pid"] is None and fact["source"] == "kubelet dir"
    assert fact["cpuManagerPolicy"] == "static"


def test_missing_config_file_is_reported(host, fake_kubelet):
    fake_kubelet("--config=/etc/kubernetes/missing.yaml", serve=host.kubelet / "pod-resources/kubelet.sock")
    fact = kc.load(host.root, host.kubelet)
    assert "not found" in fact["error"]
    assert fact["cpuManagerPolicy"] is None


def test_a_process_named_kubelet_that_serves_nothing_is_not_the_kubelet(host, fake_kubelet):
    """A tenant's decoy named kubelet, with this kubelet dir and a config of its choosing, started
    before the real one: the config read is the one of the process serving kubelet.sock."""
    etc = host.root / "etc/kubernetes"
    etc.mkdir(parents=True)
    (etc / "decoy.yaml").write_text("cpuManagerPolicy: none\n")
    (etc / "kubelet-config.yaml").write_text("cpuManagerPolicy: static\n")
    fake_kubelet("--root-dir=/var/lib/kubelet", "--config=/etc/kubernetes/decoy.yaml")
    real = fake_kubelet("--config=/etc/kubernetes/kubelet-config.yaml",
                        serve=host.kubelet / "device-plugins/kubelet.sock")
    fact = kc.load(host.root, host.kubelet)
    assert fact["pid"] == real.pid and fact["path"] == "/etc/kubernetes/kubelet-config.yaml"
    assert fact["cpuManagerPolicy"] == "static"


def test_decoy_alone_leaves_the_kubelet_dir_config(host, fake_kubelet):
    (host.root / "decoy.yaml").write_text("cpuManagerPolicy: none\n")
    (host.kubelet / "config.yaml").write_text("cpuManagerPolicy: static\n")
    fake_kubelet("--config=/decoy.yaml")
    fact = kc.load(host.root, host.kubelet)
    assert fact["pid"] is None and fact["source"] == "kubelet dir"
    assert fact["cpuManagerPolicy"] == "static"

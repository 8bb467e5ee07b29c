"""kubelet DRA plugins on the node: real gRPC servers on unix sockets in a separate process,
registration stubs generated from the pluginregistration proto with grpcio-tools; a hung plugin
is a SIGSTOPped process, a dead one a killed process whose sockets stay behind."""
from __future__ import annotations

import os
import select
import shutil
import signal
import tempfile
import subprocess
import sys
from pathlib import Path

import pytest

from node_probe.host import dra_plugins
from tests.probe_run import run_probe

REPO = Path(__file__).resolve().parents[2]
PROTO_DIR = Path(__file__).parent / "protos"
FAKE = REPO / "tests/fakes/fake_dra_plugin.py"
DRIVER = "gpu.nvidia.com"


@pytest.fixture(scope="module")
def stubs(tmp_path_factory):
    out = tmp_path_factory.mktemp("stubs")
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_DIR}",
                    f"--python_out={out}", f"--grpc_python_out={out}",
                    "pluginregistration.proto"], check=True, timeout=60)
    return out


@pytest.fixture
def plugin(tmp_path, stubs):
    """plugin(health) -> (kubelet dir, process, method log) of a running fake DRA plugin."""
    procs = []
    short = Path(tempfile.mkdtemp(prefix="gd-dra-"))  # unix socket paths must stay < 108 bytes

    def start(health="serving"):
        kdir = short / "kubelet"
        (kdir / "plugins_registry").mkdir(parents=True, exist_ok=True)
        (kdir / "plugins" / DRIVER).mkdir(parents=True, exist_ok=True)
        reg = kdir / "plugins_registry" / f"{DRIVER}-reg.sock"
        ep = kdir / "plugins" / DRIVER / "dra.sock"
        log = tmp_path / "methods.log"
        p = subprocess.Popen([sys.executable, str(FAKE), str(stubs), str(reg), str(ep), DRIVER,
                              f"/var/lib/kubelet/plugins/{DRIVER}/dra.sock", health, str(log)],
                             stdout=subprocess.PIPE, text=True)
        procs.append(p)
        # never wait forever on a plugin that did not come up
        assert select.select([p.stdout], [], [], 30)[0], "fake DRA plugin not ready in 30 s"
        assert p.stdout.readline().strip() == "ready"
        return kdir, p, log

    yield start
    for p in procs:
        try:
            os.kill(p.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        p.kill()
        p.wait(timeout=10)
    shutil.rmtree(short, ignore_errors=True)


def probe(kdir, tmp_path):
    root = tmp_path / "host"
    root.mkdir(exist_ok=True)
    return run_probe("--host-root", str(root), "--kubelet-dir", str(kdir), "--trace-seconds", "0",
                     "--only", "dra_node")


def test_healthy_dra_plugin_is_info_only(plugin, tmp_path):
    kdir, _, log = plugin("serving")
    run = probe(kdir, tmp_path)
    assert not [f for f in run.findings() if f["severity"] in ("warning", "critical")], \
        run.findings()
    inv = run.findings("dra.plugins")[0]["evidence"]["plugins"]
    assert inv[0]["name"] == DRIVER and inv[0]["type"] == "DRAPlugin"
    assert inv[0]["supported_versions"] == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    assert inv[0]["endpoint_health"] == "SERVING"
    assert run.findings("dra.plugins")[0]["evidence"]["unregistered_sockets"] == []
    # read-only: the endpoint was asked for health only, never Prepare/Unprepare
    assert set(log.read_text().split()) == {"/grpc.health.v1.Health/Check"}


def test_plugin_without_health_service_still_counts_as_answering(plugin, tmp_path):
    kdir, _, _ = plugin("none")
    run = probe(kdir, tmp_path)
    assert not run.findings("dra.plugin_unresponsive")
    assert run.findings("dra.plugins")[0]["evidence"]["plugins"][0]["endpoint_call"]["status"] \
        == "unimplemented"


def test_hung_plugin_process_is_critical_within_deadline(plugin, tmp_path):
    kdir, p, _ = plugin("serving")
    os.kill(p.pid, signal.SIGSTOP)
    run = probe(kdir, tmp_path)
    f = run.findings("dra.plugin_unresponsive")
    assert f and f[0]["severity"] == "critical", run.findings()
    assert f[0]["evidence"]["rpc"] == "GetInfo" and f[0]["evidence"]["status"] == "timeout"
    # the probe's own clock, well inside its 30 s deadline (start-up under load not counted)
    assert run.summary["duration_s"] < 10, (run.summary["duration_s"], run.wall_s)


def test_dead_plugin_with_sockets_left_behind(plugin, tmp_path):
    kdir, p, _ = plugin("serving")
    p.kill()
    p.wait()
    assert (kdir / "plugins_registry" / f"{DRIVER}-reg.sock").exists()
    run = probe(kdir, tmp_path)
    f = run.findings("dra.plugin_unresponsive")
    assert f and f[0]["evidence"]["status"] == "unavailable"


def test_registered_plugin_whose_endpoint_is_not_serving(plugin, tmp_path):
    kdir, _, _ = plugin("not_serving")
    run = probe(kdir, tmp_path)
    f = run.findings("dra.plugin_unresponsive")
    assert f and f[0]["subject"] == f"dra/{DRIVER}" and f[0]["evidence"]["health"] == "NOT_SERVING"


def test_no_registry_no_findings(tmp_path):
    kdir = tmp_path / "kubelet"
    kdir.mkdir()
    run = probe(kdir, tmp_path)
    assert not run.findings("dra.plugins") and not run.findings("dra.plugin_unresponsive")
    check = next(c for c in run.summary["checks"] if c["id"] == "dra_node")
    assert check["status"] == "skipped" and "plugins_registry" in check["reason"], check


def test_empty_registry_is_quiet_and_looked(tmp_path):
    kdir = tmp_path / "kubelet"
    (kdir / "plugins_registry").mkdir(parents=True)
    run = probe(kdir, tmp_path)
    assert not run.findings()
    assert next(c for c in run.summary["checks"] if c["id"] == "dra_node")["status"] == "ok"


def test_endpoint_is_never_dialled_outside_the_host_root():
    """The endpoint is the plugin's word: `..`, and symlinks out of the root, stay inside it."""
    import socket as so

    base = Path(tempfile.mkdtemp(prefix="gd-ep-"))   # unix socket paths must stay < 108 bytes
    socks = []
    try:
        root, kdir, out = base / "host", base / "kubelet", base / "outside"
        for d in (root / "run/drv", kdir / "plugins/drv", out):
            d.mkdir(parents=True)
        for p in (out / "x.sock", root / "run/drv/ok.sock", kdir / "plugins/drv/dra.sock"):
            s = so.socket(so.AF_UNIX)
            s.bind(str(p))
            socks.append(s)
        (root / "run/drv/link.sock").symlink_to(out / "x.sock")        # absolute, out of root
        (kdir / "plugins/drv/up.sock").symlink_to("../../../outside/x.sock")
        (root / "run/drv/file.sock").write_text("")
        ep = lambda e: dra_plugins.endpoint_path(e, root, kdir)   # noqa: E731
        assert ep("/run/drv/ok.sock") == root / "run/drv/ok.sock"
        assert ep("/var/lib/kubelet/plugins/drv/dra.sock") == kdir / "plugins/drv/dra.sock"
        assert ep("/run/drv/link.sock") is None
        assert ep("/var/lib/kubelet/plugins/drv/up.sock") is None
        assert ep("/../outside/x.sock") is None and ep("../../outside/x.sock") is None
        assert ep("/run/drv/file.sock") is None and ep("") is None and ep("/") is None
    finally:
        for s in socks:
            s.close()
        shutil.rmtree(base, ignore_errors=True)


def test_hand_decoder_matches_protobuf(stubs):
    sys.path.insert(0, str(stubs))
    try:
        import pluginregistration_pb2 as pb
    finally:
        sys.path.remove(str(stubs))
    raw = pb.PluginInfo(type="DRAPlugin", name="x", endpoint="/e",
                        supported_versions=["a", "b"]).SerializeToString()
    assert dra_plugins.decode_plugin_info(raw) == {"type": "DRAPlugin", "name": "x",
                                                   "endpoint": "/e",
                                                   "supported_versions": ["a", "b"]}
    with pytest.raises(ValueError):
        dra_plugins.decode_plugin_info(raw[:-1])


def test_socket_serving_without_registration_is_listed(plugin, tmp_path):
    import socket as so

    kdir, _, _ = plugin("serving")
    (kdir / "plugins" / "other.example.com").mkdir()
    stray = so.socket(so.AF_UNIX)
    stray.bind(str(kdir / "plugins" / "other.example.com" / "dra.sock"))
    try:
        run = probe(kdir, tmp_path)
    finally:
        stray.close()
    ev = run.findings("dra.plugins")[0]["evidence"]
    assert ev["unregistered_sockets"] == ["plugins/other.example.com/dra.sock"]

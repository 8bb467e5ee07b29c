"""The `deviceplugin` check end to end: a real probe process against real fake-plugin
processes serving the kubelet API on unix sockets under a temp kubelet dir."""
import os
import shutil
import socket
import stat
import subprocess
import textwrap
import time

import pytest

from node_probe.engine import registry
from node_probe.deviceplugin import rpc
from tests.fakes.nvml import build_fake_nvml
from tests.probe_run import run_probe

from .conftest import GPU_A, GPU_B

DP_ONLY = ("--only", "deviceplugin", "--trace-seconds", "0")
NEVER_CALLED = ("Allocate", "PreStartContainer")
PODS = [{"namespace": "ml", "pod": "train-0", "container": "main", "resource": "nvidia.com/gpu",
         "device_ids": [GPU_A]},
        {"namespace": "ml", "pod": "infer-1", "container": "srv", "resource": "nvidia.com/gpu",
         "device_ids": [GPU_B]}]


def _answers(sock) -> bool:
    with rpc.PluginClient(str(sock)) as c:
        return c.options(2.0).ok


def test_healthy_plugin_answers_everything(host, start_plugin, podres):
    p = start_plugin("nvidia-gpu.sock")
    podres(PODS)
    run = run_probe(*host.args(*DP_ONLY))
    assert run.returncode == 0, run.stdout[-3000:]
    assert run.summary["critical"] == 0 and run.summary["complete"]
    (inv,) = run.findings("deviceplugin.inventory")
    ev = inv["evidence"]
    assert ev["pid"] == p.pid and ev["resource"] == "nvidia.com/gpu"
    assert [d["id"] for d in ev["devices"]] == [GPU_A, GPU_B]
    assert {r["rpc"]: r["status"] for r in ev["rpcs"]} == {
        "GetDevicePluginOptions": "ok", "ListAndWatch": "ok", "GetPreferredAllocation": "ok"}
    assert ev["resource_source"] == "pod-resources"
    assert {h["pod"] for h in ev["pods_holding_devices"]} == {"ml/train-0", "ml/infer-1"}
    calls = p.calls()
    assert "GetPreferredAllocation" in calls
    assert not set(calls) & set(NEVER_CALLED)


def test_podresources_fact_feeds_other_checks(host, start_plugin, podres):
    """The "podresources" fact as another check sees it (in-process runner)."""
    from node_probe.engine import facts
    from node_probe.engine.context import ProbeOptions
    from node_probe.engine.runner import Runner

    start_plugin("nvidia-gpu.sock")
    podres(PODS)
    opts = ProbeOptions(host_root=host.root, kubelet_dir=host.kubelet, trace_s=0,
                        timeout_s=15)
    runner = Runner(registry.select(["deviceplugin"]), opts, lambda rec: None)
    res = runner.run()
    assert res.complete
    rows = runner.ctx.fact(facts.PODRESOURCES, timeout=0)
    assert sorted((r["pod"], tuple(r["device_ids"])) for r in rows) == [
        ("infer-1", (GPU_B,)), ("train-0", (GPU_A,))]
    (t,) = runner.ctx.fact(facts.DEVICEPLUGIN_TARGETS, timeout=0)
    assert t.socket.endswith("nvidia-gpu.sock") and t.pid and t.resource == "nvidia.com/gpu"


def test_unhealthy_device_is_reported_with_the_pod_holding_it(host, start_plugin, podres):
    start_plugin("nvidia-gpu.sock", mode="unhealthy")
    podres(PODS)
    run = run_probe(*host.args(*DP_ONLY))
    (f,) = run.findings("deviceplugin.unhealthy")
    assert f["severity"] == "warning"
    assert [d["id"] for d in f["evidence"]["unhealthy"]] == [GPU_A]
    assert f["evidence"]["pods_holding_devices"][0]["pod"] == "ml/train-0"
    # the plausible request only offers healthy devices
    inv = run.findings("deviceplugin.inventory")[0]["evidence"]
    assert inv["devices_healthy"] == 1


def test_plugin_without_preferred_allocation_is_not_asked_for_one(host, start_plugin):
    p = start_plugin("nvidia-gpu.sock", extra=("--no-preferred-allocation",))
    run = run_probe(*host.args(*DP_ONLY))
    assert run.returncode == 0
    assert "GetPreferredAllocation" not in p.calls()
    inv = run.findings("deviceplugin.inventory")[0]["evidence"]
    assert "does not offer" in inv["get_preferred_allocation"]


def _blocked_setup(host, start_plugin, podres, tmp_path):
    host.driver_version("570.158.01")
    lib = build_fake_nvml(tmp_path / "plugin-lib", init="block")
    p = start_plugin("nvidia-gpu.sock", mode="nvml-block", nvml_lib=lib,
                     devices=(GPU_A, "MIG-e76cc178-e1f3-5596-a9e1-84fa6bffa030"))
    podres(PODS[:1])
    return p


def _assert_blocked(run, p, timeout):
    # the probe's own clock (its --timeout runs from there; interpreter start-up on a loaded
    # machine is not the probe's to bound); run_probe's 60 s is the hang guard
    assert run.summary["duration_s"] < timeout + 3, (run.summary["duration_s"], run.wall_s)
    assert run.summary["complete"], run.summary
    (to,) = run.findings("deviceplugin.rpc_timeout")
    assert to["evidence"]["rpc"] == "GetPreferredAllocation"
    assert to["evidence"]["pid"] == p.pid and to["severity"] == "critical"
    (b,) = run.findings("deviceplugin.blocked_in_nvml")
    ev = b["evidence"]
    assert ev["pid"] == p.pid
    (tid,) = ev["blocked_tids"]
    assert os.path.exists(f"/proc/{p.pid}/task/{tid}")  # a real thread of the plugin
    assert f"thread {tid} of pid {p.pid}" in b["title"]
    assert "entered nvmlInit_v2 and has not returned" in b["title"]
    assert "waits on a futex" in b["title"]
    assert ev["driver_version"] == "570.158.01"
    (kb,) = ev["known_bad_driver"]
    assert kb["trigger_present"] is True  # MIG-* beside GPU-* devices
    assert "570.172.08" in kb["fixed_in"]
    assert ev["pods_holding_devices"][0]["pod"] == "ml/train-0"
    # the plugin is left running and unharmed
    assert p.alive()
    assert _answers(p.socket)
    assert not set(p.calls()) & set(NEVER_CALLED)
    return ev


@pytest.mark.slow  # waits out the 5 s GetPreferredAllocation deadline
def test_blocked_in_nvml_found_by_the_proc_stack_scan(host, start_plugin, podres, tmp_path):
    p = _blocked_setup(host, start_plugin, podres, tmp_path)
    run = run_probe(*host.args("--only", "deviceplugin", "--timeout", "15"))
    ev = _assert_blocked(run, p, 15)
    (th,) = ev["threads"]
    assert th["sources"] == ["stack scan"] and th["blocked_before_probe"] is False
    assert th["proc"]["syscall"] == "futex"
    assert ev["ebpf"].startswith("not used")


@pytest.mark.slow  # waits out the 5 s GetPreferredAllocation deadline
def test_thread_blocked_before_the_probe_started(host, start_plugin, podres, tmp_path):
    """The kubelet's own call got stuck earlier: the probe finds that thread from /proc too."""
    p = _blocked_setup(host, start_plugin, podres, tmp_path)
    with rpc.PluginClient(str(p.socket)) as c:  # plays the kubelet, with a short deadline
        assert c.preferred_allocation([GPU_A], 1, 0.5).status == "timeout"
    run = run_probe(*host.args("--only", "deviceplugin", "--timeout", "15"))
    (b,) = run.findings("deviceplugin.blocked_in_nvml")
    threads = b["evidence"]["threads"]
    assert len(threads) == 2
    assert sorted(t["blocked_before_probe"] for t in threads) == [False, True]
    assert "(and 1 more thread(s))" in b["title"]
    assert p.alive() and _answers(p.socket)


def test_stuck_thread_without_any_rpc_timeout_is_confirmed_by_two_samples(
        host, start_plugin, tmp_path):
    """The plugin does not offer GetPreferredAllocation to the probe, but an earlier caller
    (the kubelet) left a thread inside nvmlInit_v2: found from /proc alone, seen twice."""
    lib = build_fake_nvml(tmp_path / "lib", init="block")
    p = start_plugin("nvidia-gpu.sock", mode="nvml-block", nvml_lib=lib,
                     extra=("--no-preferred-allocation",))
    with rpc.PluginClient(str(p.socket)) as c:
        assert c.preferred_allocation([GPU_A], 1, 0.5).status == "timeout"
    run = run_probe(*host.args(*DP_ONLY))
    assert run.findings("deviceplugin.rpc_timeout") == []
    (b,) = run.findings("deviceplugin.blocked_in_nvml")
    assert b["title"].startswith(f"thread ") and "is inside nvmlInit_v2" in b["title"]
    (th,) = b["evidence"]["threads"]
    assert th["blocked_before_probe"] is True and th["seen_inside_for_s"] >= 1.0
    assert b["evidence"]["rpc_timeout"] is None
    assert p.calls().count("GetPreferredAllocation") == 1  # only the test's own call


def test_one_stuck_plugin_process_serving_four_resources_is_one_finding(
        host, start_plugin, tmp_path):
    """NVIDIA's plugin with the mixed MIG strategy serves nvidia.com/gpu and each MIG profile
    from one process, a socket each (the real v0.20.0 plugin in tests/data/captures/k8s-1.35/
    healthy-nvidia-device-plugin.log: pid 15981 serves nvidia-mig-1g.10gb.sock,
    nvidia-gpu.sock, nvidia-mig-3g.40gb.sock and nvidia-mig-2g.20gb.sock). Its thread stuck in
    nvmlInit is one cause: one blocked_in_nvml listing the four resources (the audit saw it
    four times on a real cluster), not one per socket."""
    lib = build_fake_nvml(tmp_path / "lib", init="block")
    extra = [str(host.plugins_dir / n) for n in ("nvidia-mig-1g.10gb.sock",
                                                 "nvidia-mig-3g.40gb.sock",
                                                 "nvidia-mig-2g.20gb.sock")]
    p = start_plugin("nvidia-gpu.sock", mode="nvml-block", nvml_lib=lib,
                     extra=("--no-preferred-allocation",
                            *[a for s in extra for a in ("--extra-socket", s)]))
    with rpc.PluginClient(str(p.socket)) as c:  # the kubelet's call, stuck in nvmlInit_v2
        assert c.preferred_allocation([GPU_A], 1, 0.5).status == "timeout"
    run = run_probe(*host.args(*DP_ONLY))
    assert len(run.findings("deviceplugin.inventory")) == 4  # four sockets, one pid
    (b,) = run.findings("deviceplugin.blocked_in_nvml")
    ev = b["evidence"]
    assert ev["pid"] == p.pid and ev["resource"] == "nvidia.com/gpu"
    assert ev["resources"] == ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb",
                               "nvidia.com/mig-2g.20gb", "nvidia.com/mig-3g.40gb"]
    assert len(ev["sockets"]) == 4
    assert b["subject"] == f"nvidia.com/gpu plugin (pid {p.pid}, 4 resources)"
    assert "the same process serves nvidia.com/gpu, nvidia.com/mig-1g.10gb, " \
           "nvidia.com/mig-2g.20gb (+1 more)" in b["title"]


@pytest.mark.bcc
@pytest.mark.slow
def test_blocked_in_nvml_seen_by_ebpf(host, start_plugin, podres, tmp_path):
    assert any(c.id == "trace" for c in registry.all_checks()), "the eBPF trace check is gone"
    p = _blocked_setup(host, start_plugin, podres, tmp_path)
    run = run_probe(*host.args("--only", "deviceplugin", "--only", "trace", "--timeout", "25"),
                    timeout=60)
    unavailable = run.findings("probe.ebpf_unavailable")
    if unavailable:
        pytest.skip(f"eBPF unavailable here: {unavailable[0]['title']}")
    ev = _assert_blocked(run, p, 25)
    assert ev["ebpf"] == "used"
    (th,) = ev["threads"]
    assert "ebpf uprobe" in th["sources"] and "stack scan" in th["sources"]
    assert th["func"] == "nvmlInit_v2"


def test_missing_plugin_on_a_gpu_node(host):
    host.gpu_dirs("0000:3b:00.0", "0000:86:00.0")
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(host.plugins_dir / "nvidia-gpu.sock"))
    dead.close()
    run = run_probe(*host.args(*DP_ONLY))
    (f,) = run.findings("deviceplugin.missing")
    assert f["severity"] == "critical"
    assert f["evidence"]["gpus"] == ["pci 0000:3b:00.0", "pci 0000:86:00.0"]
    assert f["evidence"]["dead_sockets"] == [str(host.plugins_dir / "nvidia-gpu.sock")]
    inv = run.findings("deviceplugin.inventory")[0]
    assert "nothing answers" in inv["title"]


def test_no_gpus_no_plugins_no_findings(host):
    run = run_probe(*host.args(*DP_ONLY))
    assert run.returncode == 0 and run.findings() == []


def test_hung_pod_resources_does_not_hang_the_check(host, start_plugin, podres):
    start_plugin("nvidia-gpu.sock")
    podres(PODS, hang=True)
    run = run_probe(*host.args(*DP_ONLY, "--timeout", "12"))
    assert run.summary["complete"]
    inv = run.findings("deviceplugin.inventory")[0]["evidence"]
    assert inv["pods_holding_devices"] == []
    assert run.summary["duration_s"] < 12, (run.summary["duration_s"], run.wall_s)


def test_without_grpcio_the_check_says_so(host, start_plugin, tmp_path):
    start_plugin("nvidia-gpu.sock")
    shadow = tmp_path / "shadow"
    (shadow / "grpc").mkdir(parents=True)
    (shadow / "grpc" / "__init__.py").write_text("raise ImportError('No module named grpc')\n")
    run = run_probe(*host.args(*DP_ONLY), env={"PYTHONPATH": f"{shadow}:{os.getcwd()}"})
    assert run.returncode == 0, run.stdout[-2000:]
    (f,) = [f for f in run.findings("deviceplugin.inventory") if f["subject"] == "node"]
    assert "need grpcio" in f["title"] and f["severity"] == "info"
    assert f["evidence"]["targets"][0]["pid"]  # discovery still ran
    (per_plugin,) = [f for f in run.findings("deviceplugin.inventory") if f["subject"] != "node"]
    assert per_plugin["title"].endswith("RPCs not called")
    assert run.summary["complete"]
    # the RPCs were not asked: the check did not look, whatever discovery found
    (c,) = [c for c in run.summary["checks"] if c["id"] == "deviceplugin"]
    assert c["status"] == "skipped" and "grpcio unavailable" in c["reason"], c


STALE_DEV = textwrap.dedent("""
    set -e
    mount -t tmpfs -o size=1m,mode=755 gd-dev /dev
    mknod -m 666 /dev/null c 1 3
    mknod -m 666 /dev/zero c 1 5
    mknod -m 666 /dev/random c 1 8
    mknod -m 666 /dev/urandom c 1 9
    touch /dev/nvidia0 /dev/nvidiactl
    exec "$@"
""")


@pytest.mark.root
def test_plugin_with_a_private_dev_lacking_nvidia_uvm(host, start_plugin):
    if os.geteuid() != 0:
        pytest.skip("needs root for unshare -m and mount")
    if not shutil.which("unshare"):
        pytest.skip("unshare (util-linux) not installed")
    dev = host.root / "dev"
    dev.mkdir()
    # real character device nodes, as on a GPU host (nothing drives these numbers here);
    # nvidia-modeset is on the host but never needed by compute containers: not reported
    for n, (major, minor) in {"nvidia0": (195, 0), "nvidiactl": (195, 255),
                              "nvidia-modeset": (195, 254)}.items():
        os.mknod(dev / n, 0o600 | stat.S_IFCHR, os.makedev(major, minor))
    wrapper = ("unshare", "-m", "--propagation", "private", "sh", "-c", STALE_DEV, "sh")
    p = start_plugin("nvidia-gpu.sock", wrapper=wrapper)
    time.sleep(1.2)  # nvidia-uvm appears later, on first CUDA use (seed 002)
    os.mknod(dev / "nvidia-uvm", 0o600 | stat.S_IFCHR, os.makedev(509, 0))
    assert sorted(os.listdir(f"/proc/{p.pid}/root/dev")) != sorted(os.listdir("/dev"))
    run = run_probe(*host.args(*DP_ONLY))
    (f,) = run.findings("deviceplugin.stale_dev_view")
    ev = f["evidence"]
    assert [m["name"] for m in ev["missing"]] == ["nvidia-uvm"]
    assert ev["plugin_sees"] == ["nvidia0", "nvidiactl"]
    assert ev["missing"][0]["host_ctime"] and ev["plugin_started_at"]
    assert (ev["missing"][0]["kind"], ev["missing"][0]["major"]) == ("char", 509)
    assert ev["missing"][0]["created_after_plugin_start"] is True
    assert ev["pid"] == p.pid and f["severity"] == "warning"
    # the host's mount table is untouched (private propagation)
    assert "gd-dev" not in open("/proc/self/mounts").read()

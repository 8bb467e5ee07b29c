"""A live device-plugin socket with no kubelet next to it: the kubelet stopped or crashed while
the plugin runs. The plugin is still provoked (its RPCs answer or not, as ever) and the report
says the kubelet is down, instead of skipping everything as "not a Kubernetes node"."""
from tests.probe_run import run_probe

from .conftest import GPU_A

DP_ONLY = ("--only", "deviceplugin", "--trace-seconds", "0")


def test_plugin_alive_kubelet_gone_is_provoked_and_kubelet_down_reported(host, start_plugin):
    host.not_a_node()                     # kubelet.sock gone, no kubelet process
    p = start_plugin("nvidia-gpu.sock")
    run = run_probe(*host.args(*DP_ONLY))
    (down,) = run.findings("kubelet.down")
    assert down["severity"] == "critical"
    assert "kubelet is not running" in down["title"]
    assert down["evidence"]["plugins"] == [{"socket": str(host.plugins_dir / "nvidia-gpu.sock"),
                                            "pid": p.pid, "comm": down["evidence"]["plugins"][0]["comm"]}]
    assert not run.findings("node.not_kubernetes")
    (inv,) = run.findings("deviceplugin.inventory")
    assert {r["rpc"]: r["status"] for r in inv["evidence"]["rpcs"]}["GetDevicePluginOptions"] == "ok"
    assert [d["id"] for d in inv["evidence"]["devices"]][0] == GPU_A
    assert "GetDevicePluginOptions" in p.calls()
    check = next(c for c in run.summary["checks"] if c["id"] == "deviceplugin")
    assert check["status"] == "ok"


def test_no_kubelet_and_no_live_plugin_is_still_not_a_node(host):
    host.not_a_node()
    run = run_probe(*host.args(*DP_ONLY))
    assert run.findings("node.not_kubernetes") and not run.findings("kubelet.down")


def test_a_container_process_named_kubelet_does_not_hide_that_the_kubelet_is_down(host,
                                                                                 start_plugin):
    """A process called kubelet whose root is not the host's (a tenant's decoy, a kind node's
    kubelet on the same machine) is not this node's kubelet: the plugin still serves a socket no
    kubelet listens to, and the report says the kubelet is down (before: no finding at all)."""
    from tests.fakes import fake_daemon
    host.not_a_node()
    start_plugin("nvidia-gpu.sock")
    decoy = fake_daemon.spawn("kubelet", [], "--root-dir=/var/lib/kubelet")
    try:
        run = run_probe(*host.args(*DP_ONLY))
    finally:
        decoy.kill()
        decoy.wait(10)
    (down,) = run.findings("kubelet.down")
    assert down["severity"] == "critical" and decoy.pid not in down["evidence"]["kubelet_pids"]

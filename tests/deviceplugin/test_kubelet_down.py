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

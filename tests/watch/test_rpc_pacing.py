"""The agent's quiet passes leave gRPC alone (issue 41 item 3): detect.RpcPacer says when the
device plugins' and pod-resources' RPCs are due, and the deviceplugin check asks anyway when
the plugins found changed since they were last asked -- so a quiet pass loads no grpc (~80 ms
of CPU a pass, bench/watch_pass_cost.py) and loses no detection."""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from node_probe.watch.detect import RPC_CLASSES, RPC_MAX_GAP_S, PassResult, RpcPacer
from node_probe.watch.state import Problem

REPO = Path(__file__).resolve().parents[2]


def _res(problems=None, unsure=(), plugins=("s|1|nvidia.com/gpu",), rpc=True) -> PassResult:
    return PassResult(0.0, 0.1, [], [], problems or {}, set(unsure), (), False,
                      plugin_targets=plugins, plugin_rpc=rpc)


def test_the_first_pass_asks_then_quiet_passes_do_not():
    p = RpcPacer()
    assert p.want(now=0.0)
    p.observe(_res(), now=0.0)
    assert p.seen == ("s|1|nvidia.com/gpu",)
    assert not p.want(now=30.0) and not p.want(now=60.0)
    # at most RPC_MAX_GAP_S without asking, whatever else says
    assert p.want(now=RPC_MAX_GAP_S)


def test_a_problem_an_unsure_class_or_an_active_condition_asks_at_once():
    p = RpcPacer()
    p.observe(_res(), now=0.0)
    ct = RPC_CLASSES[0]
    assert p.want(active=[ct], now=30.0)           # clears only on what the RPCs say
    assert not p.want(active=["GpuDoctorXidErrors"], now=30.0)
    p.observe(_res(problems={"GpuDoctorXidErrors": [Problem("GpuDoctorXidErrors", "gpu.xid",
                                                            "critical", "node", "Xid 79")]},
                   rpc=False), now=30.0)
    assert p.want(now=60.0)                         # the next pass names the pods, confirms
    p.observe(_res(), now=60.0)
    p.observe(_res(unsure=["GpuDoctorGpuUnhealthy"], rpc=False), now=90.0)
    assert p.want(now=120.0)
    # the isolation scan left out of a pass (its pacer) makes its class unsure: no RPC for it
    p.observe(_res(), now=120.0)
    p.observe(_res(unsure=["GpuDoctorIsolationBreach"], rpc=False), now=150.0)
    assert not p.want(now=180.0)
    # a pass without RPCs keeps what the last one that asked saw
    p = RpcPacer()
    p.observe(_res(plugins=("a",)), now=0.0)
    p.observe(_res(plugins=("b",), rpc=False), now=30.0)
    assert p.seen == ("a",)


PASS = r"""
import json, sys
from pathlib import Path
from node_probe.engine.context import ProbeOptions
from node_probe.watch import detect
root, rpc, seen = Path(sys.argv[1]), sys.argv[2] == "1", tuple(json.loads(sys.argv[3]))
base = ProbeOptions(host_root=root, kubelet_dir=root / "var/lib/kubelet",
                    cgroup_root=root / "sys/fs/cgroup", kmsg_file=root / "kmsg",
                    plugin_rpc=rpc, plugin_targets_seen=seen)
others = tuple(c for c in detect.WATCH_CHECKS if c != "deviceplugin")
res = detect.run_pass(base, 10.0, skip=others)
dp = next(c for c in res.checks if c.id == "deviceplugin")
print(json.dumps({"status": dp.status, "grpc": "grpc" in sys.modules,
                  "plugins": list(res.plugin_targets or ()), "rpc": res.plugin_rpc}))
"""


def _host(tmp_path: Path) -> Path:
    root = tmp_path / "h"  # short: a unix socket's path is at most 107 bytes
    dp = root / "var/lib/kubelet/device-plugins"
    dp.mkdir(parents=True)
    (root / "kmsg").write_text("")
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(dp / "kubelet.sock"))  # a kubelet's registration socket: a Kubernetes node
    s.close()
    return root


def _pass(root: Path, rpc: bool, seen=()) -> dict:
    r = subprocess.run([sys.executable, "-c", PASS, str(root), "1" if rpc else "0",
                        json.dumps(list(seen))], capture_output=True, text=True, timeout=60,
                       cwd=REPO)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_quiet_pass_loads_no_grpc_and_a_changed_plugin_is_asked():
    tmp = Path(tempfile.mkdtemp(prefix="gdr-", dir="/tmp"))
    try:
        _quiet_then_changed(_host(tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _quiet_then_changed(root: Path) -> None:
    asked = _pass(root, True)
    assert asked["grpc"] and asked["rpc"] and asked["status"] != "skipped"
    quiet = _pass(root, False, asked["plugins"])
    assert not quiet["grpc"] and not quiet["rpc"] and quiet["status"] == "skipped"
    # a plugin socket that was not there when they were last asked: asked in this very pass
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(root / "var/lib/kubelet/device-plugins/nvidia-gpu.sock"))
    s.close()
    changed = _pass(root, False, asked["plugins"])
    assert changed["grpc"] and changed["rpc"] and changed["status"] != "skipped"
    assert changed["plugins"] != asked["plugins"]

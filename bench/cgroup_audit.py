#!/usr/bin/env python3
"""Cost of the device cgroup audit (check `cgroup.devices`) on real cgroups of this host.

Builds a kubepods-shaped tree with N containers (each with a ~30 KB OCI config.json) (a real `sleep` process in each, half of them
GPU containers by NVIDIA_VISIBLE_DEVICES) under the v1 devices controller and under the
cgroup2 hierarchy, runs the check in-process, and prints the median wall time of:
  - v1: discovery + devices.list evaluation for N containers
  - v2: discovery + one access helper per GPU container (joins its cgroup, access(2), exits)
  - one v2 helper on its own
Everything it creates is removed. Needs root.
Usage: .venv/bin/python bench/cgroup_audit.py [--containers 40] [--runs 5]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from node_probe.host import cgroup_rules  # noqa: E402
from node_probe.checks.cgroup_devices import cgroup_devices  # noqa: E402
from node_probe.engine.context import ProbeContext, ProbeOptions  # noqa: E402
from tests.cgroups.conftest import (GPU0_UUID, V1_DEVICES, V2_UNIFIED, CgroupTree,  # noqa: E402
                                    deny_all_then_allow, make_host_root, new_cid, new_uid)


def bundle(host: Path, cid: str, i: int) -> None:
    """A ~30 KB OCI config.json, the size containerd writes for a typical pod container."""
    d = host / f"run/containerd/io.containerd.runtime.v2.task/k8s.io/{cid}"
    d.mkdir(parents=True)
    d.joinpath("config.json").write_text(json.dumps({
        "process": {"env": [f"VAR_{k}={'x' * 40}" for k in range(300)]},
        "annotations": {"io.kubernetes.cri.sandbox-name": f"pod-{i}",
                        "io.kubernetes.cri.sandbox-namespace": "bench",
                        "io.kubernetes.cri.container-name": "main"},
        "linux": {"resources": {"devices": [{"allow": False, "access": "rwm"}]}}}))


def build(tree: CgroupTree, host: Path, n: int, v1: bool) -> list[str]:
    uids = []
    for i in range(n):
        uid = new_uid()
        cid = new_cid()
        bundle(host, cid, i)
        cg = tree.container(uid, cid, qos=("burstable", "besteffort", "guaranteed")[i % 3])
        if v1:
            deny_all_then_allow(cg, ["c 1:3 rwm", "c *:* m", "c 195:255 rw", "c 195:0 rw"])
        tree.spawn(cg, {"NVIDIA_VISIBLE_DEVICES": GPU0_UUID} if i % 2 == 0 else {})
        uids.append(uid)
    return uids


def run_check(host: Path, cgroup_root: Path, uids: list[str]) -> tuple[float, int]:
    opts = ProbeOptions(host_root=host, cgroup_root=cgroup_root, trace_s=0,
                        only=("cgroup.devices",), focus_pods=tuple(uids), timeout_s=60)
    ctx = ProbeContext(opts, lambda rec: None)
    t0 = time.perf_counter()
    findings = list(cgroup_devices(ctx))
    return time.perf_counter() - t0, len(findings)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--containers", type=int, default=40)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        host = make_host_root(Path(tmp))
        for label, hroot, croot, v1 in (("v1", V1_DEVICES, Path("/sys/fs/cgroup"), True),
                                        ("v2", V2_UNIFIED, V2_UNIFIED, False)):
            tree = CgroupTree(hroot)
            try:
                uids = build(tree, host, a.containers, v1)
                times, n = [], 0
                for _ in range(a.runs):
                    t, n = run_check(host, croot, uids)
                    times.append(t)
                print(f"{label}: {a.containers} containers ({(a.containers + 1) // 2} GPU): "
                      f"median {statistics.median(times) * 1000:.1f} ms, "
                      f"max {max(times) * 1000:.1f} ms, findings {n}")
                if not v1:
                    cg = next(p for p in tree.top.rglob("*") if p.is_dir() and len(p.name) == 64)
                    hs = []
                    for _ in range(a.runs * 4):
                        r = cgroup_rules.check_access(cg, [(195, 255, [host / "dev/nvidiactl"])])
                        hs.append(r.duration_s)
                    print(f"v2 helper alone: median {statistics.median(hs) * 1000:.1f} ms "
                          f"over {len(hs)} runs")
            finally:
                tree.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())

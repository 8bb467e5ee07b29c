"""Benchmark: CPU cost of the GPU isolation check's /proc fd scan, against the agent's budget.

Method: N fake containers in real kubepods-shaped cgroup v1 directories (tests/cgroups
CgroupTree), each with M real `sleep` processes that hold K descriptors open (passed over exec
with pass_fds): one on the GPU node their pod-resources row gave them (a mknod'ed node in a temp
host root whose /proc/devices names the driver major, as tests/cgroups/test_gpu_isolation.py
does: major 1 so the kernel opens it) and K-1 on a regular file. The kubelet's pod-resources API
is the real gRPC fake on its socket, so every container is judged and the node is healthy (no
finding: the rows give time-slicing replicas `GPU-...::i`, so pods share a GPU by design): the
scan does all its work. Containers other tests leave on this machine are scanned too; their
count is printed.

Per case, in this process, CPU by process accounting (time.process_time, this process's user +
system time; getrusage of the children for the NVML child), median of --repeat passes:
  scan   gpu_holders.scan over every discovered container's pids (the check's fd scan alone)
  check  what the gpu.isolation check adds to a pass: the engine's Runner with the checks the
         watch already runs that produce its facts (containers, deviceplugin for pod-resources,
         nvml and its child), with and without gpu.isolation; the difference of the medians.
  watch_check  the same with the watch's cap (detect.ISOLATION_MAX_FDS descriptors a run);
         its status is `skipped` when the cap cut the scan.
Per-pass CPU / the 30 s default interval is the share of one CPU it adds to the agent
(budget 1% in total; bench/agent_watch.py measured the agent at 0.45-1.06% without it). The
watch cuts a run at detect.ISOLATION_MAX_FDS descriptors and paces runs to ISOLATION_SHARE of
one CPU (detect.IsolationPacer): `watch_runs_every_s` is how often it would run such a node.

Cases: 10x10 and 50x20 with K=32 (a CUDA process holds ~10-40), and a heavy container:
containers.MAX_PIDS pids x 4096 descriptors (measured on 2 containers; a node has maxPods 110
by default, so x110 is printed as an estimate). The caps (gpu_holders.MAX_PIDS processes of
gpu_holders.MAX_FDS descriptors) allow more per container than a pass can read: the scan stops
at the check's deadline and says so (the check is then `skipped`, never `ok`).

    .venv/bin/python bench/isolation_scan.py [--repeat 5] [--cases 10x10x32,50x20x32,2x64x4096]
Needs root (cgroups, mknod). Prints the numbers; asserts nothing.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from node_probe.engine import registry  # noqa: E402
from node_probe.engine.context import ProbeOptions  # noqa: E402
from node_probe.engine.runner import Runner  # noqa: E402
from node_probe.host import containers, gpu_holders  # noqa: E402
from node_probe.watch import detect  # noqa: E402
from tests.cgroups.conftest import (GPU0_UUID, GPU1_UUID, V1_DEVICES, CgroupTree,  # noqa: E402
                                    new_cid, new_uid)
from tests.cgroups.test_gpu_isolation import MAJOR, MINORS, bundle, host_root  # noqa: E402
from tests.fakes.fake_podresources import serve  # noqa: E402

SHARED = ("containers", "deviceplugin", "nvml")   # in the watch already: they produce its facts
INTERVAL_S = 30.0
BUDGET_PCT = 1.0
HEAVY_FDS = 4096


def build(tree: CgroupTree, root: Path, n: int, m: int, k: int, filler: Path) -> list[dict]:
    """n containers of m processes holding k descriptors each; their pod-resources rows."""
    rows = []
    uuids = [GPU0_UUID, GPU1_UUID]
    for i in range(n):
        uid, cid = new_uid(), new_cid()
        cg = tree.container(uid, cid)
        bundle(root, cid, "bench", f"job-{i}", uid, "main")
        gpu = uuids[i % 2]
        rows.append({"namespace": "bench", "pod": f"job-{i}", "container": "main",
                     "resource": "nvidia.com/gpu", "device_ids": [f"{gpu}::{i}"]})
        fds = [os.open(root / f"dev/nvidia{MINORS[gpu]}", os.O_RDONLY)]
        base = os.open(filler, os.O_RDONLY)
        fds.append(base)
        fds += [os.dup(base) for _ in range(k - 2)]
        try:
            for _ in range(m):
                tree.spawn(cg, pass_fds=tuple(fds), seconds=3600)
        finally:
            for fd in fds:
                os.close(fd)
    return rows


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def measure(root: Path, repeat: int) -> dict:
    opts = ProbeOptions(host_root=root, cgroup_root=Path("/sys/fs/cgroup"), trace_s=0.0,
                        timeout_s=60.0, kubelet_dir=root / "var/lib/kubelet",
                        only=SHARED + ("gpu.isolation",), skip=("trace",), provoke_plugin=False)
    _, found = containers.discover(opts.cgroup_dir, root)
    pids = [c.pids for c in found]
    scan, base, full, capped, fds_seen = [], [], [], [], 0

    def run(only, **kw):
        t, tc = time.process_time(), children_cpu()
        res = Runner(registry.select(only, opts.skip),
                     dataclasses.replace(opts, only=only, **kw),
                     lambda rec: None, fail_on="never").run()
        return res, time.process_time() - t + children_cpu() - tc

    for _ in range(repeat):
        t = time.process_time()
        held = [gpu_holders.scan(p, MAJOR).holders for p in pids]
        scan.append(time.process_time() - t)
        fds_seen = sum(len(h) for h in held)
        base.append(run(SHARED)[1])
        res, cpu = run(opts.only)
        full.append(cpu)
        wres, cpu = run(opts.only, isolation_max_fds=detect.ISOLATION_MAX_FDS)
        capped.append(cpu)
    status = {c.id: c.status for c in res.checks}
    med_scan = statistics.median(scan)
    med_check = max(0.0, statistics.median(full) - statistics.median(base))
    med_capped = max(0.0, statistics.median(capped) - statistics.median(base))
    return {"containers_seen": len(found), "pids_scanned": sum(len(p) for p in pids),
            "gpu_fds_found": fds_seen,
            "scan_cpu_s": round(med_scan, 4), "check_cpu_s": round(med_check, 4),
            "pass_without_check_cpu_s": round(statistics.median(base), 4),
            "scan_pct_of_one_cpu_at_30s": round(100 * med_scan / INTERVAL_S, 3),
            "check_pct_of_one_cpu_at_30s": round(100 * med_check / INTERVAL_S, 3),
            "check_status": status.get("gpu.isolation"),
            "watch_check_cpu_s": round(med_capped, 4),
            "watch_check_status": {c.id: c.status for c in wres.checks}.get("gpu.isolation"),
            "breaches": len([f for f in res.findings if f.id == "gpu.isolation_breach"])}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cases", default=f"10x10x32,50x20x32,"
                                       f"2x{containers.MAX_PIDS}x{HEAVY_FDS}")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(f"caps: containers.MAX_PIDS={containers.MAX_PIDS} per container, "
          f"gpu_holders.MAX_FDS={gpu_holders.MAX_FDS} per process, gpu_holders.MAX_PIDS="
          f"{gpu_holders.MAX_PIDS} processes per container, no cap on containers "
          f"(the check's deadline: it stops scanning with <1 s left)", flush=True)
    out = {}
    for case in a.cases.split(","):
        n, m, k = (int(x) for x in case.split("x"))
        tmp = Path(tempfile.mkdtemp(prefix="gdiso-", dir="/tmp"))
        tree = CgroupTree(V1_DEVICES)
        server = None
        try:
            root = host_root(tmp)
            filler = tmp / "filler"
            filler.write_bytes(b"x")
            rows = build(tree, root, n, m, k, filler)
            server = serve(root / "var/lib/kubelet/pod-resources/kubelet.sock", rows)
            r = measure(root, a.repeat)
            r["fds_per_pass"] = n * m * k
            r["scan_us_per_fd"] = round(1e6 * r["scan_cpu_s"] / (n * m * k), 2)
            # the watch: cut at ISOLATION_MAX_FDS, then paced to ISOLATION_SHARE of one CPU
            r["watch_runs_every_s"] = round(max(INTERVAL_S, r["watch_check_cpu_s"]
                                                / detect.ISOLATION_SHARE), 1)
            out[case] = r
            print(f"{n} containers x {m} processes x {k} fds: {json.dumps(r)}", flush=True)
        finally:
            if server is not None:
                server.stop(0)
            tree.cleanup()
            shutil.rmtree(tmp, ignore_errors=True)
    worst = out.get(f"2x{containers.MAX_PIDS}x{HEAVY_FDS}")
    if worst:
        per = worst["scan_cpu_s"] / 2
        print(f"heavy container: {per:.3f} s CPU per pass; x110 containers "
              f"(maxPods): {110 * per:.1f} s, i.e. {100 * 110 * per / INTERVAL_S:.0f}% of one "
              f"CPU at a 30 s interval before the check's deadline cuts it", flush=True)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

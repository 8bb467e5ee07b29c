"""Benchmark: the CPU one watch pass costs, and what each check adds to it.

Why: the watching agent must stay inside its own 5m CPU request (0.5 % of a CPU: 0.15 s of CPU
per pass at the default 30 s interval; issue 41 item 3), and every check added to the pass must
say what it costs there (issue 41 item 5: the slow-GPU checks add under 5 ms to a pass).

Method: the healthy fake GPU node of bench/agent_watch.py (host root with mknod'ed devices, the
C stand-in libnvidia-ml.so.1 with two GPUs, a real gRPC device plugin and pod-resources server
on the kubelet's sockets, a kernel log seeded from this machine's dmesg, the real cgroup tree).
Passes run exactly as the agent runs them (watch/passchild.PassRunner: a child forked from a
process that imported the checks and nothing else, as loop.py does: a worker process apart from
this one, whose gRPC servers would otherwise be inherited), after two warm-up passes. Variants are
interleaved round by round so that each sees the same load: the whole pass, then the pass
without each check of detect.WATCH_CHECKS in turn (a check a pass does not run is not run in
that variant; its fact producers still run when another check needs them). A pass's CPU is
user+sys of the forked child and every descendant it reaped (the NVML child), from
RUSAGE_CHILDREN, plus the NVML forkserver's own and reaped CPU (loop.py forks it once; it forks
each pass's NVML child); a check's added cost is the median whole pass minus the median pass without
it. Medians over --rounds (default 15). The machine's load is printed: compare before/after
in the same conditions, and prefer more rounds when it is loaded.

    .venv/bin/python bench/watch_pass_cost.py [--rounds 15] [--checks nvml,kmsg] [--budget-ms 5]

Needs root (cgroups, mknod). Prints the numbers; asserts nothing.
"""
from __future__ import annotations

import argparse
import dataclasses
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
sys.path.insert(0, str(REPO / "bench"))

import json  # noqa: E402
import subprocess  # noqa: E402

from installed_env import installed_env  # noqa: E402 (bench/)
from node_probe.engine import registry  # noqa: E402
from node_probe.engine.context import ProbeOptions  # noqa: E402
from node_probe.host import nvml_forkserver  # noqa: E402
from node_probe.watch import detect  # noqa: E402
from node_probe.watch.passchild import PassRunner  # noqa: E402

PASS_BUDGET_S = 0.15   # 0.5 % of one CPU at the default 30 s interval (the agent's 5m request)


def children_cpu() -> float:
    """This process's reaped children (the pass children) and the NVML forkserver with the
    children it reaped (each pass's NVML child), as the agent's tree."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    fs = nvml_forkserver.server()
    extra = 0.0
    if fs is not None:
        f = Path(f"/proc/{fs.pid}/stat").read_text().rsplit(")", 1)[1].split()
        extra = sum(int(x) for x in f[11:15]) / os.sysconf("SC_CLK_TCK")
    return r.ru_utime + r.ru_stime + extra


def one_pass(runner: PassRunner, base: ProbeOptions, skip: tuple[str, ...]) -> tuple[float,
                                                                                      dict]:
    c0 = children_cpu()
    res = runner.run(base, 20.0, skip=skip)
    cpu = children_cpu() - c0
    per = {c.id: (c.status, c.duration_s) for c in res.checks}
    per["_plugins"] = res.plugin_targets
    return cpu, per


def worker(spec: dict) -> dict:
    """The passes, in a process like the agent's (the checks imported, no gRPC loaded)."""
    base = ProbeOptions(**{k: Path(v) for k, v in spec["base"].items()})
    registry.select(detect.WATCH_CHECKS, ())  # imported once, as loop.py does
    nvml_forkserver.start()                    # and the NVML forkserver, as loop.py does
    runner = PassRunner()
    checks = [c for c in detect.WATCH_CHECKS if not spec["only"] or c in spec["only"]]
    for _ in range(2):
        _, per = one_pass(runner, base, ())
    # a quiet pass: the RPCs not due (detect.RpcPacer), the plugins as the last pass saw them
    quiet = dataclasses.replace(base, plugin_rpc=False,
                                plugin_targets_seen=tuple(per["_plugins"] or ()))
    variants = [("whole pass", base, ()), ("quiet pass", quiet, ())] + [
        (f"without {c}", base, (c,)) for c in checks]
    cpu: dict[str, list[float]] = {v: [] for v, _, _ in variants}
    walls: dict[str, list[float]] = {}
    statuses: dict[str, str] = {}
    for _ in range(spec["rounds"]):
        for label, opts, skip in variants:
            c, per = one_pass(runner, opts, skip)
            cpu[label].append(c)
            if label == "whole pass":
                for cid, v in per.items():
                    if not cid.startswith("_"):
                        walls.setdefault(cid, []).append(v[1])
                        statuses[cid] = v[0]
            elif label == "quiet pass":
                statuses["_quiet_deviceplugin"] = per.get("deviceplugin", ("-",))[0]
    return {"checks": checks, "cpu": cpu, "walls": walls, "statuses": statuses}


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        print(json.dumps(worker(json.loads(sys.argv[2]))))
        return 0
    from agent_watch import Node
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--checks", default="", help="only these checks' added costs (comma list; "
                                                 "default: every check of the pass)")
    ap.add_argument("--budget-ms", type=float, default=5.0,
                    help="what a check may add to a pass (issue 41 item 5: the slow checks)")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gdp-", dir="/tmp"))
    n = Node(tmp)
    try:
        spec = {"base": {"host_root": str(n.root), "cgroup_root": "/sys/fs/cgroup",
                         "kubelet_dir": str(n.kubelet), "kmsg_file": str(n.kmsg)},
                "rounds": a.rounds, "only": [c for c in a.checks.split(",") if c]}
        t0 = time.monotonic()
        got = json.loads(subprocess.run(
            [sys.executable, __file__, "--worker", json.dumps(spec)], check=True,
            stdout=subprocess.PIPE, cwd=REPO, env=installed_env(PYTHONPATH=str(REPO)),
            timeout=3600).stdout.decode().strip().splitlines()[-1])
        checks, cpu, walls, statuses = (got["checks"], got["cpu"], got["walls"],
                                        got["statuses"])
        whole = statistics.median(cpu["whole pass"])
        print(f"{a.rounds} rounds in {time.monotonic() - t0:.0f}s (load average "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
        print(f"whole pass: median {whole * 1000:.1f} ms CPU (min {min(cpu['whole pass']) * 1000:.1f}"
              f"), {100 * whole / 30:.2f} % of a CPU at the 30 s interval; budget "
              f"{PASS_BUDGET_S * 1000:.0f} ms (0.5 %) -> "
              f"{'OK' if whole < PASS_BUDGET_S else 'OVER BUDGET'}")
        q = statistics.median(cpu["quiet pass"])
        print(f"quiet pass (device-plugin RPCs not due, deviceplugin "
              f"{statuses.get('_quiet_deviceplugin')}): median {q * 1000:.1f} ms CPU, "
              f"{100 * q / 30:.2f} % of a CPU; with the RPCs every "
              f"{detect.RPC_MAX_GAP_S / 30:g} passes at most: "
              f"{100 * (q * (detect.RPC_MAX_GAP_S / 30 - 1) + whole) / detect.RPC_MAX_GAP_S:.2f} "
              f"% -> {'OK' if (q * 3 + whole) / 4 < PASS_BUDGET_S else 'OVER BUDGET'}")
        print(f"{'check':<16} {'status':<8} {'wall ms':>8} {'adds ms CPU':>12}  "
              f"(budget {a.budget_ms:g} ms)")
        for c in checks:
            added = whole - statistics.median(cpu[f"without {c}"])
            wall = statistics.median(walls.get(c) or [0.0]) * 1000
            print(f"{c:<16} {statuses.get(c, '-'):<8} {wall:8.1f} {added * 1000:12.1f}  "
                  f"{'OK' if added * 1000 < a.budget_ms else 'OVER'}")
    finally:
        n.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

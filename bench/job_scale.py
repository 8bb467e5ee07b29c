"""Benchmark: `kubectl gpu-doctor job NAME` on a 512-node job, wall time and peak RSS of the CLI.

Issue 39's budget: a 512-node job answered API side within 10 s, and with the agents' node side
(`--probe`) within 30 s, in under 512 MiB; a node that does not answer is named, not waited on.
The fake API server (kmock over TCP, the exec protocol of tests/kubectl/fakeexec.py) serves
576 GPU nodes, a PyTorchJob of 512 pods (one per node, labelled and owned as the Kubeflow
training operator writes them) among background pods, one node NotReady; for the node side a
Running agent pod on every node of the job whose exec answers a recorded probe stream
(tests/kubectl/data/probe_stream.ndjson: NVML init hanging on one node, healthy elsewhere),
and one node whose exec never answers. Times the real CLI as a user runs it (a fresh process)
through the launcher of bench/nodes_scale.py (the CLI's and its children's peak RSS, summed).
Prints the numbers; it does not assert them (timing belongs in benchmarks, not in tests).

    .venv/bin/python bench/job_scale.py [--nodes 512] [--background 8000] [--runs 2]
"""
from __future__ import annotations

import argparse
import contextvars
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from installed_env import installed_env  # noqa: E402 (bench/, beside this script)

from bench.nodes_scale import LAUNCHER  # noqa: E402
from tests.kubectl import jobkinds  # noqa: E402
from tests.kubectl.fakeexec import ExecCluster  # noqa: E402

_NODE: contextvars.ContextVar = contextvars.ContextVar("node", default=None)
DATA = REPO / "tests" / "kubectl" / "data"


class JobCluster(ExecCluster):
    """The exec of each agent pod answers as its node would (by the pod's node)."""

    async def _exec(self, req, ns, name):  # noqa: ANN001 - the fake's signature
        pod = self.pods.get((ns, name)) or {}
        _NODE.set((pod.get("spec") or {}).get("nodeName"))
        return await super()._exec(req, ns, name)


def build(fc: JobCluster, nodes: int, background: int, d: Path) -> dict:
    names = [f"gpu-{i:04d}" for i in range(nodes + 64)]
    for n in names:
        fc.add_node(n, ready=(n != "gpu-0137"))
    job_nodes = names[:nodes]
    jobkinds.pytorchjob(fc, "ml", "train", job_nodes)
    for i in range(background):
        fc.add_pod("team", f"svc-{i}", names[i % len(names)], events="none")
    full = (DATA / "probe_stream.ndjson").read_bytes()
    (d / "bad.ndjson").write_bytes(full)
    (d / "ok.ndjson").write_bytes(b"\n".join(
        ln for ln in full.split(b"\n") if b'"nvml.init_hang"' not in ln))
    odd, silent = job_nodes[300 % nodes], job_nodes[400 % nodes]

    def argv(cmd: list[str]) -> list[str]:
        node = _NODE.get()
        if node == silent:
            return ["sleep", "600"]
        return ["cat", str(d / ("bad.ndjson" if node == odd else "ok.ndjson"))]
    fc.exec_argv = argv
    return {"job_nodes": job_nodes, "odd": odd, "silent": silent}


def run(launcher, kc: Path, d: Path, *extra: str) -> tuple[dict, dict]:
    env = installed_env(PYTHONPATH=str(REPO), NO_COLOR="1")  # bytecode as installed
    so, se = d / "out", d / "err"
    launcher.stdin.write(json.dumps({
        "argv": [sys.executable, "-m", "kubectl_gpudoctor", "job", "train", "-n", "ml",
                 "--kubeconfig", str(kc), "-o", "json", *extra],
        "env": env, "cwd": str(REPO), "out": str(so), "err": str(se)}) + "\n")
    launcher.stdin.flush()
    res = json.loads(launcher.stdout.readline())
    try:
        doc = json.loads(so.read_text())
    except ValueError:
        doc = {"error": se.read_text()[-2000:]}
    return res, doc


def say(what: str, res: dict, doc: dict) -> None:
    tree = max(res["tree_peak_kib"], res["hwm_sum_kib"]) / 1024
    v = doc.get("verdict") or {}
    rows = doc.get("nodes") or []
    late = [r["node"] for r in rows if r.get("probe") == "no answer"]
    print(f"{what}: {res['wall']:.2f}s wall, {res['cpu_s']:.2f}s CPU, peak RSS "
          f"{res['maxrss_kib'] / 1024:.0f} MiB (with children, peaks added: {tree:.0f} MiB), "
          f"exit {res['rc']}; {len(rows)} nodes, differ: {(doc.get('job') or {}).get('differ')}"
          f", no answer: {late}; verdict: {str(v.get('headline'))[:110]!r}")
    if "error" in doc:
        print(doc["error"])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=512)
    ap.add_argument("--background", type=int, default=8000)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=64)
    a = ap.parse_args()
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
    fc = JobCluster()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp)
            info = build(fc, a.nodes, a.background, d)
            fc.start()
            kc = fc.kubeconfig(d / "kubeconfig", "ml")
            print(f"{a.nodes}-node PyTorchJob, {len(fc.nodes)} nodes, {len(fc.pods)} pods; "
                  f"NotReady gpu-0137, NVML hang on {info['odd']}, no answer from "
                  f"{info['silent']}")
            for i in range(a.runs):
                say(f"API side, run {i + 1}", *run(launcher, kc, d))
            for n in info["job_nodes"]:
                fc.add_agent_pod(n)
            for i in range(a.runs):
                say(f"with agents (--probe, --concurrency {a.concurrency}, --timeout 25s), "
                    f"run {i + 1}",
                    *run(launcher, kc, d, "--probe", "--concurrency", str(a.concurrency),
                         "--timeout", "25s", "--trace-seconds", "0"))
    finally:
        fc.stop()
        launcher.stdin.close()
        launcher.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())

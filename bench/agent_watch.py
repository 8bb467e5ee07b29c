"""Benchmark: the agent in watch mode: steady RSS and CPU, and fault-to-condition latency.

Method: a healthy fake GPU node on this machine: a temp host root made like the cgroup tests'
(proc/devices, proc/driver/nvidia/gpus, mknod'ed /dev/nvidia*), the C stand-in libnvidia-ml.so.1
(two GPUs) that the NVML child loads each pass, a real gRPC device plugin (tests/fakes) and a
pod-resources server on the kubelet's sockets, a kernel log file seeded from this machine's
`dmesg`, the real /sys/fs/cgroup. The REAL `python -m node_probe agent-watch` runs with its
DEFAULT interval (30 s) against the fake API server behind real TLS (tests/watch/fakeapi.py).

Steady: after the first pass, the agent's VmRSS is sampled every 5 s and its CPU is read from
/proc/PID/stat (utime+stime+cutime+cstime of the agent and of every live descendant: the pass
children, the NVML forkserver and the NVML child it forks each pass) over --steady-seconds;
CPU % = CPU seconds / wall seconds of that window.

Latency: for each class a fault is started at a random phase of the interval, and the time
until the fake API server holds the class's condition True is taken; then the fault is removed
and the condition awaited False (hysteresis: 2 passes). Faults: the plugin wedged in NVML init
(the stand-in's nvmlInit blocks and the kubelet's GetPreferredAllocation call wedges a plugin
thread), an Xid 95 flood and a hung-task report appended to the kernel log, a GPU container's
device rules rewritten without its devices (real cgroup v1), the stand-in NVML reporting a GPU
lost, an NVSwitch without a fabric manager. Memory thrash is not provoked here (a real thrash on
this shared 2-CPU machine; tests/memory measures its detection).

    .venv/bin/python bench/agent_watch.py [--steady-seconds 600] [--classes all|none|A,B]
        [--xid-storm 200000 --storm-seconds 90]

Xid storm (--xid-storm): after the steady window, 200,000 Xid lines are appended to the kernel
log and the RSS of the agent's whole process tree (the agent, each pass's forked child, the NVML
child, the evidence capture's probe) is sampled every 0.2 s; each role's peak and the peak sum
are printed beside the container's 384 MiB limit.
Needs root (cgroups, mknod). Prints the numbers; asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from installed_env import installed_env  # noqa: E402 (bench/, beside this script)

from tests.cgroups.conftest import (GPU0_UUID, GPU1_UUID, V1_DEVICES, CgroupTree,  # noqa: E402
                                    deny_all_then_allow, make_host_root, new_cid, new_uid)
from tests.cgroups.test_audit_v1 import BASE, GPU0_NO_UVM  # noqa: E402
from tests.fakes.fake_podresources import serve as serve_podresources  # noqa: E402
from tests.fakes.nvml import FakeGpu, build_fake_nvml, config_text  # noqa: E402
from tests.watch.fakeapi import NodeStatusCluster, TlsFront, make_ca  # noqa: E402

NODE = "gpu-bench-1"
FAKE_PLUGIN = REPO / "tests/fakes/fake_device_plugin.py"


def gpus(lost: bool = False):
    return (FakeGpu(GPU0_UUID, minor=0, pci_bus_id="00000000:3B:00.0", lost=1 if lost else 0),
            FakeGpu(GPU1_UUID, minor=1, pci_bus_id="00000000:3C:00.0"))


class Node:
    def __init__(self, tmp: Path) -> None:
        self.root = make_host_root(tmp, gpus=((0, GPU0_UUID), (1, GPU1_UUID)))
        (self.root / "proc/driver/nvidia/version").write_text(
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.172.08  Sun Jul  6 2025\n")
        self.libdir = self.root / "usr/lib/x86_64-linux-gnu"
        self.lib = build_fake_nvml(self.libdir, init="ok", driver_version="570.172.08",
                                   gpus=gpus())
        self.kubelet = self.root / "var/lib/kubelet"
        (self.kubelet / "device-plugins").mkdir(parents=True)
        k = socket.socket(socket.AF_UNIX)
        k.bind(str(self.kubelet / "device-plugins/kubelet.sock"))
        k.close()
        self.podres = serve_podresources(self.kubelet / "pod-resources/kubelet.sock", [])
        self.kmsg = tmp / "kmsg.txt"
        dm = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=30).stdout
        self.kmsg_base = "\n".join(line for line in dm.splitlines()
                                   if "Xid" not in line and "blocked for more" not in line)
        self.kmsg.write_text(self.kmsg_base + "\n")
        self.plugin = None
        self.tree = CgroupTree(V1_DEVICES)
        self.start_plugin()

    def start_plugin(self) -> None:
        sock = self.kubelet / "device-plugins/nvidia-gpu.sock"
        if sock.exists():
            sock.unlink()
        # the plugin container's /dev holds what the host root's /dev holds (else the agent
        # rightly reports deviceplugin.stale_dev_view against this machine's GPU-less /dev)
        nodes = [(p.name, os.major(p.stat().st_rdev), os.minor(p.stat().st_rdev))
                 for p in sorted((self.root / "dev").iterdir()) if p.is_char_device()]
        nodes += [("null", 1, 3), ("zero", 1, 5), ("urandom", 1, 9), ("random", 1, 8)]
        mk = " && ".join(f"mknod -m 666 /dev/{a} c {b} {c}" for a, b, c in nodes)
        cmd = " ".join([sys.executable, str(FAKE_PLUGIN), "--socket", str(sock), "--mode",
                        "nvml-block", "--devices", f"{GPU0_UUID},{GPU1_UUID}", "--nvml-lib",
                        str(self.lib)])
        self.plugin = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
             f"mount -t tmpfs gdbench-dev /dev && {mk} && exec {cmd}"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        line = self.plugin.stdout.readline()
        assert b"READY" in line, line

    def nvml(self, **kw) -> None:
        (self.libdir / "fake_nvml.conf").write_text(
            config_text(driver_version="570.172.08", **kw))

    def close(self) -> None:
        if self.plugin and self.plugin.poll() is None:
            os.kill(self.plugin.pid, signal.SIGKILL)
            self.plugin.wait(10)
        self.podres.stop(0)
        self.tree.cleanup()


# -- faults: start() -> stop() ---------------------------------------------------------------
def fault_plugin(n: Node):
    from node_probe.deviceplugin import rpc
    n.nvml(init="block", gpus=gpus())
    with rpc.PluginClient(str(n.kubelet / "device-plugins/nvidia-gpu.sock")) as c:
        c.preferred_allocation([GPU0_UUID], 1, 0.5)   # the kubelet's call wedges a thread

    def stop():
        n.nvml(init="ok", gpus=gpus())
        os.kill(n.plugin.pid, signal.SIGKILL)
        n.plugin.wait(10)
        n.start_plugin()
    return stop


def fault_xid(n: Node):
    with open(n.kmsg, "a") as f:
        for i in range(3000):
            f.write(f"[{90000 + i / 1000:.3f}] NVRM: Xid (PCI:0000:3b:00): 95, pid=77, "
                    f"name=python, Uncontained ECC error\n")
    return lambda: n.kmsg.write_text(n.kmsg_base + "\n")


def fault_hung(n: Node):
    with open(n.kmsg, "a") as f:
        f.write("[90000.0] INFO: task nvidia-device-p:4242 blocked for more than 120 seconds.\n")
    return lambda: n.kmsg.write_text(n.kmsg_base + "\n")


def fault_cgroup(n: Node):
    cg = n.tree.container(new_uid(), new_cid())
    deny_all_then_allow(cg, GPU0_NO_UVM + ["c 237:0 rw", "c 237:1 rw"])
    n.tree.spawn(cg, {"NVIDIA_VISIBLE_DEVICES": GPU0_UUID})
    deny_all_then_allow(cg, BASE)   # the rewrite

    def stop():
        deny_all_then_allow(cg, GPU0_NO_UVM + ["c 237:0 rw", "c 237:1 rw"])
    return stop


def fault_lost(n: Node):
    n.nvml(init="ok", gpus=gpus(lost=True))
    return lambda: n.nvml(init="ok", gpus=gpus())


def fault_fabric(n: Node):
    d = n.root / "proc/driver/nvidia-nvswitch/devices/0000:05:00.0"
    d.mkdir(parents=True)
    return lambda: shutil.rmtree(n.root / "proc/driver/nvidia-nvswitch")


FAULTS = {"GpuDoctorDevicePluginStuck": fault_plugin, "GpuDoctorXidErrors": fault_xid,
          "GpuDoctorKernelHungTask": fault_hung, "GpuDoctorDeviceAccessLost": fault_cgroup,
          "GpuDoctorGpuLost": fault_lost, "GpuDoctorFabricNotReady": fault_fabric}


def cpu_s(pid: int, children: bool = True) -> float:
    """CPU seconds of `pid` alone, or (children) of its whole tree: its utime+stime, its reaped
    children's cutime+cstime, and the same of every live descendant -- the NVML forkserver is
    a long-lived child of the agent, and the NVML child of each pass is reaped by it, not by
    the agent, so its CPU shows in the agent's cutime only when the forkserver exits."""
    tck = os.sysconf("SC_CLK_TCK")
    if not children:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return sum(int(x) for x in f[11:13]) / tck
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            f = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            kids = [int(x) for t in Path(f"/proc/{p}/task").iterdir()
                    for x in (t / "children").read_text().split()]
        except (OSError, ValueError):
            continue
        total += sum(int(x) for x in f[11:15])
        todo += kids
    return total / tck


def forkserver_pid(pid: int) -> int | None:
    """The agent's NVML forkserver (host/nvml_forkserver.py names it nvml-forkserver)."""
    for t in Path(f"/proc/{pid}/task").iterdir():
        for x in (t / "children").read_text().split():
            try:
                if Path(f"/proc/{x}/comm").read_text().strip() == "nvml-forkserver":
                    return int(x)
            except OSError:
                pass
    return None


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def private_kib(pid: int) -> int:
    """Private_Clean + Private_Dirty (/proc/PID/smaps_rollup): the pages no other process maps."""
    n = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith(("Private_Clean:", "Private_Dirty:")):
            n += int(line.split()[1])
    return n


def tree_rss_kib(pid: int) -> dict[int, tuple[str, int]]:
    """{pid: (role, VmRSS KiB)} of the agent and every descendant (pass child, NVML child,
    capture child and its own children)."""
    out, todo = {}, [pid]
    while todo:
        p = todo.pop()
        try:
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
            kids = [int(x) for t in Path(f"/proc/{p}/task").iterdir()  # per forking thread
                    for x in (t / "children").read_text().split()]
            rss = rss_kib(p)
        except (OSError, ValueError):
            continue
        try:
            comm = Path(f"/proc/{p}/comm").read_text().strip()
        except OSError:
            comm = ""
        role = "agent" if p == pid else ("capture" if b"-o" in cmd and b"jsonl" in cmd else
                                         "forkserver" if comm == "nvml-forkserver" else
                                         "nvml" if comm == "nvml-child" or
                                         any(b"nvml" in c for c in cmd) else
                                         "pass" if b"agent-watch" in cmd else "other")
        out[p] = (role, rss)
        todo += kids
    return out


def storm(agent_pid: int, kmsg: Path, lines: int, seconds: float) -> dict:
    """X-02: a 200,000-line Xid storm (the driver's own wording, as the audit's x01_xid_flood
    wrote it) appended to the kernel log; the agent's process tree sampled every 0.2 s: the
    peak of each role and of the sum, against the container's 384 MiB limit."""
    text = "".join(f"[{1000 + i * 0.0001:.6f}] NVRM: Xid (PCI:0000:3b:00): 79, pid={4000 + i % 97}"
                   f", name=python, GPU has fallen off the bus.\n" for i in range(lines))
    with open(kmsg, "a") as f:
        f.write(text)
    peak: dict[str, int] = {}
    total, at_peak = 0, {}
    t0 = time.monotonic()
    end = t0 + seconds
    while time.monotonic() < end:
        t = tree_rss_kib(agent_pid)
        s = 0
        for role, kib in t.values():
            peak[role] = max(peak.get(role, 0), kib)
            s += kib
        if s > total:
            total = s
            at_peak = {"t_s": round(time.monotonic() - t0, 1),
                       "processes": sorted((r, round(k / 1024, 1)) for r, k in t.values())}
        time.sleep(0.2)
    return {"lines": lines, "bytes": len(text), "window_s": seconds,
            "peak_rss_mib": {k: round(v / 1024, 1) for k, v in sorted(peak.items())},
            "peak_tree_rss_mib": round(total / 1024, 1), "at_the_peak": at_peak,
            "container_limit_mib": 384,
            "agent_rss_mib_after": round(rss_kib(agent_pid) / 1024, 1)}


def wait(pred, timeout: float):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.2)
    return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steady-seconds", type=float, default=600)
    ap.add_argument("--classes", default="all")
    ap.add_argument("--interval", default="30s")
    ap.add_argument("--xid-storm", type=int, default=0, metavar="LINES",
                    help="after the steady window, append this many Xid lines (X-02: 200000) "
                         "and report the process tree's peak RSS")
    ap.add_argument("--storm-seconds", type=float, default=90)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gdw-", dir="/tmp"))
    ca, crt, key = make_ca(tmp)
    fc = NodeStatusCluster().start()
    front = TlsFront(fc.url, crt, key)
    fc.add_capture_node(NODE)
    fc.tokens["bench-token"] = NODE
    (tmp / "token").write_text("bench-token\n")
    n = Node(tmp)
    env = installed_env(PYTHONPATH=str(REPO), KUBERNETES_SERVICE_HOST="127.0.0.1",
                        KUBERNETES_SERVICE_PORT=str(front.port))  # bytecode as installed
    args = [sys.executable, "-m", "node_probe", "agent-watch", "--node-name", NODE,
            "--interval", a.interval, "--host-root", str(n.root),
            "--kubelet-dir", str(n.kubelet), "--cgroup-root", "/sys/fs/cgroup",
            "--kmsg-file", str(n.kmsg), "--evidence-dir", str(tmp / "evidence"),
            "--api-token-file", str(tmp / "token"), "--api-ca-file", str(ca)]
    log = open(tmp / "agent.log", "wb")
    agent = subprocess.Popen(args, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log)
    out: dict = {"interval": a.interval}

    def conds():
        return {c["type"]: c for c in fc.nodes[NODE]["status"]["conditions"]}

    try:
        assert wait(lambda: "GpuDoctorWatching" in conds(), 120), "no first PATCH"
        base = {k: v["status"] for k, v in conds().items() if k.startswith("GpuDoctor")}
        out["baseline_true"] = sorted(k for k, v in base.items()
                                      if v == "True" and k != "GpuDoctorWatching")
        print("baseline conditions True:", out["baseline_true"], flush=True)
        if a.steady_seconds > 0:
            t0, c0, s0 = time.monotonic(), cpu_s(agent.pid), cpu_s(agent.pid, False)
            rss, fs_rss, fs_private = [], [], []
            while time.monotonic() - t0 < a.steady_seconds:
                rss.append(rss_kib(agent.pid))
                fs = forkserver_pid(agent.pid)
                if fs:
                    fs_rss.append(rss_kib(fs))
                    fs_private.append(private_kib(fs))
                time.sleep(5)
            wall, cpu = time.monotonic() - t0, cpu_s(agent.pid) - c0
            own = cpu_s(agent.pid, False) - s0
            out["steady"] = {"window_s": round(wall, 1), "cpu_s": round(cpu, 2),
                             "cpu_s_agent_alone": round(own, 2),
                             "captures_during_window": len(list((tmp / "evidence").glob("b*"))),
                             "cpu_pct_of_one_cpu": round(100 * cpu / wall, 3),
                             "rss_mib_max": round(max(rss) / 1024, 1),
                             "rss_mib_median": round(sorted(rss)[len(rss) // 2] / 1024, 1),
                             "forkserver_rss_mib_max": round(max(fs_rss) / 1024, 1)
                             if fs_rss else None,
                             # what it does not share with the agent (it is the agent's fork)
                             "forkserver_private_mib_max": round(max(fs_private) / 1024, 1)
                             if fs_private else None,
                             "patches": len(fc.patches)}
            print("steady:", json.dumps(out["steady"]), flush=True)
        if a.xid_storm:
            out["xid_storm"] = storm(agent.pid, n.kmsg, a.xid_storm, a.storm_seconds)
            print("xid storm:", json.dumps(out["xid_storm"]), flush=True)
        classes = list(FAULTS) if a.classes == "all" else \
            ([] if a.classes == "none" else a.classes.split(","))
        out["latency_s"] = {}
        interval = float(a.interval.rstrip("s"))
        for ct in classes:
            if conds()[ct]["status"] == "True":
                out["latency_s"][ct] = "already True at baseline"
                continue
            time.sleep(random.uniform(0, interval))   # a random phase of the interval
            stop = FAULTS[ct](n)
            t = time.monotonic()
            ok = wait(lambda: conds()[ct]["status"] == "True", 180)
            lat = round(time.monotonic() - t, 1) if ok else None
            reason = conds()[ct]["reason"]
            out["latency_s"][ct] = {"latency_s": lat, "reason": reason}
            print(f"{ct}: {lat} s ({reason})", flush=True)
            stop()
            t = time.monotonic()
            ok = wait(lambda: conds()[ct]["status"] == "False", 240)
            out["latency_s"][ct]["cleared_after_s"] = round(time.monotonic() - t, 1) if ok \
                else None
        out["events"] = sorted({e["reason"] for e in fc.posted_events})
        out["bundles"] = len(list((tmp / "evidence").glob("bundle-*.json")))
        out["agent_rss_mib_end"] = round(rss_kib(agent.pid) / 1024, 1)
    finally:
        if agent.poll() is None:
            os.kill(agent.pid, signal.SIGTERM)
            try:
                agent.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(agent.pid, signal.SIGKILL)
        n.close()
        front.close()
        fc.stop()
    print(json.dumps(out, indent=1))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

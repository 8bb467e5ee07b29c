"""Benchmark: what the slow-GPU questions (issue 38) add to each agent pass.

Method: the C stand-in libnvidia-ml.so.1 (tests/fakes) with 8 GPUs, each with 18 NVLink links,
loaded by pynvml in this process. Times (CPU, time.process_time) of:
  1. the NVML child's inventory() as before (slow_facts replaced by a no-op) and with the new
     queries (PCIe link, utilisation, clocks and reasons, temperatures, power, 18 NVLink links
     x 4 counters, ECC, pending retirements): the difference is the NVML child's new cost;
  2. the gpu.slow check's own work: the sysfs link chain of 8 GPUs (4 levels each, real files
     in a temp tree) and every judge over the records.
  3. a whole watch pass (detect.run_pass, the agent's cheap checks) on that node, with and
     without gpu.slow in WATCH_CHECKS: CPU of this process and of its children (the NVML
     child) per pass, median of --passes passes each.
Each of 1-2 is the median of --rounds runs. On the real driver each NVML query is an ioctl into the
kernel module (microseconds to tens of microseconds); the stand-in answers from memory, so (1)
measures pynvml's and ctypes' part only -- to be re-measured on a real GPU.

    .venv/bin/python bench/slow_gpu_cost.py [--rounds 50]
Prints the numbers; asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fakes.nvml import FakeGpu, build_fake_nvml  # noqa: E402


def _cpu_ms(fn, rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        t0 = time.process_time()
        fn()
        samples.append((time.process_time() - t0) * 1000)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--passes", type=int, default=7)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="slow-bench-"))
    gpus = [FakeGpu(f"GPU-{i:08d}-0000-0000-0000-000000000000", minor=i,
                    pci_bus_id=f"00000000:{0x18 + i * 0x10:02X}:00.0",
                    attrs=(("util_gpu", 100), ("nvlinks", 18), ("pcie_gen_cur", 5)))
            for i in range(8)]
    lib = build_fake_nvml(tmp / "lib", gpus=gpus)
    import ctypes

    import pynvml
    from node_probe.host import nvml_child
    pynvml.nvmlLib = ctypes.CDLL(str(lib))
    pynvml.nvmlInit()
    real = nvml_child.slow_facts
    nvml_child.slow_facts = lambda *args: None
    before = _cpu_ms(lambda: nvml_child.inventory(pynvml), a.rounds)
    nvml_child.slow_facts = real
    after = _cpu_ms(lambda: nvml_child.inventory(pynvml), a.rounds)
    records = nvml_child.inventory(pynvml)["gpus"]
    pynvml.nvmlShutdown()

    root = tmp / "host"
    for g in records:
        bdf = g["pci_bus_id"][4:].lower()
        bus = int(bdf[5:7], 16)
        path = root / "sys/devices/pci0000:00"
        for b in (f"0000:00:{bus // 16:02x}.0", f"0000:{bus - 2:02x}:00.0",
                  f"0000:{bus - 1:02x}:00.0", bdf):
            path = path / b
            path.mkdir(parents=True, exist_ok=True)
            for name, v in (("current_link_speed", "32.0 GT/s PCIe"), ("current_link_width", "16"),
                            ("max_link_speed", "32.0 GT/s PCIe"), ("max_link_width", "16"),
                            ("numa_node", "0")):
                (path / name).write_text(v + "\n")
            link = root / "sys/bus/pci/devices" / b
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.is_symlink():
                os.symlink(os.path.relpath(path, link.parent), link)
    from node_probe.checks import slow_gpu
    from node_probe.checks.slow import judge

    def check_work():
        links, _ = slow_gpu.gpu_links(root, records)
        judge.judge_gpus(records, links, {})

    work = _cpu_ms(check_work, a.rounds)
    print(f"NVML child inventory of 8 GPUs: {before:.2f} ms before, {after:.2f} ms with the "
          f"slow-GPU queries (+{after - before:.2f} ms CPU, stand-in library)")
    print(f"gpu.slow check's own work (sysfs chains of 8 GPUs + judges): {work:.2f} ms CPU")
    print(f"new cost per pass: {after - before + work:.2f} ms")
    whole_pass(tmp, gpus, a.passes)


def whole_pass(tmp: Path, gpus, passes: int) -> None:
    import resource

    from node_probe.engine.context import ProbeOptions
    from node_probe.watch import detect
    root = tmp / "passroot"
    build_fake_nvml(root / "usr/lib/x86_64-linux-gnu", gpus=gpus)
    (tmp / "proc").mkdir(exist_ok=True)
    kmsg = tmp / "kmsg.txt"
    kmsg.write_text("[1.0] Linux version 6.1\n")
    opts = ProbeOptions(host_root=root, cgroup_root=tmp / "cg", proc_root=tmp / "proc",
                        kmsg_file=kmsg)

    def cpu() -> float:
        s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime

    full = detect.WATCH_CHECKS
    res = {}
    for label, checks in (("without gpu.slow", tuple(c for c in full if c != "gpu.slow")),
                          ("with gpu.slow", full)):
        detect.WATCH_CHECKS = checks
        samples = []
        for _ in range(passes):
            t0 = cpu()
            detect.run_pass(opts, 20.0)
            samples.append((cpu() - t0) * 1000)
        res[label] = statistics.median(samples)
        print(f"watch pass {label}: {res[label]:.1f} ms CPU (median of {passes})")
    detect.WATCH_CHECKS = full
    print(f"watch pass difference: {res['with gpu.slow'] - res['without gpu.slow']:+.1f} ms CPU")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Cost of the eBPF probes: compile+attach time, probe peak RSS, and per-syscall overhead.

Prints (the budgets of the README's "Measured" table in brackets):
  - compile+attach of all programs as the probe does it, in fresh processes [< 2 s]
  - peak RSS of `python -m node_probe --only trace` and of a full probe run [< 300 MiB]
  - the CPU time a 2-million-iteration ioctl loop gains per call when
      (a) its fd is not traced (the in-kernel filter rejects it), and
      (b) its fd is traced (opened under the device prefix: counted and timed),
    beside the floor: the same syscall tracepoints with an empty BPF program each.
    [(a) within 1.1x of the floor's added cost, (b) within 1.5x]
    The probes as shipped time ioctls with the kernel tick; "ns clock" is the same programs
    timing with bpf_ktime_get_ns (TraceConfig.precise_ioctl_clock), shown for comparison.
Each loop measures its own CPU time (getrusage: user + sys) because the machine is noisy;
conditions are interleaved round by round and medians reported. Needs root and BCC.
Usage: .venv/bin/python bench/bpf_cost.py [--rounds 5] [--iterations 2000000]
"""
from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from node_probe.tracing import bcc_env, bundle  # noqa: E402
from node_probe.tracing import cgroup_devices, fdtrack, nvidia_dev  # noqa: E402
from node_probe.tracing.loader import TraceConfig  # noqa: E402
from node_probe.tracing.session import TraceSession  # noqa: E402

LOOP_C = r"""
/* ioctl_loop PATH N: N x ioctl(fd, FIONREAD) on PATH; prints the loop's own CPU seconds. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <unistd.h>
static double cpu(void) {
    struct rusage r; getrusage(RUSAGE_SELF, &r);
    return r.ru_utime.tv_sec + r.ru_utime.tv_usec / 1e6 + r.ru_stime.tv_sec + r.ru_stime.tv_usec / 1e6;
}
int main(int argc, char **argv) {
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0) { perror("open"); return 1; }
    long n = atol(argv[2]);
    int avail;
    double t0 = cpu();
    for (long i = 0; i < n; i++) ioctl(fd, FIONREAD, &avail);
    printf("%.6f\n", cpu() - t0);
    return 0;
}
"""

TRACEPOINTS = [*fdtrack.TRACEPOINTS, *nvidia_dev.TRACEPOINTS, *cgroup_devices.TRACEPOINTS]
# The floor: one empty program per real program, attached to exactly the same tracepoints.
EMPTY = "".join(f"int {fn}(void *ctx) {{ return 0; }}\n"
                for fn in dict.fromkeys(fn for _e, fn in TRACEPOINTS)).encode()


def build_loop(workdir: Path) -> Path:
    digest = hashlib.sha256(LOOP_C.encode()).hexdigest()[:12]
    exe = Path(tempfile.gettempdir()) / f"gpu-doctor-ioctl-loop-{digest}"
    if not exe.exists():
        src = workdir / "ioctl_loop.c"
        src.write_text(LOOP_C)
        subprocess.run(["gcc", "-O2", "-o", str(exe), str(src)], check=True, timeout=60)
    return exe


def run_loop(exe: Path, path: Path, n: int) -> float:
    out = subprocess.run([str(exe), str(path), str(n)], capture_output=True, text=True,
                         timeout=300, check=True)
    return float(out.stdout.strip())


def compile_attach_in_child(prefix: str) -> tuple[float, float, float]:
    """(compile_s, attach_s, peak RSS MiB) of a fresh process doing what the probe does."""
    code = (
        "import resource, sys, time\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from pathlib import Path\n"
        "from node_probe.tracing.loader import TraceConfig\n"
        "from node_probe.tracing.session import TraceSession\n"
        f"s = TraceSession(TraceConfig(dev_prefix={prefix!r}, cgroup_dir=Path('/sys/fs/cgroup')),"
        f" tracefs={TRACEFS!r}, targets=[1])\n"
        "s.compile(); s.attach()\n"
        "print(s.timings['compile_s'], s.timings['attach_s'],"
        " resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)\n"
        "s.close()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    c, a, rss = out.stdout.split()[-3:]
    return float(c), float(a), float(rss)


def probe_peak_rss(args: list[str]) -> tuple[float, float]:
    """(peak RSS MiB of the probe process itself, wall seconds)."""
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "node_probe", "-o", "jsonl", *args],
                         cwd=str(REPO), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, _status, ru = os.wait4(p.pid, 0)
    p.returncode = 0
    return ru.ru_maxrss / 1024, time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=2_000_000)
    ap.add_argument("--attach-runs", type=int, default=3)
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root", file=sys.stderr)
        return 2
    env = bcc_env.check(Path("/"), lambda *x, **k: None)
    if not env.ok:
        print("eBPF unavailable: " + "; ".join(env.missing), file=sys.stderr)
        return 2
    global TRACEFS
    TRACEFS = env.tracefs

    with tempfile.TemporaryDirectory(prefix="gd-bpfcost-") as tmp:
        tmp = Path(tmp)
        prefix = str(tmp / "nvidia")
        traced, untraced = tmp / "nvidiactl", tmp / "other-file"
        traced.write_bytes(b"x" * 64)
        untraced.write_bytes(b"x" * 64)
        exe = build_loop(tmp)

        print(f"kernel {os.uname().release}, {os.cpu_count()} CPUs, "
              f"load {os.getloadavg()[0]:.2f}")
        # -- compile + attach, RSS -------------------------------------------------------------
        runs = [compile_attach_in_child(prefix) for _ in range(a.attach_runs)]
        totals = [c + at for c, at, _ in runs]
        print(f"compile+attach, all programs ({a.attach_runs} fresh processes): median "
              f"{statistics.median(totals):.2f} s (compile {statistics.median(r[0] for r in runs):.2f}"
              f" + attach {statistics.median(r[1] for r in runs):.3f}), max {max(totals):.2f} s"
              f"  [budget < 2 s: {'ok' if statistics.median(totals) < 2 else 'OVER'}]")
        print(f"peak RSS of a process that compiled+attached: {max(r[2] for r in runs):.0f} MiB")
        rss_trace, wall_trace = probe_peak_rss(["--only", "trace", "--trace-seconds", "1"])
        rss_full, wall_full = probe_peak_rss(["--trace-seconds", "1"])
        print(f"probe peak RSS: --only trace {rss_trace:.0f} MiB ({wall_trace:.1f} s), full run "
              f"{rss_full:.0f} MiB ({wall_full:.1f} s)  [budget < 300 MiB: "
              f"{'ok' if max(rss_trace, rss_full) < 300 else 'OVER'}]")

        # -- per-call cost -----------------------------------------------------------------------
        def unit(precise: bool):
            s = TraceSession(TraceConfig(dev_prefix=prefix, precise_ioctl_clock=precise),
                             tracefs=TRACEFS,
                             loaders=(nvidia_dev.NvidiaDev, cgroup_devices.CgroupDevices))
            s.compile()
            return s.b

        units = {"probes": unit(False), "ns clock": unit(True)}
        from bcc import BPF
        floor = BPF(text=EMPTY)

        def attach(cond: str):
            if cond == "none":
                return None
            tps = bundle.TracepointSet(floor if cond == "floor" else units[cond], TRACEFS)
            tps.attach(TRACEPOINTS)
            return tps

        conds = ["none", "floor", *units]
        res: dict[tuple[str, str], list[float]] = {(c, k): [] for c in conds
                                                   for k in ("untraced", "traced")}
        n = a.iterations
        for r in range(a.rounds):
            order = conds[r % len(conds):] + conds[:r % len(conds)]
            for cond in order:
                tps = attach(cond)
                try:
                    kinds = ("untraced", "traced") if r % 2 == 0 else ("traced", "untraced")
                    for kind in kinds:
                        res[(cond, kind)].append(run_loop(exe, traced if kind == "traced"
                                                          else untraced, n))
                finally:
                    if tps is not None:
                        tps.detach(wait=True)
        med = {k: statistics.median(v) for k, v in res.items()}
        print(f"\nioctl loop, {n:,} iterations, median CPU of {a.rounds} interleaved rounds "
              "(added/call: CPU per call above the run with nothing attached):")
        print(f"  {'':10} {'no probe':>9} {'floor':>9} " + " ".join(f"{c:>9}" for c in units)
              + "   added/call: floor " + " ".join(f"{c:>9}" for c in units))
        for kind, budget in (("untraced", 1.1), ("traced", 1.5)):
            base, fl = med[("none", kind)], med[("floor", kind)]
            add_floor = (fl - base) / n * 1e9
            cells = []
            for c in units:
                add = (med[(c, kind)] - base) / n * 1e9
                ratio = add / add_floor if add_floor > 0 else float("inf")
                mark = f" [budget {budget}x: {'ok' if ratio <= budget else 'OVER'}]" if c == "probes" else ""
                cells.append(f"{add:5.0f} ns {ratio:4.2f}x{mark}")
            print(f"  {kind:10} {base:8.3f}s {fl:8.3f}s " +
                  " ".join(f"{med[(c, kind)]:8.3f}s" for c in units) +
                  f"   {add_floor:5.0f} ns | " + " | ".join(cells))
        for b in units.values():
            b.cleanup()
        floor.cleanup()
    return 0


TRACEFS = "/sys/kernel/tracing"

if __name__ == "__main__":
    sys.exit(main())

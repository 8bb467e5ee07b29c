"""`python -m node_probe agent-watch`: the watching agent's process.

Every `--interval` it runs one pass of the cheap checks (detect.run_pass; the GPU isolation scan
only as often as its CPU allows, detect.IsolationPacer), applies hysteresis
(state), hands the conditions and the transitions' Events to the writer thread, starts an
evidence capture for each transition to a problem, and updates the metrics. The pass has its own
deadline below the interval, each check has its own inside it, and nothing here waits on the API
server or the capture: a wedged plugin, a wedged NVML or a FIFO in the host root costs one check
its deadline, never the loop. SIGTERM/SIGINT end it within one check deadline.
"""
from __future__ import annotations

import argparse
import ctypes
import dataclasses
import gc
import ipaddress
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

from node_probe.engine.context import ProbeOptions
from node_probe.host import nvml_forkserver, subproc
from node_probe.protocol import duration

from node_probe.engine import registry

from . import detect
from .passchild import PassRunner
from .capture import DEFAULT_MIN_GAP_S, Capturer
from .metrics import Metrics, serve
from .ring import DEFAULT_MAX_BYTES, DEFAULT_MAX_COUNT, DEFAULT_RING, Ring, RingError
from .state import CLASS_CHECKS, STOPPED_REASON, ConditionState
from .writer import ApiClient, ConfigError, Writer

CLEAR_QUIET_S = 60.0
# a reason/message change alone (the problem goes on) is written at most this often; a flip
# of any condition is written at once, a heartbeat every conditions.HEARTBEAT_S
MESSAGE_REFRESH_S = 60.0
STOP_WRITE_S = 6.0
# the kernel-log readers, not in a pass while a capture runs the full probe
CAPTURE_EXCLUSIVE = ("kmsg", "gpu_lost")   # the last write on SIGTERM (terminationGracePeriodSeconds is 10)
NODE_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def _malloc():
    """glibc's malloc, tamed for a long-lived threaded process: each check runs in a thread and
    every thread would get its own arena (8 per CPU at most) that keeps its peak; two arenas and
    a trim after each pass keep the steady RSS at the pass's real need. None off glibc."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(-8, 2)  # M_ARENA_MAX
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None


class _Usage(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise _Usage(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="gpu-doctor-probe agent-watch",
                description="Watch this node: cheap checks every interval, NodeConditions and "
                            "Events on changes, evidence bundles when a problem starts.")
    d = duration.argparse_type(0, exclusive=True)
    p.add_argument("--interval", type=d, default=30.0, metavar="DURATION",
                   help="time between passes (default 30s)")
    p.add_argument("--clear-after", type=int, default=2, metavar="N",
                   help="passes a problem must be absent before its condition goes False "
                        "(default 2)")
    p.add_argument("--clear-quiet", type=duration.argparse_type(0), default=CLEAR_QUIET_S,
                   metavar="DURATION",
                   help="and the time it must have been gone: a fault that comes and goes "
                        "faster stays True instead of flapping (default 60s)")
    p.add_argument("--node-name", default=None,
                   help="this node's name (default: $NODE_NAME, from the downward API)")
    p.add_argument("--events-namespace", default="default",
                   help="namespace of the Events on the node (default: default, where "
                        "`kubectl describe node` finds them)")
    p.add_argument("--api-token-file", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--api-ca-file", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--no-api", action="store_true",
                   help="do not write to the API server (metrics and evidence only)")
    p.add_argument("--evidence-dir", type=Path, default=DEFAULT_RING,
                   help=f"host directory of the evidence ring (default {DEFAULT_RING})")
    p.add_argument("--evidence-max-count", type=int, default=DEFAULT_MAX_COUNT)
    p.add_argument("--evidence-max-bytes", type=int, default=DEFAULT_MAX_BYTES)
    p.add_argument("--evidence-min-gap", type=d, default=DEFAULT_MIN_GAP_S, metavar="DURATION",
                   help="at most one capture per problem class in this time (default 5m)")
    p.add_argument("--no-evidence", action="store_true", help="do not capture bundles")
    p.add_argument("--capture-trace-seconds", type=duration.argparse_type(0), default=5.0,
                   metavar="DURATION", help="eBPF window of the evidence probe (default 5s)")
    p.add_argument("--capture-timeout", type=d, default=60.0, metavar="DURATION",
                   help="deadline of the evidence probe (default 60s)")
    p.add_argument("--provoke-min-gap", type=d, default=detect.PROVOKE_MIN_GAP_S,
                   metavar="DURATION",
                   help="at most one GetPreferredAllocation per this time, and only after a "
                        "cheaper signal points at the plugin (default 10m)")
    p.add_argument("--metrics-port", type=int, default=0,
                   help="serve Prometheus text on this port (default 0: off)")
    p.add_argument("--metrics-address", default=None, metavar="IP",
                   help="address the metrics port binds (default: $POD_IP, from the downward "
                        "API status.podIP; else 127.0.0.1)")
    p.add_argument("--passes", type=int, default=0, help=argparse.SUPPRESS)  # tests, bench
    p.add_argument("--host-root", type=Path, default=Path("/"))
    p.add_argument("--cgroup-root", type=Path, default=None)
    p.add_argument("--kubelet-dir", type=Path, default=None)
    p.add_argument("--kmsg-file", type=Path, default=None)
    p.add_argument("--nvml-timeout", type=d, default=8.0, metavar="DURATION")
    p.add_argument("--trusted-namespace", action="append", default=None, metavar="NAMESPACE",
                   help="pods in this namespace may hold GPUs they were not given (GPU agents; "
                        "repeatable; replaces the default list, as the probe's flag)")
    return p


def _log(msg: str) -> None:
    sys.stderr.write(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} agent-watch: "
                     f"{msg}\n")
    sys.stderr.flush()


def _probe_args(a: argparse.Namespace) -> list[str]:
    out = ["--host-root", str(a.host_root), "--timeout", f"{max(5.0, a.capture_timeout - 5)}",
           "--trace-seconds", f"{a.capture_trace_seconds}",
           "--nvml-timeout", f"{a.nvml_timeout}"]
    for flag, v in (("--cgroup-root", a.cgroup_root), ("--kubelet-dir", a.kubelet_dir),
                    ("--kmsg-file", a.kmsg_file)):
        if v is not None:
            out += [flag, str(v)]
    for ns in a.trusted_namespace or ():
        out += ["--trusted-namespace", ns]
    return out


def main(argv: list[str] | None = None) -> int:
    try:
        return _watch(argv)
    finally:
        nvml_forkserver.stop()


def _watch(argv: list[str] | None) -> int:
    try:
        a = build_parser().parse_args(argv)
        node = a.node_name or os.environ.get("NODE_NAME") or ""
        if not NODE_NAME_RE.match(node):
            raise _Usage("no valid node name: set NODE_NAME from the downward API "
                         "(spec.nodeName) or pass --node-name")
        if a.clear_after < 1 or a.interval < 1 and not a.passes:
            raise _Usage("--clear-after must be >= 1 and --interval >= 1s")
        if not a.host_root.is_dir():
            raise _Usage(f"--host-root {a.host_root}: not a directory")
        if not 0 <= a.metrics_port <= 65535:
            raise _Usage("--metrics-port must be 0..65535")
        metrics_ip = a.metrics_address or os.environ.get("POD_IP") or "127.0.0.1"
        try:
            metrics_ip = str(ipaddress.ip_address(metrics_ip))
        except ValueError:
            raise _Usage(f"--metrics-address / POD_IP {metrics_ip[:64]!r}: not an IP "
                         f"address") from None
        # the checks' modules once, here (each forked pass shares them); grpc and protobuf only
        # in the passes that use them (passchild.py)
        registry.select(detect.WATCH_CHECKS, ())
        # the NVML forkserver, forked now while this process has one thread (it forks each
        # pass's NVML child: no interpreter start per pass; host/nvml_forkserver.py)
        forkserver = nvml_forkserver.start()
        writer = None
        if not a.no_api:
            client = ApiClient.in_cluster(token_file=a.api_token_file, ca_file=a.api_ca_file)
            writer = Writer(client, node, a.events_namespace, log=_log).start()
        capturer = None
        if not a.no_evidence:
            ring = Ring(a.evidence_dir, a.evidence_max_count, a.evidence_max_bytes)
            ring.entries()  # fails now, not at the first problem, on a bad directory
            ring.sweep()    # what a write cut by a crash or a full disk left (W-13)
            capturer = Capturer(ring, _probe_args(a), a.capture_timeout, node,
                                a.evidence_min_gap, log=_log)
    except (_Usage, ConfigError, RingError, ValueError) as exc:
        print(f"gpu-doctor-probe agent-watch: error: {exc}", file=sys.stderr)
        return 2

    metrics = Metrics()
    if a.metrics_port:
        try:
            serve(metrics, a.metrics_port, metrics_ip)
        except OSError as exc:
            print(f"gpu-doctor-probe agent-watch: error: --metrics-port {a.metrics_port} on "
                  f"{metrics_ip}: "
                  f"{exc.strerror}", file=sys.stderr)
            return 2

    trim = _malloc()
    stop = threading.Event()

    def on_signal(signum, frame):  # noqa: ARG001
        stop.set()
        raise KeyboardInterrupt  # the runner ends a pass in progress as on Ctrl-C

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)

    base = ProbeOptions(host_root=a.host_root, cgroup_root=a.cgroup_root,
                        kubelet_dir=a.kubelet_dir, kmsg_file=a.kmsg_file,
                        nvml_timeout_s=a.nvml_timeout,
                        trusted_namespaces=(None if a.trusted_namespace is None
                                            else tuple(a.trusted_namespace)))
    state = ConditionState(a.clear_after, clear_quiet_s=a.clear_quiet)
    passes = PassRunner()
    if writer is not None:
        node_doc = writer.read_node()
        if node_doc is not None:
            kept = state.adopt((node_doc.get("status") or {}).get("conditions"))
            if kept:
                _log(f"kept what node {node} carries: {', '.join(kept)}")
        del node_doc
    provoker = detect.Provoker(a.provoke_min_gap)
    pacer = detect.IsolationPacer()
    rpcs = detect.RpcPacer()
    pass_timeout = max(5.0, min(a.interval * 0.8, 25.0)) if a.interval >= 6 else 20.0
    _log(f"watching node {node} every {a.interval:g}s"
         f"{'' if writer else ' (API writes off)'}")
    n = 0
    first = True
    last_gpus: list = []   # the previous pass's per-GPU gauges (detect.rising)
    pending: dict[str, dict] = {}   # transitions to True whose capture waits for a free turn
    last_sig = last_flips = None
    last_write = 0.0
    try:
        while not stop.is_set():
            t0 = time.monotonic()
            provoke = provoker.want()
            if provoke:
                provoker.used()
            # while an evidence capture runs the full probe (which reads the kernel log too),
            # the pass leaves the kernel log alone: in an Xid storm two readers of a 20 MB log
            # at once were past the container's memory limit; its classes wait a pass
            busy = capturer is not None and capturer.busy
            # the device plugins' RPCs (grpc in the pass child) only when due (detect.RpcPacer);
            # a quiet pass gives containers their GPUs from the kubelet's device checkpoint, as
            # the isolation scan reads them then (the scan itself is paced to run on most passes
            # of an idle node: asking with it would ask every pass)
            active = [ct for ct, c in state.conds.items() if c.status == "True"]
            iso = pacer.want()
            opts = dataclasses.replace(base, plugin_rpc=provoke or rpcs.want(active),
                                       plugin_targets_seen=rpcs.seen)
            res = passes.run(opts, pass_timeout, provoke, isolation=iso,
                             skip=CAPTURE_EXCLUSIVE if busy else ())
            rpcs.observe(res)
            if busy:  # a partial look: problems may go True, none clears
                res.unsure |= set(CLASS_CHECKS)
            if res.isolation_cpu_s is not None:
                pacer.used(res.isolation_cpu_s)
            if stop.is_set():
                break
            provoker.observe(res.findings)
            for p in detect.rising(last_gpus, res.gpus):   # counters rising between passes
                res.problems.setdefault(p.ctype, []).append(p)
            last_gpus = res.gpus or last_gpus
            transitions = state.update(res.problems, res.unsure)
            events = [(t.ctype, t.reason, f"{t.ctype} is {t.status}: {t.message}",
                       t.status == "True") for t in transitions]
            if first:
                events.insert(0, ("agent", "AgentWatching", f"gpu-doctor agent started watching "
                                                            f"node {node} every {a.interval:g}s",
                                  False))
                first = False
            sig, flips = state.signature(), state.flips()
            # flips and Events at once; a message-only change at most every MESSAGE_REFRESH_S
            due = events or flips != last_flips or (
                sig != last_sig and t0 - last_write >= MESSAGE_REFRESH_S)
            if writer is not None and due:  # else: the writer's heartbeat only
                writer.publish(state.api_conditions, events)
                last_sig, last_flips, last_write = sig, flips, t0
            for t in transitions:
                _log(f"{t.ctype} -> {t.status}: {t.message}")
                if t.status == "True" and capturer is not None:
                    pending[t.ctype] = {"condition": t.ctype, "reason": t.reason,
                                        "message": t.message,
                                        "findings": [p.finding_id for p in t.problems]}
                else:
                    pending.pop(t.ctype, None)
            # a capture starts only when no pass child lingers (one killed at its deadline may
            # take seconds to free a storm's memory): never two big readers at once
            if pending and not passes.alive():
                ct = next(iter(pending))
                if capturer.trigger(ct, pending[ct]) or not capturer.busy:
                    del pending[ct]   # started, or not due (the class had one lately)
            metrics.update(res, state, writer, capturer)
            if forkserver and not nvml_forkserver.alive():
                forkserver = None
                _log("the NVML forkserver exited: each pass starts its NVML child")
            del res
            gc.collect()
            if trim is not None:
                trim(0)
            n += 1
            if a.passes and n >= a.passes:
                break
            stop.wait(max(0.0, a.interval - (time.monotonic() - t0)))
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        subproc.kill_all()
    if stop.is_set() and writer is not None:
        # the last word: this node is no longer watched (its marks stay for the next agent
        # pod to adopt; `node`/`nodes` read them as not current)
        why = f"the gpu-doctor agent on {node} stopped (SIGTERM or SIGINT)"
        state.stopped(why)
        writer.publish(state.api_conditions, [("agent", STOPPED_REASON, why, False)])
        if not writer.flush(STOP_WRITE_S):
            _log("the stop could not be written in time")
    if a.passes:  # tests and the bench: let the last write and capture land
        if capturer is not None:
            capturer.wait(a.capture_timeout + 10)
        if writer is not None:
            writer.flush(30)
    elif capturer is not None:  # stopping: a capture in flight does not outlive the agent
        capturer.kill()
    _log("stopped")
    return 0

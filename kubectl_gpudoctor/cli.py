"""`kubectl gpu-doctor`: the commands users type (click), and the one place errors become exits.

Why here: kubectl finds the plugin as the `kubectl-gpu_doctor` executable and passes the rest
of the command line through. This module parses it with kubectl's conventions
(--kubeconfig, --context, -n, -o) and hands the options to one program (cluster.py), which
collects and returns or raises. `main` alone ends the run, as httpie's `main` does: it installs
the SIGTERM handler, catches what the program raised, maps it to an exit code of DESIGN.md
section 7 through errors.exit_status_of, and lets Session.finish render the report once and
print ONE line on stderr for an error (never a traceback; GPU_DOCTOR_DEBUG=1 shows it for
bugs). The kubernetes client is imported only by programs that talk to a cluster, so --help,
version, completion and local start fast.
"""
from __future__ import annotations

import functools
import gc
import os
import signal
import sys
import threading
from typing import Any, Callable

import click
from click.core import ParameterSource

from node_probe.protocol import FAIL_ON, ExitStatus

from . import errors, params
from .commands import agent
from .commands import cleanup
from .commands import explain
from .commands import job
from .commands import local
from .commands import mcp
from .commands import node
from .commands import nodes
from .commands import rbac
from .commands import replay
from .commands import version
from .report.output import FORMATS
from .session import PROG, Session, closed_pipe_ok

_GROUP_OPTS = "gpu_doctor.group_options"


def examples(*pairs: str) -> str:
    """An `Examples:` block as kubectl's help has one: (comment, command) pairs, kept as
    written (click's \\b: not rewrapped)."""
    blocks = [f"\b\n  # {pairs[i]}\n  {pairs[i + 1]}" for i in range(0, len(pairs), 2)]
    return "\b\nExamples:\n" + "\n\n".join(b.removeprefix("\b\n") if i == 0 else b
                                          for i, b in enumerate(blocks)) + "\n"


EXAMPLES = {
    "": examples(
        "Why are the GPU pods on this node stuck? The verdict, then the evidence",
        "kubectl gpu-doctor node gpu-node-7",
        "Why is this pod Pending or failing, and what is wrong with its node",
        "kubectl gpu-doctor pod trainer-0 -n ml",
        "The sick GPU nodes of the fleet, worst first",
        "kubectl gpu-doctor nodes",
        "Which node holds up this multi-node job",
        "kubectl gpu-doctor job llama-train -n ml",
        "This host, over SSH on a node where no pod can start",
        "sudo kubectl-gpu_doctor local",
        "What a finding means and how to fix it (offline)",
        "kubectl gpu-doctor explain kubelet.admission_stalled"),
    "node": examples(
        "The verdict and the evidence of one node (by exec in its agent pod if one runs)",
        "kubectl gpu-doctor node gpu-node-7",
        "The API side only: no pod, no exec",
        "kubectl gpu-doctor node gpu-node-7 --no-probe",
        "For a ticket: keep the evidence, paste the answer",
        "kubectl gpu-doctor node gpu-node-7 --save incident.json -o markdown",
        "What the watching agent captured when the problem started",
        "kubectl gpu-doctor node gpu-node-7 --history"),
    "pod": examples(
        "Why this pod does not run, then its node (the checks focused on its containers)",
        "kubectl gpu-doctor pod trainer-0 -n ml",
        "A Pending GPU pod: its fit against every node, from three lists",
        "kubectl gpu-doctor pod trainer-0 -n ml --no-probe",
        "For a bot",
        "kubectl gpu-doctor pod pod/trainer-0 -n ml -o json"),
    "nodes": examples(
        "Every GPU node, the sick ones listed worst first",
        "kubectl gpu-doctor nodes",
        "A pool, every node listed, every column whole",
        "kubectl gpu-doctor nodes -l pool=h100 --show-healthy -o wide",
        "Also the node side of each (by exec where an agent runs, else a debug pod)",
        "kubectl gpu-doctor nodes -l pool=h100 --probe"),
    "job": examples(
        "Which node holds up this job? Its nodes and ranks compared (the API side)",
        "kubectl gpu-doctor job llama-train -n ml",
        "A name that is two kinds of job: say which",
        "kubectl gpu-doctor job llama-train -n ml --kind JobSet",
        "The pods of a selector as one job, the node side too (agents, else debug pods)",
        "kubectl gpu-doctor job -l app=trainer -n ml --probe",
        "For a bot",
        "kubectl gpu-doctor job llama-train -n ml -o json"),
    "local": examples(
        "This host (run it on the node, e.g. over SSH, where no pod can start)",
        "sudo kubectl-gpu_doctor local",
        "Only the device-plugin checks, no eBPF trace",
        "sudo kubectl-gpu_doctor local --only deviceplugin --trace-seconds 0",
        "A kernel log saved from another machine",
        "kubectl-gpu_doctor local --kmsg-file dmesg.txt --only kmsg",
        "Why is it slow, from what a ticket pasted (no GPU, no cluster needed)",
        "kubectl-gpu_doctor local --host-root /tmp/empty --bug-report nvidia-bug-report.log.gz"),
    "cleanup": examples(
        "Leftover debug pods in the probe namespace",
        "kubectl gpu-doctor cleanup",
        "In every namespace",
        "kubectl gpu-doctor cleanup -A"),
    "agent": examples(
        "Install the watching agent on every node (before the next incident)",
        "kubectl gpu-doctor agent install",
        "Which nodes it covers",
        "kubectl gpu-doctor agent status"),
    "agent install": examples(
        "The watching agent on every node",
        "kubectl gpu-doctor agent install",
        "Only on GPU nodes, as manifests for GitOps",
        "kubectl gpu-doctor agent install --node-selector nvidia.com/gpu.present=true "
        "--dry-run=client -o yaml",
        "The sleeping agent (exec only, no node status writes)",
        "kubectl gpu-doctor agent install --no-watch"),
    "agent status": examples(
        "Nodes without a Running agent, and version skew",
        "kubectl gpu-doctor agent status",
        "Every node, for a script",
        "kubectl gpu-doctor agent status -o json"),
    "agent uninstall": examples(
        "Remove the agent (the namespace stays)",
        "kubectl gpu-doctor agent uninstall"),
    "replay": examples(
        "The report of a saved bundle, offline, with its exit code",
        "kubectl gpu-doctor replay incident.json",
        "For the ticket",
        "kubectl gpu-doctor replay incident.json -o markdown"),
    "explain": examples(
        "A finding's page",
        "kubectl gpu-doctor explain kubelet.admission_stalled",
        "The page behind one of the watching agent's NodeConditions or reasons",
        "kubectl gpu-doctor explain GpuDoctorDevicePluginStuck",
        "Every id with its meaning",
        "kubectl gpu-doctor explain"),
    "mcp": examples(
        "Serve an incident assistant over stdio: API reads only, nothing created",
        "kubectl gpu-doctor mcp",
        "Also let its tools run the node probe (exec in the agent, else a debug pod)",
        "kubectl gpu-doctor mcp --allow-node-probe --call-timeout 2m"),
    "version": examples(
        "The plugin version and the probe image it launches",
        "kubectl gpu-doctor version",
        "For a script",
        "kubectl gpu-doctor version -o json"),
    "rbac": examples(
        "The probe namespace and the users' RBAC",
        "kubectl gpu-doctor rbac | kubectl apply -f -",
        "The base and the admission policy, to review first (opt-ins only when named)",
        "kubectl gpu-doctor rbac all > gpu-doctor-rbac.yaml"),
    "completion": examples(
        "bash completion for the kubectl-gpu_doctor executable",
        "source <(kubectl-gpu_doctor completion bash)"),
}
CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
_DEFAULTS = {"output": "table", "fail_on": "warning", "timeout": 60.0, "trace_seconds": 5.0,
             "start_timeout": 60.0, "stall_threshold": 120.0, "concurrency": 8,
             "kubelet_timeout": 10.0, "request_timeout": 15.0}


def _apply(f: Callable, opts: list) -> Callable:
    for o in reversed(opts):
        f = o(f)
    return f


def _output_options(f: Callable) -> Callable:
    """Output and deadlines: every command that runs checks, `local` included."""
    return _apply(f, [
        click.option("-o", "--output", type=click.Choice(FORMATS), default=None,
                     help="Output format (default table)."),
        click.option("--fail-on", type=click.Choice(FAIL_ON), default=None,
                     help="Exit 1 if findings at or above this severity (default warning)."),
        click.option("--timeout", type=params.Duration(1), default=None,
                     help="Deadline for the node probe: 60s, 2m, 1m30s or seconds "
                          "(default 60s)."),
        click.option("--trace-seconds", type=params.Duration(0), default=None,
                     help="eBPF trace window on the node; 0 disables tracing (default 5s)."),
        click.option("--details", is_flag=True, default=None,
                     help="Table: details of every finding (evidence, fix, references), not "
                          "only of critical and warning ones."),
    ])


_NS_POD = ("Namespace of POD (default: the kubeconfig context's namespace, else default). "
           "The debug pod never runs there: see --probe-namespace.")
_NS_GROUP = ("Namespace for the commands that take one: `pod` (POD's), `cleanup` (default "
             "the probe namespace), `agent` (default gpu-doctor).")


def _kube_options(f: Callable, namespace_help: str | None = None,
                  namespace_env: str | None = None) -> Callable:
    """kubectl's own global flags: where to connect, and -n. A command without a namespace of
    its own (node, nodes: cluster-scoped) still accepts -n and ignores it, as kubectl does for
    `kubectl get node X -n NS`; it is hidden from that command's --help."""
    opts = [
        click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None,
                     help="Path to the kubeconfig file (default: $KUBECONFIG, ~/.kube/config, "
                          "else the in-cluster config)."),
        click.option("--context", default=None, metavar="NAME",
                     help="The kubeconfig context to use (default: its current-context)."),
        click.option("--request-timeout", type=params.Duration(0.1), default=None,
                     help="Wall-clock limit of each API request, however slowly the server "
                          "answers (default 15s)."),
    ]
    opts.append(click.option("-n", "--namespace", type=params.NAMESPACE, default=None,
                             envvar=namespace_env, hidden=not namespace_help,
                             help=namespace_help or "Accepted and ignored (cluster-scoped)."))
    return _apply(f, opts)


def _common(f: Callable, namespace_help: str | None = None) -> Callable:
    """What every command that runs checks in a cluster takes: output, deadlines, kubectl's
    flags, the probe image."""
    return _output_options(_kube_options(_apply(f, [
        click.option("--image", default=None,
                     help="Probe image of the debug pod (default: the release image this "
                          "plugin pins; `kubectl gpu-doctor version` names it)."),
    ]), namespace_help))


def _with_group(ctx: click.Context, local: dict) -> dict:
    """The command's options with kubectl's flags given before the command name
    (`kubectl gpu-doctor --context prod agent install`): a flag on the command line of the
    command wins; one given before it wins over an environment variable or a default."""
    merged = dict(local)
    for name, value in (ctx.meta.get(_GROUP_OPTS) or {}).items():
        if value is None or name not in local:
            continue
        if merged[name] is None or ctx.get_parameter_source(name) != ParameterSource.COMMANDLINE:
            merged[name] = value
    return merged


def _opts(ctx: click.Context, local: dict) -> dict:
    """Merge defaults, group-level and command-level options; command-level wins."""
    merged = dict(_DEFAULTS)
    merged.update({k: v for k, v in _with_group(ctx, local).items() if v is not None})
    if merged["trace_seconds"] >= merged["timeout"]:
        raise click.UsageError(
            f"--trace-seconds ({merged['trace_seconds']:g}) must be shorter than --timeout "
            f"({merged['timeout']:g}): the trace window runs inside the probe's deadline")
    return merged


def _refuse_unused_group_options(ctx: click.Context, kw: dict) -> None:
    """A kubectl flag given before a command that does not use it is a usage error, never
    silently ignored (`--kubeconfig X local` has no cluster; `-n NS node X` has no
    namespace)."""
    name = ctx.invoked_subcommand
    cmd = ctx.command.get_command(ctx, name) if name else None
    if cmd is None or isinstance(cmd, click.Group):
        return  # unknown: click says so; a group (agent): all its commands take them
    takes = {p.name for p in cmd.params}
    for param in ctx.command.params:
        if kw.get(param.name) is not None and param.name not in takes \
                and ctx.get_parameter_source(param.name) == ParameterSource.COMMANDLINE:
            raise click.UsageError(f"{'/'.join(param.opts)} does not apply to `{name}`", ctx)


@click.group(context_settings=CONTEXT_SETTINGS, invoke_without_command=False,
             no_args_is_help=True, epilog=EXAMPLES[""],
             help="Why are the GPU pods on this node stuck, failing or slow? The verdict "
                  "first (the root cause, the pods it holds up, the commands to run), then "
                  "the evidence.\n\n"
                  "The API side (pods, events, the node Lease, the kubelet's goroutine dump, "
                  "health and config, other monitors' conditions and the watching agent's) "
                  "answers in about a second and needs no pod. The node side (the node probe: "
                  "device-plugin RPCs with deadlines, NVML in a killable child, cgroup device "
                  "rules, the kernel log, a short eBPF trace) runs by exec in the standing "
                  "agent's pod where one runs (`kubectl gpu-doctor agent install`), else in a "
                  "short-lived privileged debug pod, deleted on every path -- never on a node "
                  "that is NotReady or whose kubelet admits no pod.\n\n"
                  "Exit codes: 0 ok, 1 findings at or above --fail-on, 2 usage, 3 cluster or "
                  "launch error, 4 probe incomplete, 70 internal error (a bug), 130 "
                  "interrupted. kubectl's flags below may also come after the command.")
@functools.partial(_kube_options, namespace_help=_NS_GROUP)
@click.pass_context
def cli(ctx: click.Context, **kw: Any) -> None:
    _refuse_unused_group_options(ctx, kw)
    ctx.meta[_GROUP_OPTS] = kw


def _kubelet_timeout(f: Callable) -> Callable:
    return click.option("--kubelet-timeout", type=params.Duration(0.1), default=None,
                        help="Wall-clock limit of each kubelet call proxied by the API server "
                             "(goroutine dump, healthz, configz; default 10s).")(f)


def _agent_options(f: Callable) -> Callable:
    """The standing agent (exec first) and evidence bundles: node, pod, nodes."""
    f = click.option("--save", "save", type=click.Path(dir_okay=False), default=None,
                     help="Also write an evidence bundle to FILE (the report, the raw "
                          "evidence, versions, the command line; secrets redacted). "
                          "`replay FILE` renders it again offline.")(f)
    f = click.option("--agent-namespace", type=params.NAMESPACE, default=None,
                     envvar="GPU_DOCTOR_AGENT_NAMESPACE",
                     help="Namespace of the standing agent (default gpu-doctor); env "
                          "GPU_DOCTOR_AGENT_NAMESPACE.")(f)
    f = click.option("--no-agent", is_flag=True, default=False,
                     help="Do not exec into a Running agent pod; always use a debug pod.")(f)
    return f


def _cluster_options(f: Callable) -> Callable:
    f = _agent_options(f)
    f = _kubelet_timeout(f)
    f = click.option("--start-timeout", type=params.Duration(1), default=None,
                     help="How long to wait for the debug pod to run (default 60s).")(f)
    f = click.option("--stall-threshold", type=params.Duration(1), default=None,
                     help="How long a bound pod may go untouched by the kubelet before it "
                          "counts as stalled (default 2m).")(f)
    f = click.option("--no-probe", is_flag=True, default=False,
                     help="API-side analysis only; do not start a debug pod.")(f)
    f = click.option("--force-pod", is_flag=True, default=False,
                     help="Create the debug pod even when the API side already shows the "
                          "kubelet admits no pod (by default it is not created there).")(f)
    return _probe_namespace(f)


_PROBE_NS_HELP = ("Namespace of the debug pod (default gpu-doctor; env GPU_DOCTOR_NAMESPACE). "
                  "It must carry the label gpu-doctor.io/probe-namespace=true and admit "
                  "privileged pods: `kubectl gpu-doctor rbac` prints the manifests that "
                  "create it so.")


def _probe_namespace(f: Callable) -> Callable:
    return click.option("--probe-namespace", type=params.NAMESPACE, default=None,
                        envvar="GPU_DOCTOR_NAMESPACE", help=_PROBE_NS_HELP)(f)


def _complete_names(ctx: click.Context, kind: str, incomplete: str) -> list[str]:
    """Names of `kind` ("node" or "pod") starting with `incomplete`, through the kubeconfig,
    context and namespace typed so far; [] on any failure (completion never fails loudly)."""
    try:
        from .commands.version import complete_names
        o = {}  # completion runs no callbacks: read kubectl's flags before and after the command
        for c in (ctx.parent, ctx):
            o.update({k: v for k, v in (c.params if c else {}).items() if v is not None})
        return complete_names(kind, incomplete, o.get("kubeconfig"), o.get("context"),
                              o.get("namespace"))
    except Exception:  # noqa: BLE001 - completion must never fail loudly
        return []


def _complete_nodes(ctx, param, incomplete):
    return _complete_names(ctx, "node", incomplete)


def _complete_pods(ctx, param, incomplete):
    return _complete_names(ctx, "pod", incomplete)


def _session(ctx: click.Context) -> Session:
    return ctx.ensure_object(Session)


def _target_command(kind: str, name_type: click.ParamType, help: str, short: str,
                    namespace_help: str | None = None, extra: Callable = lambda f: f,
                    **argument: Any) -> click.Command:
    """`node NAME` and `pod NAME`: one named target, the same options, commands/node.<kind>."""
    @cli.command(kind, context_settings=CONTEXT_SETTINGS, help=help, short_help=short,
                 epilog=EXAMPLES[kind])
    @click.argument("name", type=name_type, metavar=kind.upper(), **argument)
    @functools.partial(_common, namespace_help=namespace_help)
    @_cluster_options
    @extra
    @click.pass_context
    def command(ctx: click.Context, name: str, **kw: Any) -> int:
        return getattr(node, kind)(_session(ctx), _opts(ctx, kw), name)
    return command


def _not_negative(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    if value is not None and value < 0:
        raise click.BadParameter(f"{value} is not a bundle number (1 is the newest)", ctx, param)
    return value


def _history_option(f: Callable) -> Callable:
    # a plain INT checked in a callback: click.IntRange would print `[x>=0]` in --help
    return click.option(
        "--history", "history", type=click.INT, is_flag=False, flag_value=0,
        default=None, metavar="[N]", callback=_not_negative,
        help="The evidence the watching agent kept on the node: without N, list the bundles; "
             "--history N replays bundle N like `replay` (with --save FILE, also copies it "
             "out). Read by exec in the agent pod; nothing runs on the node.")(f)


node_cmd = _target_command(
    "node", params.NODE_NAME, shell_complete=_complete_nodes, extra=_history_option,
    short="Why the GPU pods on node NODE are stuck, failing or slow.",
    help="Why the GPU pods on node NODE (or node/NODE) are stuck, failing or slow: the "
         "verdict (root cause, the pods it holds up, the commands to run), then each "
         "finding once.\n\n"
         "The API side first (about a second, no pod); then the node probe, by exec in the "
         "standing agent's pod when one runs on NODE, else in a short-lived debug pod in the "
         "probe namespace (deleted on every path). No debug pod is created on a NotReady "
         "node or one whose kubelet admits no pod (--force-pod to try anyway); the report "
         "says how the node was reached.")
pod_cmd = _target_command(
    "pod", params.POD_NAME, namespace_help=_NS_POD, shell_complete=_complete_pods,
    short="Why pod POD is not running, then what is wrong with its node.",
    help="Why pod POD (or pod/POD) is not running: rejected at admission, waiting on a wedged "
         "kubelet, or never scheduled (its GPU fit against every node, named as one case "
         "with the nodes and the numbers); then the analysis of its node and the node probe "
         "focused on its containers, as `node` runs it.")


@cli.command("nodes", context_settings=CONTEXT_SETTINGS, epilog=EXAMPLES["nodes"],
             short_help="The sick GPU nodes of a fleet, worst first.")
@click.option("-l", "--selector", default=None,
              help="Label selector (default: all nodes that have GPUs).")
@click.option("--all", "all_nodes", is_flag=True, default=False,
              help="Without -l: include nodes without GPUs.")
@click.option("--show-healthy", is_flag=True, default=False,
              help="List every node in the table, not only those with problems (-o json "
                   "and yaml always carry every node).")
@click.option("--concurrency", type=click.IntRange(min=1, max=64), default=None,
              help="Parallel per-node kubelet calls for flagged nodes (default 8).")
@click.option("--stall-threshold", type=params.Duration(1), default=None,
              help="How long a bound pod may go untouched before it counts as stalled "
                   "(default 2m).")
@click.option("--probe", "probe", is_flag=True, default=False,
              help="Also run the node probe on every selected node, --concurrency at a "
                   "time: by exec in the standing agent where one runs, else in a debug pod.")
@click.option("--max-probes", type=click.IntRange(min=1), default=20, show_default=True,
              help="Refuse --probe when more than this many nodes would need a debug pod "
                   "(nodes with a Running agent do not count).")
@click.option("--start-timeout", type=params.Duration(1), default=None,
              help="How long to wait for each debug pod to run (default 60s).")
@_probe_namespace
@_kubelet_timeout
@_agent_options
@_common
@click.pass_context
def nodes_cmd(ctx: click.Context, selector: str | None, all_nodes: bool, probe: bool,
              max_probes: int, show_healthy: bool, **kw: Any) -> int:
    """The GPU nodes of a fleet from the API side in a constant number of list calls: the
    sick ones, worst first, each with its verdict on a line of its own; the healthy ones
    counted. The watching agent's conditions come with the node list (no exec);
    --probe also runs the node probe on each selected node."""
    o = _opts(ctx, kw)
    o["no_probe"] = not probe
    return nodes.nodes(_session(ctx), o, selector, all_nodes, max_probes, show_healthy)


def _complete_kinds(ctx, param, incomplete):  # pragma: no cover - interactive
    from .analysis.job.kinds import kind_names
    return [k for k in kind_names() if k.lower().startswith(incomplete.lower())]


@cli.command("job", context_settings=CONTEXT_SETTINGS, epilog=EXAMPLES["job"],
             short_help="The node (or rank) that holds up a multi-node GPU job.")
@click.argument("name", required=False, metavar="[NAME]")
@click.option("--kind", "kind", default=None, shell_complete=_complete_kinds,
              help="The kind of NAME when it is more than one (any case): Job, JobSet, "
                   "PyTorchJob, TFJob, MPIJob, LeaderWorkerSet, RayJob, RayCluster, vcjob "
                   "(Volcano), Workload (Kueue), or KIND.GROUP.")
@click.option("-l", "--selector", default=None,
              help="Treat the pods this label selector matches in the namespace (-n) as "
                   "the job, instead of NAME.")
@click.option("--probe", "probe", is_flag=True, default=False,
              help="Also run the node probe on every node of the job, --concurrency at a "
                   "time, all within --timeout: by exec in the standing agent where one "
                   "runs, else in a debug pod. A node that does not answer in time is named.")
@click.option("--concurrency", type=click.IntRange(min=1, max=64), default=None,
              help="Parallel node probes and kubelet calls (default 8).")
@click.option("--max-probes", type=click.IntRange(min=1), default=20, show_default=True,
              help="Refuse --probe when more than this many nodes would need a debug pod "
                   "(nodes with a Running agent do not count).")
@click.option("--stall-threshold", type=params.Duration(1), default=None,
              help="How long a bound pod may go untouched before it counts as stalled "
                   "(default 2m).")
@click.option("--start-timeout", type=params.Duration(1), default=None,
              help="How long to wait for each debug pod to run (default 60s).")
@click.option("--agent-namespace", type=params.NAMESPACE, default=None,
              envvar="GPU_DOCTOR_AGENT_NAMESPACE",
              help="Namespace of the standing agent (default gpu-doctor); env "
                   "GPU_DOCTOR_AGENT_NAMESPACE.")
@click.option("--no-agent", is_flag=True, default=False,
              help="Do not exec into a Running agent pod; always use a debug pod.")
@_probe_namespace
@_kubelet_timeout
@functools.partial(_common, namespace_help="Namespace of the job (default: the kubeconfig "
                                           "context's namespace, else default).")
@click.pass_context
def job_cmd(ctx: click.Context, name: str | None, kind: str | None, selector: str | None,
            probe: bool, max_probes: int, **kw: Any) -> int:
    """Which node (or rank) holds up a multi-node GPU job. NAME is a batch Job, JobSet,
    Kubeflow job (PyTorchJob, MPIJob...), LeaderWorkerSet, RayJob, RayCluster, Volcano Job or
    Kueue Workload (its kind found, --kind when the name is more than one); -l takes the
    pods of a selector instead. Every node of the job is judged as `nodes` judges it (the
    agent's marks, NotReady, black holes, allocatable GPUs, other monitors' conditions) and
    every pod (Pending, CrashLoopBackOff, restarts, replaced, started late); the node or rank
    that differs from its siblings is named with the action that fits."""
    if name and "/" in name:  # kubectl's TYPE/NAME: jobset/llama-train
        typ, name = name.split("/", 1)
        if kind and kind.lower() != typ.lower():
            raise click.UsageError(f"--kind {kind} and {typ}/{name} disagree", ctx)
        kind = typ
    if name:
        problem = params.name_problem("job", name)
        if problem:
            raise click.BadParameter(problem, ctx, param_hint="NAME")
    o = _opts(ctx, kw)
    o["no_probe"] = not probe
    return job.job(_session(ctx), o, name, kind, selector, max_probes)


@cli.command("local", context_settings=CONTEXT_SETTINGS, epilog=EXAMPLES["local"],
             short_help="The node probe on THIS host (no cluster).")
@click.option("--host-root", type=click.Path(file_okay=False), default=None,
              help="Where the host's / is mounted (default /).")
@click.option("--cgroup-root", type=click.Path(file_okay=False), default=None,
              help="The cgroup mount (default <host-root>/sys/fs/cgroup).")
@click.option("--kubelet-dir", type=click.Path(file_okay=False), default=None,
              help="The kubelet's directory: device-plugin and pod-resources sockets, "
                   "checkpoint, config (default <host-root>/var/lib/kubelet).")
@click.option("--kmsg-file", type=click.Path(dir_okay=False), default=None,
              help="A saved kernel log (raw kmsg, dmesg or journal lines) instead of "
                   "<host-root>/dev/kmsg.")
@click.option("--plugin-log", type=click.Path(dir_okay=False), default=None,
              help="A device plugin's log to scan for known HAMi errors.")
@click.option("--nvidia-smi-file", type=click.Path(dir_okay=False), default=None,
              help="A saved `nvidia-smi -q` (text) or `nvidia-smi -q -x` (XML): its GPUs "
                   "judged for slow-GPU causes (link, clocks, memory health).")
@click.option("--lspci-file", type=click.Path(dir_okay=False), default=None,
              help="A saved `lspci -vvv`: its GPUs' PCIe links (LnkCap/LnkSta) judged.")
@click.option("--bug-report", type=click.Path(dir_okay=False), default=None,
              help="An nvidia-bug-report.log or .log.gz: its nvidia-smi, lspci and kernel "
                   "log sections through every check that applies.")
@click.option("--only", multiple=True, help="Run only these checks (repeatable).")
@click.option("--skip", multiple=True, help="Skip these checks (repeatable).")
@click.option("--list-checks", is_flag=True, default=False,
              help="List the checks --only and --skip take, and exit.")
@_output_options
@click.pass_context
def local_cmd(ctx: click.Context, host_root, cgroup_root, kubelet_dir, kmsg_file, plugin_log,
              nvidia_smi_file, lspci_file, bug_report, only, skip, list_checks,
              **kw: Any) -> int:
    """Run the node probe on THIS host, no cluster needed: over SSH on a node where no pod
    can start (a wedged kubelet, a NotReady node), or on a machine being set up."""
    if list_checks:
        return local.list_checks(_session(ctx))
    o = _opts(ctx, kw)
    args: list[str] = []
    for flag, val in (("--host-root", host_root), ("--cgroup-root", cgroup_root),
                      ("--kubelet-dir", kubelet_dir), ("--kmsg-file", kmsg_file),
                      ("--plugin-log", plugin_log), ("--nvidia-smi-file", nvidia_smi_file),
                      ("--lspci-file", lspci_file), ("--bug-report", bug_report)):
        if val:
            args += [flag, str(val)]
    for c in only:
        args += ["--only", c]
    for c in skip:
        args += ["--skip", c]
    return local.local(_session(ctx), o, args)


@cli.command("cleanup", context_settings=CONTEXT_SETTINGS, epilog=EXAMPLES["cleanup"],
             short_help="Delete leftover debug pods.")
@functools.partial(_kube_options, namespace_env="GPU_DOCTOR_NAMESPACE", namespace_help=(
    "Namespace to clean (default: the probe namespace, where debug pods run: "
    "$GPU_DOCTOR_NAMESPACE, else gpu-doctor)."))
@click.option("-A", "--all-namespaces", is_flag=True, default=False,
              help="Clean every namespace (needs list and delete on pods cluster-wide).")
@click.pass_context
def cleanup_cmd(ctx: click.Context, **kw: Any) -> int:
    """Delete leftover debug pods (label app.kubernetes.io/name=gpu-doctor with a
    gpu-doctor/run-id) in one namespace, or in all with -A."""
    o = _with_group(ctx, kw)
    explicit_ns = ctx.get_parameter_source("namespace") == ParameterSource.COMMANDLINE or \
        (ctx.meta.get(_GROUP_OPTS) or {}).get("namespace") is not None
    if o["all_namespaces"] and explicit_ns:
        raise click.UsageError("-n/--namespace and -A/--all-namespaces exclude each other", ctx)
    return cleanup.cleanup(_session(ctx), o)


@cli.group("agent", context_settings=CONTEXT_SETTINGS, epilog=EXAMPLES["agent"],
           short_help="The standing agent on every node: install, status, uninstall.")
def agent_group() -> None:
    """The standing agent: a DaemonSet of the probe image in the gpu-doctor namespace.
    `node`, `pod` and `nodes --probe` run the node probe by exec in it, which works where a
    new pod cannot start (a kubelet that admits nothing). By default it also watches: every
    30 s it runs the cheap checks, marks its own node with GpuDoctor* NodeConditions and
    Events, and keeps evidence bundles (`node X --history`); --no-watch installs the
    sleeping agent that only waits for exec."""


def _agent_cmd_options(f: Callable, image: bool = True) -> Callable:
    """kubectl's flags (also accepted before `agent`), the agent's namespace and image."""
    f = _kube_options(f, namespace_env="GPU_DOCTOR_AGENT_NAMESPACE", namespace_help=(
        "The agent's namespace (default gpu-doctor; env GPU_DOCTOR_AGENT_NAMESPACE)."))
    if not image:
        return f
    return click.option("--image", default=None,
                        help="Probe image of the agent (default: the release image this "
                             "plugin pins).")(f)


@agent_group.command("install", context_settings=CONTEXT_SETTINGS,
                     epilog=EXAMPLES["agent install"],
                     short_help="Install or update the agent DaemonSet.")
@_agent_cmd_options
@click.option("--node-selector", default=None,
              help="Run the agent only on nodes with these labels (key=value[,key=value]); "
                   "default: every node (it tolerates every taint).")
@click.option("--watch/--no-watch", "watch", default=None,
              help="Watch mode: the agent checks its node every --interval and marks it "
                   "with GpuDoctor* NodeConditions and Events, keeping evidence bundles "
                   "(default for a new install; an installed agent keeps its mode). "
                   "--no-watch: the agent only sleeps until `node X` execs into it.")
@click.option("--interval", type=params.Duration(10), default=None,
              help="Time between the watching agent's passes (default 30s; at least 10s).")
@click.option("--metrics-port", type=click.IntRange(1024, 65535), default=None,
              help="Serve Prometheus metrics on this pod port (default: off); see "
                   "deploy/examples/agent-podmonitor.yaml.")
@click.option("--dry-run", type=click.Choice(("none", "client", "server")), is_flag=False,
              flag_value="client", default="none",
              help="As kubectl: `client` (or bare --dry-run) prints the manifests without "
                   "sending them (GitOps); `server` sends them with dryRun=All, so the API "
                   "server validates and admits them without persisting anything.")
@click.option("-o", "--output", type=click.Choice(("yaml", "json")), default="yaml",
              help="Format of --dry-run=client (default yaml).")
@click.pass_context
def agent_install_cmd(ctx: click.Context, **kw: Any) -> int:
    """Install (or update) the agent DaemonSet, its namespace and priority quota; watching,
    also its ServiceAccount, RBAC (nodes/status patch, events create) and the admission
    policies that keep it to its own node."""
    return agent.agent_install(_session(ctx), _with_group(ctx, kw))


@agent_group.command("status", context_settings=CONTEXT_SETTINGS,
                     epilog=EXAMPLES["agent status"],
                     short_help="Nodes without a Running agent, and version skew.")
@_agent_cmd_options
@click.option("-l", "--selector", default=None,
              help="Nodes to report (default: those the DaemonSet selects).")
@click.option("-o", "--output", type=click.Choice(("table", "json", "yaml")), default="table",
              help="Output format (default table).")
@click.pass_context
def agent_status_cmd(ctx: click.Context, **kw: Any) -> int:
    """How many nodes have a Running agent of this plugin's version; the nodes that need a
    look (no agent pod, not Running, another version, a pod that is not the DaemonSet's own).
    Exit 0: every node has a Running agent of this version; 1 otherwise (also when it is not
    installed)."""
    return agent.agent_status(_session(ctx), _with_group(ctx, kw))


@agent_group.command("uninstall", context_settings=CONTEXT_SETTINGS,
                     epilog=EXAMPLES["agent uninstall"],
                     short_help="Delete the agent DaemonSet and its identity.")
@functools.partial(_agent_cmd_options, image=False)
@click.pass_context
def agent_uninstall_cmd(ctx: click.Context, **kw: Any) -> int:
    """Delete the agent DaemonSet (its pods go with it), its quota and its identity."""
    return agent.agent_uninstall(_session(ctx), _with_group(ctx, kw))


@cli.command("replay", context_settings=CONTEXT_SETTINGS, epilog=EXAMPLES["replay"],
             short_help="Render a bundle saved with --save again, offline.")
@click.argument("bundle_file", metavar="FILE", type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Choice(FORMATS), default=None,
              help="Output format (default table).")
@click.option("--fail-on", type=click.Choice(FAIL_ON), default=None,
              help="Recompute the exit code for this threshold (default: the saved run's).")
@click.option("--details", is_flag=True, default=False,
              help="Table: details of every finding, not only of critical and warning ones.")
@click.pass_context
def replay_cmd(ctx: click.Context, bundle_file: str, output: str | None,
               fail_on: str | None, details: bool) -> int:
    """Render a bundle saved with --save (or kept by the watching agent) again, offline,
    with the same exit code; the header says it is a replay, of which file, captured when
    and by which command."""
    return replay.replay(_session(ctx), bundle_file, output or "table", fail_on, details)


def _complete_ids(ctx, param, incomplete):  # pragma: no cover - interactive
    from node_probe.protocol.catalog import CATALOG
    return [i for i in sorted(CATALOG) if i.startswith(incomplete)]


@cli.command("explain", context_settings=CONTEXT_SETTINGS, epilog=EXAMPLES["explain"],
             short_help="A finding's page: what it means and the fix (offline).")
@click.argument("finding_id", metavar="[ID]", required=False, shell_complete=_complete_ids)
@click.pass_context
def explain_cmd(ctx: click.Context, finding_id: str | None) -> int:
    """A finding's page, offline: its one-line meaning, the fix, the cause, the evidence
    and the references. ID is a finding id from a report, or one of the watching agent's
    NodeCondition types or reasons (GpuDoctorDevicePluginStuck, DevicepluginBlockedInNvml).
    Without ID, every id with its meaning."""
    return explain.explain(_session(ctx), finding_id)


@cli.command("mcp", context_settings=CONTEXT_SETTINGS, epilog=EXAMPLES["mcp"],
             short_help="Serve the diagnosis as MCP tools to an incident assistant.")
@click.option("--allow-node-probe", is_flag=True, default=False,
              help="Let the tools run on a node: the node probe of node, pod and nodes "
                   "(probe=true; exec in the standing agent, else a debug pod) and history "
                   "(exec in the agent). Without it: API reads only, nothing created.")
@click.option("--call-timeout", type=params.Duration(1), default=None,
              help="Wall-clock limit of one tool call; past it the call's run is stopped "
                   "(its debug pod deleted) and the call answers an error (default 5m).")
@click.option("--fail-on", type=click.Choice(FAIL_ON), default=None,
              help="Exit code 1 in a document with findings at or above this severity "
                   "(default warning).")
@click.option("--timeout", type=params.Duration(1), default=None,
              help="Deadline of the node probe (default 60s).")
@click.option("--trace-seconds", type=params.Duration(0), default=None,
              help="eBPF trace window of the node probe; 0 disables tracing (default 5s).")
@click.option("--start-timeout", type=params.Duration(1), default=None,
              help="How long to wait for a debug pod to run (default 60s).")
@click.option("--image", default=None, help="Probe image of the debug pod (default: the "
                                              "release image this plugin pins).")
@_probe_namespace
@click.option("--agent-namespace", type=params.NAMESPACE, default=None,
              envvar="GPU_DOCTOR_AGENT_NAMESPACE",
              help="Namespace of the standing agent (default gpu-doctor); env "
                   "GPU_DOCTOR_AGENT_NAMESPACE.")
@_kubelet_timeout
@functools.partial(_kube_options, namespace_help=(
    "Namespace of the pod tool's POD when a call names none (default: the context's "
    "namespace, else default)."))
@click.pass_context
def mcp_cmd(ctx: click.Context, **kw: Any) -> int:
    """Serve the read-only diagnosis (node, pod, nodes, explain, history, replay) as tools to
    an MCP client, e.g. an incident assistant, over stdio; each answer is the -o json
    document. Runs until the client closes stdin."""
    return mcp.serve(_session(ctx), _opts(ctx, kw))


@cli.command("version", context_settings=CONTEXT_SETTINGS, epilog=EXAMPLES["version"])
@click.option("-o", "--output", type=click.Choice(("json", "yaml")), default=None,
              help="One document instead of text, as `kubectl version -o json|yaml`.")
@click.pass_context
def version_cmd(ctx: click.Context, output: str | None) -> int:
    """Print the plugin version and the probe image it uses."""
    return version.version(_session(ctx), output)


@cli.command("rbac", context_settings=CONTEXT_SETTINGS, epilog=EXAMPLES["rbac"],
             short_help="Print the RBAC and namespace manifests to apply.")
@click.argument("parts", nargs=-1, metavar="[PART]...",
                type=click.Choice(rbac.PARTS + ("all",)))
@click.pass_context
def rbac_cmd(ctx: click.Context, parts: tuple[str, ...]) -> int:
    """Print the manifests a cluster admin applies, from this plugin (no repository needed):
    `kubectl gpu-doctor rbac | kubectl apply -f -`. PART: base (default: the probe namespace
    and the users' RBAC), nodes-proxy (opt-in, exec-equivalent: read its warning), agent
    (opt-in: exec into the standing agent), admission-policy (only the probe image in the
    probe namespace), or all (base and admission-policy, never an opt-in: name those too,
    e.g. `rbac all nodes-proxy`)."""
    return rbac.rbac(_session(ctx), parts)


@cli.command("completion", context_settings=CONTEXT_SETTINGS, epilog=EXAMPLES["completion"],
             short_help="Print a shell completion script.")
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
@click.pass_context
def completion_cmd(ctx: click.Context, shell: str) -> int:
    """Print a shell completion script: `source <(kubectl-gpu_doctor completion bash)`."""
    return version.completion(_session(ctx), cli, shell)


# -- the one end of every run ------------------------------------------------------------------

class _Terminated(KeyboardInterrupt):
    """SIGTERM, delivered like Ctrl-C so every `finally` (pod deletion) runs."""


def _on_sigterm(signum, frame):
    raise _Terminated()


def main(argv: list[str] | None = None, exiting: bool = False) -> int:
    """Run one command; return its exit code. Never raises (except SystemExit from click
    completion, which exits on its own).

    exiting=True (entrypoint: the process ends right after): from the finish on, SIGINT and
    SIGTERM stay held, so a late signal cannot end the process with another code between the
    verdict and the exit."""
    _reopen_closed_streams()
    session = Session()
    old = signal.signal(signal.SIGTERM, _on_sigterm)
    # A short-lived CLI holding 30,000 pod dicts: the cyclic GC would rescan them on every
    # collection (seconds at fleet scale) and there are no cycles worth collecting.
    gc_was = gc.isenabled()
    gc.disable()
    try:
        try:
            rv = cli.main(args=argv, prog_name=PROG, standalone_mode=False, obj=session)
            return _end(session, int(rv or 0), None, exiting)
        except click.exceptions.Exit as exc:  # --help, --version
            return int(exc.exit_code)
        except _NO_ARGS_HELP as exc:  # bare `kubectl gpu-doctor`: its help, exit 0, as kubectl
            with closed_pipe_ok():
                click.echo(exc.ctx.get_help() if exc.ctx else cli.get_help(
                    click.Context(cli, info_name=PROG)))
            return int(ExitStatus.OK)
        except BrokenPipeError:  # the reader left mid-run (`-o jsonl | head -1`)
            _quiet_stdout()
            if session.out is None:
                return int(ExitStatus.OK)
            session.out.mark_incomplete("stdout was closed by its reader before the run ended")
            return _end(session, int(ExitStatus.OK), None, exiting)
        except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - one line and a code
            err = _as_error(exc)
            if os.environ.get("GPU_DOCTOR_DEBUG") and isinstance(err, errors.InternalError):
                session.close()
                raise
            return _end(session, errors.exit_status_of(err), err, exiting)
    finally:
        if not exiting:
            signal.signal(signal.SIGTERM, old)
        if gc_was:
            gc.enable()


_ENDING_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _end(session: Session, status: int, error: errors.GpuDoctorError | None,
         exiting: bool) -> int:
    """Session.finish with SIGINT/SIGTERM ignored: Ctrl-C hammered while the run ends must
    not cut the pod deletions or the report short. The finish is bounded (each DELETE has a
    deadline); signals that arrive meanwhile are dropped, the run is ending anyway. Ignored,
    not masked: a mask is per thread, and the kernel hands a process signal to any thread
    that does not block it, while Python runs the handler in the main thread regardless."""
    held = threading.current_thread() is threading.main_thread()
    if held:
        old = {s: signal.signal(s, signal.SIG_IGN) for s in _ENDING_SIGNALS}
    try:
        return session.finish(status, error)
    finally:
        if held and not exiting:
            for sig, handler in old.items():
                signal.signal(sig, handler)


def _as_error(exc: BaseException) -> errors.GpuDoctorError:
    """click's and Python's exceptions in our hierarchy, so errors.exit_status_of stays the one
    mapping to exit codes."""
    if isinstance(exc, errors.GpuDoctorError):
        return exc
    if isinstance(exc, click.UsageError):
        msg = " ".join(m.strip() for m in exc.format_message().strip().splitlines())
        path = exc.ctx.command_path if exc.ctx is not None else PROG
        if exc.ctx is not None and exc.ctx.info_name == "node" and "Missing argument" in msg:
            msg = msg.rstrip(".") + " (every node: `kubectl gpu-doctor nodes`)"
        # as kubectl's usage errors end (cmdutil.UsageErrorf), on the same line
        return errors.UsageError(f"{msg.rstrip('.')}. See '{path} -h' for help and examples")
    if isinstance(exc, (click.Abort, KeyboardInterrupt)):
        return errors.Interrupted("interrupted")
    if isinstance(exc, click.ClickException):
        return errors.UsageError(exc.format_message())
    return errors.InternalError(f"internal error: {type(exc).__name__}: {exc} "
                                "(GPU_DOCTOR_DEBUG=1 shows the traceback)")


# click >= 8.2 raises this for a group called without a command (older ones print the help
# and exit 0 themselves)
_NO_ARGS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


def _reopen_closed_streams() -> None:
    """Started with stdout or stderr closed (`>&-`): Python then has None there and the first
    write would be an AttributeError (exit 70). Write to /dev/null instead."""
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w"))  # noqa: SIM115 - lives as long as we do


def _quiet_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass


def cobra_complete(args: list[str]) -> str:
    """kubectl's plugin completion protocol (kubernetes/kubernetes#105867): kubectl runs
    `kubectl_complete-gpu_doctor <words after the plugin name>` (last word = the partial one)
    and expects Cobra's `__complete` output: one candidate per line (`value<TAB>help`), then
    `:<directive>` (4 = do not fall back to file names)."""
    from click.shell_completion import ShellComplete
    words, incomplete = (args[:-1], args[-1]) if args else ([], "")
    comp = ShellComplete(cli, {}, "kubectl-gpu_doctor", "_KUBECTL_GPU_DOCTOR_COMPLETE")
    lines = []
    for item in comp.get_completions(words, incomplete):
        lines.append(f"{item.value}\t{item.help}" if item.help else str(item.value))
    return "\n".join(lines + [":4"]) + "\n"


def complete_entrypoint() -> None:
    """The `kubectl_complete-gpu_doctor` executable kubectl looks for on PATH."""
    try:
        sys.stdout.write(cobra_complete(sys.argv[1:]))
        sys.stdout.flush()
    except Exception:  # noqa: BLE001 - completion must never print a traceback into a shell
        sys.stdout.write(":4\n")
    os._exit(0)


def entrypoint() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["__complete"]:  # `kubectl-gpu_doctor __complete ...` == the completer
        sys.argv = sys.argv[:1] + argv[1:]
        complete_entrypoint()
    if argv[:1] == ["__probe"]:  # frozen builds: run the node probe in this child process
        from .reach import localproc as local
        local.run_probe_here(argv[1:])
    code = main(argv, exiting=True)
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _quiet_stdout()
    # Abandoned threads (a hung proxy call) must not keep the process alive.
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    entrypoint()

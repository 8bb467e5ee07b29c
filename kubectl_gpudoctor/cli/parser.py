"""The click group and its commands: each command is its flags and one call into the program
of commands/ that runs it (flags -> one call; the program returns an exit status or raises).
The flags several commands share live in options.py, the examples in help_text.py."""
from __future__ import annotations

import functools
from typing import Any, Callable

import click
from click.core import ParameterSource

from node_probe.protocol import FAIL_ON

from .. import params
from ..commands import agent
from ..commands import cleanup
from ..commands import explain
from ..commands import job
from ..commands import local
from ..commands import mcp
from ..commands import node
from ..commands import nodes
from ..commands import rbac
from ..commands import replay
from ..commands import version
from ..report.output import FORMATS
from ..session import Session
from .help_text import EXAMPLES
from .options import (CONTEXT_SETTINGS, GROUP_OPTS, NS_GROUP, NS_POD, agent_options,
                      all_namespaces, cluster_options, common_options, history_option,
                      kube_options, kubelet_timeout, merged_options, output_options,
                      probe_namespace, refuse_unused_group_options, with_group)


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
@functools.partial(kube_options, namespace_help=NS_GROUP)
@click.pass_context
def cli(ctx: click.Context, **kw: Any) -> None:
    refuse_unused_group_options(ctx, kw)
    ctx.meta[GROUP_OPTS] = kw


def _complete_names(ctx: click.Context, kind: str, incomplete: str) -> list[str]:
    """Names of `kind` ("node" or "pod") starting with `incomplete`, through the kubeconfig,
    context and namespace typed so far; [] on any failure (completion never fails loudly)."""
    try:
        from ..commands.version import complete_names
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
    @functools.partial(common_options, namespace_help=namespace_help)
    @cluster_options
    @extra
    @click.pass_context
    def command(ctx: click.Context, name: str, **kw: Any) -> int:
        return getattr(node, kind)(_session(ctx), merged_options(ctx, kw), name)
    return command


node_cmd = _target_command(
    "node", params.NODE_NAME, shell_complete=_complete_nodes,
    extra=lambda f: all_namespaces(None)(history_option(f)),
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
    "pod", params.POD_NAME, namespace_help=NS_POD, shell_complete=_complete_pods,
    extra=all_namespaces("Find POD in every namespace (one list call; an error if more "
                         "than one namespace has a pod of that name)."),
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
@click.option("--concurrency", type=params.Count(1, 64), default=None,
              help="Parallel per-node kubelet calls for flagged nodes, 1 to 64 (default 8).")
@click.option("--stall-threshold", type=params.Duration(1), default=None,
              help="How long a bound pod may go untouched before it counts as stalled "
                   "(default 2m).")
@click.option("--probe", "probe", is_flag=True, default=False,
              help="Also run the node probe on every selected node, --concurrency at a "
                   "time: by exec in the standing agent where one runs, else in a debug pod.")
@click.option("--max-probes", type=params.Count(1), default=20,
              help="Refuse --probe when more than this many nodes would need a debug pod "
                   "(nodes with a Running agent do not count; default 20).")
@click.option("--start-timeout", type=params.Duration(1), default=None,
              help="How long to wait for each debug pod to run (default 60s).")
@click.option("--no-headers", "no_headers", is_flag=True, default=False,
              help="Table: leave out the column titles, as kubectl's --no-headers.")
@probe_namespace
@kubelet_timeout
@agent_options
@functools.partial(common_options, formats=FORMATS + ("name",))
@all_namespaces(None)
@click.pass_context
def nodes_cmd(ctx: click.Context, selector: str | None, all_nodes: bool, probe: bool,
              max_probes: int, show_healthy: bool, no_headers: bool, **kw: Any) -> int:
    """The GPU nodes of a fleet from the API side in a constant number of list calls: the
    sick ones, worst first, each with its verdict on a line of its own; the healthy ones
    counted. The watching agent's conditions come with the node list (no exec);
    --probe also runs the node probe on each selected node. -o name prints `node/NAME` for
    each node the table lists (for `xargs kubectl cordon`)."""
    names_only = kw.get("output") == "name"
    if names_only:
        kw["output"] = "table"
    o = merged_options(ctx, kw)
    o["no_probe"] = not probe
    return nodes.nodes(_session(ctx), o, selector, all_nodes, max_probes, show_healthy,
                       names_only=names_only, headers=not no_headers)


def _complete_kinds(ctx, param, incomplete):  # pragma: no cover - interactive
    from ..analysis.job.kinds import kind_names
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
@probe_namespace
@kubelet_timeout
@functools.partial(common_options, namespace_help="Namespace of the job (default: the "
                                                  "kubeconfig context's namespace, else default).")
@click.pass_context
def job_cmd(ctx: click.Context, name: str | None, kind: str | None, selector: str | None,
            probe: bool, max_probes: int, **kw: Any) -> int:
    """Which node (or rank) holds up a multi-node GPU job. NAME is a batch Job, JobSet,
    Kubeflow job (PyTorchJob, MPIJob and the rest), LeaderWorkerSet, RayJob, RayCluster, Volcano Job or
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
    o = merged_options(ctx, kw)
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
@output_options
@click.pass_context
def local_cmd(ctx: click.Context, host_root, cgroup_root, kubelet_dir, kmsg_file, plugin_log,
              nvidia_smi_file, lspci_file, bug_report, only, skip, list_checks,
              **kw: Any) -> int:
    """Run the node probe on THIS host, no cluster needed: over SSH on a node where no pod
    can start (a wedged kubelet, a NotReady node), or on a machine being set up."""
    if list_checks:
        return local.list_checks(_session(ctx))
    o = merged_options(ctx, kw)
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
@functools.partial(kube_options, namespace_env="GPU_DOCTOR_NAMESPACE", namespace_help=(
    "Namespace to clean (default: the probe namespace, where debug pods run: "
    "$GPU_DOCTOR_NAMESPACE, else gpu-doctor)."))
@click.option("-A", "--all-namespaces", is_flag=True, default=False,
              help="Clean every namespace (needs list and delete on pods cluster-wide).")
@click.pass_context
def cleanup_cmd(ctx: click.Context, **kw: Any) -> int:
    """Delete leftover debug pods (label app.kubernetes.io/name=gpu-doctor with a
    gpu-doctor/run-id) in one namespace, or in all with -A."""
    o = with_group(ctx, kw)
    explicit_ns = ctx.get_parameter_source("namespace") == ParameterSource.COMMANDLINE or \
        (ctx.meta.get(GROUP_OPTS) or {}).get("namespace") is not None
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
    f = kube_options(f, namespace_env="GPU_DOCTOR_AGENT_NAMESPACE", namespace_help=(
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
@click.option("--metrics-port", type=params.Count(1024, 65535), default=None,
              help="Serve Prometheus metrics on this pod port, 1024 to 65535 (default: off); see "
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
    return agent.agent_install(_session(ctx), with_group(ctx, kw))


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
    return agent.agent_status(_session(ctx), with_group(ctx, kw))


@agent_group.command("uninstall", context_settings=CONTEXT_SETTINGS,
                     epilog=EXAMPLES["agent uninstall"],
                     short_help="Delete the agent DaemonSet and its identity.")
@functools.partial(_agent_cmd_options, image=False)
@click.option("--dry-run", type=click.Choice(("none", "client", "server")), is_flag=False,
              flag_value="client", default="none",
              help="As kubectl: `client` (or bare --dry-run) says what would be deleted and "
                   "sends nothing; `server` sends each delete with dryRun=All, so the API "
                   "server checks it and deletes nothing. Neither clears node conditions.")
@click.pass_context
def agent_uninstall_cmd(ctx: click.Context, **kw: Any) -> int:
    """Delete the agent DaemonSet (its pods go with it), its quota and its identity."""
    return agent.agent_uninstall(_session(ctx), with_group(ctx, kw))


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
@probe_namespace
@click.option("--agent-namespace", type=params.NAMESPACE, default=None,
              envvar="GPU_DOCTOR_AGENT_NAMESPACE",
              help="Namespace of the standing agent (default gpu-doctor); env "
                   "GPU_DOCTOR_AGENT_NAMESPACE.")
@kubelet_timeout
@functools.partial(kube_options, namespace_help=(
    "Namespace of the pod tool's POD when a call names none (default: the context's "
    "namespace, else default)."))
@click.pass_context
def mcp_cmd(ctx: click.Context, **kw: Any) -> int:
    """Serve the read-only diagnosis (node, pod, nodes, explain, history, replay) as tools to
    an MCP client, e.g. an incident assistant, over stdio; each answer is the -o json
    document. Runs until the client closes stdin."""
    return mcp.serve(_session(ctx), merged_options(ctx, kw))


@cli.command("version", context_settings=CONTEXT_SETTINGS, epilog=EXAMPLES["version"],
             short_help="The plugin version and its probe image.")
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

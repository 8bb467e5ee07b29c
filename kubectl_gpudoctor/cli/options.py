"""The flags many commands share (kubectl's global flags, output and deadlines, the agent's and
the debug pod's), and the one merge of defaults, flags given before the command name and the
command's own flags: the decorators parser.py stacks on each click command."""
from __future__ import annotations

from typing import Callable

import click
from click.core import ParameterSource

from node_probe.protocol import FAIL_ON

from .. import params
from ..report.output import FORMATS

GROUP_OPTS = "gpu_doctor.group_options"
CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
DEFAULTS = {"output": "table", "fail_on": "warning", "timeout": 60.0, "trace_seconds": 5.0,
            "start_timeout": 60.0, "stall_threshold": 120.0, "concurrency": 8,
            "kubelet_timeout": 10.0, "request_timeout": 15.0}


def apply_options(f: Callable, opts: list) -> Callable:
    for o in reversed(opts):
        f = o(f)
    return f


def output_options(f: Callable, formats: tuple = FORMATS) -> Callable:
    """Output and deadlines: every command that runs checks, `local` included."""
    return apply_options(f, [
        click.option("-o", "--output", type=click.Choice(formats), default=None,
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


NS_POD = ("Namespace of POD (default: the kubeconfig context's namespace, else default). "
          "The debug pod never runs there: see --probe-namespace.")
NS_GROUP = ("Namespace for the commands that take one: `pod` (POD's), `cleanup` (default "
            "the probe namespace), `agent` (default gpu-doctor).")


def kube_options(f: Callable, namespace_help: str | None = None,
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
        click.option("--request-timeout", type=params.RequestTimeout(), default=None,
                     help="Wall-clock limit of each API request, however slowly the server "
                          "answers; 0 for none, as in kubectl (default 15s)."),
    ]
    opts.append(click.option("-n", "--namespace", type=params.NAMESPACE, default=None,
                             envvar=namespace_env, hidden=not namespace_help,
                             help=namespace_help or "Accepted and ignored (cluster-scoped)."))
    return apply_options(f, opts)


def common_options(f: Callable, namespace_help: str | None = None,
                   formats: tuple = FORMATS) -> Callable:
    """What every command that runs checks in a cluster takes: output, deadlines, kubectl's
    flags, the probe image."""
    return output_options(kube_options(apply_options(f, [
        click.option("--image", default=None,
                     help="Probe image of the debug pod (default: the release image this "
                          "plugin pins; `kubectl gpu-doctor version` names it)."),
    ]), namespace_help), formats)


def with_group(ctx: click.Context, local: dict) -> dict:
    """The command's options with kubectl's flags given before the command name
    (`kubectl gpu-doctor --context prod agent install`): a flag on the command line of the
    command wins; one given before it wins over an environment variable or a default."""
    merged = dict(local)
    for name, value in (ctx.meta.get(GROUP_OPTS) or {}).items():
        if value is None or name not in local:
            continue
        if merged[name] is None or ctx.get_parameter_source(name) != ParameterSource.COMMANDLINE:
            merged[name] = value
    return merged


def merged_options(ctx: click.Context, local: dict) -> dict:
    """Merge defaults, group-level and command-level options; command-level wins."""
    merged = dict(DEFAULTS)
    merged.update({k: v for k, v in with_group(ctx, local).items() if v is not None})
    if merged["trace_seconds"] >= merged["timeout"]:
        raise click.UsageError(
            f"--trace-seconds ({merged['trace_seconds']:g}) must be shorter than --timeout "
            f"({merged['timeout']:g}): the trace window runs inside the probe's deadline")
    return merged


def refuse_unused_group_options(ctx: click.Context, kw: dict) -> None:
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


def kubelet_timeout(f: Callable) -> Callable:
    return click.option("--kubelet-timeout", type=params.Duration(0.1), default=None,
                        help="Wall-clock limit of each kubelet call proxied by the API server "
                             "(goroutine dump, healthz, configz; default 10s).")(f)


def agent_options(f: Callable) -> Callable:
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


def cluster_options(f: Callable) -> Callable:
    f = agent_options(f)
    f = kubelet_timeout(f)
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
    return probe_namespace(f)


PROBE_NS_HELP = ("Namespace of the debug pod (default gpu-doctor; env GPU_DOCTOR_NAMESPACE). "
                 "It must carry the label gpu-doctor.io/probe-namespace=true and admit "
                 "privileged pods: `kubectl gpu-doctor rbac` prints the manifests that "
                 "create it so.")


def probe_namespace(f: Callable) -> Callable:
    return click.option("--probe-namespace", type=params.NAMESPACE, default=None,
                        envvar="GPU_DOCTOR_NAMESPACE", help=PROBE_NS_HELP)(f)


def all_namespaces(help: str | None) -> Callable:
    """kubectl's -A: `pod NAME -A` looks for POD in every namespace; on the cluster-scoped
    `node` and `nodes` it is accepted and ignored, as `kubectl get nodes -A` does (hidden)."""
    return click.option("-A", "--all-namespaces", is_flag=True, default=False,
                        hidden=help is None, help=help or "Accepted and ignored.")


def not_negative(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    if value is not None and value < 0:
        raise click.BadParameter(f"{value} is not a bundle number (1 is the newest)", ctx, param)
    return value


def history_option(f: Callable) -> Callable:
    # a plain INT checked in a callback: click.IntRange would print `[x>=0]` in --help
    return click.option(
        "--history", "history", type=click.INT, is_flag=False, flag_value=0,
        default=None, metavar="[N]", callback=not_negative,
        help="The evidence the watching agent kept on the node: without N, list the bundles; "
             "--history N replays bundle N like `replay` (with --save FILE, also copies it "
             "out). Read by exec in the agent pod; nothing runs on the node.")(f)

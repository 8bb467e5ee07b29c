"""`kubectl gpu-doctor`: the commands users type (click), and the one place errors become exits.

Why here: kubectl finds the plugin as the `kubectl-gpu_doctor` executable and passes the rest
of the command line through. This module parses it with kubectl's conventions
(--kubeconfig, --context, -n, -o), runs one command, and maps every outcome to an exit code
of DESIGN.md section 7 through errors.exit_status_of, printing ONE line on stderr for errors
(never a traceback; GPU_DOCTOR_DEBUG=1 shows it). The kubernetes client is imported only by
commands that talk to a cluster, so --help, version, completion and local start fast.
"""
from __future__ import annotations

import gc
import os
import signal
import sys
from typing import Any, Callable

import click

from node_probe.protocol.version import __version__
from node_probe.protocol import FAIL_ON, ExitStatus

from . import errors
from .output import FORMATS, Output

PROG = "kubectl gpu-doctor"
CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
_DEFAULTS = {"output": "table", "fail_on": "warning", "timeout": 60.0, "trace_seconds": 5.0,
             "start_timeout": 60.0, "stall_threshold": 120.0, "concurrency": 8,
             "kubelet_timeout": 10.0}


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
        click.option("--timeout", type=click.FloatRange(min=1), default=None,
                     help="Deadline in seconds for the node probe (default 60)."),
        click.option("--trace-seconds", type=click.FloatRange(min=0), default=None,
                     help="eBPF trace window on the node; 0 disables tracing (default 5)."),
    ])


def _common(f: Callable) -> Callable:
    """kubectl-style options, accepted before or after the subcommand."""
    return _output_options(_apply(f, [
        click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None,
                     help="Path to the kubeconfig file (default: $KUBECONFIG, ~/.kube/config)."),
        click.option("--context", default=None, help="The kubeconfig context to use."),
        click.option("-n", "--namespace", default=None,
                     help="Namespace of the debug pod and of `pod Y` (default: the context's)."),
        click.option("--image", default=None,
                     help="Probe image for the debug pod (default: the pinned release image)."),
    ]))


def _opts(ctx: click.Context, local: dict) -> dict:
    """Merge group-level and command-level options; command-level wins."""
    merged = dict(_DEFAULTS)
    for src in (ctx.obj or {}), local:
        merged.update({k: v for k, v in src.items() if v is not None})
    if merged["trace_seconds"] >= merged["timeout"]:
        raise click.UsageError(
            f"--trace-seconds ({merged['trace_seconds']:g}) must be shorter than --timeout "
            f"({merged['timeout']:g}): the trace window runs inside the probe's deadline")
    return merged


@click.group(context_settings=CONTEXT_SETTINGS, invoke_without_command=False,
             help="Why are the GPU pods on this node stuck, failing or slow?\n\n"
                  "API-side analysis (pods, events, node Lease, the kubelet's goroutine dump "
                  "and config) plus a short-lived privileged debug pod that runs the node "
                  "probe. Exit codes: 0 ok, 1 findings at or above --fail-on, 2 usage, "
                  "3 cluster or launch error, 4 probe incomplete, 130 interrupted.")
@_common
@click.pass_context
def cli(ctx: click.Context, **kw: Any) -> None:
    ctx.obj = kw


def _kubelet_timeout(f: Callable) -> Callable:
    return click.option("--kubelet-timeout", type=click.FloatRange(min=0.1), default=None,
                        help="Seconds to wait for each kubelet call proxied by the API server "
                             "(goroutine dump, healthz, configz; default 10).")(f)


def _cluster_options(f: Callable) -> Callable:
    f = _kubelet_timeout(f)
    f = click.option("--start-timeout", type=click.FloatRange(min=1), default=None,
                     help="Seconds to wait for the debug pod to run (default 60).")(f)
    f = click.option("--stall-threshold", type=click.FloatRange(min=1), default=None,
                     help="Seconds a bound pod may go untouched by the kubelet before it "
                          "counts as stalled (default 120).")(f)
    f = click.option("--no-probe", is_flag=True, default=False,
                     help="API-side analysis only; do not start a debug pod.")(f)
    f = click.option("--probe-namespace", default=None, envvar="GPU_DOCTOR_NAMESPACE",
                     help="Namespace of the debug pod when it differs from -n (e.g. the "
                          "privileged `gpu-doctor` namespace of deploy/rbac.yaml while "
                          "`pod Y -n team`); env GPU_DOCTOR_NAMESPACE.")(f)
    return f


def _complete_nodes(ctx, param, incomplete):  # pragma: no cover - interactive
    try:
        from .kube import Kube
        k = Kube(request_timeout_s=3)
        doc = k.get_json("/api/v1/nodes", [("resourceVersion", "0")], timeout=3)
        names = [n["metadata"]["name"] for n in doc.get("items") or ()]
        return [n for n in names if n.startswith(incomplete)]
    except Exception:  # noqa: BLE001 - completion must never fail loudly
        return []


@cli.command("node", context_settings=CONTEXT_SETTINGS)
@click.argument("name", shell_complete=_complete_nodes)
@_common
@_cluster_options
@click.pass_context
def node_cmd(ctx: click.Context, name: str, **kw: Any) -> int:
    """Diagnose node NAME: API-side analysis, then the node probe in a debug pod."""
    o = _opts(ctx, kw)
    from . import diagnose
    return _run_cluster(o, {"kind": "node", "name": name, "node": name},
                        lambda kube, out, s, reg: diagnose.diagnose_node(
                            kube, name, s, out, on_pod=reg))


@cli.command("pod", context_settings=CONTEXT_SETTINGS)
@click.argument("name")
@_common
@_cluster_options
@click.pass_context
def pod_cmd(ctx: click.Context, name: str, **kw: Any) -> int:
    """Explain why pod NAME is not running, then run the node checks focused on it."""
    o = _opts(ctx, kw)
    from . import diagnose

    def go(kube, out, s, reg):
        diagnose.diagnose_pod(kube, s.namespace, name, s, out, on_pod=reg)
    return _run_cluster(o, {"kind": "pod", "name": name, "node": None}, go, pod_target=True)


@cli.command("nodes", context_settings=CONTEXT_SETTINGS)
@click.option("-l", "--selector", default=None,
              help="Label selector (default: all nodes that have GPUs).")
@click.option("--all", "all_nodes", is_flag=True, default=False,
              help="Without -l: include nodes without GPUs.")
@click.option("--concurrency", type=click.IntRange(min=1, max=64), default=None,
              help="Parallel per-node kubelet calls for flagged nodes (default 8).")
@click.option("--stall-threshold", type=click.FloatRange(min=1), default=None,
              help="Seconds a bound pod may go untouched before it counts as stalled.")
@click.option("--probe", "probe", is_flag=True, default=False,
              help="Also run the node probe in a debug pod on every selected node, "
                   "--concurrency at a time (narrow the set with -l).")
@click.option("--max-probes", type=click.IntRange(min=1), default=20, show_default=True,
              help="Refuse --probe on more nodes than this.")
@click.option("--start-timeout", type=click.FloatRange(min=1), default=None,
              help="Seconds to wait for each debug pod to run (default 60).")
@click.option("--probe-namespace", default=None, envvar="GPU_DOCTOR_NAMESPACE",
              help="Namespace of the debug pods (default: -n / the context's); env "
                   "GPU_DOCTOR_NAMESPACE.")
@_kubelet_timeout
@_common
@click.pass_context
def nodes_cmd(ctx: click.Context, selector: str | None, all_nodes: bool, probe: bool,
              max_probes: int, **kw: Any) -> int:
    """Scan many nodes from the API side (a constant number of list calls) in one table."""
    o = _opts(ctx, kw)
    o["no_probe"] = not probe
    from . import fleet
    rows_box: list = []

    def go(kube, out, s, reg):
        rows_box.extend(fleet.scan(kube, selector, s, out, all_nodes=all_nodes,
                                   max_probes=max_probes, on_pod=reg))
    return _run_cluster(o, {"kind": "nodes", "name": selector or
                            ("all nodes" if all_nodes else "GPU nodes"), "node": None}, go,
                        pre_table=lambda: fleet.table(rows_box) if rows_box else (
                            "No nodes matched " + (f"-l {selector}" if selector else
                                                   "(no node has GPUs; --all shows every node)")
                            + ".\n\n"))


@cli.command("local", context_settings=CONTEXT_SETTINGS)
@click.option("--host-root", type=click.Path(file_okay=False), default=None,
              help="Where the host's / is mounted (default /).")
@click.option("--cgroup-root", type=click.Path(file_okay=False), default=None)
@click.option("--kubelet-dir", type=click.Path(file_okay=False), default=None)
@click.option("--kmsg-file", type=click.Path(dir_okay=False), default=None)
@click.option("--plugin-log", type=click.Path(dir_okay=False), default=None)
@click.option("--only", multiple=True, help="Run only these checks (repeatable).")
@click.option("--skip", multiple=True, help="Skip these checks (repeatable).")
@_output_options
@click.pass_context
def local_cmd(ctx: click.Context, host_root, cgroup_root, kubelet_dir, kmsg_file, plugin_log,
              only, skip, **kw: Any) -> int:
    """Run the node probe on THIS host (no cluster; e.g. over SSH on a wedged node)."""
    o = _opts(ctx, kw)
    args = ["--timeout", f"{o['timeout']:g}", "--trace-seconds", f"{o['trace_seconds']:g}",
            "--fail-on", o["fail_on"]]
    for flag, val in (("--host-root", host_root), ("--cgroup-root", cgroup_root),
                      ("--kubelet-dir", kubelet_dir), ("--kmsg-file", kmsg_file),
                      ("--plugin-log", plugin_log)):
        if val:
            args += [flag, str(val)]
    for c in only:
        args += ["--only", c]
    for c in skip:
        args += ["--skip", c]
    return _run_local(o, args)


@cli.command("cleanup", context_settings=CONTEXT_SETTINGS)
@_common
@click.pass_context
def cleanup_cmd(ctx: click.Context, **kw: Any) -> int:
    """Delete leftover debug pods (label app.kubernetes.io/name=gpu-doctor)."""
    o = _opts(ctx, kw)
    from . import debugpod
    from .kube import ApiStatus, Kube
    kube = Kube(o.get("kubeconfig"), o.get("context"))
    pods = debugpod.list_leftovers(kube, o.get("namespace"))
    deleted, failed = 0, []
    for p in pods:
        md = p.get("metadata") or {}
        try:
            kube.request("DELETE", f"/api/v1/namespaces/{md.get('namespace')}/pods/"
                         f"{md.get('name')}", [("gracePeriodSeconds", "0")])
            deleted += 1
        except ApiStatus as exc:
            if exc.status == 404:
                deleted += 1
            else:
                failed.append(f"{md.get('namespace')}/{md.get('name')}: {exc.status}")
    where = f"namespace {o['namespace']}" if o.get("namespace") else "all namespaces"
    click.echo(f"deleted {deleted} gpu-doctor debug pod(s) in {where}"
               + (f"; could not delete {len(failed)}: {', '.join(failed)}" if failed else ""))
    return ExitStatus.CLUSTER_ERROR if failed else ExitStatus.OK


@cli.command("version", context_settings=CONTEXT_SETTINGS)
def version_cmd() -> int:
    """Print the plugin version and the probe image it uses."""
    from .debugpod import DEFAULT_IMAGE
    click.echo(f"kubectl-gpu_doctor {__version__}\nprobe image {DEFAULT_IMAGE}")
    return ExitStatus.OK


@cli.command("completion", context_settings=CONTEXT_SETTINGS)
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion_cmd(shell: str) -> int:
    """Print a shell completion script: `source <(kubectl-gpu_doctor completion bash)`."""
    from click.shell_completion import get_completion_class
    comp_cls = get_completion_class(shell)
    comp = comp_cls(cli, {}, "kubectl-gpu_doctor", "_KUBECTL_GPU_DOCTOR_COMPLETE")
    click.echo(comp.source())
    return ExitStatus.OK


# -- running a cluster command ---------------------------------------------------------------

class _Terminated(KeyboardInterrupt):
    """SIGTERM, delivered like Ctrl-C so every `finally` (pod deletion) runs."""


def _on_sigterm(signum, frame):
    raise _Terminated()


def _settings(o: dict, namespace: str):
    from .diagnose import Settings
    from .debugpod import DEFAULT_IMAGE
    return Settings(namespace=namespace, probe_namespace=o.get("probe_namespace"),
                    image=o.get("image") or DEFAULT_IMAGE,
                    timeout_s=o["timeout"], trace_s=o["trace_seconds"],
                    start_timeout_s=o["start_timeout"], stall_threshold_s=o["stall_threshold"],
                    probe=not o.get("no_probe"), concurrency=o.get("concurrency") or 8,
                    kubelet_timeout_s=o["kubelet_timeout"])


def _run_cluster(o: dict, target: dict, fn: Callable, pod_target: bool = False,
                 pre_table: Callable[[], str] = lambda: "") -> int:
    from .kube import Kube
    kube = Kube(o.get("kubeconfig"), o.get("context"))  # kubeconfig errors: nothing to render
    namespace = o.get("namespace") or kube.default_namespace
    if pod_target:
        target["name"] = f"{namespace}/{target['name']}"
    out = Output(o["output"], o["fail_on"], target)
    seen: list = []  # every debug pod of this run (several with `nodes --probe`)

    def register(pod) -> None:
        if pod is not None:
            seen.append(pod)

    error: errors.GpuDoctorError | None = None
    old = signal.signal(signal.SIGTERM, _on_sigterm)
    # A short-lived CLI holding 30,000 pod dicts: the cyclic GC would rescan them on every
    # collection (seconds at fleet scale) and there are no cycles worth collecting.
    gc_was = gc.isenabled()
    gc.disable()
    try:
        fn(kube, out, _settings(o, namespace), register)
    except errors.GpuDoctorError as exc:
        error = exc
    except KeyboardInterrupt:
        error = errors.Interrupted("interrupted")
    finally:
        for pod in list(seen):  # belt and braces: run_probe's finally deletes it already;
            pod.delete()        # idempotent, and here the only path for worker threads' pods
        signal.signal(signal.SIGTERM, old)
        if gc_was:
            gc.enable()
    if error is not None:
        if isinstance(error, errors.Interrupted):
            created = [p for p in seen if p.created]
            if created:
                gone = all(p.deleted for p in created)
                what = "debug pod" if len(created) == 1 else f"{len(created)} debug pods"
                error.message = "interrupted; " + (
                    f"{what} deleted" if gone else
                    f"could not delete every {what}, run `kubectl gpu-doctor cleanup`")
        out.mark_incomplete(error.one_line())
    code = int(out.exit_status(error.exit_status if error else None))
    show = error is None or out.report.findings or o["output"] != "table"
    if show:
        if error is not None and o["output"] in ("json", "yaml"):
            _attach_error(out, error)
        out.finish(code, pre_table=pre_table())
    if error is not None:
        _say_error(error)
    return code


def _attach_error(out: Output, error: errors.GpuDoctorError) -> None:
    doc_fn = out.report.document

    def document(fail_on, exit_code=None):
        d = doc_fn(fail_on, exit_code)
        d["error"] = {"type": type(error).__name__, "message": error.one_line()}
        return d
    out.report.document = document  # type: ignore[method-assign]


def _run_local(o: dict, args: list[str]) -> int:
    from . import local, stream
    node = os.uname().nodename
    out = Output(o["output"], o["fail_on"], {"kind": "local", "name": node, "node": node})
    out.api_only = False
    error: errors.GpuDoctorError | None = None
    old = signal.signal(signal.SIGTERM, _on_sigterm)
    proc = None
    try:
        proc = local.ProbeProcess(["--target-name", node, *args])
        got_summary = False
        for rec in stream.records(proc.chunks()):
            out.node_record(rec)
            got_summary = got_summary or rec.get("kind") == "summary"
        rc = proc.wait(5.0)
        if rc == ExitStatus.USAGE and not got_summary:
            raise errors.UsageError("the probe rejected its arguments (see above)")
        if not got_summary:
            out.mark_incomplete(f"the probe ended without a summary (exit {rc})")
    except KeyboardInterrupt:
        error = errors.Interrupted("interrupted")
    except errors.GpuDoctorError as exc:
        error = exc
    finally:
        if proc is not None:
            proc.stop()
        signal.signal(signal.SIGTERM, old)
    if error is not None:
        out.mark_incomplete(error.one_line())
    code = int(out.exit_status(error.exit_status if error else None))
    if error is None or out.report.findings:
        out.finish(code)
    if error is not None:
        _say_error(error)
    return code


def _say_error(error: BaseException) -> None:
    text = error.one_line() if isinstance(error, errors.GpuDoctorError) else str(error)
    prefix = "" if isinstance(error, errors.Interrupted) else "error: "
    sys.stderr.write(f"{PROG}: {prefix}{text}\n")
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    """Run one command; return its exit code. Never raises (except SystemExit from click
    completion, which exits on its own)."""
    try:
        rv = cli.main(args=argv, prog_name=PROG, standalone_mode=False)
        return int(rv or 0)
    except click.exceptions.Exit as exc:  # --help, --version
        return int(exc.exit_code)
    except BrokenPipeError:
        _quiet_stdout()
        return int(ExitStatus.OK)
    except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - one line and a code
        if os.environ.get("GPU_DOCTOR_DEBUG") and not isinstance(
                exc, (errors.GpuDoctorError, click.ClickException, click.Abort,
                      KeyboardInterrupt)):
            raise
        err = _as_error(exc)
        _say_error(err)
        return int(errors.exit_status_of(err))


def _as_error(exc: BaseException) -> errors.GpuDoctorError:
    """click's and Python's exceptions in our hierarchy, so errors.exit_status_of stays the one
    mapping to exit codes."""
    if isinstance(exc, errors.GpuDoctorError):
        return exc
    if isinstance(exc, click.UsageError):
        msg = exc.format_message().strip().splitlines()
        return errors.UsageError(" ".join(m.strip() for m in msg))
    if isinstance(exc, (click.Abort, KeyboardInterrupt)):
        return errors.Interrupted("interrupted")
    if isinstance(exc, click.ClickException):
        return errors.UsageError(exc.format_message())
    return errors.GpuDoctorError(f"internal error: {type(exc).__name__}: {exc} "
                                 "(GPU_DOCTOR_DEBUG=1 shows the traceback)")


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
        from node_probe.cli import main as probe_main
        code = probe_main(argv[1:])
        sys.stdout.flush()
        os._exit(int(code))
    code = main(argv)
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _quiet_stdout()
    # Abandoned threads (a hung proxy call) must not keep the process alive.
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    entrypoint()

"""The programs behind the commands: each collects into the session and returns or raises.

Why apart from cli.py: cli.py parses the command line (click) and `cli.main` is the one place
that ends a run (exit codes through errors.exit_status_of, the report rendered once by
Session.finish). A program here never calls sys.exit, never maps an error to a code and never
renders: it returns the report's verdict (or a plain status) or raises a GpuDoctorError.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import click

from node_probe.protocol import ExitStatus
from node_probe.protocol.version import __version__

from . import errors
from .session import Session


def settings_of(o: dict, namespace: str):
    from .debugpod import DEFAULT_IMAGE
    from .diagnose import Settings
    from .probens import choose
    return Settings(namespace=namespace, probe_namespace=choose(o.get("probe_namespace")),
                    image=o.get("image") or DEFAULT_IMAGE,
                    timeout_s=o["timeout"], trace_s=o["trace_seconds"],
                    start_timeout_s=o["start_timeout"], stall_threshold_s=o["stall_threshold"],
                    probe=not o.get("no_probe"), concurrency=o.get("concurrency") or 8,
                    kubelet_timeout_s=o["kubelet_timeout"],
                    agent=not o.get("no_agent"),
                    agent_namespace=o.get("agent_namespace") or "gpu-doctor",
                    force_pod=bool(o.get("force_pod")))


def connect(o: dict):
    """The API client for these options (kubeconfig, context, --request-timeout)."""
    from .kube import DEFAULT_REQUEST_TIMEOUT_S, Kube
    return Kube(o.get("kubeconfig"), o.get("context"),
                request_timeout_s=o.get("request_timeout") or DEFAULT_REQUEST_TIMEOUT_S)


def _cluster(session: Session, o: dict, target: dict, fn: Callable,
             pod_target: bool = False) -> ExitStatus:
    """Connect, open the report, run `fn(kube, out, settings, register)`; the verdict."""
    kube = connect(o)  # kubeconfig errors: nothing to render
    namespace = o.get("namespace") or kube.default_namespace
    if pod_target:
        target["name"] = f"{namespace}/{target['name']}"
    out = session.open_report(o["output"], o["fail_on"], target)
    settings = settings_of(o, namespace)
    if o.get("save"):  # --save FILE: record the evidence as it is read
        from . import bundle
        session.bundle = bundle.Saver(o["save"], kube, out, settings.image)
    fn(kube, out, settings, session.register)
    return out.exit_status()


def node(session: Session, o: dict, name: str) -> ExitStatus:
    from . import diagnose
    return _cluster(session, o, {"kind": "node", "name": name, "node": name},
                    lambda kube, out, s, reg: diagnose.diagnose_node(kube, name, s, out,
                                                                     on_pod=reg))


def pod(session: Session, o: dict, name: str) -> ExitStatus:
    from . import diagnose
    return _cluster(session, o, {"kind": "pod", "name": name, "node": None},
                    lambda kube, out, s, reg: diagnose.diagnose_pod(kube, s.namespace, name, s,
                                                                    out, on_pod=reg),
                    pod_target=True)


def nodes(session: Session, o: dict, selector: str | None, all_nodes: bool,
          max_probes: int) -> ExitStatus:
    from . import fleet
    rows: list = []

    def preamble() -> str:
        if rows:
            return fleet.table(rows)
        return ("No nodes matched " + (f"-l {selector}" if selector else
                                       "(no node has GPUs; --all shows every node)") + ".\n\n")
    session.preamble = preamble
    target = {"kind": "nodes", "name": selector or ("all nodes" if all_nodes else "GPU nodes"),
              "node": None}
    return _cluster(session, o, target,
                    lambda kube, out, s, reg: rows.extend(fleet.scan(
                        kube, selector, s, out, all_nodes=all_nodes, max_probes=max_probes,
                        on_pod=reg)))


def local(session: Session, o: dict, probe_args: Sequence[str]) -> ExitStatus:
    """The node probe on this host in a child process, rendered like `node X`."""
    from . import local as local_probe
    from . import stream
    host = os.uname().nodename
    args = ["--timeout", f"{o['timeout']:g}", "--trace-seconds", f"{o['trace_seconds']:g}",
            "--fail-on", o["fail_on"], *probe_args]
    out = session.open_report(o["output"], o["fail_on"],
                              {"kind": "local", "name": host, "node": host}, api_only=False)
    proc = local_probe.ProbeProcess(["--target-name", host, *args])
    try:
        got_summary = False
        for rec in stream.records(proc.chunks()):
            out.node_record(rec)
            got_summary = got_summary or rec.get("kind") == "summary"
        rc = proc.wait(5.0)
        if rc == ExitStatus.USAGE and not got_summary:
            raise errors.UsageError("the probe rejected its arguments (see above)")
        if not got_summary:
            out.mark_incomplete(f"the probe ended without a summary (exit {rc})")
    finally:
        proc.stop()
    return out.exit_status()


def cleanup(session: Session, o: dict) -> ExitStatus:
    """Delete leftover debug pods (by label); a pod already gone counts as deleted."""
    from . import debugpod
    from .kube import seg
    kube = connect(o)
    deleted, failed = 0, []
    for p in debugpod.list_leftovers(kube, o.get("namespace")):
        md = p.get("metadata") or {}
        try:
            kube.request("DELETE", f"/api/v1/namespaces/{seg(md.get('namespace'))}/pods/"
                         f"{seg(md.get('name'))}", [("gracePeriodSeconds", "0")])
            deleted += 1
        except errors.NotFound:
            deleted += 1
        except errors.ApiError as exc:
            failed.append(f"{md.get('namespace')}/{md.get('name')}: {exc.status}")
    where = f"namespace {o['namespace']}" if o.get("namespace") else "all namespaces"
    click.echo(f"deleted {deleted} gpu-doctor debug pod(s) in {where}")
    if failed:
        raise errors.ClusterError(f"could not delete {len(failed)} gpu-doctor debug pod(s): "
                                  f"{', '.join(failed)}")
    return ExitStatus.OK


def version(session: Session) -> ExitStatus:
    from .build_info import DEFAULT_PROBE_IMAGE
    click.echo(f"kubectl-gpu_doctor {__version__}\n{DEFAULT_PROBE_IMAGE.describe()}")
    return ExitStatus.OK


def completion(session: Session, group: Any, shell: str) -> ExitStatus:
    from click.shell_completion import get_completion_class
    comp = get_completion_class(shell)(group, {}, "kubectl-gpu_doctor",
                                       "_KUBECTL_GPU_DOCTOR_COMPLETE")
    click.echo(comp.source())
    return ExitStatus.OK


# -- the standing agent and bundles ----------------------------------------------------------

def _agent_kube(o: dict):
    return connect(o)


def agent_install(session: Session, o: dict) -> ExitStatus:
    from . import agent
    from .debugpod import DEFAULT_IMAGE
    docs = agent.manifests(o.get("namespace") or agent.DEFAULT_NAMESPACE,
                           o.get("image") or DEFAULT_IMAGE,
                           agent.parse_selector(o.get("node_selector")))
    if o.get("dry_run"):
        import json
        import yaml
        if o.get("output") == "json":
            click.echo(json.dumps({"apiVersion": "v1", "kind": "List", "items": docs},
                                  indent=2))
        else:
            click.echo(yaml.safe_dump_all(docs, sort_keys=False), nl=False)
        return ExitStatus.OK
    for line in agent.install(_agent_kube(o), docs):
        click.echo(line)
    return ExitStatus.OK


def agent_status(session: Session, o: dict) -> ExitStatus:
    from . import agent
    from .debugpod import DEFAULT_IMAGE
    doc = agent.status(_agent_kube(o), o.get("namespace") or agent.DEFAULT_NAMESPACE,
                       o.get("image") or DEFAULT_IMAGE, o.get("selector"))
    if o.get("output") == "json":
        import json
        click.echo(json.dumps(doc, indent=2))
    elif o.get("output") == "yaml":
        import yaml
        click.echo(yaml.safe_dump(doc, sort_keys=False), nl=False)
    else:
        click.echo(agent.status_table(doc), nl=False)
    return ExitStatus.OK if agent.status_ok(doc) else ExitStatus.FINDINGS


def agent_uninstall(session: Session, o: dict) -> ExitStatus:
    from . import agent
    for line in agent.uninstall(_agent_kube(o), o.get("namespace") or agent.DEFAULT_NAMESPACE):
        click.echo(line)
    return ExitStatus.OK


def replay(session: Session, path: str, fmt: str, fail_on: str | None) -> ExitStatus:
    from . import bundle
    return ExitStatus(bundle.replay(bundle.load(path), fmt, fail_on))

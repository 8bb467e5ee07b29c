"""What every cluster command shares: the API client for the options, the settings of a run,
and `run_cluster`, which opens the report, records `--save` bundles and returns the verdict."""
from __future__ import annotations

from typing import Callable


from node_probe.protocol import ExitStatus

from ..session import Session


def settings_of(o: dict, namespace: str):
    from ..reach.podspec import DEFAULT_IMAGE
    from ..reach.probe_run import Settings
    from ..reach.probens import choose
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
    from ..api.kube import DEFAULT_REQUEST_TIMEOUT_S, Kube
    return Kube(o.get("kubeconfig"), o.get("context"),
                request_timeout_s=o.get("request_timeout") or DEFAULT_REQUEST_TIMEOUT_S)


def run_cluster(session: Session, o: dict, target: dict, fn: Callable,
             pod_target: bool = False) -> ExitStatus:
    """Connect, open the report, run `fn(kube, out, settings, register)`; the verdict."""
    # The report opens first: a kubeconfig or connection error still ends as the document
    # -o json/yaml promise (with its `error` object); a table shows only the error line.
    out = session.open_report(o["output"], o["fail_on"], target,
                              details=bool(o.get("details")))
    kube = connect(o)
    # a terminal shows what an unanswered request waits for (stderr, one live line)
    kube.on_wait = lambda text, budget, waited: out.say(text, deadline_s=budget,
                                                        waited_s=round(waited, 1))
    # an answer nested past the decoder was cut (api/depth.py): a warning, the run goes on
    def on_note(text: str) -> None:
        out.log("warning", text)
        out.check("api.nested_json", "error", 0.0, text)
    kube.on_note = on_note
    namespace = o.get("namespace") or kube.default_namespace
    if pod_target:
        out.report.target["name"] = f"{namespace}/{target['name']}"
    settings = settings_of(o, namespace)
    if o.get("save"):  # --save FILE: record the evidence as it is read
        from ..report import bundle
        session.bundle = bundle.Saver(o["save"], kube, out, settings.image)
    fn(kube, out, settings, session.register)
    return out.exit_status()


# -- the standing agent and bundles ----------------------------------------------------------



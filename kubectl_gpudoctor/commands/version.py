"""`version` and `completion`: what this build is (and which probe image it pins), and the shell
completion script with the node and pod names it offers."""
from __future__ import annotations

import json
from typing import Any

from node_probe.protocol import ExitStatus
from node_probe.protocol.version import __version__

from ..session import Session, echo

COMPLETION_TIMEOUT_S = 3.0
COMPLETION_LIMIT = 500  # one page: a shell prompt is no place for 30,000 names


def version_document() -> dict:
    from ..build_info import DEFAULT_PROBE_IMAGE as image
    return {"version": __version__,
            "probe_image": {"reference": image.reference, "tag": image.tag,
                            "digest": image.digest, "pinned": image.pinned}}


def version(session: Session, output: str | None = None) -> ExitStatus:
    from ..build_info import DEFAULT_PROBE_IMAGE
    if output == "json":
        echo(json.dumps(version_document(), indent=2))
    elif output == "yaml":
        from ..report.output import yaml_dump
        echo(yaml_dump(version_document()), nl=False)
    else:
        echo(f"kubectl gpu-doctor {__version__}\n{DEFAULT_PROBE_IMAGE.describe()}")
    return ExitStatus.OK


def completion(session: Session, group: Any, shell: str) -> ExitStatus:
    from click.shell_completion import get_completion_class
    comp = get_completion_class(shell)(group, {}, "kubectl-gpu_doctor",
                                       "_KUBECTL_GPU_DOCTOR_COMPLETE")
    echo(comp.source())
    return ExitStatus.OK


def complete_names(kind: str, incomplete: str, kubeconfig: str | None, context: str | None,
                   namespace: str | None) -> list[str]:
    """Node names, or pod names of `namespace` (default: the context's), that start with
    `incomplete`: one bounded list call from the API server's cache."""
    from ..api.kube import Kube, seg
    kube = Kube(kubeconfig, context, request_timeout_s=COMPLETION_TIMEOUT_S)
    if kind == "node":
        path = "/api/v1/nodes"
    else:
        path = f"/api/v1/namespaces/{seg(namespace or kube.default_namespace)}/pods"
    doc = kube.get_json(path, [("resourceVersion", "0"), ("limit", str(COMPLETION_LIMIT))],
                        timeout=COMPLETION_TIMEOUT_S)
    names = [str((i.get("metadata") or {}).get("name") or "") for i in doc.get("items") or ()
             if isinstance(i, dict)]
    return sorted(n for n in names if n and n.startswith(incomplete))

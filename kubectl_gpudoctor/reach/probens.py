"""Where the privileged debug pod may run: only the tool's own, labelled namespace.

Why: the debug pod is root on the node (privileged, hostPID, the host's / mounted). Anyone who
can exec into pods in its namespace gets that root for the run, and the standard `edit` role
grants pods/exec. So the pod never goes to the namespace named by `-n` or the kubeconfig
context (`pod Y -n team` reads the pod from `team`), only to the probe namespace: `gpu-doctor`
unless `--probe-namespace` / GPU_DOCTOR_NAMESPACE says otherwise. Before creating anything the
client reads that namespace and refuses it unless it carries `gpu-doctor.io/probe-namespace=
true`, a label the base manifest (`kubectl gpu-doctor rbac`, the repository's deploy/rbac.yaml)
sets and only someone who may edit namespaces (a cluster admin) can add: a typo or a hostile
default cannot put a root pod where tenants work. Hints name what a krew user has: the plugin's
own `rbac` command, never a file of the repository.
"""
from __future__ import annotations

import os
import re
from typing import Mapping

from .. import errors

DEFAULT = "gpu-doctor"
ENV = "GPU_DOCTOR_NAMESPACE"
LABEL = "gpu-doctor.io/probe-namespace"
LABEL_VALUE = "true"
APPLY_RBAC = "kubectl gpu-doctor rbac | kubectl apply -f -"  # commands/rbac.APPLY
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class NotProbeNamespace(errors.ClusterError):
    """The probe namespace is missing, unreadable or not labelled as gpu-doctor's."""


def choose(flag: str | None, environ: Mapping[str, str] | None = None) -> str:
    """The probe namespace: the flag, else the environment, else `gpu-doctor`. Never the
    `-n` namespace or the kubeconfig context's (the caller does not even pass them)."""
    env = os.environ if environ is None else environ
    value = (flag or env.get(ENV) or DEFAULT).strip()
    if not _DNS1123_LABEL.match(value):
        raise errors.UsageError(f"invalid probe namespace {value!r}: a namespace name is a "
                                "DNS-1123 label (lowercase letters, digits, '-', <= 63)")
    return value


def fix_hint(namespace: str) -> str:
    return (f"run the debug pod in the namespace `{APPLY_RBAC}` creates "
            f"(--probe-namespace {DEFAULT}), "
            f"or have a cluster admin label a namespace only node admins can use: "
            f"`kubectl label namespace {namespace} {LABEL}={LABEL_VALUE}`")


def verify(kube, namespace: str, timeout_s: float = 10.0, missing_ok: bool = False
           ) -> dict | None:
    """The Namespace object if it is a gpu-doctor probe namespace; NotProbeNamespace if not.
    Called before the debug pod is created, and before `agent install` (missing_ok: it creates
    the namespace labelled; None then)."""
    try:
        ns = kube.get_json(f"/api/v1/namespaces/{namespace}", timeout=timeout_s)
    except errors.NotFound:
        if missing_ok:
            return None
        raise NotProbeNamespace(
            f"probe namespace {namespace} does not exist",
            hint=f"a cluster admin creates it with `{APPLY_RBAC}`"
                 + ("" if namespace == DEFAULT else f" or pass --probe-namespace {DEFAULT}")
        ) from None
    except errors.Forbidden:
        raise NotProbeNamespace(
            f"cannot read namespace {namespace} to check that it is gpu-doctor's probe "
            f"namespace (the debug pod is root on the node, so it is not created unchecked)",
            hint=f"grant `get` on that namespace (`kubectl gpu-doctor rbac` does for "
                 f"{DEFAULT})") from None
    labels = ((ns or {}).get("metadata") or {}).get("labels") or {}
    if labels.get(LABEL) != LABEL_VALUE:
        raise NotProbeNamespace(
            f"namespace {namespace} is not a gpu-doctor probe namespace (no label "
            f"{LABEL}={LABEL_VALUE}); the privileged probe pod (debug pod or agent) is root on "
            f"the node and anyone with pods/exec there would get it", hint=fix_hint(namespace))
    return ns


def pod_security_hint(namespace: str) -> str:
    """What to say when Pod Security admission refuses the debug pod in the probe namespace:
    fix the probe namespace, never relax a tenant's."""
    return (f"the probe namespace {namespace} must admit privileged pods: `{APPLY_RBAC}` "
            f"labels {DEFAULT} pod-security.kubernetes.io/enforce=privileged "
            f"(do not relax Pod Security in a namespace where others run pods)")

"""`rbac`: print the manifests a cluster admin applies before anyone runs the plugin.

Why: a krew install has no repository checkout, so an error that says "apply deploy/rbac.yaml"
points at nothing. The manifests travel inside the plugin (kubectl_gpudoctor/manifests/, the
same files as the repository's deploy/, packaged with the wheel and the frozen build), and
`kubectl gpu-doctor rbac | kubectl apply -f -` applies them. The files are printed as they are
(their comments say what each permission is for and what it risks).

`all` is what every cluster needs (base and the admission policy), never an opt-in: the
nodes-proxy grant is exec-equivalent on every kubelet and the agent's Role is exec into a root
pod, so `rbac all | kubectl apply -f -` must not hand them out (round-4 audit E-02). An opt-in
is printed only when named: `rbac all nodes-proxy`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from node_probe.protocol import ExitStatus

from .. import errors
from ..session import Session, echo

MANIFESTS = Path(__file__).resolve().parent.parent / "manifests"
# PART -> file; `base` first: the others live in the namespace it creates
FILES = {"base": "rbac.yaml", "nodes-proxy": "rbac-nodes-proxy.yaml",
         "agent": "agent-rbac.yaml", "admission-policy": "admission-policy.yaml"}
PARTS = tuple(FILES)
OPT_IN = ("nodes-proxy", "agent")            # printed only when named, never by `all`
ALL = tuple(p for p in PARTS if p not in OPT_IN)
APPLY = "kubectl gpu-doctor rbac | kubectl apply -f -"


def manifest_text(part: str) -> str:
    """The packaged manifest of `part` (KeyError for an unknown part)."""
    path = MANIFESTS / FILES[part]
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:  # a broken install: not the user's input, not the cluster
        raise errors.InternalError(f"the packaged manifest {path} is missing: "
                                   f"{exc.strerror or exc}") from None


def rbac(session: Session, parts: Sequence[str]) -> ExitStatus:
    wanted = set(parts or ("base",))
    if "all" in wanted:
        wanted |= set(ALL)
    chosen = [p for p in PARTS if p in wanted]    # base first: the others use its namespace
    docs = [manifest_text(p).strip("\n") for p in chosen]
    echo("\n---\n".join(docs))
    return ExitStatus.OK

"""`version` and `completion`: what this build is (and which probe image it pins), and the shell
completion script."""
from __future__ import annotations

from typing import Any

import click

from node_probe.protocol import ExitStatus
from node_probe.protocol.version import __version__

from ..session import Session


def version(session: Session) -> ExitStatus:
    from ..build_info import DEFAULT_PROBE_IMAGE
    click.echo(f"kubectl-gpu_doctor {__version__}\n{DEFAULT_PROBE_IMAGE.describe()}")
    return ExitStatus.OK


def completion(session: Session, group: Any, shell: str) -> ExitStatus:
    from click.shell_completion import get_completion_class
    comp = get_completion_class(shell)(group, {}, "kubectl-gpu_doctor",
                                       "_KUBECTL_GPU_DOCTOR_COMPLETE")
    click.echo(comp.source())
    return ExitStatus.OK



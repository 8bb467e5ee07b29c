"""The client's one error hierarchy and the one place that maps errors to exit codes.

Why: every failure a user can hit (bad flag, unknown node, RBAC, PodSecurity, image pull, no API
server, Ctrl-C) must end as ONE clear line on stderr and a documented exit code (DESIGN.md
section 7), never a traceback. Code raises one of these; `cli.entrypoint` prints `message` and
exits with `exit_status_of(exc)`. Modelled on kopf's errors: a small tree, each class knowing
its meaning, no string matching at the top.
"""
from __future__ import annotations

from node_probe.protocol import ExitStatus


class GpuDoctorError(Exception):
    """Base of everything the CLI reports as one line. `exit_status` says how it ends."""

    exit_status: ExitStatus = ExitStatus.CLUSTER_ERROR

    def __init__(self, message: str, *, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def one_line(self) -> str:
        text = self.message if not self.hint else f"{self.message}; {self.hint}"
        return " ".join(text.split())


class UsageError(GpuDoctorError):
    """Bad flags or arguments (exit 2)."""

    exit_status = ExitStatus.USAGE


class ClusterError(GpuDoctorError):
    """Anything about the cluster or the launch of the debug pod (exit 3)."""

    exit_status = ExitStatus.CLUSTER_ERROR


class ApiUnreachable(ClusterError):
    """No API server answered (connection refused, DNS, TLS, timeout)."""


class KubeconfigError(ClusterError):
    """No usable kubeconfig / context."""


class NotFound(ClusterError):
    """A named object (node, pod, namespace) does not exist."""


class Forbidden(ClusterError):
    """RBAC said no (HTTP 403) for something we cannot do without."""


class PodSecurityRejected(Forbidden):
    """The debug pod was rejected by Pod Security admission."""


class ImagePullFailed(ClusterError):
    """The debug pod's image cannot be pulled."""


class LaunchFailed(ClusterError):
    """The debug pod could not be created or failed before the probe ran."""


class ApiError(ClusterError):
    """Another API error (5xx, 4xx we do not special-case)."""


class StreamBroken(ClusterError):
    """The debug pod's log stream ended abnormally (the run becomes incomplete, not an error)."""


class ProbeIncomplete(GpuDoctorError):
    """The node probe ended without a summary (exit 4)."""

    exit_status = ExitStatus.INCOMPLETE


class Interrupted(GpuDoctorError):
    """Ctrl-C or SIGTERM (exit 130)."""

    exit_status = ExitStatus.INTERRUPTED


def exit_status_of(exc: BaseException) -> ExitStatus:
    """The ONE mapping from an exception to an exit code."""
    if isinstance(exc, GpuDoctorError):
        return exc.exit_status
    if isinstance(exc, KeyboardInterrupt):
        return ExitStatus.INTERRUPTED
    # click's usage errors are mapped by the caller before they get here; anything else is a
    # bug, but the user still gets one line and the cluster-error code.
    return ExitStatus.CLUSTER_ERROR

"""The client's one error hierarchy and the one place that maps errors to exit codes.

Why: every failure a user can hit (bad flag, unknown node, RBAC, PodSecurity, image pull, no API
server, Ctrl-C) must end as ONE clear line on stderr and a documented exit code (DESIGN.md
section 7), never a traceback. Code raises one of these; `cli.main` prints `one_line()` and
exits with `exit_status_of(exc)`. Modelled on kopf's errors: a small tree, each class knowing
its meaning, no string matching at the top. API answers become typed exceptions once, where the
response is read (`api_error`, kopf's `check_response`), so call sites catch a class
(`NotFound`, `Forbidden`, `GatewayTimeout`...) and never compare status numbers.
"""
from __future__ import annotations

import json

from node_probe.protocol import ExitStatus


class GpuDoctorError(Exception):
    """Base of everything the CLI reports as one line. `exit_status` says how it ends."""

    exit_status: ExitStatus = ExitStatus.CLUSTER_ERROR
    said = False  # its line is already on stderr (the probe child's own): not written again

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


class ProbeUsageError(UsageError):
    """`local`: the probe child refused its arguments and said why in its own one line on
    stderr (a file of a format it does not read, a bad value): exit 2, nothing said twice."""

    said = True


class InternalError(GpuDoctorError):
    """A bug in the tool itself (exit 70, EX_SOFTWARE): not the cluster's fault."""

    exit_status = ExitStatus.INTERNAL


class ClusterError(GpuDoctorError):
    """Anything about the cluster or the launch of the debug pod (exit 3)."""

    exit_status = ExitStatus.CLUSTER_ERROR


class ApiUnreachable(ClusterError):
    """No API server answered (connection refused, DNS, TLS, timeout)."""


class KubeconfigError(ClusterError):
    """No usable kubeconfig / context."""


class ImagePullFailed(ClusterError):
    """The debug pod's image cannot be pulled."""


class LaunchFailed(ClusterError):
    """The debug pod could not be created or failed before the probe ran."""


class StreamBroken(ClusterError):
    """The debug pod's log stream ended abnormally (the run becomes incomplete, not an error)."""


class Interrupted(GpuDoctorError):
    """Ctrl-C or SIGTERM (exit 130)."""

    exit_status = ExitStatus.INTERRUPTED


# -- API answers -------------------------------------------------------------------------------

class ApiError(ClusterError):
    """A non-2xx answer of the API server (or of a kubelet it proxies).

    `message` is the API's own message (the Status object's `message`, else the first line of
    the body); `body` is the raw body (a failing `/healthz?verbose` lists its checks there).
    `about()` rewords it for the object the caller asked about, keeping the class.
    """

    status: int = 0  # the class's HTTP status; an instance carries the one it got

    def __init__(self, message: str, *, status: int | None = None, reason: str = "",
                 path: str = "", body: str = "", hint: str = "") -> None:
        super().__init__(message, hint=hint)
        if status is not None:
            self.status = status
        self.reason = reason
        self.path = path
        self.body = body

    def describe(self, what: str, verb: str) -> str:
        return f"API error {self.status} {verb} {what}: {self.message}"

    def about(self, what: str, verb: str = "get") -> "ApiError":
        """The same error, worded for `what` (e.g. "node gpu-1"): raise exc.about(...)."""
        return type(self)(self.describe(what, verb), status=self.status, reason=self.reason,
                          path=self.path, body=self.body, hint=self.hint)


class ClientError(ApiError):
    """4xx: the request was wrong or not allowed."""


class BadRequest(ClientError):
    status = 400


class Unauthorized(ClientError):
    status = 401

    def describe(self, what: str, verb: str) -> str:
        return (f"unauthorized to {verb} {what} (401): {self.message}; check your kubeconfig "
                f"credentials")


class Forbidden(ClientError):
    """RBAC (or an admission plugin) said no."""

    status = 403
    # what a 403 of a read says next: the ClusterRole the plugin's users need, and the command
    # that prints it (commands/rbac.py; the role is named in manifests/rbac.yaml)
    RBAC_HINT = ("the gpu-doctor-user ClusterRole grants what it reads: `kubectl gpu-doctor "
                 "rbac | kubectl apply -f -` (by a cluster admin)")

    def describe(self, what: str, verb: str) -> str:
        return f"forbidden to {verb} {what}: {self.message}"

    def about(self, what: str, verb: str = "get") -> "ApiError":
        """As ApiError.about; a read (get, list) also names the RBAC that grants it."""
        hint = self.hint or (self.RBAC_HINT if verb in ("get", "list") else "")
        return type(self)(self.describe(what, verb), status=self.status, reason=self.reason,
                          path=self.path, body=self.body, hint=hint)


class PodSecurityRejected(Forbidden):
    """The debug pod was rejected by Pod Security admission."""


class NotFound(ClientError):
    """A named object (node, pod, namespace) does not exist."""

    status = 404

    def describe(self, what: str, verb: str) -> str:
        return f"{what} not found"


class Conflict(ClientError):
    """Already exists, or a stale resourceVersion."""

    status = 409


class Gone(ClientError):
    """A watch or list continue token too old (410)."""

    status = 410


class Invalid(ClientError):
    """The object failed validation (422)."""

    status = 422


class TooManyRequests(ClientError):
    """API priority and fairness throttled us (429)."""

    status = 429


class ServerError(ApiError):
    """5xx: the API server (or the kubelet behind a proxy) failed."""


class InternalServerError(ServerError):
    status = 500


class ServiceUnavailable(ServerError):
    status = 503


class GatewayTimeout(ServerError):
    """504, and what the client raises when a connected request gets no answer in time (for a
    proxied kubelet call that is evidence: the kubelet hangs)."""

    status = 504


class ClientTimeout(GatewayTimeout):
    """Our own deadline passed (--request-timeout, --kubelet-timeout): no answer came in time.
    Said as a client-side timeout, never as "API error 504" (the server sent no 504); still a
    GatewayTimeout for callers to whom a proxied kubelet call's silence is evidence."""

    def describe(self, what: str, verb: str) -> str:
        return self.message.replace("no complete answer within",
                                    f"no complete answer to {verb} {what} within", 1)


class BadAnswer(ApiError):
    """A 2xx answer no API server gives: endless, or a list whose `continue` token repeats
    or whose pages never end. Not an HTTP status: `status` stays 0; the message says what."""

    def describe(self, what: str, verb: str) -> str:
        return f"cannot {verb} {what}: {self.message}"


class TooLarge(BadAnswer):
    """An answer longer than the call can need (api/kube.py caps every body): not read
    further."""


_BY_STATUS: dict[int, type[ApiError]] = {
    c.status: c for c in (BadRequest, Unauthorized, Forbidden, NotFound, Conflict, Gone,
                          Invalid, TooManyRequests, InternalServerError, ServiceUnavailable,
                          GatewayTimeout)}


def api_message(body: str, reason: str) -> str:
    """The Status object's message, else the body's first line, else the HTTP reason."""
    try:
        doc = json.loads(body)
        if isinstance(doc, dict) and doc.get("message"):
            return str(doc["message"])
    except (ValueError, TypeError, RecursionError):
        pass
    text = (body or "").strip().splitlines()
    return text[0][:300] if text else reason


def api_error(status: int, reason: str, body: str, path: str) -> ApiError:
    """The typed exception for one non-2xx answer (the only place a status number is read)."""
    cls = _BY_STATUS.get(status)
    if cls is None:
        cls = ServerError if status >= 500 else ClientError if status >= 400 else ApiError
    return cls(api_message(body, reason), status=status, reason=reason, path=path, body=body)


def exit_status_of(exc: BaseException) -> ExitStatus:
    """The ONE mapping from an exception to an exit code."""
    if isinstance(exc, GpuDoctorError):
        return exc.exit_status
    if isinstance(exc, KeyboardInterrupt):
        return ExitStatus.INTERRUPTED
    return ExitStatus.INTERNAL  # anything else is a bug in the tool

"""What went wrong on the way to or from the API server, as errors.py's typed exceptions in
kubectl's words: unreachable, too slow (the request's deadline), an answer too large or
malformed, a stream that broke off.

Why a module of its own: kube.py decides WHEN a request failed (its one raw request, the
status read once through errors.api_error); the wording of each failure, without Python's
object reprs and errno tags (urllib3's `HTTPSConnection(host=..., port=...): [Errno 111]`,
which kubectl never prints), is a job of its own, shared by the kubeconfig's reader.
"""
from __future__ import annotations

import re
import urllib.parse
from typing import Any

from . import deadline
from .. import errors


def too_large(path: str, max_bytes: int) -> "errors.TooLarge":
    return errors.TooLarge(f"the answer to {path} is over {max_bytes / (1 << 20):g} MiB; "
                           f"not read further", path=path)


def stream_over(ticket: deadline.Ticket) -> errors.StreamBroken:
    return errors.StreamBroken(f"the log stream ran past its deadline of "
                               f"{fmt_timeout(ticket.budget_s)}")


def too_slow(ticket: deadline.Ticket, path: str) -> errors.GatewayTimeout:
    """Past the request's wall-clock deadline (a slow or trickling answer)."""
    return _timed_out(ticket.budget_s, path)


def _timed_out(timeout: Any, path: str) -> errors.ClientTimeout:
    return errors.ClientTimeout(
        f"client-side timeout: no complete answer within {fmt_timeout(timeout)}", status=504,
                                reason="Timeout", path=path)


def unreachable(host: str, exc: BaseException) -> errors.ApiUnreachable:
    """A transport failure in kubectl's words: `The connection to the server HOST:PORT was
    refused - did you specify the right host or port?`, else `Unable to connect to the
    server: WHY` with WHY stripped of urllib3's object reprs (never `HTTPSConnection(...)`)."""
    where = urllib.parse.urlsplit(host or "")
    hostport = where.netloc or host or "the API server"
    if ":" not in hostport.rsplit("]", 1)[-1]:
        hostport += ":443" if where.scheme == "https" else ":80"
    chain, seen = [exc], 0
    while seen < len(chain) < 8:
        e = chain[seen]
        seen += 1
        for nxt in (getattr(e, "reason", None), e.__cause__, e.__context__):
            if isinstance(nxt, BaseException) and nxt not in chain:
                chain.append(nxt)
    if any(isinstance(e, ConnectionRefusedError) for e in chain) or \
            "Connection refused" in str(exc):
        return errors.ApiUnreachable(f"The connection to the server {hostport} was refused - "
                                     f"did you specify the right host or port?")
    why = short_reason(chain[-1] if len(chain) > 1 else exc)
    return errors.ApiUnreachable(f"Unable to connect to the server {hostport}: {why}")


def exception_types() -> dict:
    import urllib3.exceptions
    from kubernetes.client.exceptions import ApiException
    return {"api": ApiException, "read_timeout": urllib3.exceptions.ReadTimeoutError,
            "transport": (urllib3.exceptions.HTTPError, OSError)}


def no_answer(timeout: Any, path: str) -> errors.GatewayTimeout:
    """Connected, but no answer in time: for a proxied kubelet call that is evidence (the
    kubelet hangs), not a dead API server, so it is a (client-side) GatewayTimeout, not
    ApiUnreachable."""
    return _timed_out(timeout, path)


def fmt_timeout(timeout: Any) -> str:
    if isinstance(timeout, tuple):
        timeout = timeout[-1]
    return f"{float(timeout):g}s" if timeout else "the deadline"


def as_text(data: Any) -> str:
    if isinstance(data, bytes):
        return data.decode("utf-8", "replace")
    return str(data or "")


_PY_REPRS = (re.compile(r"<?\w+(Connection|Pool)\w*\(host='[^']*', port=\d+\)"
                        r"( at 0x[0-9a-f]+)?>?:?\s*"),
             re.compile(r"<[\w.]+ object at 0x[0-9a-f]+>:?\s*"),
             re.compile(r"\[Errno -?\d+\]\s*"))


def short_reason(exc: BaseException) -> str:
    """An exception's reason for one line, without Python's object reprs and errno tags
    (urllib3 says `HTTPSConnection(host=..., port=...): ... [Errno 111]`; kubectl never does)."""
    text = str(exc)
    reason = getattr(exc, "reason", None)
    args = getattr(exc, "args", ())
    if reason is not None and str(reason):
        text = str(reason)
    elif len(args) >= 2 and isinstance(args[-1], str) and not isinstance(args[0], str):
        text = args[-1]  # urllib3's (connection, message)
    text = " ".join(text.split())
    for rx in _PY_REPRS:
        text = rx.sub("", text)
    return text.strip(" :")[:200] or type(exc).__name__


def malformed(path: str, exc: Exception) -> errors.BadAnswer:
    return errors.BadAnswer(f"the API server's answer for {path} is malformed: {exc}",
                            path=path)

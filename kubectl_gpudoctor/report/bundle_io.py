"""Bundle files on disk: written only as regular files, atomically; read only from regular files,
bounded; a hostile bundle's report checked field by field before anything renders it.

Why: `--save` runs as whoever runs the plugin (often root on a jump host). `--save /dev/null`
or `--save /dev/stdout` must not replace the device with a regular file, and a symlink planted
where a bundle is expected must not be replaced either: the target must be a regular file or
not exist (then a temporary file in the same directory is renamed over it); anything else is
refused with one line, before the run starts and again before the rename. `replay` reads
files a ticket or a chat brought, so a FIFO (which would block the open), a device, a
64 MiB+ file, a million nested objects, an exit code of 42 or a finding whose title is a
number are each one usage error (exit 2), never a hang or an internal error (70).
"""
from __future__ import annotations

import json
import math
import os
import stat
import tempfile
from typing import Any, Mapping

from node_probe.protocol import FAIL_ON, ExitStatus, Severity
from node_probe.protocol.bundle import NotRegularFile, TooLargeFile, read_capped

from .. import errors

MAX_BUNDLE_BYTES = 64 * 1024 * 1024   # replay refuses anything larger (bounded read)
MAX_CONTAINERS = 600_000              # JSON objects/arrays in one bundle (a real one: < 300k;
                                      # replay of this many stays under the CLI's 512 MiB)
MAX_REPORT_DEPTH = 48                 # the report part is rendered: evidence a few levels deep
EXIT_CODES = frozenset(int(e) for e in ExitStatus)
MAX_TIME = 1e11       # seconds since the epoch: year 5138 (time.gmtime's range on every libc)
MAX_DURATION = 1e9    # seconds a run or a check took: 31 years
MAX_INT = 1 << 63     # a number in the report past this is not a count, size or time
SEVERITIES = frozenset(s.value for s in Severity)


# -- writing ---------------------------------------------------------------------------------

def target_problem(path: str) -> str:
    """Why `--save path` cannot be written ("" if it can): only a regular file, or a path that
    does not exist yet, is ever (re)placed."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return ""
    except OSError as exc:
        return exc.strerror or str(exc)
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link; give the file itself"
    if stat.S_ISDIR(st.st_mode):
        return "is a directory"
    if not stat.S_ISREG(st.st_mode):
        return ("is not a regular file (a device, FIFO or socket); a bundle is written only to "
                "a regular file")
    return ""


def check_target(path: str) -> None:
    """Before the run: the directory exists and is writable, the target is writable as a file."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory) or not os.access(directory, os.W_OK):
        raise errors.UsageError(f"--save {path}: directory {directory} does not exist or "
                                f"is not writable")
    problem = target_problem(path)
    if problem:
        raise errors.UsageError(f"--save {path}: {problem}")


def write(path: str, doc: Mapping[str, Any]) -> int:
    """Atomically (temporary file in the target's directory, renamed over it), readable by the
    owner only (it describes the cluster); refused when the target is not a regular file.
    Returns the bytes written."""
    problem = target_problem(path)
    if problem:
        raise errors.UsageError(f"the bundle {path} {problem}; not written")
    directory = os.path.dirname(os.path.abspath(path)) or "."
    try:
        fd, tmp = tempfile.mkstemp(prefix=".gpu-doctor-bundle-", dir=directory)
    except OSError as exc:
        raise errors.UsageError(f"cannot write the bundle {path}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1, default=str, ensure_ascii=False)
            f.write("\n")
        os.chmod(tmp, 0o600)
        size = os.stat(tmp).st_size
        problem = target_problem(path)  # again: it may have changed while the run went on
        if problem:
            raise errors.UsageError(f"the bundle {path} {problem}; not written")
        os.replace(tmp, path)
        return size
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# -- reading ---------------------------------------------------------------------------------

def read(path: str) -> bytes:
    """The file's bytes, at most MAX_BUNDLE_BYTES; only a regular file (opened without blocking,
    so a FIFO is refused instead of waited on)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise errors.UsageError(f"cannot read bundle {path}: {exc.strerror}") from None
    try:
        return read_capped(fd, MAX_BUNDLE_BYTES, path)
    except TooLargeFile:
        raise errors.UsageError(f"{path} is larger than {MAX_BUNDLE_BYTES // 2**20} MiB; "
                                f"not a gpu-doctor bundle") from None
    except NotRegularFile:
        raise errors.UsageError(f"{path} is not a regular file (a FIFO, device or "
                                f"directory); replay reads a bundle file") from None
    except OSError as exc:
        raise errors.UsageError(f"cannot read bundle {path}: {exc.strerror}") from None
    finally:
        os.close(fd)


def parse(path: str, data: bytes) -> Any:
    """JSON, with the number of objects/arrays bounded before parsing (a 64 MiB file of `[]`
    would be 20 million lists, gigabytes as Python objects)."""
    if data.count(b"{") + data.count(b"[") > MAX_CONTAINERS:
        raise errors.UsageError(f"{path} holds more than {MAX_CONTAINERS:,} JSON objects; not "
                                f"a gpu-doctor bundle")
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        raise errors.UsageError(f"{path} is not a gpu-doctor bundle (not JSON)") from None


# -- the report part, field by field -------------------------------------------------------------

class Malformed(ValueError):
    pass


def check_report(rep: Any) -> None:
    """Raise Malformed naming the first field of the saved report that replay cannot render as
    the original run did: wrong type, unknown exit code or severity, nesting too deep."""
    if not isinstance(rep, dict):
        raise Malformed("no report")
    _depth(rep)
    target = rep.get("target")
    if not isinstance(target, dict) or not all(isinstance(v, str) or v is None
                                               for v in target.values()):
        raise Malformed("target is not an object of strings")
    for key in ("version", "preamble", "incomplete_reason"):
        _opt(rep, key, str)
    _opt(rep, "started_at", (int, float), 0, MAX_TIME)
    if rep.get("fail_on") is not None and rep["fail_on"] not in FAIL_ON:
        raise Malformed("fail_on is not one of " + "/".join(FAIL_ON))
    code = rep.get("exit_code")
    if code is not None and (type(code) is not int or code not in EXIT_CODES):
        raise Malformed(f"exit code {str(code)[:20]!r} is not one gpu-doctor exits with")
    err = rep.get("error")
    if err is not None:
        if not isinstance(err, dict) or not isinstance(err.get("message"), str):
            raise Malformed("error is not an object with a message")
        _opt(err, "type", str)
        es = err.get("exit_status")
        if type(es) is not int or es not in EXIT_CODES:
            raise Malformed("error exit status is not one gpu-doctor exits with")
    if not isinstance(rep.get("findings"), list) or not isinstance(rep.get("checks"), list):
        raise Malformed("findings or checks are not lists")
    for f in rep["findings"]:
        if not isinstance(f, dict):
            raise Malformed("a finding is not an object")
        for key in ("id", "severity"):
            if not isinstance(f.get(key), str):
                raise Malformed(f"a finding's {key} is not a string")
        if f["severity"] not in SEVERITIES:
            raise Malformed("a finding's severity is not one of " + "/".join(sorted(SEVERITIES)))
        for key in ("subject", "title", "remediation", "check"):
            _opt(f, key, str)
        _opt(f, "evidence", dict)
        if not all(isinstance(r, str) for r in f.get("refs") or ()):
            raise Malformed("a finding's refs are not strings")
    for c in rep["checks"]:
        if not isinstance(c, dict) or not isinstance(c.get("id", ""), str) or \
                not isinstance(c.get("status", ""), str):
            raise Malformed("a check is not an object with a string id and status")
        for key in ("message", "reason"):
            _opt(c, key, str)
        _opt(c, "duration_s", (int, float), 0, MAX_DURATION)
    sr = rep.get("summary_record")
    if sr is not None and not isinstance(sr, dict):
        raise Malformed("summary_record is not an object")


def _opt(obj: Mapping[str, Any], key: str, types: type | tuple,
         lo: float | None = None, hi: float | None = None) -> None:
    """`obj[key]` is absent, null or of `types` (a number: finite, within [lo, hi))."""
    v = obj.get(key)
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, types):
        raise Malformed(f"{key} is {type(v).__name__}")
    if isinstance(v, float) and not math.isfinite(v):
        raise Malformed(f"{key} is not finite")
    if lo is not None and hi is not None and isinstance(v, (int, float)) and \
            not lo <= v < hi:
        raise Malformed(f"{key} is out of range ({str(v)[:24]})")


def _depth(value: Any) -> None:
    """Nesting and numbers: no deeper than MAX_REPORT_DEPTH, every number finite and within
    MAX_INT (the renderers turn `*_s` evidence into durations: float(10**400) overflows).
    Iterative: no recursion on hostile nesting."""
    stack = [(value, 0)]
    while stack:
        v, d = stack.pop()
        if d > MAX_REPORT_DEPTH:
            raise Malformed(f"nested deeper than {MAX_REPORT_DEPTH} levels")
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v)
        elif isinstance(v, float) and not math.isfinite(v) or \
                type(v) is int and not -MAX_INT < v < MAX_INT:
            raise Malformed(f"a number is out of range ({str(v)[:24]})")

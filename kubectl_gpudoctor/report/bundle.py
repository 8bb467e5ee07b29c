"""Evidence bundles: `--save FILE` keeps a run's report and the raw evidence behind it;
`replay FILE` renders it again offline with the same exit code.

Why: what goes into a ticket or an incident channel must outlive the cluster state that produced
it (the wedged kubelet gets restarted, the debug pod is gone). A bundle is one JSON file: the
report's records (findings, checks, completeness, the error if any), the raw inputs the verdicts
came from (node, the node's pods and events, Lease, kubelet config, healthz, an excerpt of the
goroutine dump, the node probe's NDJSON records), tool and image versions and the exact command
line. Collection does not change: a Recorder wraps the run's Kube reads and the probe records as
they pass, so diagnose/fleet know nothing about bundles.

Bundles never contain secrets, by the report's own rules plus what raw API objects add: no
Secret is ever read; environment variable values, `last-applied-configuration` annotations
and managedFields are replaced or dropped; strings that look like credentials (token=,
password=, Authorization headers, bearer tokens) are masked everywhere, the command line too.
The bundle says so in its header. Replay never talks to a cluster.
"""
from __future__ import annotations

import json
import os
import platform
import re
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Mapping, Sequence

from node_probe.protocol import CheckResult, ExitStatus, Finding
from node_probe.protocol import bundle as protocol_bundle
from node_probe.protocol.version import __version__

from .. import errors

SCHEMA = protocol_bundle.SCHEMA  # one layout, shared with the watching agent
REDACTED = "<redacted>"
REDACTION_NOTICE = (
    "No secrets: no Secret object is read; environment variable values, "
    "kubectl.kubernetes.io/last-applied-configuration annotations and managedFields are "
    "removed; strings that look like credentials (token=, password=, secret=, Authorization "
    "and bearer tokens) are masked, the command line included. Node-side evidence is what the "
    "report shows (the probe reads only NVIDIA_*, CUDA_* and HAMi environment keys).")
MAX_BUNDLE_BYTES = 64 * 1024 * 1024   # replay refuses anything larger (bounded read)
MAX_LIST_ITEMS = 500                   # a fleet's 150,000 pods are not evidence of one verdict
MAX_RECORDS = 20000
GOROUTINE_EXCERPT_BYTES = 64 * 1024
_SECRETISH = re.compile(
    r"(?i)((?:--?)?[\w.-]*(?:token|passw(?:or)?d|secret|api[_-]?key|credential|auth)[\w.-]*"
    r"\s*[=:]\s*)(\"[^\"]*\"|'[^']*'|[^\s,;&\"']+)")
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}")
_SECRET_FLAGS = re.compile(r"(?i)^--?[\w.-]*(token|passw(or)?d|secret|api[_-]?key|credential)"
                           r"[\w.-]*$")
_GOROUTINE_KEYS = ("devicemanager", "deviceplugin", "GetPreferredAllocation", "Allocate",
                   "podresources", "syncLoop", "HandlePodAdditions", "nvidia")


# -- redaction -----------------------------------------------------------------------------------

def redact_text(text: str) -> str:
    text = _BEARER.sub(REDACTED, text)  # first: "Authorization: Bearer x" is one value
    return _SECRETISH.sub(lambda m: m.group(1) + REDACTED, text)


def redact(obj: Any) -> Any:
    """A deep copy with the bundle's redaction applied (Kubernetes objects and anything else)."""
    if isinstance(obj, str):
        return redact_text(obj)
    if isinstance(obj, list):
        return [redact(v) for v in obj]
    if not isinstance(obj, dict):
        return obj
    out: dict = {}
    for k, v in obj.items():
        if k == "managedFields":
            continue
        if k == "env" and isinstance(v, list):  # container env: names stay, values go
            out[k] = [{**{kk: vv for kk, vv in e.items() if kk != "value"},
                       **({"value": REDACTED} if "value" in e else {})}
                      if isinstance(e, dict) else REDACTED for e in v]
            continue
        if k == "annotations" and isinstance(v, dict):
            out[k] = {ak: (REDACTED if ak.endswith("last-applied-configuration") else
                           redact(av)) for ak, av in v.items()}
            continue
        if k in ("staticPodURLHeader", "headers", "Authorization", "authorization"):
            out[k] = REDACTED
            continue
        out[k] = redact(v)
    return out


def redact_argv(argv: Sequence[str]) -> list[str]:
    out, hide_next = [], False
    for a in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        flag, eq, _ = a.partition("=")
        if _SECRET_FLAGS.match(flag):
            if eq:
                out.append(f"{flag}={REDACTED}")
            else:
                out.append(a)
                hide_next = True
            continue
        out.append(redact_text(a))
    return out


# -- recording a run -------------------------------------------------------------------------

_KINDS = (
    ("node", re.compile(r"^/api/v1/nodes/[^/]+$")),
    ("kubelet_configz", re.compile(r"^/api/v1/nodes/[^/]+/proxy/configz$")),
    ("kubelet_healthz", re.compile(r"^/api/v1/nodes/[^/]+/proxy/healthz$")),
    ("goroutine_dump", re.compile(r"^/api/v1/nodes/[^/]+/proxy/debug/pprof/goroutine$")),
    ("lease", re.compile(r"^/apis/coordination\.k8s\.io/v1/namespaces/kube-node-lease/leases/")),
    ("pod", re.compile(r"^/api/v1/namespaces/[^/]+/pods/[^/]+$")),
    ("pods", re.compile(r"^/api/v1/(namespaces/[^/]+/)?pods$")),
    ("events", re.compile(r"^/api/v1/(namespaces/[^/]+/)?events$")),
    ("nodes", re.compile(r"^/api/v1/nodes$")),
    ("leases", re.compile(r"^/apis/coordination\.k8s\.io/v1/namespaces/kube-node-lease/leases$")),
)


def _kind_of(path: str) -> str | None:
    for kind, rx in _KINDS:
        if rx.match(path):
            return kind
    return None


class Recorder:
    """Wraps one run's Kube reads and probe records (instance attributes, nothing global)."""

    def __init__(self) -> None:
        self.api: list[dict] = []
        self.records: list[dict] = []
        self.records_dropped = 0
        self.images: dict[str, str] = {}
        self._lock = threading.Lock()

    def attach_kube(self, kube: Any) -> None:
        for name in ("get_json", "get_text"):
            orig = getattr(kube, name)
            setattr(kube, name, self._wrap(orig, name == "get_text"))

    def attach_output(self, out: Any) -> None:
        orig = out.node_record

        def node_record(rec: Mapping[str, Any], node: str | None = None) -> None:
            with self._lock:
                if len(self.records) < MAX_RECORDS:
                    self.records.append({**dict(rec), **({"_node": node} if node else {})})
                else:
                    self.records_dropped += 1
            orig(rec, node=node)
        out.node_record = node_record

    def _wrap(self, fn: Callable, text: bool) -> Callable:
        def call(path: str, query: Sequence[tuple[str, Any]] | None = None,
                 timeout: float | None = None):
            kind = _kind_of(path)
            try:
                val = fn(path, query, timeout)
            except errors.ApiError as exc:
                if kind:
                    self._keep(kind, path, query, error={"status": exc.status,
                                                         "message": exc.message[:500]},
                               body=exc.body if kind == "kubelet_healthz" else None)
                raise
            except errors.GpuDoctorError as exc:
                if kind:
                    self._keep(kind, path, query, error={"message": exc.one_line()[:500]})
                raise
            if kind:
                self._keep(kind, path, query, value=val)
            return val
        return call

    def _keep(self, kind: str, path: str, query, value: Any = None, error: dict | None = None,
              body: str | None = None) -> None:
        entry: dict = {"kind": kind, "path": path,
                       "query": [[k, str(v)] for k, v in (query or ())]}
        if error is not None:
            entry["error"] = error
            if body:
                entry["text"] = body[:GOROUTINE_EXCERPT_BYTES]
        elif isinstance(value, str):
            entry["text"] = goroutine_excerpt(value) if kind == "goroutine_dump" else \
                value[:GOROUTINE_EXCERPT_BYTES]
            if kind == "goroutine_dump":
                entry["bytes"] = len(value)
        elif isinstance(value, dict) and "items" in value:
            items = list(value.get("items") or ())
            entry["items"] = [redact(i) for i in items[:MAX_LIST_ITEMS]]
            if len(items) > MAX_LIST_ITEMS:
                entry["items_total"] = len(items)
        else:
            entry["object"] = redact(value)
        with self._lock:
            self.api.append(entry)


def goroutine_excerpt(text: str, limit: int = GOROUTINE_EXCERPT_BYTES) -> str:
    """The goroutines that matter for the verdicts (device manager, plugin gRPC, sync loop)
    first, then the others, within `limit` bytes."""
    blocks = text.split("\n\n")
    hot = [b for b in blocks if any(k in b for k in _GOROUTINE_KEYS)]
    rest = [b for b in blocks if b not in hot]
    out, size = [], 0
    for b in hot + rest:
        if size + len(b) + 2 > limit:
            out.append(f"... ({len(blocks) - len(out)} more goroutine block(s) not kept)")
            break
        out.append(b)
        size += len(b) + 2
    return redact_text("\n\n".join(out))


# -- writing ---------------------------------------------------------------------------------

def build(out: Any, code: int, error: errors.GpuDoctorError | None, recorder: Recorder,
          argv: Sequence[str], image: str | None = None, preamble: str = "") -> dict:
    report = protocol_bundle.report_block(
        out.report, out.fail_on, code, preamble=preamble,
        error=None if error is None else {"type": type(error).__name__,
                                          "message": error.one_line(),
                                          "exit_status": int(errors.exit_status_of(error))})
    # for readers of the bundle; replay decides the verdict again from the findings
    report["verdict"] = out.verdict()
    try:
        from importlib.metadata import version as _v
        client = _v("kubernetes")
    except Exception:  # noqa: BLE001 - a frozen build may not carry the metadata
        client = None
    return {
        "schema": SCHEMA,
        "redaction": REDACTION_NOTICE,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command_line": redact_argv(list(argv)),
        "tool": {"name": "kubectl-gpu_doctor", "version": __version__,
                 "python": platform.python_version(), "kubernetes_client": client},
        "image": {"probe": image, **recorder.images},
        "report": redact(report),
        "evidence": {
            "api": recorder.api,
            "probe_ndjson": [redact(rec) for rec in recorder.records],
            "probe_records_dropped": recorder.records_dropped,
        },
    }


def write(path: str, doc: Mapping[str, Any]) -> None:
    """Atomically, readable by the owner only (it describes the cluster)."""
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
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# -- replay ----------------------------------------------------------------------------------

def load(path: str) -> dict:
    """Read and check a bundle; a bad file is one usage error, never a traceback."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BUNDLE_BYTES + 1)
    except OSError as exc:
        raise errors.UsageError(f"cannot read bundle {path}: {exc.strerror}") from None
    return parse(data, path)


def parse(data: bytes, path: str) -> dict:
    """Check a bundle's bytes (from a file, or from the watching agent's ring); `path` names
    where they came from in the one-line error."""
    if len(data) > MAX_BUNDLE_BYTES:
        raise errors.UsageError(f"{path} is larger than {MAX_BUNDLE_BYTES // 2**20} MiB; not a "
                                f"gpu-doctor bundle")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        raise errors.UsageError(f"{path} is not a gpu-doctor bundle (not JSON)") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise errors.UsageError(f"{path} is not a gpu-doctor bundle (schema "
                                f"{doc.get('schema') if isinstance(doc, dict) else None!r}, "
                                f"expected {SCHEMA})")
    rep = doc.get("report")
    if not isinstance(rep, dict) or not isinstance(rep.get("findings"), list) or \
            not isinstance(rep.get("checks"), list) or not isinstance(rep.get("target"), dict):
        raise errors.UsageError(f"{path}: the bundle's report is missing or malformed")
    return doc


def replay(doc: Mapping[str, Any], fmt: str, fail_on: str | None = None,
           stdout: Any = None, stderr: Any = None, details: bool = False) -> int:
    """Render the saved report as the original run did; return its exit code (recomputed from
    the findings only when --fail-on differs from the saved run's)."""
    from .output import Output

    rep = doc["report"]
    saved_fail_on = rep.get("fail_on") or "warning"
    fail_on = fail_on or saved_fail_on
    out = Output(fmt, fail_on, rep["target"], out=stdout, err=stderr, progress=False,
                 details=details)
    r = out.report
    r.version = rep.get("version") or r.version
    try:
        r.started_at = float(rep.get("started_at") or r.started_at)
        for rec in rep["findings"]:
            r.add_finding(Finding.from_record(rec))
        for c in rep["checks"]:
            r.checks.append(CheckResult(c.get("id", "?"), c.get("status", "?"),
                                        float(c.get("duration_s", 0.0)), c.get("message", ""),
                                        c.get("reason", "")))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise errors.UsageError(f"the bundle's report is malformed: {exc}") from None
    r.summary_record = rep.get("summary_record")
    r.extra_incomplete_reason = rep.get("incomplete_reason") or ""
    out.api_only = r.summary_record is None
    err = rep.get("error") or None
    if fail_on == saved_fail_on and isinstance(rep.get("exit_code"), int):
        code = int(rep["exit_code"])
    else:
        code = int(out.exit_status(ExitStatus(err["exit_status"]) if err else None))
    if err is None or r.findings or fmt != "table":
        out.finish(code, pre_table=str(rep.get("preamble") or ""),
                   error=None if err is None else {"type": err.get("type"),
                                                   "message": err.get("message")})
    if err is not None:
        (stderr or sys.stderr).write(f"kubectl gpu-doctor: (replayed) error: "
                                     f"{err.get('message')}\n")
    return code


class Saver:
    """`--save FILE` for one run: records from the start, writes at the verdict
    (Session.finish). The target directory is checked up front, so a typo fails before
    anything runs."""

    def __init__(self, path: str, kube: Any, out: Any, image: str | None,
                 argv: Sequence[str] | None = None) -> None:
        directory = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(directory) or not os.access(directory, os.W_OK):
            raise errors.UsageError(f"--save {path}: directory {directory} does not exist or "
                                    f"is not writable")
        if os.path.isdir(path):
            raise errors.UsageError(f"--save {path}: is a directory")
        self.path = path
        self.out = out
        self.image = image
        self.argv = list(argv if argv is not None else ["kubectl-gpu_doctor", *sys.argv[1:]])
        self.recorder = Recorder()
        self.recorder.attach_kube(kube)
        self.recorder.attach_output(out)

    def save(self, code: int, error: errors.GpuDoctorError | None,
             preamble: Callable[[], str] = lambda: "") -> None:
        try:
            pre = preamble() if self.out.fmt == "table" else ""
            write(self.path, build(self.out, code, error, self.recorder, self.argv,
                                   image=self.image, preamble=pre))
        except (OSError, errors.GpuDoctorError) as exc:
            sys.stderr.write(f"kubectl gpu-doctor: warning: could not write the bundle "
                             f"{self.path}: {getattr(exc, 'strerror', None) or exc}\n")

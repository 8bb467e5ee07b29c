"""Evidence bundles: `--save FILE` keeps a run's report and the raw evidence behind it;
`replay FILE` renders it again offline with the same exit code.

Why: what goes into a ticket or an incident channel must outlive the cluster state that produced
it (the wedged kubelet gets restarted, the debug pod is gone). A bundle is one JSON file: the
report's records (findings, checks, completeness, the error if any), the raw inputs the verdicts
came from (node, the node's pods and events, Lease, kubelet config, healthz, an excerpt of the
goroutine dump, the node probe's NDJSON records), tool and image versions and the exact command
line. Collection does not change: a Recorder wraps the run's Kube reads and the probe records as
they pass, so diagnose/fleet know nothing about bundles.

Bundles keep an allow-list of fields (report/bundle_keep.py): what the verdicts read and a
person needs to check them; no Secret is ever read, env values, volumes, managedFields and the
values of annotations no analysis reads are never kept, and the free text that remains
(messages, titles, command lines) is cut and scrubbed of credential shapes, linearly.
The bundle says so in its header. Replay never talks to a cluster.
"""
from __future__ import annotations

import platform
import re
import signal
import sys
import threading
import time
from typing import Any, Callable, Mapping, Sequence

from node_probe.protocol import (CheckResult, ExitStatus, Finding, ProtocolError, catalog,
                                 worst_exit)
from node_probe.protocol import bundle as protocol_bundle
from node_probe.protocol.render import terminal_safe
from node_probe.protocol.version import __version__

from .. import errors
from . import bundle_io, bundle_keep
from .bundle_keep import REDACTED  # noqa: F401 - bundle.REDACTED, what redaction leaves

SCHEMA = protocol_bundle.SCHEMA  # one layout, shared with the watching agent
REDACTION_NOTICE = (
    "No secrets: no Secret object is read; of API objects only an allow-list of fields is kept "
    "(names, owners, node, resources, phases, states, conditions, events' reasons and "
    "messages, the kubelet settings the analysis reads): no environment variable values, "
    "volumes, managedFields or values of annotations the analysis does not read; free text "
    "(messages, titles, command lines) is cut and scrubbed of credential shapes (key=value "
    "and flag values of secret-named keys, JSON password fields, bearer/basic credentials, "
    "JWTs, PEM private keys, AWS access key ids, passwords in URLs).")
MAX_BUNDLE_BYTES = bundle_io.MAX_BUNDLE_BYTES
MAX_LIST_ITEMS = 500                   # a fleet's 150,000 pods are not evidence of one verdict
MAX_RECORDS = 20000
GOROUTINE_EXCERPT_BYTES = 64 * 1024
_GOROUTINE_KEYS = ("devicemanager", "deviceplugin", "GetPreferredAllocation", "Allocate",
                   "podresources", "syncLoop", "HandlePodAdditions", "nvidia")


# -- redaction (report/bundle_keep.py) ----------------------------------------------------

def redact_text(text: str) -> str:
    return bundle_keep.scrub(text)


def redact_argv(argv: Sequence[str]) -> list[str]:
    return bundle_keep.scrub_argv(argv)


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

    def keep_list(self, kind: str, path: str, items: Sequence[Any], total: int,
                  subset: str) -> None:
        """A list the run read page by page and did not keep whole (`nodes` folds its pods
        into per-node tallies): the items the verdicts were drawn from, at most
        MAX_LIST_ITEMS, with the list's length and a line saying which subset this is."""
        entry: dict = {"kind": kind, "path": path, "query": [],
                       "items": [bundle_keep.keep_object(kind, i)
                                 for i in list(items)[:MAX_LIST_ITEMS]],
                       "items_total": total, "subset": subset}
        with self._lock:
            self.api.append(entry)

    def _keep(self, kind: str, path: str, query, value: Any = None, error: dict | None = None,
              body: str | None = None) -> None:
        entry: dict = {"kind": kind, "path": path,
                       "query": [[k, str(v)] for k, v in (query or ())]}
        if error is not None:
            entry["error"] = {k: bundle_keep.scrub(v, 500) if isinstance(v, str) else v
                              for k, v in error.items()}
            if body:
                entry["text"] = bundle_keep.scrub(body, GOROUTINE_EXCERPT_BYTES)
        elif isinstance(value, str):
            entry["text"] = goroutine_excerpt(value) if kind == "goroutine_dump" else \
                bundle_keep.scrub(value, GOROUTINE_EXCERPT_BYTES)
            if kind == "goroutine_dump":
                entry["bytes"] = len(value)
        elif isinstance(value, dict) and "items" in value:
            items = list(value.get("items") or ())
            entry["items"] = [bundle_keep.keep_object(kind, i) for i in items[:MAX_LIST_ITEMS]]
            if len(items) > MAX_LIST_ITEMS:
                entry["items_total"] = len(items)
        else:
            entry["object"] = bundle_keep.keep_object(kind, value)
        with self._lock:
            self.api.append(entry)


def goroutine_excerpt(text: str, limit: int = GOROUTINE_EXCERPT_BYTES) -> str:
    """The goroutines that matter for the verdicts (device manager, plugin gRPC, sync loop)
    first, then the others, within `limit` bytes."""
    blocks = text.split("\n\n")
    is_hot = [any(k in b for k in _GOROUTINE_KEYS) for b in blocks]   # linear: no `b in hot`
    hot = [b for b, h in zip(blocks, is_hot) if h]
    rest = [b for b, h in zip(blocks, is_hot) if not h]
    out, size = [], 0
    for b in hot + rest:
        if size + len(b) + 2 > limit:
            out.append(f"... ({len(blocks) - len(out)} more goroutine block(s) not kept)")
            break
        out.append(b)
        size += len(b) + 2
    return bundle_keep.scrub("\n\n".join(out), limit + 200)


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
    report["context"] = dict(out.context)  # what the verdict's commands were built from
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
        "report": keep_report(report),
        "evidence": {
            "api": recorder.api,
            "probe_ndjson": [bundle_keep.keep_record(rec) for rec in recorder.records],
            "probe_records_dropped": recorder.records_dropped,
        },
    }


def keep_report(report: Mapping[str, Any]) -> dict:
    """The report as the bundle keeps it: findings and checks by the allow-list, free text
    scrubbed (event text reaches finding titles)."""
    k = bundle_keep
    err = report.get("error")
    # any other part (the verdict, durations): its strings scrubbed, bounded
    return {**{key: k.keep(v, k.KEEP) for key, v in report.items()},
            "target": k.keep(report.get("target"), k.KEEP),
            "version": k.scrub(str(report.get("version") or ""), 256),
            "findings": k.keep_findings(report.get("findings") or ()),
            "checks": k.keep_checks(report.get("checks") or ()),
            "summary_record": k.keep_record(report.get("summary_record"))
            if report.get("summary_record") is not None else None,
            "incomplete_reason": k.scrub(str(report.get("incomplete_reason") or "")),
            "error": None if err is None else {**err, "message": k.scrub(str(err["message"]))},
            "preamble": k.scrub(str(report.get("preamble") or ""), k.MAX_BIG_TEXT)}


def keep_node_bundle(doc: Mapping[str, Any]) -> dict:
    """A bundle the watching agent kept on a node, as `--save` keeps the client's own: the
    report and the probe records by the allow-list, free text scrubbed, nothing else."""
    ev = doc.get("evidence") if isinstance(doc.get("evidence"), Mapping) else {}
    recs = ev.get("probe_ndjson") if isinstance(ev.get("probe_ndjson"), list) else []
    return {"schema": SCHEMA, "redaction": REDACTION_NOTICE,
            "created_at": bundle_keep.scrub(str(doc.get("created_at") or ""), 64),
            "command_line": bundle_keep.scrub_argv(list(doc.get("command_line") or ())[:64]),
            "tool": bundle_keep.keep(doc.get("tool"), bundle_keep.KEEP),
            "image": bundle_keep.keep(doc.get("image"), bundle_keep.KEEP),
            "report": keep_report(doc["report"]),
            "evidence": {"api": [],
                         "probe_ndjson": [bundle_keep.keep_record(r)
                                          for r in recs[:MAX_RECORDS]],
                         "probe_records_dropped": max(0, len(recs) - MAX_RECORDS)},
            "agent": bundle_keep.keep(doc.get("agent"), bundle_keep.KEEP)}


def write(path: str, doc: Mapping[str, Any], say: Any = None) -> int:
    """Atomically, owner-readable, only over a regular file (report/bundle_io.py); says where
    and how big on `say` (stderr), as kubectl confirms what it did."""
    size = bundle_io.write(path, doc)
    if say is not None:
        say.write(f"saved bundle {terminal_safe(path)} ({_size(size)}, mode 0600; "
                  f"`kubectl gpu-doctor replay {terminal_safe(path)}` shows it again)\n")
        say.flush()
    return size


def _size(n: int) -> str:
    return f"{n} B" if n < 1024 else f"{n / 1024:.0f} KiB" if n < 1 << 20 else \
        f"{n / (1 << 20):.1f} MiB"


def origin_of(doc: Mapping[str, Any], source: str, now: float | None = None) -> str:
    """What a replay says instead of "live": which bundle, when it was captured and how long
    ago, and the command that captured it (all escaped: the bundle is hostile)."""
    import calendar
    created = str(doc.get("created_at") or "")[:40]
    ago = ""
    try:
        t = calendar.timegm(time.strptime(created, "%Y-%m-%dT%H:%M:%SZ"))
        from node_probe.protocol.duration import human
        ago = f" ({human((now or time.time()) - t)} ago)"
    except (ValueError, OverflowError):
        pass
    argv = doc.get("command_line") if isinstance(doc.get("command_line"), list) else []
    words: list[str] = []
    for a in [str(a)[:200] for a in argv[:24]]:  # whole words, at most ~400 characters
        if sum(len(w) + 1 for w in words) + len(a) > 400:
            words.append("...")
            break
        words.append(a)
    cmd = " ".join(words).replace("kubectl-gpu_doctor ", "kubectl gpu-doctor ", 1)
    return terminal_safe(f"replay of {source}, captured {created or 'at an unknown time'}{ago}"
                         + (f" by `{cmd}`" if cmd else ""))


# -- replay ----------------------------------------------------------------------------------

def load(path: str) -> dict:
    """Read and check a bundle; a bad file is one usage error, never a traceback or a hang."""
    return parse(bundle_io.read(path), path)


def parse(data: bytes, path: str) -> dict:
    """Check a bundle's bytes (from a file, or from the watching agent's ring); `path` names
    where they came from in the one-line error."""
    if len(data) > MAX_BUNDLE_BYTES:
        raise errors.UsageError(f"{path} is larger than {MAX_BUNDLE_BYTES // 2**20} MiB; not a "
                                f"gpu-doctor bundle")
    doc = bundle_io.parse(path, data)
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        schema = doc.get("schema") if isinstance(doc, dict) else None
        raise errors.UsageError(f"{path} is not a gpu-doctor bundle (schema "
                                f"{terminal_safe(repr(schema))[:80]}, expected {SCHEMA})")
    try:
        bundle_io.check_report(doc.get("report"))
    except bundle_io.Malformed as exc:
        raise errors.UsageError(f"{path}: the bundle's report is missing or malformed "
                                f"({exc})") from None
    return doc


def replay(doc: Mapping[str, Any], fmt: str, fail_on: str | None = None,
           stdout: Any = None, stderr: Any = None, details: bool = False,
           source: str = "a bundle") -> int:
    """Render the saved report as the original run did, saying it is a replay of `source`
    and when it was captured; return its exit code (recomputed from the findings only when
    --fail-on differs from the saved run's). `doc` is used up: its evidence and finding
    records are dropped as the report is built (a 64 MiB bundle is not held twice: the CLI's
    512 MiB bound)."""
    from .output import Output

    rep = doc["report"]
    saved_fail_on = rep.get("fail_on") or "warning"
    fail_on = fail_on or saved_fail_on
    # what the report shows around the findings comes from the file: escaped for a terminal
    target = {k: terminal_safe(v) if isinstance(v, str) else v
              for k, v in rep["target"].items()}
    out = Output(fmt, fail_on, target, out=stdout, err=stderr, progress=False,
                 details=details)
    r = out.report
    out.origin = origin_of(doc, source)
    # everything below is the file's contents, whoever wrote it (docs/mcp.md, "Untrusted")
    out.doc_extra["replay"] = {"bundle": source, "captured_at": doc.get("created_at"),
                               "untrusted": True}
    r.version = terminal_safe(rep.get("version") or r.version)
    if isinstance(doc, dict):
        doc.pop("evidence", None)   # not rendered: its memory goes before the report's grows
    try:
        r.started_at = float(rep.get("started_at") or r.started_at)
        d = rep.get("duration_s")  # the run's own duration, not the time since it
        r.duration_s = float(d) if isinstance(d, (int, float)) and not isinstance(d, bool) \
            else None
        recs = rep["findings"]
        for i, rec in enumerate(recs):  # a bundle is hostile: its advice labelled as ours are
            recs[i] = None              # each record freed once it is a Finding (memory)
            r.add_finding(Finding.from_record(catalog.label_foreign_remediation(rec)))
        for c in rep["checks"]:
            r.checks.append(CheckResult(c.get("id", "?"), c.get("status", "?"),
                                        float(c.get("duration_s", 0.0)), c.get("message", ""),
                                        c.get("reason", "")))
    except (ValueError, TypeError, KeyError, AttributeError, ProtocolError) as exc:
        raise errors.UsageError(f"the bundle's report is malformed: "
                                f"{terminal_safe(str(exc))[:200]}") from None
    if isinstance(rep.get("context"), dict):  # validated again by the verdict, like the target
        out.context = dict(rep["context"])
    r.summary_record = rep.get("summary_record")
    r.extra_incomplete_reason = rep.get("incomplete_reason") or ""
    out.api_only = r.summary_record is None
    err = rep.get("error") or None
    code = int(out.exit_status(ExitStatus(err["exit_status"]) if err else None))
    saved = rep.get("exit_code")
    if fail_on == saved_fail_on and isinstance(saved, int) and saved != code:
        # the saved code stands where it is the worse one (an interrupted run, a probe that
        # died); never below what the saved findings say: a bundle is anyone's to edit, and
        # one saying 0 over a critical finding replayed as 0 (audit round 3, R-2)
        code = int(worst_exit(ExitStatus(saved), ExitStatus(code)))
        out.doc_extra["replay"]["saved_exit_code"] = saved
    message = None if err is None else terminal_safe(" ".join(err["message"].split()))
    if err is None or r.findings or fmt not in ("table", "wide"):
        out.finish(code, pre_table="\n".join(terminal_safe(line) for line in
                                          (rep.get("preamble") or "").split("\n")),
                   error=None if err is None else {"type": terminal_safe(err.get("type") or ""),
                                                   "message": message})
    if err is not None:
        (stderr or sys.stderr).write(f"kubectl gpu-doctor: (replayed) error: {message}\n")
    return code


class Saver:
    """`--save FILE` for one run: records from the start, writes at the verdict
    (Session.finish). The target directory is checked up front, so a typo fails before
    anything runs."""

    def __init__(self, path: str, kube: Any, out: Any, image: str | None,
                 argv: Sequence[str] | None = None) -> None:
        bundle_io.check_target(path)
        self.path = path
        self.out = out
        self.image = image
        self.argv = list(argv if argv is not None else ["kubectl-gpu_doctor", *sys.argv[1:]])
        self.recorder = Recorder()
        self.recorder.attach_kube(kube)
        self.recorder.attach_output(out)

    def save(self, code: int, error: errors.GpuDoctorError | None,
             preamble: Callable[[], str] = lambda: "") -> None:
        """Build and write the bundle. Ctrl-C (or SIGTERM) while saving stops the save -- the
        run's end holds those signals (cli._end) so pod deletions are never cut short, but a
        bundle is not worth waiting for: the file is left as it was and the report goes on."""
        try:
            with _interruptible():
                pre = preamble() if self.out.fmt in ("table", "wide") else ""
                write(self.path, build(self.out, code, error, self.recorder, self.argv,
                                       image=self.image, preamble=pre), say=sys.stderr)
        except KeyboardInterrupt:
            sys.stderr.write(f"kubectl gpu-doctor: warning: interrupted: the bundle "
                             f"{terminal_safe(self.path)} was not written\n")
        except (OSError, errors.GpuDoctorError) as exc:
            sys.stderr.write(f"kubectl gpu-doctor: warning: could not write the bundle "
                             f"{terminal_safe(self.path)}: "
                             f"{terminal_safe(getattr(exc, 'strerror', None) or exc)}\n")


class _interruptible:
    """SIGINT and SIGTERM raise KeyboardInterrupt inside the block (main thread only: Python
    runs handlers there), whatever handler or SIG_IGN was set; the old ones come back after."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __enter__(self) -> None:
        self.old = None
        if threading.current_thread() is threading.main_thread():
            self.old = {s: signal.signal(s, _raise_interrupt) for s in self.SIGNALS}

    def __exit__(self, *exc: Any) -> None:
        if self.old is not None:
            for sig, handler in self.old.items():
                signal.signal(sig, handler)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt

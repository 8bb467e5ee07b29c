"""The gpu-doctor/v1 record model: the one contract between the node probe and the client.

Why this module exists: the probe (on the node, often in a pod) and the kubectl plugin (on a
laptop or in a bot) are separate processes that only share NDJSON lines. Both sides build and
parse records here, so the wire format, severities, the JSON report document and the exit-code
rule exist exactly once. Stdlib only: the probe image carries no third-party packages besides
grpcio/pynvml/bcc, and the client must never import those.
"""
from __future__ import annotations

import dataclasses
import enum
import itertools
import json
import sys
import time
from typing import IO, Any, Iterable, Mapping, Sequence

SCHEMA = "gpu-doctor/v1"

KINDS = ("progress", "finding", "event", "log", "summary")


class Severity(str, enum.Enum):
    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"
    OK = "ok"

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {Severity.OK: 0, Severity.INFO: 1, Severity.WARNING: 2, Severity.CRITICAL: 3}


class ExitStatus(enum.IntEnum):
    """Exit codes of both `gpu-doctor-probe` and `kubectl gpu-doctor` (DESIGN.md section 7).

    Precedence when several apply (EXIT_PRECEDENCE): INTERRUPTED > USAGE > INTERNAL >
    CLUSTER_ERROR > FINDINGS > INCOMPLETE > OK. Findings outrank incompleteness: a critical
    finding is real even if another check timed out; bots read `summary.complete` in the JSON
    document for the rest. INTERNAL (70, sysexits' EX_SOFTWARE) is a bug in the tool, never
    the cluster's or the node's state.
    """

    OK = 0
    FINDINGS = 1
    USAGE = 2
    CLUSTER_ERROR = 3
    INCOMPLETE = 4
    INTERNAL = 70
    INTERRUPTED = 130


EXIT_PRECEDENCE = (ExitStatus.INTERRUPTED, ExitStatus.USAGE, ExitStatus.INTERNAL,
                   ExitStatus.CLUSTER_ERROR, ExitStatus.FINDINGS, ExitStatus.INCOMPLETE,
                   ExitStatus.OK)


def worst_exit(*statuses: ExitStatus) -> ExitStatus:
    """The status that wins when several apply (EXIT_PRECEDENCE)."""
    return min((ExitStatus(s) for s in statuses), key=EXIT_PRECEDENCE.index)


FAIL_ON = ("critical", "warning", "never")


def exit_status_for(findings: Iterable["Finding"], fail_on: str, complete: bool) -> ExitStatus:
    """The verdict rule, in one place: findings at or above --fail-on, else incompleteness."""
    if fail_on not in FAIL_ON:
        raise ValueError(f"fail_on must be one of {FAIL_ON}, not {fail_on!r}")
    if fail_on != "never":
        threshold = Severity(fail_on).rank
        if any(f.severity.rank >= threshold for f in findings):
            return ExitStatus.FINDINGS
    if not complete:
        return ExitStatus.INCOMPLETE
    return ExitStatus.OK


class ProtocolError(ValueError):
    """A line that claims to be a gpu-doctor record but is not a valid one."""


_NO_EVIDENCE: Mapping[str, Any] = {}   # never written to: Finding.evidence is read-only

# Text a finding quotes from the cluster (an event's message, a container's message, a
# condition's message, an annotation) or from a bundle: data, never the tool's words. A
# finding's title and remediation are the tool's own; what others wrote goes in `quoted`, each
# entry {"source": the object it came from, "field": its field, "text": what it says}, which
# renderers show escaped and marked as quoted, and which an assistant is told is untrusted.
MAX_QUOTED = 8
MAX_QUOTE_CHARS = 600


def quote(source: Any, field: str, text: Any, limit: int = 300) -> dict:
    """One `quoted` entry: `text` (whitespace runs made one space; both ends kept past
    `limit` characters) from `field` of `source` (e.g. "event ml/train-0 FailedMount")."""
    t = " ".join(str(text if text is not None else "").split())
    limit = max(8, min(int(limit), MAX_QUOTE_CHARS))
    if len(t) > limit:
        half = (limit - 5) // 2
        t = f"{t[:half]} ... {t[-half:]}"
    return {"source": " ".join(str(source).split())[:200], "field": str(field)[:80],
            "text": t}


def _quoted(raw: Any) -> tuple:
    """`quoted` as a record carries it: a list of {source, field, text} strings, bounded."""
    if not raw:
        return ()
    if not isinstance(raw, (list, tuple)):
        raise TypeError("quoted is not a list")
    out = []
    for q in list(raw)[:MAX_QUOTED]:
        if not isinstance(q, Mapping):
            raise TypeError("a quoted entry is not an object")
        out.append(quote(q.get("source", ""), str(q.get("field", "")), q.get("text", ""),
                         MAX_QUOTE_CHARS))
    return tuple(out)


@dataclasses.dataclass(frozen=True, slots=True)
class Finding:
    """One diagnosis: a stable catalog id, how bad it is, about what, why we think so, the fix.

    `evidence` holds raw values with units in key names (`wait_s`, `major`, `errno`).
    Frozen so a finding can be shared between threads and de-duplicated safely.
    """

    id: str
    severity: Severity
    subject: str
    title: str
    evidence: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    remediation: str = ""
    refs: tuple[str, ...] = ()
    check: str = ""  # which check produced it (filled in by the runner when empty)
    # what others wrote, quoted as data (see quote()); never part of title or remediation
    quoted: tuple[Mapping[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.severity, Severity):
            object.__setattr__(self, "severity", Severity(self.severity))
        object.__setattr__(self, "refs", tuple(self.refs))
        if self.quoted and not isinstance(self.quoted, tuple):
            object.__setattr__(self, "quoted", tuple(self.quoted))
        if not self.id or self.id != self.id.strip() or " " in self.id:
            raise ValueError(f"bad finding id {self.id!r}")

    def to_record(self) -> dict:
        rec = {
            "schema": SCHEMA,
            "kind": "finding",
            "id": self.id,
            "severity": self.severity.value,
            "subject": self.subject,
            "title": self.title,
            "evidence": dict(self.evidence),
            "remediation": self.remediation,
            "refs": list(self.refs),
        }
        if self.check:
            rec["check"] = self.check
        if self.quoted:  # additive within v1: absent when nothing is quoted
            rec["quoted"] = [dict(q) for q in self.quoted]
        return rec

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> "Finding":
        try:
            ev = rec.get("evidence")
            return cls(
                id=sys.intern(rec["id"]) if type(rec["id"]) is str else rec["id"],
                severity=Severity(rec["severity"]),
                subject=str(rec.get("subject", "")),
                title=str(rec.get("title", "")),
                # no evidence: one shared empty mapping (findings are frozen; a replayed bundle
                # of 1,000,000 findings would hold 64 MB of empty dicts)
                evidence=dict(ev) if ev else _NO_EVIDENCE,
                remediation=str(rec.get("remediation", "")),
                refs=tuple(rec.get("refs") or ()),
                check=str(rec.get("check", "")),
                quoted=_quoted(rec.get("quoted")),
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise ProtocolError(f"invalid finding record: {exc}") from exc

    def key(self) -> tuple:
        """Identity for de-duplication (same id about the same subject)."""
        return (self.id, self.subject)


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """How one check ended: one of CHECK_STATUSES. `reason`: why a `skipped` check could not
    look (said by the check itself); `message`: what went wrong (error, timeout)."""

    id: str
    status: str
    duration_s: float
    message: str = ""
    reason: str = ""

    def to_dict(self) -> dict:
        d = {"id": self.id, "status": self.status, "duration_s": round(self.duration_s, 3)}
        if self.message:
            d["message"] = self.message
        if self.reason:
            d["reason"] = self.reason
        return d


CHECK_STATUSES = ("ok", "error", "timeout", "skipped", "interrupted")


def record(kind: str, **fields: Any) -> dict:
    if kind not in KINDS:
        raise ValueError(f"unknown record kind {kind!r}")
    rec = {"schema": SCHEMA, "kind": kind}
    rec.update(fields)
    return rec


def progress(**fields: Any) -> dict:
    return record("progress", ts=round(time.time(), 3), **fields)


def event(name: str, subject: str, message: str, **data: Any) -> dict:
    """A traced occurrence worth showing live (e.g. an EPERM open seen by eBPF)."""
    return record("event", ts=round(time.time(), 3), name=name, subject=subject,
                  message=message, data=data)


def log(level: str, message: str, **fields: Any) -> dict:
    return record("log", ts=round(time.time(), 3), level=level, message=message, **fields)


def summary(findings: Iterable[Finding], checks: Iterable[CheckResult], complete: bool,
            duration_s: float, exit_code: int) -> dict:
    counts = count_severities(findings)
    return record(
        "summary",
        critical=counts["critical"],
        warning=counts["warning"],
        info=counts["info"],
        complete=complete,
        duration_s=round(duration_s, 3),
        checks=[c.to_dict() for c in checks],
        exit_code=int(exit_code),
    )


def count_severities(findings: Iterable[Finding]) -> dict:
    counts = {"critical": 0, "warning": 0, "info": 0, "ok": 0}
    for f in findings:
        counts[f.severity.value] += 1
    return counts


def encode(rec: Mapping[str, Any]) -> str:
    """One NDJSON line (no trailing newline). Never raises on odd evidence values."""
    return json.dumps(rec, separators=(",", ":"), sort_keys=False, default=_json_default)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if isinstance(obj, bytes):
        return obj.decode("utf-8", "replace")
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    return str(obj)


def decode_line(line: str | bytes) -> dict:
    """Parse one line of probe output. Non-JSON (or foreign JSON) becomes a `log` record.

    Raises ProtocolError only for lines that carry our schema but are malformed.
    """
    if isinstance(line, bytes):
        line = line.decode("utf-8", "replace")
    text = line.rstrip("\r\n")
    stripped = text.strip()
    if not stripped.startswith("{"):
        return log("info", text, raw=True)
    try:
        rec = json.loads(stripped)
    except json.JSONDecodeError:
        return log("info", text, raw=True)
    if not isinstance(rec, dict) or rec.get("schema") != SCHEMA:
        return log("info", text, raw=True)
    kind = rec.get("kind")
    if kind not in KINDS:
        # Additive changes within v1: an unknown kind from a newer probe is kept as a log.
        return log("debug", text, raw=True, unknown_kind=kind)
    if kind == "finding":
        Finding.from_record(rec)  # validates
    return rec


class Report:
    """Accumulates records into the `-o json` document (DESIGN.md section 3).

    Used by the probe's own CLI and by the client, which merges API-side findings with the
    node stream. A stream without a summary is incomplete.
    """

    def __init__(self, target: Mapping[str, Any], version: str) -> None:
        self.target = dict(target)
        self.version = version
        self.started_at = time.time()
        self.findings: list[Finding] = []
        self._seen: dict[tuple, int] = {}   # (id, subject) -> index in self.findings
        self.checks: list[CheckResult] = []
        self.events: list[dict] = []
        self.logs: list[dict] = []
        self.summary_record: dict | None = None
        self.extra_incomplete_reason: str = ""
        self.duration_s: float | None = None  # set for a replay: the run's own duration

    def add_finding(self, f: Finding) -> bool:
        """Add unless an (id, subject) finding is already present. True if added. A later
        finding of the same key that is more severe replaces the earlier one in place (and
        counts as added): a critical never vanishes behind an earlier minor one."""
        at = self._seen.get(f.key())
        if at is not None:
            if f.severity.rank > self.findings[at].severity.rank:
                self.findings[at] = f
                return True
            return False
        self._seen[f.key()] = len(self.findings)
        self.findings.append(f)
        return True

    def add_record(self, rec: Mapping[str, Any]) -> Finding | None:
        kind = rec.get("kind")
        if kind == "finding":
            f = Finding.from_record(rec)
            return f if self.add_finding(f) else None
        if kind == "summary":
            self.summary_record = dict(rec)
            for c in rec.get("checks") or ():
                self.checks.append(CheckResult(c.get("id", "?"), c.get("status", "?"),
                                               float(c.get("duration_s", 0.0)),
                                               c.get("message", ""), c.get("reason", "")))
        elif kind == "event":
            self.events.append(dict(rec))
        elif kind == "log":
            self.logs.append(dict(rec))
        return None

    @property
    def complete(self) -> bool:
        if self.extra_incomplete_reason:
            return False
        if self.summary_record is None:
            return False
        return bool(self.summary_record.get("complete", False))

    def exit_status(self, fail_on: str) -> ExitStatus:
        return exit_status_for(self.findings, fail_on, self.complete)

    def sorted_findings(self) -> list[Finding]:
        return sorted(self.findings, key=lambda f: (-f.severity.rank, f.id, f.subject))

    def document(self, fail_on: str, exit_code: int | None = None,
                 lazy: bool = False) -> dict:
        """The `-o json` document. `lazy`: its findings are a list each finding's document is
        made from as it is iterated (json's encoder, write_json): a report of 300,000
        findings is not held twice (the client's 512 MiB bound)."""
        counts = count_severities(self.findings)
        if exit_code is None:
            exit_code = int(self.exit_status(fail_on))
        summ = {"critical": counts["critical"], "warning": counts["warning"],
                "info": counts["info"], "complete": self.complete}
        if self.extra_incomplete_reason:
            summ["incomplete_reason"] = self.extra_incomplete_reason
        return {
            "schema": SCHEMA,
            "version": self.version,
            "target": self.target,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started_at)),
            "duration_s": round(self.duration_s if self.duration_s is not None
                                else time.time() - self.started_at, 3),
            "findings": (FindingDocs(self.sorted_findings()) if lazy else
                         [_finding_doc(f) for f in self.sorted_findings()]),
            "checks": [c.to_dict() for c in self.checks],
            "summary": summ,
            "exit_code": int(exit_code),
        }


class FindingDocs(list):
    """The findings of a document, each made when iterated (json.JSONEncoder's pure-Python
    encoder, which indent=2 uses, iterates a list and asks its length). Not for YAML."""

    def __init__(self, findings: Sequence[Finding]) -> None:
        super().__init__()
        self._findings = findings

    def __iter__(self):
        return (_finding_doc(f) for f in self._findings)

    def __len__(self) -> int:
        return len(self._findings)


def write_json(stream: IO, doc: Any, pieces: int = 1 << 15) -> None:
    """`json.dumps(doc, indent=2, default=str)` and a newline, written `pieces` tokens at a
    time: the same bytes without the whole text (and json's list of its millions of tokens)
    in memory at once."""
    tokens = json.JSONEncoder(indent=2, default=str).iterencode(doc)
    while True:
        batch = list(itertools.islice(tokens, pieces))
        if not batch:
            break
        stream.write("".join(batch))
    stream.write("\n")


def _finding_doc(f: Finding) -> dict:
    rec = f.to_record()
    rec.pop("schema", None)
    rec.pop("kind", None)
    return rec

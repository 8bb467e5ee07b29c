"""The evidence bundle document (`gpu-doctor-bundle/v1`), built from a probe's NDJSON records.

Why here: the client writes bundles with `--save` and reads them with `replay`; the watching
agent writes them on the node, where it cannot import the client. The document layout both
sides share (schema name, the `report` block replay renders, the `evidence` block) lives in
this stdlib-only module so the two writers cannot drift apart.
"""
from __future__ import annotations

import os
import platform
import stat
import time
from typing import Any, Iterable, Mapping, Sequence

from node_probe.protocol import Report, decode_line, ProtocolError
from node_probe.protocol.version import __version__

SCHEMA = "gpu-doctor-bundle/v1"
REDACTION_NOTICE_NODE = (
    "Node-side evidence only: the probe's own records as its report shows them (the probe "
    "reads only NVIDIA_*, CUDA_* and HAMi environment keys; no Kubernetes object is read).")


class NotABundleFile(ValueError):
    """The file cannot be a bundle: see the two kinds below."""


class NotRegularFile(NotABundleFile):
    pass


class TooLargeFile(NotABundleFile):
    pass


def read_capped(fd: int, limit: int, name: str = "bundle") -> bytes:
    """The bytes of the regular file open at `fd`, at most `limit`: never blocks on a FIFO or a
    device (the caller opens with O_NONBLOCK), never holds more than `limit` + 1 MiB. Both
    readers of bundles use it: `replay` on the laptop, `agent-history` on the node."""
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        raise NotRegularFile(f"{name} is not a regular file (a FIFO, device or directory)")
    chunks, size = [], 0
    while size <= limit:
        chunk = os.read(fd, min(1 << 20, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if size > limit:
        raise TooLargeFile(f"{name} is larger than {limit} bytes")
    return b"".join(chunks)


def report_block(report: Report, fail_on: str, exit_code: int, *, error: dict | None = None,
                 preamble: str = "") -> dict:
    """The `report` block `replay` renders: findings, checks, summary, exit code."""
    return {
        "target": report.target, "version": report.version,
        "started_at": report.started_at,
        "duration_s": round(time.time() - report.started_at, 3),
        "fail_on": fail_on,
        "findings": [f.to_record() for f in report.findings],
        "checks": [c.to_dict() for c in report.checks],
        "summary_record": report.summary_record,
        "incomplete_reason": report.extra_incomplete_reason,
        "error": error,
        "exit_code": int(exit_code),
        "preamble": preamble,
    }


def from_probe_lines(lines: Iterable[bytes | str], target: Mapping[str, Any],
                     argv: Sequence[str], *, fail_on: str = "warning",
                     started_at: float | None = None, note: Mapping[str, Any] | None = None,
                     incomplete_reason: str = "", max_records: int = 20000) -> dict:
    """A bundle from the NDJSON lines of one `python -m node_probe -o jsonl` run.

    Lines that are not our records are dropped; a run cut short (no summary) is kept as an
    incomplete report with `incomplete_reason` saying why."""
    report = Report(target, __version__)
    if started_at is not None:
        report.started_at = started_at
    records: list[dict] = []
    dropped = 0
    for line in lines:
        try:
            rec = decode_line(line)
        except ProtocolError:
            dropped += 1
            continue
        if rec.get("raw"):
            continue
        if len(records) >= max_records:
            dropped += 1
            continue
        records.append(rec)
        try:
            report.add_record(rec)
        except ProtocolError:
            dropped += 1
    if report.summary_record is None:
        report.extra_incomplete_reason = incomplete_reason or "the probe ended without a summary"
        code = 4
    else:
        code = int(report.summary_record.get("exit_code", 0))
    return {
        "schema": SCHEMA,
        "redaction": REDACTION_NOTICE_NODE,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command_line": list(argv),
        "tool": {"name": "gpu-doctor-agent", "version": __version__,
                 "python": platform.python_version(), "kubernetes_client": None},
        "image": {"probe": None},
        "report": report_block(report, fail_on, code),
        "evidence": {"api": [], "probe_ndjson": records, "probe_records_dropped": dropped},
        **({"agent": dict(note)} if note else {}),
    }

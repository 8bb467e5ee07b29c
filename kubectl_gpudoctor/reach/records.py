"""Decoding the probe's byte stream into records the client can trust.

Why: the debug pod's log is written by a privileged process on a node a tenant shares, and
arrives over the network in arbitrary cuts. Whatever comes in (a finding whose `id` is a
number, a lone surrogate in a title, JSON nested 50,000 deep, `complete: "false"` as a string,
a 100 MB line) must not crash the client or throw away what the API side already found. So:
- lines are capped: a longer one is skipped up to its newline, with one warning for the run,
  and its bytes are never echoed (`-o jsonl` would otherwise print them);
- every record that claims our schema is validated field by field (types, depth, strings that
  encode as UTF-8); one that does not validate becomes a warning log line that names the
  problem, not the content;
- a finding whose id is not in our catalog keeps its remediation only labelled as the node's
  (catalog.label_foreign_remediation): the client never shows a node's advice as its own;
- the whole stream is capped too (MAX_RECORDS records, MAX_RECORD_BYTES bytes of lines passed
  on): an agent or debug pod that floods (50 MB/s of records or log lines until the deadline)
  cannot grow the report without bound; past the cap only the summary is still decoded;
- a skipped line, a record that does not validate or a stream past its cap makes the run
  incomplete: the probe's summary, when it comes, is passed on with
  `complete: false` and `incomplete_reason`, and `Decoder.incomplete_reason` says the same to a
  caller that saw no summary.
`Decoder.feed()` / `finish()` and `records()` never raise on any input.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any, Iterable, Iterator, Mapping

from node_probe import protocol
from node_probe.protocol import catalog

MAX_LINE_BYTES = 4 * 1024 * 1024   # a real record is a few KiB; the biggest seen ~200 KiB
MAX_DEPTH = 32                      # evidence is at most a few levels deep
MAX_ID_LEN = 128
MAX_RAW_CHARS = 8192                # a non-JSON line is shown as a log, at most this much
MAX_RECORDS = 50_000                # a real run: a few hundred; 20,000 findings on a big node
MAX_RECORD_BYTES = 32 * 1024 * 1024  # of lines passed on as records (~10x in Python objects)
_SUMMARY_LINE_BYTES = 64 * 1024     # past the caps, a line this short may still be the summary
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]*$")
_SEVERITIES = tuple(s.value for s in protocol.Severity)


class Invalid(ValueError):
    """A record that carries our schema but not a valid shape."""


def _reject_constant(name: str) -> Any:
    raise Invalid(f"non-finite number {name}")


def _walk(value: Any, depth: int = 0) -> None:
    """Depth and string checks over a decoded JSON value (iterative over siblings)."""
    if depth > MAX_DEPTH:
        raise Invalid(f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, str):
        _check_str(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_str(k)
            _walk(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            _walk(v, depth + 1)


def _check_str(s: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise Invalid("a string holds a lone surrogate") from None


def _want(rec: Mapping, key: str, types: type | tuple, required: bool = False) -> None:
    if key not in rec:
        if required:
            raise Invalid(f"{rec.get('kind')} record without {key!r}")
        return
    v = rec[key]
    if isinstance(v, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise Invalid(f"{key!r} is a boolean")
    if not isinstance(v, types):
        raise Invalid(f"{key!r} is {type(v).__name__}, not "
                      f"{' or '.join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))}")


def _number(rec: Mapping, key: str, required: bool = False) -> None:
    _want(rec, key, (int, float), required)
    v = rec.get(key)
    if isinstance(v, float) and not math.isfinite(v):
        raise Invalid(f"{key!r} is not finite")


def validate(rec: Mapping[str, Any]) -> None:
    """Raise Invalid unless `rec` (a dict with our schema) is a well-formed v1 record."""
    kind = rec.get("kind")
    if kind == "finding":
        _want(rec, "id", str, True)
        rid = rec["id"]
        if not rid or len(rid) > MAX_ID_LEN or not _ID_RE.match(rid):
            raise Invalid("finding id is not a catalog-style id")
        _want(rec, "severity", str, True)
        if rec["severity"] not in _SEVERITIES:
            raise Invalid("finding severity is not one of " + "/".join(_SEVERITIES))
        for k in ("subject", "title", "remediation", "check"):
            _want(rec, k, str)
        _want(rec, "evidence", dict)
        _want(rec, "refs", list)
        if not all(isinstance(r, str) for r in rec.get("refs") or ()):
            raise Invalid("finding refs are not all strings")
        try:
            protocol.Finding.from_record(rec)
        except (protocol.ProtocolError, AttributeError, TypeError, ValueError) as exc:
            raise Invalid(f"finding: {exc}") from None
    elif kind == "summary":
        _want(rec, "complete", bool, True)
        for k in ("critical", "warning", "info", "exit_code"):
            _want(rec, k, int)
        _number(rec, "duration_s")
        _want(rec, "checks", list)
        for c in rec.get("checks") or ():
            if not isinstance(c, dict):
                raise Invalid("summary check is not an object")
            _want(c, "id", str, True)
            _want(c, "status", str, True)
            _number(c, "duration_s")
            _want(c, "message", str)
            _want(c, "reason", str)
    elif kind == "log":
        _want(rec, "level", str)
        _want(rec, "message", str)
    elif kind == "event":
        for k in ("name", "subject", "message"):
            _want(rec, k, str)
        _want(rec, "data", dict)
    elif kind == "progress":
        for k in ("message", "phase", "check", "status"):
            _want(rec, k, str)
    _number(rec, "ts")


class Decoder:
    """Bytes in, validated records out; keeps what it had to drop for the verdict."""

    def __init__(self, max_line: int = MAX_LINE_BYTES) -> None:
        self.max_line = max_line
        self._buf = bytearray()
        self._skipping = False
        self.oversize_lines = 0
        self.invalid_records = 0
        self.records_out = 0     # records passed on, and the bytes of their lines
        self.bytes_out = 0
        self.dropped_lines = 0   # lines skipped past the caps

    # -- the verdict -----------------------------------------------------------------------
    @property
    def incomplete_reason(self) -> str:
        parts = []
        if self.invalid_records:
            parts.append(f"{self.invalid_records} probe record(s) did not validate")
        if self.oversize_lines:
            parts.append(f"{self.oversize_lines} probe output line(s) over "
                         f"{self.max_line} bytes were skipped")
        if self.dropped_lines:
            parts.append(f"the probe's output went past {MAX_RECORDS} records or "
                         f"{MAX_RECORD_BYTES >> 20} MiB: {self.dropped_lines} further line(s) "
                         f"were skipped")
        return "; ".join(parts)

    # -- bytes in --------------------------------------------------------------------------
    def feed(self, chunk: bytes) -> list[dict]:
        out: list[dict] = []
        data = bytes(chunk)
        pos, n = 0, len(data)
        while pos < n:
            nl = data.find(b"\n", pos)
            if self._skipping:
                if nl < 0:
                    return out
                self._skipping = False
                pos = nl + 1
                continue
            if nl < 0:
                self._buf += data[pos:]
                if len(self._buf) > self.max_line:
                    self._drop_oversize(out)
                return out
            if len(self._buf) + (nl - pos) > self.max_line:
                self._buf.clear()
                self._count_oversize(out)
            else:
                line = bytes(self._buf) + data[pos:nl] if self._buf else data[pos:nl]
                self._buf.clear()
                self._line(line, out)
            pos = nl + 1
        return out

    def finish(self) -> list[dict]:
        """What is left when the stream ends (a last line without a newline)."""
        out: list[dict] = []
        if self._buf and not self._skipping:
            line = bytes(self._buf)
            self._buf.clear()
            self._line(line, out)
        self._buf.clear()
        self._skipping = False
        return out

    def _drop_oversize(self, out: list[dict]) -> None:
        self._buf.clear()
        self._skipping = True
        self._count_oversize(out)

    def _count_oversize(self, out: list[dict]) -> None:
        self.oversize_lines += 1
        if self.oversize_lines == 1:  # one warning per run, never the content
            out.append(protocol.log(
                "warning", f"a probe output line over {self.max_line} bytes was skipped "
                "(further ones are counted, not reported)", oversize=True))

    # -- one line --------------------------------------------------------------------------
    def _line(self, line: bytes, out: list[dict]) -> None:
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line.strip():
            return
        size = min(len(line), MAX_RAW_CHARS) if not line.lstrip().startswith(b"{") else len(line)
        if self.records_out >= MAX_RECORDS or self.bytes_out + size > MAX_RECORD_BYTES:
            if len(line) > _SUMMARY_LINE_BYTES or b'"summary"' not in line:
                self._drop(out)
                return
        rec = self._decode(line)
        if rec is not None:
            self.records_out += 1
            self.bytes_out += size
            out.append(rec)

    def _drop(self, out: list[dict]) -> None:
        self.dropped_lines += 1
        if self.dropped_lines == 1:
            out.append(protocol.log(
                "warning", f"the probe's output went past {MAX_RECORDS} records or "
                f"{MAX_RECORD_BYTES >> 20} MiB; further lines are skipped", flood=True))

    def _decode(self, line: bytes) -> dict | None:
        text = line.decode("utf-8", "replace")
        stripped = text.strip()
        if not stripped.startswith("{"):
            return _raw(text)
        try:
            rec = json.loads(stripped, parse_constant=_reject_constant)
        except Invalid as exc:
            return self._invalid(str(exc))
        except RecursionError:
            return self._invalid(f"nested deeper than {MAX_DEPTH} levels")
        except ValueError:  # not JSON after all (JSONDecodeError, huge integer literal)
            if '"' + protocol.SCHEMA + '"' in stripped[:4096]:
                return self._invalid("not valid JSON")
            return _raw(text)
        if not isinstance(rec, dict) or rec.get("schema") != protocol.SCHEMA:
            try:
                _walk(rec)
            except Invalid:
                return protocol.log("info", "(a non-record JSON line too deep or not "
                                    "encodable was dropped)", raw=True)
            return _raw(text)
        try:
            _walk(rec)
            kind = rec.get("kind")
            if not isinstance(kind, str) or kind not in protocol.KINDS:
                if isinstance(kind, str):  # additive within v1: a newer probe's kind
                    return protocol.log("debug", f"record of unknown kind {kind[:40]!r} ignored",
                                        unknown_kind=kind[:40])
                raise Invalid("kind is not a string")
            validate(rec)
        except Invalid as exc:
            return self._invalid(str(exc))
        except RecursionError:
            return self._invalid(f"nested deeper than {MAX_DEPTH} levels")
        if rec["kind"] == "finding":  # advice from a node is never shown as ours
            rec = dict(catalog.label_foreign_remediation(rec))
        if rec["kind"] == "summary":
            reason = self.incomplete_reason
            if reason:
                rec = dict(rec, complete=False, incomplete_reason=reason)
        return rec

    def _invalid(self, reason: str) -> dict:
        self.invalid_records += 1
        return protocol.log("warning", f"invalid probe record ignored: {reason}", invalid=True)


def _raw(text: str) -> dict:
    """A non-record line (BCC compile noise, a stack trace) kept as a log, bounded."""
    if len(text) > MAX_RAW_CHARS:
        return protocol.log("info", text[:MAX_RAW_CHARS], raw=True, truncated=len(text))
    return protocol.log("info", text, raw=True)


def records(chunks: Iterable[bytes], decoder: Decoder | None = None) -> Iterator[dict]:
    """Validated gpu-doctor/v1 records from raw chunks (bad lines become log records)."""
    dec = decoder or Decoder()
    for chunk in chunks:
        yield from dec.feed(chunk)
    yield from dec.finish()

"""One run's output: collects API-side and node-side records into a Report and presents it.

Why: `node X`, `pod Y`, `nodes` and `local` all end the same way: findings from the API side and
from the node probe merged into ONE report (node_probe.protocol.Report), rendered as a table,
one JSON/YAML document for bots, or NDJSON passed through live. Progress goes to stderr only
when stderr is a terminal (DESIGN.md section 7), so pipes and bots see clean stdout.
Renderers are node_probe.protocol.render's (and markdown.py's); this module only routes
records, and asks analysis/verdict for the verdict that leads every presentation (the table's
first lines, `verdict` in the JSON/YAML document and the jsonl summary).
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import IO, Any, Callable, Mapping

from node_probe import protocol
from node_probe.protocol.version import __version__
from node_probe.protocol import render
from node_probe.protocol import CheckResult, ExitStatus, Finding, Report

from ..analysis import verdict
from . import markdown

FORMATS = ("table", "wide", "json", "jsonl", "yaml", "markdown", "chat")
HUMAN = ("table", "wide")  # the terminal renderings (wide: one line per finding, nothing cut)
SINGLE_TARGETS = ("node", "pod", "local")  # targets with one verdict (`nodes`: one per node)
MAX_STARTUP_S = 60.0  # a process older than this when the report opens is not a CLI start


def process_started_at() -> float:
    """When this process started (epoch seconds), so the report's elapsed time is what the user
    waited, interpreter start and `import kubernetes` included, not only the part after the
    report was opened (that printed 0.0s for a 0.55 s API-only run). From /proc/self/stat
    (start in clock ticks since boot) and /proc/uptime; now, when unknown or when the process
    is too old to be a CLI that just started (a long-lived embedder, a test runner)."""
    now = time.time()
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read(4096).decode("ascii", "replace")
        with open("/proc/uptime", "rb") as f:
            uptime = float(f.read(64).split()[0])
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, after "pid (comm)"
        age = uptime - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return now
    return now - age if 0.0 <= age <= MAX_STARTUP_S else now


class Output:
    def __init__(self, fmt: str, fail_on: str, target: Mapping[str, Any],
                 out: IO | None = None, err: IO | None = None,
                 progress: bool | None = None, details: bool = False) -> None:
        self.fmt = fmt
        self.details = details
        self.fail_on = fail_on
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.report = Report(target, __version__)
        self.report.started_at = process_started_at()
        self.live = render.LiveProgress(self.err, enabled=progress)
        self.jsonl = render.JsonlWriter(self.out) if fmt == "jsonl" else None
        self.node_summary: dict | None = None
        # a command's own additions: keys added to the JSON/YAML document (`nodes`: its rows),
        # and a table view replacing the default one (`nodes`: the fleet table)
        self.doc_extra: dict[str, Any] = {}
        self.table_view: Callable[[Report, IO, str, int], None] | None = None
        # what the command resolved from the API for the verdict's actions (`plugin_pods`:
        # the node's device plugin pods); kept in a --save bundle for replay
        self.context: dict[str, Any] = {}
        # a command that decides its own verdict (`job`: the node that differs) sets this
        self.verdict_of: Callable[[], dict] | None = None
        # when the evidence is from, for the header: None is a live run; `replay` says which
        # bundle and when it was captured
        self.origin: str | None = None
        self.api_only = True
        self._t0 = time.monotonic()
        self._lock = threading.RLock()  # `nodes --probe` streams several nodes at once

    # -- records in ------------------------------------------------------------------------
    def finding(self, f: Finding) -> None:
        with self._lock:
            if self.report.add_finding(f):
                rec = f.to_record()
                self.live(rec)
                if self.jsonl:
                    self.jsonl(rec)

    def findings(self, fs) -> None:
        for f in fs:
            self.finding(f)

    def node_record(self, rec: Mapping[str, Any], node: str | None = None) -> None:
        """A record from the node probe's stream (already decoded).

        With `node` (several nodes in one report, `nodes --probe`) node-side subjects are
        qualified with the node name, check ids too, and each node's summary only adds its
        checks and completeness instead of standing for the whole run.
        """
        with self._lock:
            if node is not None:
                self._fleet_record(rec, node)
            else:
                self._node_record(rec)

    def _fleet_record(self, rec: Mapping[str, Any], node: str) -> None:
        kind = rec.get("kind")
        if kind == "summary":
            for c in rec.get("checks") or ():
                self.check(f"{node}/{c.get('id', '?')}", c.get("status", "?"),
                           float(c.get("duration_s", 0.0)), c.get("message", ""))
            if rec.get("incomplete_reason"):  # set by the decoder (records.py)
                self.mark_incomplete(f"{node}: {rec['incomplete_reason']}")
            if not rec.get("complete", False):
                self.mark_incomplete(f"the probe on {node} did not finish every check")
            return
        if kind == "finding":
            rec = dict(rec)
            subj = str(rec.get("subject") or "")
            rec["subject"] = (f"node/{node}" if subj in ("", "node") or subj == f"node {node}"
                              else f"node/{node} {subj}")
        self._node_record(rec, fleet=True, node=node)

    def _node_record(self, rec: Mapping[str, Any], fleet: bool = False,
                     node: str | None = None) -> None:
        if not fleet:
            self.api_only = False  # the single node's own summary decides completeness
        kind = rec.get("kind")
        if kind == "finding":
            try:
                f = Finding.from_record(rec)
            except protocol.ProtocolError as exc:
                self.log("warning", f"bad finding from the probe: {exc}")
                return
            self.finding(f)
            return
        if kind == "summary":
            self.node_summary = dict(rec)
            self.report.add_record(rec)  # checks + completeness; our own summary goes out last
            if rec.get("incomplete_reason"):  # set by the decoder (records.py)
                self.mark_incomplete(str(rec["incomplete_reason"]))
            return
        self.report.add_record(rec)
        self.live(rec, node=node)
        if self.jsonl:
            self.jsonl(rec)

    def check(self, id: str, status: str, duration_s: float, message: str = "") -> None:
        with self._lock:
            self.report.checks.append(CheckResult(id, status, duration_s, message))

    def say(self, message: str, **fields: Any) -> None:
        rec = protocol.progress(message=message, **fields)
        with self._lock:
            self.live(rec)
            if self.jsonl:
                self.jsonl(rec)

    def log(self, level: str, message: str) -> None:
        rec = protocol.log(level, message)
        with self._lock:
            self.report.add_record(rec)
            self.live(rec)
            if self.jsonl:
                self.jsonl(rec)

    def mark_incomplete(self, reason: str) -> None:
        with self._lock:
            if not self.report.extra_incomplete_reason:
                self.report.extra_incomplete_reason = reason

    # -- verdict and presentation -----------------------------------------------------------
    def exit_status(self, error: ExitStatus | None = None) -> ExitStatus:
        if self.api_only and self.report.summary_record is None:
            # No node probe in this run (API-only, or the probe never started): completeness
            # is ours to judge; extra_incomplete_reason says what is missing.
            self.report.summary_record = {"complete": True}
        status = self.report.exit_status(self.fail_on)
        if error is None:
            return status
        return protocol.worst_exit(status, error)

    def verdict(self) -> dict | None:
        """The verdict of a single target (analysis/verdict.decide) as its JSON object; None
        for `nodes`, whose verdicts are per node. Decided from our findings and validated
        target names only, so a replayed bundle gets it recomputed, never trusted."""
        if self.verdict_of is not None:
            return self.verdict_of()
        if self.report.target.get("kind") not in SINGLE_TARGETS:
            return None
        with self._lock:
            return verdict.decide(self.report.findings, self.report.target,
                                  complete=self.report.complete, context=self.context,
                                  could_not_look=len(render.skipped_checks(self.report))
                                  ).to_dict()

    def clear_live(self) -> None:
        """Erase the live status line (before the report or an error line)."""
        self.live.clear()

    def finish(self, code: int, pre_table: str = "", error: Mapping[str, str] | None = None
               ) -> None:
        """Write the final presentation for `code` (already decided by exit_status).
        `error` ({type, message}) goes into the JSON/YAML document of a run that failed."""
        self.live.clear()
        r = self.report
        v = self.verdict()
        if self.fmt in HUMAN:
            if pre_table:
                self.out.write(pre_table)
            if self.table_view is not None:   # a command's own view (`nodes`: the fleet)
                self.table_view(r, self.out, self.fail_on, code)
            else:
                render.render_table(r, self.out, self.fail_on, code, verdict=v,
                                    details=self.details, origin=self.origin,
                                    wide=self.fmt == "wide")
        elif self.fmt in ("markdown", "chat"):
            self.out.write(markdown.render(r, self.fail_on, code, verdict=v,
                                           rows=self.doc_extra.get("nodes")
                                           if self.verdict_of is None else None,
                                           origin=self.origin, chat=self.fmt == "chat"))
        elif self.fmt in ("json", "yaml"):
            doc = r.document(self.fail_on, code, lazy=True)
            if v is not None:
                doc["verdict"] = v
            doc["reach"] = render.reach_of(r)  # how the node side was reached, as fields
            doc.update(self.doc_extra)
            if error is not None:
                doc["error"] = dict(error)
            # written in 1 MiB pieces: json.dump() to the stream writes every token on its own
            # (0.7 s for the 2,000 rows of `nodes`), json.dumps() holds the whole text and a
            # list of its every token (~1.2 KiB a finding: 712 MiB replaying 150,000)
            if self.fmt == "json":
                protocol.write_json(self.out, doc)
            else:
                write_yaml(self.out, doc)
        else:
            doc = r.document(self.fail_on, code)
            s = doc["summary"]
            summ = protocol.record(
                "summary", critical=s["critical"], warning=s["warning"], info=s["info"],
                complete=s["complete"], duration_s=doc["duration_s"], checks=doc["checks"],
                exit_code=int(code), target=doc["target"])
            if s.get("incomplete_reason"):
                summ["incomplete_reason"] = s["incomplete_reason"]
            if v is not None:
                summ["verdict"] = v
            self.jsonl(summ)
        self.out.flush()


def write_yaml(stream: Any, doc: Mapping[str, Any], chunk: int = 200) -> None:
    """yaml_dump(doc) written in pieces: the keys before `findings`, the findings `chunk` at a
    time (PyYAML builds a node for every scalar first: ~5 KiB a finding, 1 GiB replaying
    200,000), the keys after. The same text: a block mapping's keys are one after another,
    and a list under a key is written unindented, as a top-level list is."""
    keys = list(doc)
    if "findings" not in keys or not doc["findings"]:
        stream.write(yaml_dump({k: [] if k == "findings" else v for k, v in doc.items()}))
        return
    at = keys.index("findings")
    if at:
        stream.write(yaml_dump({k: doc[k] for k in keys[:at]}))
    stream.write("findings:\n")
    batch: list = []
    for item in doc["findings"]:
        batch.append(item)
        if len(batch) >= chunk:
            stream.write(yaml_dump(batch))
            batch.clear()
    if batch:
        stream.write(yaml_dump(batch))
    if keys[at + 1:]:
        stream.write(yaml_dump({k: doc[k] for k in keys[at + 1:]}))


def yaml_dump(doc: Any, *, all_documents: bool = False) -> str:
    """YAML as kubectl writes it: block style, keys in order, and never an anchor or alias
    (`&id001`/`*id001`, which PyYAML emits for an object that appears twice and which
    kubectl, GitOps tools and humans do not expect). PyYAML ships with the kubernetes client;
    imported here only when YAML is asked for."""
    import yaml

    # libyaml's emitter when PyYAML has it: the same text, 3x faster (5,000 `nodes` rows)
    class NoAliases(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
        def ignore_aliases(self, data: Any) -> bool:
            return True

    kw = dict(Dumper=NoAliases, sort_keys=False, default_flow_style=False,
              allow_unicode=True)
    return yaml.dump_all(doc, **kw) if all_documents else yaml.dump(doc, **kw)

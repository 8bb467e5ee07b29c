"""`replay` of a hostile bundle: every field of the saved report of another JSON type, or a number
out of range, is one usage error (exit 2) or a rendered report, never an internal error (round-3
audit R-3/R-4: `started_at` of 1e300 gave OverflowError and -1e18 EOVERFLOW, exit 70).

The bundle is a real one: `node X --save` against the fake API server (tests/kubectl/
test_bundle.py's run, the probe's recorded NDJSON stream), then each field of its report is
replaced in turn and the bundle parsed and replayed in every output format.
"""
from __future__ import annotations

import copy
import io
import json
from typing import Any, Iterator

import pytest

from kubectl_gpudoctor import errors
from kubectl_gpudoctor.report import bundle
from kubectl_gpudoctor.report.output import FORMATS
from tests.kubectl.test_bundle import _run, fc  # noqa: F401 - fixture: the fake API server
from tests.kubectl.conftest import run_cli
from tests.kubectl.test_api_type_confusion import _paths as walk

# numbers JSON can carry that no clock or duration can be: json.loads reads all of them
NUMBERS = (1e300, -1e18, 10 ** 400, -1, float("nan"), float("inf"))


def _others(v: Any) -> list[Any]:
    if isinstance(v, dict):
        return ["x", [v]]
    if isinstance(v, list):
        return [{"a": 1}, "x"]
    if isinstance(v, bool):
        return ["true", 2]
    if isinstance(v, (int, float)):
        return ["7", *NUMBERS]
    return [5, ["x"], {"a": "b"}]


def _paths(v: Any) -> Iterator[tuple]:
    """Every field, and the first two items of each list (a bundle repeats its shapes)."""
    return walk(v, max_items=2)


def _replace(doc: Any, path: tuple, value: Any) -> Any:
    doc = copy.deepcopy(doc)
    cur = doc
    for k in path[:-1]:
        cur = cur[k]
    cur[path[-1]] = value
    return doc


@pytest.fixture
def saved(fc, tmp_path):  # noqa: F811
    _, _, path = _run(fc, tmp_path, "json", wedged=True)
    return json.loads(path.read_text())


def _replay(doc: dict, fmt: str) -> None:
    raw = json.dumps(doc).encode()
    try:
        bundle.replay(bundle.parse(raw, "b.json"), fmt, stdout=io.StringIO(),
                      stderr=io.StringIO())
    except errors.UsageError:
        pass


def test_every_report_field_of_another_type_or_out_of_range(saved):
    crashed = []
    # the report's top level and its records: findings, checks, summary record, error
    rep = saved["report"]
    rep.setdefault("error", None)
    cases = [("report",) + p for p in _paths(rep)]
    assert len(cases) > 60
    for path in cases:
        cur = saved
        for k in path:
            cur = cur[k]
        for value in _others(cur):
            doc = _replace(saved, path, value)
            for fmt in FORMATS:
                try:
                    _replay(doc, fmt)
                except Exception as exc:  # noqa: BLE001 - what the test looks for
                    crashed.append(f"{fmt} {'.'.join(map(str, path))}={str(value)[:20]}: "
                                   f"{type(exc).__name__}: {str(exc)[:80]}")
    assert crashed == []


@pytest.mark.parametrize("value", [1e300, -1e18, "nan", 10 ** 400, float("inf")])
def test_started_at_out_of_range_is_exit_2(saved, tmp_path, value):
    """The audit's cases end to end (t3-repro/r02_replay_hostile.py started_at_*)."""
    saved["report"]["started_at"] = value
    p = tmp_path / "b.json"
    p.write_text(json.dumps(saved))
    r = run_cli("replay", str(p))
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stderr.count("\n") == 1 and "started_at" in r.stderr


def test_a_bundle_saying_exit_0_over_a_critical_finding_replays_as_1(saved, tmp_path):
    """docs/cli.md promises the same exit code as the run; a bundle is anyone's to edit, and
    one saying `exit_code: 0` over its critical finding replayed with 0 (audit round 3 R-2,
    still partial in round 5). The code follows the saved findings; the saved one is kept in
    the document's `replay` object."""
    rep = saved["report"]
    assert any(f["severity"] == "critical" for f in rep["findings"])
    assert rep["exit_code"] == 1
    p = tmp_path / "b.json"
    p.write_text(json.dumps(saved))
    untouched = run_cli("replay", str(p), "-o", "json")
    assert untouched.returncode == 1
    assert "saved_exit_code" not in json.loads(untouched.stdout)["replay"]
    rep["exit_code"] = 0
    p.write_text(json.dumps(saved))
    r = run_cli("replay", str(p), "-o", "json")
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["exit_code"] == 1 and doc["replay"]["saved_exit_code"] == 0
    r = run_cli("replay", str(p), "--fail-on", "never")   # recomputed as before: the
    assert r.returncode == 4, r.stderr                      # saved run was incomplete

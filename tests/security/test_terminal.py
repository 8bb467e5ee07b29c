"""The terminal sanitiser (issue 12 item 2): tenant strings holding CSI, OSC 52, C1 and lone
surrogates are shown escaped by the table and live-progress renderers; JSON stays exact."""
from __future__ import annotations

import io
import json

import pytest

from node_probe.protocol import Finding, Report, event, log, progress, render

OSC52 = "\x1b]52;c;ZWNobyBwd25lZA==\x07"          # write the clipboard
CSI_HIDE = "\x1b[2K\x1b[1A\x1b[8m"                 # erase line, cursor up, conceal
C1_CSI = "\x9b31m"                                 # 8-bit CSI
SURR = "\ud800"
BIDI = "\u202e"
HOSTILE = f"ok{OSC52}{CSI_HIDE}{C1_CSI}{SURR}{BIDI}\x7f\x00end"
RAW = ("\x1b", "\x07", "\x9b", "\ud800", "\u202e", "\x7f", "\x00")


def _assert_clean(text: str) -> None:
    for ch in RAW:
        assert ch not in text, (ch, text)


def _report() -> Report:
    r = Report({"kind": "pod", "name": f"pod-{HOSTILE}", "node": "gpu-1"}, "0.0.0")
    r.add_finding(Finding("hami.isolation_missing", "critical", f"team/{HOSTILE}",
                          f"Title {HOSTILE}", {"comm": HOSTILE, f"k{CSI_HIDE}": 1,
                                               "nested": {"msg": HOSTILE}, "list": [HOSTILE]},
                          f"fix {HOSTILE}\nsecond {OSC52}", (f"https://x/{OSC52}",)))
    r.add_finding(Finding("pod.admission_error", "info", HOSTILE, HOSTILE))
    r.add_record({"kind": "summary", "complete": True,
                  "checks": [{"id": "hami", "status": "error", "duration_s": 0.1,
                              "message": HOSTILE}]})
    return r


def test_terminal_safe_escapes_every_class():
    assert render.terminal_safe("a\x1bb") == "a\\x1bb"
    assert render.terminal_safe("\x9b") == "\\u009b"
    assert render.terminal_safe("\ud800") == "\\ud800"
    assert render.terminal_safe("\x7f\x00\n\t") == "\\x7f\\x00\\x0a\\x09"
    assert render.terminal_safe("\u202e") == "\\u202e"
    assert render.terminal_safe("nvidia-device-plugin é ✓ 日本") == "nvidia-device-plugin é ✓ 日本"


@pytest.mark.parametrize("color", [False, True])
def test_table_shows_hostile_strings_escaped(color):
    out = io.StringIO()
    render.render_table(_report(), out, "warning", 1, color=color, details=True, width=200)
    text = out.getvalue()
    if color:  # our own colour codes are the only ESCs left
        text = text.replace("\x1b[1;31m", "").replace("\x1b[36m", "").replace("\x1b[0m", "")
    _assert_clean(text)
    assert "\\x1b]52;c;ZWNobyBwd25lZA==\\x07" in text
    assert "\\u009b31m" in text and "\\ud800" in text
    assert "pod-ok\\x1b]52" in text                       # the target (pod name) too
    assert "process: ok\\x1b]52" in text                  # scalar evidence
    assert "second \\x1b]52" in text                      # each remediation line
    text.encode("utf-8")                                  # printable: no lone surrogates


def test_json_document_stays_exact():
    out = io.StringIO()
    render.render_json(_report(), out, "warning", 1)
    doc = json.loads(out.getvalue())
    crit = doc["findings"][0]
    assert crit["title"] == f"Title {HOSTILE}" and crit["evidence"]["comm"] == HOSTILE
    assert crit["subject"] == f"team/{HOSTILE}" and doc["target"]["name"] == f"pod-{HOSTILE}"


@pytest.mark.parametrize("rec", [
    Finding("gpu.xid", "critical", HOSTILE, f"title {HOSTILE}").to_record(),
    event("nvidia.open_denied", HOSTILE, f"open {HOSTILE} = EPERM"),
    progress(phase="check", check="hami", status="error", message=HOSTILE),
    progress(message=f"waiting: {HOSTILE}"),
    log("warning", f"container waiting: {HOSTILE}"),
])
def test_live_progress_lines_are_escaped(rec):
    out = io.StringIO()
    render.LiveProgress(out, enabled=True)(rec)
    text = out.getvalue()
    assert text.startswith("\r\x1b[2K"), rec  # the status line: our own erase, then the text
    text = text[len("\r\x1b[2K"):]
    assert text, rec
    _assert_clean(text)
    assert "\\x1b]52" in text


def test_jsonl_stays_exact():
    out = io.StringIO()
    rec = event("x", HOSTILE, HOSTILE)
    render.JsonlWriter(out)(rec)
    assert json.loads(out.getvalue())["message"] == HOSTILE


def test_fleet_table_and_error_line_are_escaped(capsys):
    from kubectl_gpudoctor import errors, session
    from kubectl_gpudoctor.report import fleet
    row = {"node": f"gpu-1{CSI_HIDE}", "ready": True, "schedulable": True,
           "gpu_allocatable": 8, "gpu_capacity": 8, "gpu_free": 1, "lease_age_s": 3,
           "pods": 2, "critical": 1, "warning": 0, "findings": [f"x{OSC52}"],
           "verdict": f"agent says {OSC52}", "agent": {"state": "stale"}}
    text = fleet.table([row], cols=400)
    _assert_clean(text)
    assert text.count("\\x1b]52") == 2 and "\\x1b[2K" in text
    session.say_error(errors.LaunchFailed(f"debug pod cannot start: {CSI_HIDE}{OSC52}"))
    err = capsys.readouterr().err
    _assert_clean(err)
    assert "\\x1b[2K" in err

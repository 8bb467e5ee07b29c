"""The table renderer: JSON evidence wraps between values, lists of objects one per line."""
from __future__ import annotations

import io
import json
import re

from node_probe.protocol import Report, catalog, render

PODS = [{"pod": "default/gdscn-gpu", "waiting_s": 176, "gpu": {"nvidia.com/gpu": "1"}},
        {"pod": "default/gdscn-plain", "waiting_s": 173, "gpu": None}]


def finding(**evidence):
    return catalog.make("kubelet.admission_stalled", "critical", "node/127.0.0.1",
                        "kubelet admission is stalled", evidence, "cordon it")


def table(f, width) -> str:
    rep = Report({"kind": "node", "name": "127.0.0.1"}, "0.0-test")
    rep.add_finding(f)
    buf = io.StringIO()
    old = render.shutil.get_terminal_size
    render.shutil.get_terminal_size = lambda fallback=(0, 0): type(
        "T", (), {"columns": width, "lines": 24})()
    try:
        render.render_table(rep, buf, "warning", 1, color=False)
    finally:
        render.shutil.get_terminal_size = old
    return buf.getvalue()


def test_list_of_objects_one_per_line_never_split_in_a_word():
    for width in (60, 80, 140):
        out = table(finding(pods=PODS, pending_untouched=2), width)
        lines = out.splitlines()
        i = lines.index("      pods:")
        items = [ln for ln in lines[i + 1:] if ln.startswith("        - ")]
        assert len(items) == 2
        assert '"default/gdscn-gpu"' in out
        assert not any(ln.rstrip().endswith(("gdscn-", '"default/')) for ln in lines)
        # each object's lines, joined again, are that object's JSON
        block = lines[i + 1:]
        objs, cur = [], ""
        for ln in block:
            if ln.startswith("        - "):
                if cur:
                    objs.append(cur)
                cur = ln[len("        - "):]
            elif ln.startswith("          ") and cur:
                cur += " " + ln.strip()
            else:
                break
        objs.append(cur)
        assert [json.loads(o) for o in objs] == PODS


def test_wide_dict_wraps_between_values_and_reassembles():
    ev = {"resources": {f"nvidia.com/mig-{i}g.{i * 10}gb": {"capacity": i, "allocatable": 0}
                        for i in range(1, 8)}}
    out = table(finding(**ev), 60)
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("      resources: "))
    parts = [lines[start][len("      resources: "):]]
    for ln in lines[start + 1:]:
        if not ln.startswith("        "):
            break
        parts.append(ln.strip())
    assert len(parts) > 3   # it did wrap
    assert json.loads(" ".join(parts)) == ev["resources"]
    for p in parts:   # every line ends at a value boundary
        assert re.search(r'[,}\]]$|^\{?"[^"]+": \{?$', p) or p.endswith("{"), p


def test_plain_values_do_not_break_on_hyphens():
    out = table(finding(message="x " * 15 + "default/gdscn-gpu-with-a-long-name-here"), 60)
    assert "default/gdscn-gpu-with-a-long-name-here" in out

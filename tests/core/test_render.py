"""The table renderer (--details): evidence one entry a line, lists and mappings of objects
as small tables, values never broken inside a word."""
from __future__ import annotations

import io
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
    render.render_table(rep, buf, "warning", 1, color=False, width=width, details=True)
    return buf.getvalue()


def test_list_of_objects_is_a_small_table_one_row_each():
    for width in (60, 80, 140):
        out = table(finding(pods=PODS, pending_untouched=2), width)
        lines = out.splitlines()
        i = lines.index("      pods:")
        assert re.match(r"^        POD\s+WAITING\s+GPU$", lines[i + 1]), lines[i + 1]
        assert re.match(r"^        default/gdscn-gpu\s+2m56s\s+nvidia.com/gpu=1$", lines[i + 2])
        assert re.match(r"^        default/gdscn-plain\s+2m53s\s+-$", lines[i + 3])
        assert "pending untouched: 2" in out
        assert '{"' not in out and "None" not in out


def test_mapping_of_objects_is_a_table_with_a_name_column():
    ev = {"resources": {f"nvidia.com/mig-{i}g.{i * 10}gb": {"capacity": i, "allocatable": 0}
                        for i in range(1, 8)}}
    out = table(finding(**ev), 60)
    lines = out.splitlines()
    i = lines.index("      resources:")
    assert re.match(r"^        NAME\s+CAPACITY\s+ALLOCATABLE$", lines[i + 1])
    rows = [ln.split() for ln in lines[i + 2:i + 9]]
    assert rows == [[f"nvidia.com/mig-{n}g.{n * 10}gb", str(n), "0"] for n in range(1, 8)]


def test_plain_values_do_not_break_on_hyphens():
    out = table(finding(message="x " * 15 + "default/gdscn-gpu-with-a-long-name-here"), 60)
    assert "default/gdscn-gpu-with-a-long-name-here" in out

"""Constants shared by the BPF C and Python have one home (the C), and the shared headers are
pasted into each compile unit once (no BPF needed)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from node_probe.tracing import abi, sources, ticks
from node_probe.tracing.session import PROGRAMS

REPO = Path(__file__).resolve().parents[2]


def test_defines_are_read_from_the_c_and_its_headers():
    assert abi.parse_defines("#define A 1\n#define B -100\n#define C 0x10ULL /* c */\n"
                             "#define D \"str\"\n#define E (1 << 2)\n") == {"A": 1, "B": -100,
                                                                          "C": 16}
    c = abi.Constants("cgroup_devices")
    assert c.FDT_KIND_CG_ALLOW != c.FDT_KIND_CG_DENY          # from include/fdtrack.h
    assert c.CGDEV_EV_WRITE != c.CGDEV_EV_BPF                  # from the program itself
    try:
        c.NO_SUCH_CONSTANT
    except AttributeError as exc:
        assert "cgroup_devices" in str(exc)
    else:
        raise AssertionError("unknown constant did not raise")


def test_headers_are_pasted_once_per_unit_with_line_directives():
    text = sources.unit_text(PROGRAMS)
    assert text.count("#define GD_FDTRACK_H") == 1 and text.count("#define GD_SYSCALL_TP_H") == 1
    assert '#line 1 "' in text and "include/fdtrack.h" in text
    for name in PROGRAMS:   # BCC rewrites map calls only in the main file: nothing left out
        assert not re.search(r'^\s*#\s*include\s+"', sources.unit_text([name]), re.M), name


def test_nvidia_major_has_one_definition():
    defs = []
    for path in (REPO / "node_probe").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "NVIDIA_MAJOR" for t in node.targets):
                defs.append(str(path.relative_to(REPO)))
    assert defs == ["node_probe/host/nvidia_devices.py"], defs


def test_tick_rate_is_inferred_from_initial_jiffies():
    # jiffies start at 2**32 - 300*HZ; 1196.6 s after boot at HZ=250 (a sample of this VM)
    assert ticks.infer_hz(1196614314686, 4295191371) == 250
    assert ticks.infer_hz(5000 * 10**9, (1 << 32) - 300 * 1000 + 1000 * 5000) == 1000
    assert ticks.infer_hz(301 * 10**9, (1 << 32) + 250) is None   # ambiguous near 300 s


def test_timer_list_sample(tmp_path):
    (tmp_path / "timer_list").write_text("Timer List Version: v0.9\nHRTIMER_MAX_CLOCK_BASES: 8\n"
                                         "now at 1196614314686 nsecs\n\ncpu: 0\n"
                                         " clock 0:\n  .idle_jiffies   : 4295189613\n"
                                         "jiffies: 4295191371\n")
    assert ticks.sample(tmp_path) == (1196614314686, 4295191371)
    assert ticks.sample(tmp_path / "missing") is None


def test_tick_clock_is_carried_forward_when_timer_list_goes_away(tmp_path):
    """ioctl start times are in ticks; "now" in ticks comes from /proc/timer_list, and from the
    first sample plus elapsed monotonic time if it cannot be read at the end."""
    from node_probe.tracing.fdtrack import FdTracker
    from node_probe.tracing.loader import TraceConfig
    from node_probe.tracing.nvidia_dev import NvidiaDev
    if ticks.tick_hz() is None:
        import pytest
        pytest.skip("no readable /proc/timer_list or tick rate here")
    d = NvidiaDev(TraceConfig(), lambda k, r: None, FdTracker("/dev/nvidia"))
    assert d.hz and d.unit_s == 1 / d.hz
    real = d._clock_now()
    d.proc = tmp_path            # timer_list unreadable from now on
    carried = d._clock_now()
    assert abs(carried[0] - real[0]) <= 2 and carried[1] >= real[1]
    d2 = NvidiaDev(TraceConfig(proc=tmp_path), lambda k, r: None, FdTracker("/dev/nvidia"))
    assert d2.hz is None and d2.unit_s == 1e-9   # no tick source at all: nanoseconds
    assert "-DNVDEV_JIFFIES" not in d2.cflags() and "-DNVDEV_JIFFIES" in d.cflags()

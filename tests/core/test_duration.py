"""Durations on the node probe's CLI: the same grammar as the plugin (node_probe.protocol.
duration), through argparse; non-finite numbers are usage errors (exit 2, one line)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from node_probe import cli
from node_probe.protocol import duration

from tests.probe_run import REPO


@pytest.mark.parametrize("text,seconds", [
    ("60s", 60.0), ("2m", 120.0), ("1m30s", 90.0), ("500ms", 0.5), ("1h", 3600.0),
    ("30", 30.0), ("2.5", 2.5), ("0", 0.0), ("1h2m3s4ms", 3723.004), ("100ns", 1e-7)])
def test_parse(text, seconds):
    assert duration.parse(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "Infinity", "1e999", "1e3", "-5s",
                                  "5x", "1m30", "m", "", " ", "1.2.3s", "9999999h"])
def test_parse_rejects(text):
    with pytest.raises(duration.DurationError):
        duration.parse(text)


def test_probe_parser_takes_go_durations():
    a = cli.build_parser().parse_args(["--timeout", "1m30s", "--trace-seconds", "500ms",
                                       "--nvml-timeout", "8s"])
    assert (a.timeout, a.trace_seconds, a.nvml_timeout) == (90.0, 0.5, 8.0)
    a = cli.build_parser().parse_args(["--timeout", "45", "--trace-seconds", "0"])
    assert (a.timeout, a.trace_seconds) == (45.0, 0.0)


@pytest.mark.parametrize("args", [["--timeout", "nan"], ["--timeout", "inf"],
                                  ["--trace-seconds", "nan"], ["--nvml-timeout", "inf"],
                                  ["--timeout", "0s"], ["--trace-seconds", "-1"],
                                  ["--timeout", "2x"]])
def test_probe_cli_rejects_bad_durations_in_one_line(args):
    p = subprocess.run([sys.executable, "-m", "node_probe", *args, "--list-checks"],
                       capture_output=True, text=True, cwd=REPO, timeout=30)
    assert p.returncode == 2, (args, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and args[0] in lines[0] and "Traceback" not in p.stderr

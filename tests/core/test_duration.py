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


# kubectl's own table: TestHumanDuration and TestHumanDurationBoundaries of
# https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apimachinery/pkg/util/duration/duration_test.go
# (the function behind the AGE column of `kubectl get`); seconds, expected text, as it lists them
# (`d - time.Millisecond` written as d - 0.001).
HUMAN_DURATION = [
    (1, "1s"), (70, "70s"), (190, "3m10s"), (70 * 60, "70m"), (47 * 3600, "47h"),
    (49 * 3600, "2d1h"), ((8 * 24 + 2) * 3600, "8d"), (367 * 24 * 3600, "367d"),
    ((365 * 2 * 24 + 25) * 3600, "2y1d"), ((365 * 8 * 24 + 2) * 3600, "8y"),
    (-2, "<invalid>"), (-2 + 1e-9, "0s"), (0, "0s"), (120 - 0.001, "119s"), (120, "2m"),
    (121, "2m1s"), (600 - 0.001, "9m59s"), (600, "10m"), (601, "10m"),
    (3 * 3600 - 0.001, "179m"), (3 * 3600, "3h"), (3 * 3600 + 60, "3h1m"),
    (8 * 3600 - 0.001, "7h59m"), (8 * 3600, "8h"), (8 * 3600 + 59 * 60, "8h"),
    (2 * 86400 - 0.001, "47h"), (2 * 86400, "2d"), (2 * 86400 + 3600, "2d1h"),
    (8 * 86400 - 0.001, "7d23h"), (8 * 86400, "8d"), (8 * 86400 + 23 * 3600, "8d"),
    (2 * 365 * 86400 - 0.001, "729d"), (2 * 365 * 86400, "2y"),
    (2 * 365 * 86400 + 23 * 3600 + 59 * 60, "2y"), (2 * 365 * 86400 + 86400, "2y1d"),
    (3 * 365 * 86400, "3y"), (8 * 365 * 86400 - 0.001, "7y364d"), (8 * 365 * 86400, "8y"),
    (9 * 365 * 86400, "9y")]


@pytest.mark.parametrize("seconds,text", HUMAN_DURATION)
def test_human_is_kubectls_human_duration(seconds, text):
    """Every age, wait and deadline is printed as kubectl prints an age (the two formatters
    the client and the probe had, `10m33s`/`2d00h` and `10m`/`48h02m`, are this one)."""
    assert duration.human(seconds) == text


def test_human_keeps_a_tenth_under_ten_seconds():
    """The one addition to HumanDuration: a 0.5 s deadline is not `0s`."""
    assert [duration.human(s) for s in (0.3, 2.5, 9.0, 12.7)] == ["0.3s", "2.5s", "9s", "12s"]
    assert duration.human(None) == "?"


def test_the_client_and_the_probe_share_the_formatter():
    from kubectl_gpudoctor.analysis import common
    from node_probe.protocol import evidence
    assert common.fmt_duration is duration.human and evidence.fmt_duration is duration.human

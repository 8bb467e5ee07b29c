"""Hostile or sloppy input on the kubectl plugin's command line: names are validated as the API
server validates them and quoted into URLs; durations are typed as kubectl users type them;
non-finite numbers are usage errors before anything is created."""
from __future__ import annotations

import json

import click
import pytest

from kubectl_gpudoctor import errors, params
from kubectl_gpudoctor.commands import node
from kubectl_gpudoctor.api.kube import Kube, seg

from .conftest import DATA, one_error_line, run_cli
from .fakecluster import cut_odd
from .test_cli_cluster import healthy_node


@pytest.mark.parametrize("args", [
    ("node", "../nodes/gpu-1"),
    ("node", "gpu-1?watch=true"),
    ("node", "gpu-1/proxy/configz"),
    ("node", "GPU-1"),
    ("node", "gpu-1 "),
    ("node", "gpu-"),
    ("node", "a" * 254),
    ("pod", "../../nodes/gpu-1", "-n", "ml"),
    ("pod", "train-0#x", "-n", "ml"),
    ("pod", "train-0", "-n", "ml/../kube-system"),
    ("pod", "train-0", "-n", "Team"),
    ("pod", "train-0", "-n", "a.b"),  # a namespace is a label: no dots
    ("pod", "train-0", "-n", "n" * 64),
    ("node", "gpu-1", "--probe-namespace", "gpu-doctor/x"),
    ("cleanup", "-n", "kube-system?x=1"),
])
def test_invalid_names_are_usage_errors_and_nothing_is_requested(cluster, kubeconfig, args):
    healthy_node(cluster)
    r = run_cli(*args, "--kubeconfig", str(kubeconfig))
    line = one_error_line(r.stderr)
    assert r.returncode == 2, (args, r.stderr)
    assert "not valid" in line or "longer than" in line
    assert cluster.requests() == [] and cluster.created == []


def test_valid_names_pass():
    for kind, name in (("node", "gpu-1"), ("node", "ip-10-0-1-2.ec2.internal"),
                       ("pod", "neal-0729-0-68b4895fb7-6868w"), ("pod", "a.b-c"),
                       ("namespace", "kube-system"), ("namespace", "a" * 63),
                       ("node", "a" * 253)):
        assert params.name_problem(kind, name) is None, (kind, name)


@pytest.mark.parametrize("name", ["../nodes/gpu-1", "gpu-1?watch=true", "gpu-1#", "gpu-1/"])
def test_names_are_quoted_into_one_path_segment(cluster, kubeconfig, name):
    """Even past validation (names read back from the API, library callers), a name never
    addresses another object: it is one quoted path segment."""
    cluster.add_node("gpu-1")
    k = Kube(str(kubeconfig))
    with pytest.raises(errors.NotFound):
        node.get_node(k, name)
    with pytest.raises(errors.NotFound):
        node.get_pod(k, "default", name)
    assert "/" not in seg(name) and "?" not in seg(name) and "#" not in seg(name)
    assert node.get_node(k, "gpu-1")["metadata"]["name"] == "gpu-1"


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN", "1e999", "-5", "5x", "1m30",
                                   ""])
def test_non_finite_or_bad_timeouts_are_usage_errors_before_any_request(cluster, kubeconfig,
                                                                         value):
    healthy_node(cluster)
    r = run_cli("node", "gpu-1", "--kubeconfig", str(kubeconfig), "--timeout", value)
    line = one_error_line(r.stderr)
    assert r.returncode == 2 and "--timeout" in line
    assert cluster.requests() == [] and cluster.created == []


@pytest.mark.parametrize("opt", ["--trace-seconds", "--start-timeout", "--stall-threshold",
                                 "--kubelet-timeout", "--request-timeout"])
def test_every_duration_option_rejects_nan(cluster, kubeconfig, opt):
    r = run_cli("node", "gpu-1", "--kubeconfig", str(kubeconfig), opt, "nan")
    assert r.returncode == 2 and opt in one_error_line(r.stderr)
    assert cluster.requests() == []


def test_local_rejects_non_finite_timeout():
    for value in ("nan", "inf"):
        r = run_cli("local", "--timeout", value)
        assert r.returncode == 2 and "--timeout" in one_error_line(r.stderr)


def test_go_durations_reach_the_probe_and_the_waits(cluster, kubeconfig):
    healthy_node(cluster)
    cluster.log_chunks = cut_odd((DATA / "probe_stream.ndjson").read_bytes())
    r = run_cli("node", "gpu-1", "--kubeconfig", str(kubeconfig), "--timeout", "1m30s",
                "--trace-seconds", "500ms", "--start-timeout", "2m", "--stall-threshold",
                "60s", "--kubelet-timeout", "10s", "--request-timeout", "15s", "-o", "json")
    assert r.returncode == 1, r.stderr
    cmd = cluster.created[0]["spec"]["containers"][0]["command"]
    assert cmd[cmd.index("--timeout") + 1] == "90"
    assert cmd[cmd.index("--trace-seconds") + 1] == "0.5"
    assert json.loads(r.stdout)["summary"]["complete"] is True


@pytest.mark.parametrize("text,seconds", [
    ("60s", 60.0), ("2m", 120.0), ("1m30s", 90.0), ("500ms", 0.5), ("1h", 3600.0),
    ("60", 60.0), ("2.5", 2.5), ("1.5h", 5400.0), ("0", 0.0), ("1h2m3s", 3723.0),
    ("250us", 0.00025), (" 5s ", 5.0)])
def test_duration_param_type(text, seconds):
    assert params.Duration().convert(text, None, None) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["nan", "inf", "Infinity", "-1s", "5x", "s", "1e3", "1m30",
                                  "", "9999999h"])
def test_duration_param_type_rejects(text):
    with pytest.raises(click.BadParameter):
        params.Duration().convert(text, None, None)


def test_duration_minimum():
    with pytest.raises(click.BadParameter, match="minimum 1s"):
        params.Duration(1).convert("500ms", None, None)
    assert params.Duration(1).convert("1s", None, None) == 1.0


def _all_params(cmd, path=()):
    for p in cmd.params:
        yield path + (cmd.name,), p
    for sub in getattr(cmd, "commands", {}).values():
        yield from _all_params(sub, path + (cmd.name,))


def test_every_duration_option_of_every_command_is_a_duration():
    """New commands keep the rule: an option named like a duration takes Go durations."""
    from kubectl_gpudoctor import cli
    durationish = ("timeout", "seconds", "threshold", "interval", "deadline", "grace")
    seen = 0
    for where, p in _all_params(cli.cli):
        if isinstance(p, click.Option) and any(w in p.name for w in durationish):
            seen += 1
            assert isinstance(p.type, params.Duration), (where, p.name, p.type)
    assert seen >= 8


def test_every_name_argument_and_namespace_option_is_validated():
    from kubectl_gpudoctor import cli
    for where, p in _all_params(cli.cli):
        if p.name in ("namespace", "probe_namespace") and where[-1] != "agent" and \
                "agent" not in where:
            assert p.type is params.NAMESPACE, (where, p.name)
    assert cli.cli.commands["node"].params[0].type is params.NODE_NAME
    assert cli.cli.commands["pod"].params[0].type is params.POD_NAME

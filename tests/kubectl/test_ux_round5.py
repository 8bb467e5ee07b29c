"""The UX audit of round 5 (../shared/audits/ux-round-5.md), the items of issue 36.6 and 36.7
that are about the command line: the 3 a.m. mistakes (N11 "did you mean", N12 a 403 that
says how, N13 kubectl habits, N14 piped width, N21 `local` without root) and click's own
words (R4-18). The CLI runs as a user runs it (`python -m kubectl_gpudoctor`, a subprocess)
against the suite's HTTP fake API server, on test_fleet_view.sick_fleet (40 nodes
gpu-0000..gpu-0039: NotReady gpu-0030, wedged gpu-0003, agent-marked gpu-0020).

What the audit saw is quoted in each docstring; the assertions are what the tired engineer
needs instead. Each error is one stderr line with the exit code of errors.py's one map.
"""
from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import pty
import re
import shutil
import stat
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from kubectl_gpudoctor import params

from tests.deviceplugin.conftest import host, start_plugin  # noqa: F401 - fixtures

from .conftest import REPO, cli_env, one_error_line
from .fakecluster import FakeCluster, ts
from .test_agent_wedge import stuck_plugin  # noqa: F401 - fixture
from .test_fleet_view import sick_fleet
from .test_ux_round4 import wedged_full  # noqa: F401 - fixture


@pytest.fixture(scope="module")
def fleet_server(tmp_path_factory):
    """sick_fleet, plus pods whose names a tired engineer types without their namespace."""
    fc = FakeCluster()
    sick_fleet(fc)
    fc.add_pod("ml", "trainer-0", "gpu-0001", gpus=1)
    fc.add_pod("ml", "twin", "gpu-0001", gpus=1)
    fc.add_pod("team-b", "twin", "gpu-0002", gpus=1)
    fc.start()
    try:
        yield fc, str(fc.kubeconfig(tmp_path_factory.mktemp("kc") / "kubeconfig"))
    finally:
        fc.stop()


@pytest.fixture
def fleet(fleet_server):
    """The module's fleet with the Leases of its Ready nodes renewed now, as their kubelets
    would (under load the module runs for minutes: a Lease left alone goes stale and the node
    with it, an artifact of the fake; the NotReady gpu-0030 keeps its old one)."""
    fc, kc = fleet_server
    now = dt.datetime.now(dt.timezone.utc)
    for name, lease in fc.leases.items():
        if name != "gpu-0030":
            lease["spec"]["renewTime"] = ts(now)
    return fc, kc


def cli(*args: str, env: dict | None = None, timeout: float = 120,
        **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kubectl_gpudoctor", *args],
                          capture_output=True, text=True, timeout=timeout,
                          env=env or cli_env(), cwd=str(REPO), **kw)


# -- N11: did you mean ---------------------------------------------------------------------

def test_a_node_name_one_zero_short_names_the_node_meant(fleet):
    """Audit N11: `node gpu-001` said `error: node gpu-001 not found`, with no near name."""
    _, kc = fleet
    r = cli("node", "gpu-001", "--kubeconfig", kc, "--no-probe")
    assert r.returncode == 3, r.stderr
    line = one_error_line(r.stderr)
    assert line.endswith("node gpu-001 not found; did you mean gpu-0001?"), line


def test_a_lookalike_letter_in_a_node_name_names_the_node_meant(fleet):
    """Audit N11: `node gpu-0l50` (an l for a 1). Here gpu-00l5 for gpu-0015."""
    _, kc = fleet
    r = cli("node", "node/gpu-00l5", "--kubeconfig", kc, "--no-probe")
    assert r.returncode == 3
    assert one_error_line(r.stderr).endswith("did you mean gpu-0015?")


def test_a_name_nothing_resembles_says_only_not_found(fleet):
    _, kc = fleet
    r = cli("node", "cpu-login-1", "--kubeconfig", kc, "--no-probe")
    assert r.returncode == 3
    assert one_error_line(r.stderr).endswith("node cpu-login-1 not found")


def test_closest_names_are_bounded_and_best_first():
    names = [f"gpu-{i:04d}" for i in range(1000)]
    assert params.closest_names("gpu-001", names) == ["gpu-0001"]
    assert params.closest_names("gpu-0O50", names) == ["gpu-0050"]
    assert params.closest_names("gpu-0l50", names) == ["gpu-0150"]
    near = params.closest_names("gpu-10000", names)
    assert 0 < len(near) <= params.MAX_SUGGESTIONS
    assert params.closest_names("login-7", names) == []
    assert params.closest_names("gpu-9", ["gpu-1", "gpu-2"]) == []  # another node, no typo
    assert params.closest_names("gpu-1x", ["gpu-2", "gpu-1"])[0] == "gpu-1"
    assert params.did_you_mean(["a", "b", "c"]) == "did you mean a, b or c?"


def test_a_pod_in_another_namespace_says_which(fleet):
    """Audit N11: `pod trainer-0` (no -n) said `pod default/trainer-0 not found`, though
    ml/trainer-0 exists. One list call (a field selector on the name) finds it."""
    fc, kc = fleet
    before = fc.count("GET", r"^/api/v1/pods$")
    r = cli("pod", "trainer-0", "--kubeconfig", kc, "--no-probe")
    assert r.returncode == 3
    line = one_error_line(r.stderr)
    assert line.endswith("pod default/trainer-0 not found; found in namespace ml (use -n ml)")
    assert fc.count("GET", r"^/api/v1/pods$") - before == 1
    r = cli("pod", "twin", "--kubeconfig", kc, "--no-probe")
    assert one_error_line(r.stderr).endswith(
        "found in namespaces ml, team-b (use -n NAMESPACE)")


def test_pod_all_namespaces_finds_the_pod(fleet):
    """Audit N13: no `pod -A`. kubectl users type -A to look everywhere."""
    _, kc = fleet
    r = cli("pod", "trainer-0", "-A", "--kubeconfig", kc, "--no-probe", "-o", "json")
    assert r.returncode in (0, 1), r.stderr
    doc = json.loads(r.stdout)
    assert doc["target"]["name"] == "ml/trainer-0"
    r = cli("pod", "twin", "-A", "--kubeconfig", kc, "--no-probe")
    assert r.returncode == 2
    assert one_error_line(r.stderr).endswith(
        "pod twin exists in namespaces ml, team-b: choose one with -n")
    r = cli("pod", "nosuch", "-A", "--kubeconfig", kc, "--no-probe")
    assert r.returncode == 3
    assert one_error_line(r.stderr).endswith("pod nosuch not found in any namespace")


def test_all_namespaces_is_accepted_where_kubectl_accepts_it(fleet):
    """`kubectl get nodes -A` works (the flag is ignored for cluster-scoped kinds)."""
    _, kc = fleet
    r = cli("nodes", "-A", "--kubeconfig", kc, "-o", "name")
    assert r.returncode == 1, r.stderr  # the fleet has critical nodes
    r = cli("node", "gpu-0001", "-A", "--kubeconfig", kc, "--no-probe")
    assert r.returncode in (0, 1), r.stderr


# -- N12: a 403 that says how ----------------------------------------------------------------

def test_forbidden_names_the_rbac_command(tmp_path):
    """Audit N12: `error: forbidden to list nodes: /api/v1/nodes is forbidden: User "tester"
    cannot get resource at this path` (exit 3), not how to get the right."""
    fc = FakeCluster()
    fc.add_node("gpu-1")
    fc.forbid.append(("*", re.compile(r"^/api/v1/nodes")))
    fc.start()
    try:
        kc = str(fc.kubeconfig(tmp_path / "kc"))
        for args in (("nodes",), ("node", "gpu-1", "--no-probe")):
            r = cli(*args, "--kubeconfig", kc)
            assert r.returncode == 3
            line = one_error_line(r.stderr)
            assert "is forbidden" in line
            assert line.endswith("the gpu-doctor-user ClusterRole grants what it reads: "
                                 "`kubectl gpu-doctor rbac | kubectl apply -f -` (by a "
                                 "cluster admin)"), line
    finally:
        fc.stop()


# -- N13: kubectl habits ----------------------------------------------------------------------

def test_nodes_output_name_lists_the_sick_nodes_as_kubectl_names(fleet):
    """Audit N13: `-o name` was refused (exit 2). As kubectl's: `node/NAME` lines, nothing
    else, the nodes the table lists (the sick ones, worst first), for `xargs kubectl ...`."""
    _, kc = fleet
    r = cli("nodes", "-o", "name", "--kubeconfig", kc)
    assert r.returncode == 1, r.stderr
    assert r.stdout.splitlines() == ["node/gpu-0030", "node/gpu-0003", "node/gpu-0020"]
    r = cli("nodes", "-o", "name", "--show-healthy", "--kubeconfig", kc)
    assert len(r.stdout.splitlines()) == 40
    assert all(re.fullmatch(r"node/gpu-00[0-3][0-9]", ln) for ln in r.stdout.splitlines())


def test_nodes_no_headers_leaves_out_the_column_titles(fleet):
    """Audit N13: `--no-headers` was "No such option ... Did you mean '--no-agent'?." """
    _, kc = fleet
    env = dict(cli_env(), COLUMNS="80")
    with_h = cli("nodes", "--kubeconfig", kc, env=env).stdout.splitlines()
    without = cli("nodes", "--no-headers", "--kubeconfig", kc, env=env).stdout.splitlines()
    assert with_h[0].split()[:2] == ["NODE", "READY"]

    def ageless(lines: list[str]) -> list[str]:  # the lease ages and the run time move on
        return [" ".join(re.sub(r"(\d+(\.\d+)?(ms|s|m|h|d))+\b", "T", ln).split())
                for ln in lines]
    assert ageless(without) == ageless(with_h[1:])
    assert not any(ln.startswith("NODE ") for ln in without)


def test_a_mistyped_option_ends_its_question_once(fleet):
    """Audit N13: the doubled "?." after click's "Did you mean"."""
    _, kc = fleet
    r = cli("nodes", "--no-agnt", "--kubeconfig", kc)
    assert r.returncode == 2
    line = one_error_line(r.stderr)
    assert "--no-agent" in line and "?." not in line


def test_request_timeout_zero_means_no_limit_as_in_kubectl(fleet):
    """Audit N13: `--request-timeout 0` was refused ("shorter than the minimum 0.1s"); in
    kubectl 0 means no timeout. A node whose answer takes 2 s is read with it."""
    fc, kc = fleet
    fc.slow["/api/v1/nodes/gpu-0005"] = 2.0
    try:
        r = cli("node", "gpu-0005", "--request-timeout", "0", "--kubeconfig", kc,
                "--no-probe", "-o", "json")
    finally:
        fc.slow.pop("/api/v1/nodes/gpu-0005")
    assert r.returncode in (0, 1), r.stderr
    assert json.loads(r.stdout)["target"]["name"] == "gpu-0005"
    assert params.RequestTimeout().convert("0s", None, None) == params.NO_REQUEST_LIMIT_S
    r = cli("node", "gpu-0005", "--request-timeout", "50ms", "--kubeconfig", kc)
    assert r.returncode == 2
    assert "shorter than the minimum 0.1s" in one_error_line(r.stderr)


# -- N14: piped output at the terminal's width, else 80 --------------------------------------

def _no_columns() -> dict:
    env = cli_env()
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    return env


def test_piped_output_is_80_columns_without_a_terminal(fleet):
    """Audit N14: `node X | less` formatted for 120 columns when stdout is not a TTY and
    COLUMNS is unset; the terminal then wrapped the layout at column 0."""
    _, kc = fleet
    r = cli("node", "gpu-0003", "--kubeconfig", kc, "--no-probe", env=_no_columns(),
            stdin=subprocess.DEVNULL)
    assert r.returncode == 1, r.stderr
    widths = [len(ln) for ln in r.stdout.splitlines()]
    assert max(widths) <= 80, r.stdout
    assert max(widths) > 70  # it did wrap at 80, not shorter


def test_piped_output_takes_the_width_of_the_terminal_stderr_is_on(fleet):
    """`node X | less` in a 100-column terminal: stdout is the pipe, stderr the terminal."""
    _, kc = fleet
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 100, 0, 0))
    try:
        r = subprocess.run([sys.executable, "-m", "kubectl_gpudoctor", "node", "gpu-0003",
                            "--kubeconfig", kc, "--no-probe"], stdout=subprocess.PIPE,
                           stderr=slave, stdin=subprocess.DEVNULL, text=True, timeout=120,
                           env=_no_columns(), cwd=str(REPO))
    finally:
        os.close(slave)
        os.close(master)
    widths = [len(ln) for ln in r.stdout.splitlines()]
    assert 80 < max(widths) <= 100, r.stdout


# -- N21: `local` without root -----------------------------------------------------------------

def _closed_to_others(*paths: Path) -> Path | None:
    """The first directory on the way to `paths` that another user cannot enter, or None."""
    for path in paths:
        for d in reversed([path, *path.parents]):
            if not d.stat().st_mode & stat.S_IXOTH:
                return d
    return None


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root to drop to another user (setpriv)")
def test_local_without_root_says_to_run_it_with_sudo(tmp_path):
    """Audit N21: as nobody, `local` said "14 checks could not look" and nothing about root;
    the kernel log's "needs root or CAP_SYSLOG" was under --details only."""
    # os.access answers for root, who passes every mode bit: look at the bits for others on
    # each directory down to the checkout and the interpreter
    closed = _closed_to_others(REPO, Path(sys.executable).parent)
    if closed is not None:
        pytest.skip(f"the checkout is not readable by another user: {closed} is mode "
                    f"{closed.stat().st_mode & 0o777:04o} (`mktemp -d` makes 0700)")
    env = dict(_no_columns(), HOME=str(tmp_path), COLUMNS="200")
    os.chmod(tmp_path, 0o777)
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                        sys.executable, "-m", "kubectl_gpudoctor", "local", "--only", "kmsg",
                        "--trace-seconds", "0"], capture_output=True, text=True, timeout=120,
                       env=env, cwd=str(REPO))
    assert r.returncode == 0, r.stderr
    assert "1 of them need root: run it with sudo" in r.stdout, r.stdout
    r = subprocess.run([sys.executable, "-m", "kubectl_gpudoctor", "local", "--only", "kmsg",
                        "--trace-seconds", "0", "-o", "json"], capture_output=True, text=True,
                       timeout=120, env=env, cwd=str(REPO))
    assert "run it with sudo" not in r.stdout  # root: nothing to say


# -- R4-18: --help in words, not click's range markers -----------------------------------------

@pytest.mark.parametrize("path", [("nodes",), ("agent", "install"), ("node",)])
def test_help_has_no_click_range_markers(path):
    """Audit R4-18: `nodes --help`: `--concurrency ... [1<=x<=64]`, `--max-probes ...
    [default: 20; x>=1]`; `agent install`: `[1024<=x<=65535]`."""
    r = cli(*path, "--help", env=dict(cli_env(), COLUMNS="100"))
    assert r.returncode == 0
    assert not re.search(r"\[[^\]]*x[<>]=|<=x|\[default:", r.stdout), r.stdout


def test_a_count_out_of_range_is_said_in_words():
    r = cli("nodes", "--concurrency", "65")
    assert r.returncode == 2
    assert "65 is out of range: it must be from 1 to 64" in one_error_line(r.stderr)
    r = cli("nodes", "--max-probes", "x")
    assert r.returncode == 2 and "'x' is not a whole number" in r.stderr


def test_no_command_summary_is_cut():
    """Audit R4-18: completion showed `version	Print the plugin version and the probe...`
    (click cuts a summary it makes from the help at 45 characters)."""
    import click

    from kubectl_gpudoctor import cli as cli_mod

    def walk(group):
        for name, cmd in group.commands.items():
            yield name, cmd
            if isinstance(cmd, click.Group):
                yield from walk(cmd)
    for name, cmd in walk(cli_mod.cli):
        assert not cmd.get_short_help_str(45).endswith("..."), name


# -- N19, R4-15, R4-14: evidence whole, on one line each value ----------------------------------

def _finding():
    from node_probe.protocol import Finding, Severity
    # the kubelet's event texts (pkg/kubelet/kuberuntime, the scheduler's "Successfully
    # assigned") and the runtime's multi-line message, as the audit's staging carried them
    return Finding(
        id="pod.gpu_start_failed", severity=Severity.CRITICAL, subject="ml/cuda-0",
        title="Container main cannot start on gpu-0060",
        evidence={"message": "Auto-detected mode as 'legacy'\nnvidia-container-cli: "
                             "initialization error: nvml error: driver/library version "
                             "mismatch: unknown",
                  "events": [{"type": "Normal", "reason": "Scheduled",
                              "message": "Successfully assigned ml/cuda-0 to gpu-0060"},
                             {"type": "Warning", "reason": "Failed",
                              "message": "Error: failed to create containerd task: failed to "
                                         "create shim task: OCI runtime create failed: runc "
                                         "create failed: unable to start container process"}]},
        remediation="Drain the node and reboot it.")


def test_details_cut_nothing_at_80_columns():
    """Audit N19: `--details` cut the events table at 80 columns (`Successfully assigned
    ml/…`, `Error: failed to create c…`), though docs/cli.md says nothing is cut."""
    from node_probe.protocol import render
    lines = render._details(render.terminal_safe_finding(_finding()), 80, False)
    text = "\n".join(lines)
    assert "…" not in text and all(len(ln) <= 80 for ln in lines), text
    flat = " ".join(text.split())
    assert "Successfully assigned ml/cuda-0 to gpu-0060" in flat
    assert "unable to start container process" in flat


def test_a_line_break_in_evidence_is_a_space_not_an_escape():
    """Audit R4-14: the evidence `message:` showed `'legacy'\\x0anvidia-container-cli`."""
    from node_probe.protocol import render
    text = "\n".join(render._details(render.terminal_safe_finding(_finding()), 200, False))
    assert "'legacy' nvidia-container-cli" in text and "\\x0a" not in text
    assert render.terminal_safe_finding(_finding()).evidence["message"].count("\\x") == 0


def test_markdown_evidence_cells_are_whole():
    """Audit R4-15: markdown evidence cells were cut (`wchan: futex_do_w…`)."""
    from kubectl_gpudoctor.report import markdown
    md = "\n".join(markdown._evidence(_finding()))
    assert "…" not in md
    assert "unable to start container process" in md


# -- N17: docs/cli.md's JSON examples are a real run's ------------------------------------------

def _doc_json_blocks() -> list[str]:
    text = (REPO / "docs" / "cli.md").read_text()
    section = text[text.index("## `-o json` (for bots)"):]
    return re.findall(r"```json\n(.*?)```", section, re.S)


def test_the_json_examples_of_docs_cli_are_a_real_run(wedged_full, stuck_plugin,  # noqa: F811
                                                      tmp_path):
    """Audit N17: docs/cli.md's verdict example said `"root_cause": "driver.known_bad"` and
    "Likely: known-bad NVIDIA driver ... hangs the device plugin"; the real run of the same
    wedge says deviceplugin.blocked_in_nvml, "...; likely cause: known-bad NVIDIA driver".
    The examples are now that run's (the README's wedge through the agent), and stay so."""
    kc = str(wedged_full.kubeconfig(tmp_path / "kc"))
    r = cli("node", "gpu-wedged", "--kubeconfig", kc, "--trace-seconds", "0", "--timeout", "20",
            "-o", "json")
    real = json.loads(r.stdout)
    top, verdict = (json.loads(b) if i == 0 else json.loads("{" + b + "}")["verdict"]
                    for i, b in enumerate(_doc_json_blocks()[:2]))
    assert set(top) == set(real)
    assert set(top["findings"][0]) == set(real["findings"][0])
    assert set(top["summary"]) <= set(real["summary"]) and top["target"] == real["target"]
    pid = re.compile(r"pid \d+")
    real_v = dict(real["verdict"], headline=pid.sub("pid N", real["verdict"]["headline"]))
    doc_v = dict(verdict, headline=pid.sub("pid N", verdict["headline"]))
    assert doc_v == real_v


# -- N18: docs/symptoms.md has a row for the newer findings -------------------------------------

@pytest.mark.parametrize("fid", ["node.gpu_black_hole", "pod.gpu_start_failed",
                                 "kueue.not_admitted", "volcano.podgroup_pending",
                                 "kai.podgroup_unschedulable", "hami.filter_failed"])
def test_symptoms_page_has_a_row_for(fid):
    """Audit N18: README's "what it finds, symptom by symptom" (docs/symptoms.md) had no row
    for black holes, GPU container start failures, Kueue, Volcano, KAI or HAMi's filter."""
    from node_probe.protocol import catalog
    assert fid in catalog.CATALOG
    text = (REPO / "docs" / "symptoms.md").read_text()
    table = text[:text.index("## Real messages")]
    assert any(f"`{fid}`" in ln.split("|")[2] for ln in table.splitlines()
               if ln.startswith("| ") and ln.count("|") >= 3)


# -- N20: agent dry runs --------------------------------------------------------------------------

def test_agent_uninstall_dry_runs_delete_nothing(cluster, kubeconfig):
    """Audit N20: `agent uninstall --dry-run=server`: "No such option '--dry-run'"."""
    kc = str(kubeconfig)
    r = cli("agent", "uninstall", "--dry-run", "--kubeconfig", kc)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "daemonset/gpu-doctor-agent deleted (dry run)" in lines
    assert lines[-1] == "the GpuDoctor node conditions are left as they are (dry run)"
    assert cluster.count("DELETE", ".") == 0 and cluster.count("PATCH", ".") == 0
    r = cli("agent", "uninstall", "--dry-run=server", "--kubeconfig", kc)
    assert r.returncode == 0, r.stderr
    deletes = [q for m, _, q in cluster.requests() if m == "DELETE"]
    assert deletes and all(q.get("dryRun") == "All" for q in deletes)
    assert cluster.count("PATCH", ".") == 0  # no node condition cleared


def test_a_failed_server_dry_run_never_says_to_run_it_again(cluster, kubeconfig):
    """Audit N20: a server dry run that failed said "4 of 5 objects were applied before it;
    `kubectl gpu-doctor agent install` again applies the rest": a dry run applied nothing."""
    r = cli("agent", "install", "--dry-run=server", "--kubeconfig", str(kubeconfig))
    assert r.returncode == 3
    line = one_error_line(r.stderr)
    assert "server dry run: nothing was applied" in line
    assert "again applies the rest" not in line


def test_request_timeout_zero_keeps_the_mcp_stop_grace_bounded():
    """`mcp --request-timeout 0` (no limit) passes it to every run, but the SIGTERM -> SIGKILL
    grace of a call past its deadline stays bounded (the debug pod's DELETE has its own)."""
    from kubectl_gpudoctor.commands import mcp_calls
    opts = mcp_calls.Options.of({"request_timeout": params.NO_REQUEST_LIMIT_S}, 300.0)
    assert opts.stop_grace_s <= 65.0
    assert f"--request-timeout={params.NO_REQUEST_LIMIT_S!r}" in opts.kube

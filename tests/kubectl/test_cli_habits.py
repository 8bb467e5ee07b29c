"""kubectl's habits and help that tells the truth (issue 22 item 6; issue 21 items 6 and 8, the
CLI's parts), through the real CLI process against the HTTP-level fakes:

- each command lists only the flags it uses, and says truly what they do;
- bare `kubectl gpu-doctor` prints its help and exits 0, as kubectl does;
- `--dry-run[=client|server]`, YAML without anchors, `node/NAME` and `pod/NAME`;
- kubectl's flags before `agent` reach the cluster they name (two fake clusters);
- errors in kubectl's words, `-o json` always a document, hostile kubeconfigs one line;
- `version -o json`, pod name completion, the exit code under a closed pipe.
"""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from .conftest import REPO, cli_env, one_error_line, run_cli
from .fakeexec import ExecCluster
from .test_cli_cluster import healthy_node

PROBE_STREAM = (Path(__file__).with_name("data") / "probe_stream.ndjson").read_bytes()


# -- help --------------------------------------------------------------------------------------

def _help(*argv: str) -> str:
    r = run_cli(*argv, "--help")
    assert r.returncode == 0, r.stderr
    return re.sub(r"(\w)- (\w)", r"\1-\2", " ".join(r.stdout.split()))  # undo wrapping


def test_bare_invocation_prints_help_and_exits_0_like_kubectl():
    r = run_cli()
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout.startswith("Usage: kubectl gpu-doctor") and "Commands:" in r.stdout
    r = run_cli("agent")
    assert r.returncode == 0 and "install" in r.stdout and r.stderr == ""


def test_namespace_help_says_what_n_is_and_node_ignores_it_like_kubectl():
    """`kubectl get node X -n NS` works (the namespace is ignored for a cluster-scoped object):
    `node X -n NS` and `-n NS node X` are habits, not usage errors; --help does not list -n."""
    pod = _help("pod")
    assert "Namespace of POD" in pod and "never runs there" in pod
    assert "-n, --namespace" not in _help("node") and "-n, --namespace" not in _help("nodes")
    for argv in (("node", "gpu-1", "-n", "team"), ("-n", "team", "node", "gpu-1"),
                 ("nodes", "-n", "team")):
        r = run_cli(*argv, "--kubeconfig", "/nonexistent/kubeconfig")
        assert r.returncode == 3 and "stat /nonexistent/kubeconfig" in one_error_line(r.stderr), \
            (argv, r.stderr)


@pytest.mark.parametrize("command", ["node", "pod", "nodes"])
def test_probe_namespace_help_gives_the_real_default(command):
    text = _help(command)
    assert "--probe-namespace" in text
    assert "default gpu-doctor; env GPU_DOCTOR_NAMESPACE" in text
    assert "default: -n" not in text and "differs from -n" not in text
    assert "deploy/" not in text  # a krew user has no repository: `kubectl gpu-doctor rbac`


def test_cleanup_lists_only_what_it_uses():
    text = _help("cleanup")
    for unused in ("--output", "--fail-on", "--timeout", "--trace-seconds", "--image"):
        assert unused not in text
    for used in ("--kubeconfig", "--context", "--request-timeout", "-n, --namespace",
                 "-A, --all-namespaces"):
        assert used in text
    r = run_cli("cleanup", "-o", "json")
    assert r.returncode == 2


def test_a_kubectl_flag_before_a_command_that_does_not_use_it_is_refused():
    r = run_cli("--kubeconfig", "/nowhere", "local", "--list-checks")
    assert r.returncode == 2 and "--kubeconfig does not apply to `local`" in \
        one_error_line(r.stderr)
    r = run_cli("-n", "team", "local", "--list-checks")
    assert r.returncode == 2 and "-n/--namespace does not apply to `local`" in \
        one_error_line(r.stderr)


def test_local_list_checks_exists_where_the_unknown_check_error_points():
    r = run_cli("local", "--only", "bogus", "--trace-seconds", "0")
    assert r.returncode == 2 and "--list-checks" in r.stderr
    r = run_cli("local", "--list-checks")
    assert r.returncode == 0, r.stderr
    ids = {line.split()[0] for line in r.stdout.splitlines() if line.strip()}
    assert {"nvml", "driver", "deviceplugin", "cgroup.devices"} <= ids


def test_every_option_has_help():
    from kubectl_gpudoctor import cli
    from .test_cli_input import _all_params
    import click
    for where, p in _all_params(cli.cli):
        if isinstance(p, click.Option) and p.name != "help":
            assert (p.help or "").strip(), (where, p.name)


# -- kubectl's spellings -------------------------------------------------------------------------

def test_agent_install_dry_run_client_server_and_bare(tmp_path):
    bare = run_cli("agent", "install", "--dry-run")
    client = run_cli("agent", "install", "--dry-run=client", "-o", "yaml")
    assert bare.returncode == client.returncode == 0, bare.stderr + client.stderr
    assert bare.stdout == client.stdout
    assert "&id" not in client.stdout and "*id" not in client.stdout  # no YAML anchors
    docs = [d for d in yaml.safe_load_all(client.stdout) if d]
    # the watching agent's own policies and grant, then the probe namespace's admission policy
    # in force before the DaemonSet creates the first agent pod
    assert [d["kind"] for d in docs] == ["Namespace", "ResourceQuota",
                                         "ValidatingAdmissionPolicy",
                                         "ValidatingAdmissionPolicyBinding",
                                         "ValidatingAdmissionPolicy",
                                         "ValidatingAdmissionPolicyBinding",
                                         "ValidatingAdmissionPolicy",
                                         "ValidatingAdmissionPolicyBinding",
                                         "ValidatingAdmissionPolicy",
                                         "ValidatingAdmissionPolicyBinding",
                                         "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                                         "ValidatingAdmissionPolicy",
                                         "ValidatingAdmissionPolicyBinding", "DaemonSet"]
    r = run_cli("agent", "install", "--dry-run=sometimes")
    assert r.returncode == 2


def test_agent_install_dry_run_server_sends_dry_run_all_and_persists_nothing(tmp_path):
    xc = ExecCluster().start()
    try:
        xc.add_node("gpu-a")
        kc = str(xc.kubeconfig(tmp_path / "kc"))
        xc.namespaces.pop("gpu-doctor", None)
        r = run_cli("agent", "install", "--dry-run=server", "--kubeconfig", kc)
        assert r.returncode == 0, r.stderr
        assert "namespace/gpu-doctor created (server dry run)" in r.stdout
        assert "not checked (server dry run: namespace gpu-doctor does not exist yet)" \
            in r.stdout
        assert "gpu-doctor" not in xc.namespaces and not xc.daemonsets
        xc.namespaces["gpu-doctor"] = {"gpu-doctor.io/probe-namespace": "true"}
        r = run_cli("agent", "install", "--dry-run=server", "--kubeconfig", kc)
        assert r.returncode == 0, r.stderr
        assert "daemonset/gpu-doctor-agent created (server dry run)" in r.stdout
        assert not xc.daemonsets and not xc.quotas
        writes = [(m, p) for m, p, _ in xc.requests() if m in ("POST", "PUT", "PATCH")]
        assert writes and set(writes) <= set(xc.dry_runs)  # every write was a dry run
    finally:
        xc.stop()


def test_yaml_report_has_no_anchors():
    from kubectl_gpudoctor.report.output import yaml_dump
    shared = {"a": 1}
    text = yaml_dump({"x": shared, "y": shared, "z": [shared, shared]})
    assert "&" not in text and "*" not in text
    assert yaml.safe_load(text) == {"x": shared, "y": shared, "z": [shared, shared]}


@pytest.mark.parametrize("arg", ["node/gpu-1", "nodes/gpu-1", "no/gpu-1", "gpu-1"])
def test_node_accepts_kubectl_type_slash_name(cluster, kubeconfig, arg):
    cluster.add_node("gpu-1")
    r = run_cli("node", arg, "--kubeconfig", str(kubeconfig), "--no-probe", "-o", "json")
    doc = json.loads(r.stdout)
    assert doc["target"]["name"] == "gpu-1", r.stderr
    assert cluster.count("GET", r"^/api/v1/nodes/gpu-1$") >= 1


def test_pod_accepts_pod_slash_name(cluster, kubeconfig):
    healthy_node(cluster)
    r = run_cli("pod", "pod/train-0", "-n", "ml", "--kubeconfig", str(kubeconfig),
                "--no-probe", "-o", "json")
    assert json.loads(r.stdout)["target"]["name"] == "ml/train-0", r.stderr


@pytest.mark.parametrize("argv, says", [
    (("node", "pod/train-0"), "names a pod, not a node: use `kubectl gpu-doctor pod train-0`"),
    (("pod", "node/gpu-1"), "names a node, not a pod: use `kubectl gpu-doctor node gpu-1`"),
    (("node", "deployment/x"), "the type must be node"),
    (("node", "node/Bad_Name"), "is not valid"),
])
def test_a_wrong_type_is_a_usage_error_before_any_request(cluster, kubeconfig, argv, says):
    r = run_cli(*argv, "--kubeconfig", str(kubeconfig))
    assert r.returncode == 2 and says in one_error_line(r.stderr)
    assert cluster.requests() == []


# -- kubectl's flags before `agent`: two clusters --------------------------------------------------

def _two_cluster_kubeconfig(path: Path, a: ExecCluster, b: ExecCluster) -> Path:
    cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "a",
           "clusters": [{"name": n, "cluster": {"server": c.url}} for n, c in (("a", a), ("b", b))],
           "users": [{"name": "tester", "user": {"token": "fake-token"}}],
           "contexts": [{"name": n, "context": {"cluster": n, "user": "tester"}}
                        for n in ("a", "b")]}
    path.write_text(json.dumps(cfg))
    return path


def test_group_level_context_and_kubeconfig_reach_agent_commands(tmp_path):
    a, b = ExecCluster().start(), ExecCluster().start()
    try:
        for c in (a, b):
            c.add_node("gpu-x")
        both = str(_two_cluster_kubeconfig(tmp_path / "both", a, b))
        r = run_cli("--kubeconfig", both, "--context", "b", "agent", "install")
        assert r.returncode == 0, r.stderr
        assert b.daemonsets and not a.daemonsets  # the cluster named, not the current one
        r = run_cli("--kubeconfig", both, "--context", "b", "agent", "status", "-o", "json")
        assert r.returncode == 0 and json.loads(r.stdout)["installed"] is True, r.stderr
        r = run_cli("--kubeconfig", both, "agent", "status", "-o", "json")  # current: a
        assert json.loads(r.stdout)["installed"] is False
        # a flag after the command wins over one before it, as kubectl's would
        r = run_cli("--context", "a", "agent", "uninstall", "--kubeconfig", both,
                    "--context", "b")
        assert r.returncode == 0 and not b.daemonsets, r.stderr
        # -n before `agent` is the agent's namespace
        b.namespaces["gpu-ops"] = {"gpu-doctor.io/probe-namespace": "true"}
        r = run_cli("--kubeconfig", both, "--context", "b", "-n", "gpu-ops", "agent", "install")
        assert r.returncode == 0, r.stderr
        assert [k[0] for k in b.daemonsets] == ["gpu-ops"] and not a.daemonsets
    finally:
        b.stop()  # the reverse of start: kmock's resolver chain unwinds in order
        a.stop()


# -- errors in kubectl's words -----------------------------------------------------------------

def test_missing_kubeconfig_file_is_kubectls_stat_line_and_json_still_a_document(tmp_path):
    missing = tmp_path / "nope"
    r = run_cli("node", "gpu-1", "--kubeconfig", str(missing))
    assert r.returncode == 3 and r.stdout == ""
    assert one_error_line(r.stderr).endswith(f"error: stat {missing}: no such file or directory")
    r = run_cli("node", "gpu-1", "--kubeconfig", str(missing), "-o", "json")
    doc = json.loads(r.stdout)
    assert doc["exit_code"] == r.returncode == 3
    assert doc["error"] == {"type": "KubeconfigError",
                            "message": f"stat {missing}: no such file or directory"}
    r = run_cli("nodes", "--kubeconfig", str(missing), "-o", "yaml")
    assert yaml.safe_load(r.stdout)["exit_code"] == 3


def test_no_kubeconfig_at_all(tmp_path):
    env = dict(cli_env(), HOME=str(tmp_path), KUBECONFIG=str(tmp_path / "none"))
    env.pop("KUBERNETES_SERVICE_HOST", None)
    r = subprocess.run([sys.executable, "-m", "kubectl_gpudoctor", "node", "gpu-1"],
                       capture_output=True, text=True, env=env, cwd=str(REPO), timeout=60)
    assert r.returncode == 3
    assert "invalid configuration: no configuration has been provided" in \
        one_error_line(r.stderr)


def test_unknown_context_is_kubectls_line(cluster, kubeconfig):
    r = run_cli("node", "gpu-1", "--kubeconfig", str(kubeconfig), "--context", "prod")
    assert r.returncode == 3
    assert one_error_line(r.stderr).endswith('error: context "prod" does not exist')
    assert cluster.requests() == []


def test_client_side_timeout_is_named_as_such(tmp_path):
    """A server that accepts the connection and never answers: our --request-timeout ends it,
    and the line says it was ours, not an "API error 504" the server never sent."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue
    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        kc = tmp_path / "kc"
        kc.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "x",
            "clusters": [{"name": "x", "cluster": {
                "server": f"http://127.0.0.1:{srv.getsockname()[1]}"}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "x", "context": {"cluster": "x", "user": "u"}}]}))
        r = run_cli("node", "gpu-1", "--kubeconfig", str(kc), "--request-timeout", "1s")
        line = one_error_line(r.stderr)
        assert r.returncode == 3
        assert "client-side timeout" in line and "within 1s" in line, line
        assert "API error" not in line and "504" not in line
    finally:
        stop.set()
        t.join(5)
        for s in held:
            s.close()
        srv.close()


def test_transport_errors_never_show_python_reprs():
    from kubectl_gpudoctor.api.kube import unreachable
    import urllib3.exceptions as ue
    from urllib3.connection import HTTPSConnection
    conn = HTTPSConnection("gpu.invalid", 6443)
    inner = ue.NameResolutionError("gpu.invalid", conn,
                                   socket.gaierror(-2, "Name or service not known"))
    outer = ue.MaxRetryError(None, "/api", inner)
    line = unreachable("https://gpu.invalid:6443", outer).one_line()
    assert line.startswith("Unable to connect to the server gpu.invalid:6443: ")
    assert "HTTPSConnection" not in line and "object at 0x" not in line and "Errno" not in line
    slow = ue.MaxRetryError(None, "/api", ue.ConnectTimeoutError(
        conn, "Connection to gpu.invalid timed out. (connect timeout=3)"))
    line = unreachable("https://gpu.invalid", slow).one_line()
    assert line == ("Unable to connect to the server gpu.invalid:443: Connection to gpu.invalid "
                    "timed out. (connect timeout=3)")


# -- hostile kubeconfigs: one line, exit 3, never a hang or exit 70 ----------------------------

def _fifo(tmp_path: Path) -> Path:
    p = tmp_path / "fifo"
    os.mkfifo(p)
    return p


def _write(name: str, text: str):
    def make(tmp_path: Path) -> Path:
        p = tmp_path / name
        p.write_text(text)
        return p
    return make


HOSTILE = {
    "fifo": (_fifo, "not a regular file"),
    "dev-zero": (lambda tmp_path: Path("/dev/zero"), "not a regular file"),
    "deep-flow": (_write("deep", "a: " + "[" * 200_000), "nested too deeply"),
    "deep-block": (_write("deep2", "".join("  " * i + f"k{i}:\n" for i in range(3000))
                          + "  " * 3000 + "v\n"), "error loading config file"),
    "huge": (_write("huge", "# " + "x" * (5 << 20) + "\n"), "larger than 4 MiB"),
    "not-a-mapping": (_write("list", "- 1\n- 2\n"), "expected a mapping at the top"),
    "clusters-int": (_write("ints", "clusters: 5\n"), "clusters must be a list"),
    "context-name-int": (_write("cn", "contexts:\n- name: 5\n"),
                         "contexts[0] must be a mapping with a string name"),
    "context-body-list": (_write("cb", "current-context: a\ncontexts:\n- name: a\n"
                                       "  context: [1, 2]\n"), "contexts[0].context"),
    "current-context-list": (_write("cc", "current-context: [a]\n"), "current-context"),
    "bad-yaml": (_write("bad", "clusters: [\n"), "yaml: line"),
    "dangling-refs": (_write("refs", "current-context: a\nclusters: []\nusers: []\n"
                                     "contexts:\n- name: a\n  context: {cluster: 5, user: x}\n"),
                      "error loading config file"),
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_hostile_kubeconfig_is_one_line_exit_3(tmp_path, kind):
    make, says = HOSTILE[kind]
    path = make(tmp_path)
    r = run_cli("node", "gpu-1", "--kubeconfig", str(path), timeout=60)
    assert r.returncode == 3, r.stderr
    assert says in one_error_line(r.stderr)
    env = dict(cli_env(), KUBECONFIG=str(path))  # from the environment too
    r = subprocess.run([sys.executable, "-m", "kubectl_gpudoctor", "nodes", "-o", "json"],
                       capture_output=True, text=True, env=env, cwd=str(REPO), timeout=60)
    assert r.returncode == 3 and json.loads(r.stdout)["exit_code"] == 3
    assert says in one_error_line(r.stderr)


def test_kubeconfig_reader_holds_at_most_the_cap_in_memory(tmp_path):
    """The cap is enforced while reading (never read whole, then measured)."""
    from kubectl_gpudoctor import errors
    from kubectl_gpudoctor.api import kubeconfig
    import tracemalloc
    big = tmp_path / "big"
    with open(big, "wb") as f:
        f.truncate(64 << 20)  # sparse: 64 MiB of zeros
    tracemalloc.start()
    try:
        with pytest.raises(errors.KubeconfigError, match="larger than 4 MiB"):
            kubeconfig.kubeconfig_files(str(big))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * kubeconfig.MAX_KUBECONFIG_BYTES


# -- version, completion, pipes ------------------------------------------------------------------

def test_version_json_and_yaml():
    from node_probe import __version__
    r = run_cli("version", "-o", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["version"] == __version__
    assert doc["probe_image"]["reference"].endswith(f"gpu-doctor-probe:{__version__}")
    assert doc["probe_image"]["pinned"] is False and doc["probe_image"]["digest"] is None
    assert yaml.safe_load(run_cli("version", "-o", "yaml").stdout) == doc


def test_pod_names_complete_in_the_namespace_typed(cluster, kubeconfig):
    cluster.add_node("gpu-1")
    for ns, name in (("ml", "train-0"), ("ml", "train-1"), ("ml", "serve-0"), ("ops", "train-9")):
        cluster.add_pod(ns, name, "gpu-1")
    r = subprocess.run([sys.executable, "-m", "kubectl_gpudoctor", "__complete", "pod",
                        "--kubeconfig", str(kubeconfig), "-n", "ml", "tr"],
                       capture_output=True, text=True, env=cli_env(), cwd=str(REPO), timeout=60)
    assert r.returncode == 0
    assert r.stdout.splitlines() == ["train-0", "train-1", ":4"]


def _flagged_fleet(cluster) -> None:
    from .fakecluster import build_fleet
    build_fleet(cluster, 3, 6, wedged=(1,))


def test_nodes_into_a_closed_pipe_keeps_its_exit_code(cluster, kubeconfig):
    """`nodes | head`: the reader is gone before the report is written; the exit code is
    still the verdict's (1: findings), with no traceback."""
    _flagged_fleet(cluster)
    ref = run_cli("nodes", "--kubeconfig", str(kubeconfig))
    assert ref.returncode == 1, ref.stdout + ref.stderr
    r, w = os.pipe()
    os.close(r)  # the reader is gone before anything is written
    try:
        p = subprocess.run([sys.executable, "-m", "kubectl_gpudoctor", "nodes",
                            "--kubeconfig", str(kubeconfig)], stdout=w,
                           stderr=subprocess.PIPE, text=True, env=cli_env(), cwd=str(REPO),
                           timeout=60)
    finally:
        os.close(w)
    assert p.returncode == 1 and "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr


def test_a_closed_stdout_prints_no_traceback(cluster, kubeconfig):
    _flagged_fleet(cluster)
    p = subprocess.run(["sh", "-c", 'exec "$0" -m kubectl_gpudoctor nodes --kubeconfig "$1" >&-',
                        sys.executable, str(kubeconfig)], stderr=subprocess.PIPE, text=True,
                       env=cli_env(), cwd=str(REPO), timeout=60)
    assert p.returncode == 1 and "Traceback" not in p.stderr and "internal error" not in p.stderr
    p = subprocess.run(["sh", "-c", 'exec "$0" -m kubectl_gpudoctor version >&-',
                        sys.executable], stderr=subprocess.PIPE, text=True, env=cli_env(),
                       cwd=str(REPO), timeout=60)
    assert p.returncode == 0 and p.stderr == ""


def test_jsonl_reader_gone_mid_run_keeps_the_verdict(cluster, kubeconfig):
    """`node X -o jsonl | head -1`: records are written while the run goes on; a reader that
    leaves ends the output, and the exit code is still the findings' (1), not 0."""
    healthy_node(cluster)
    cluster.log_chunks = [PROBE_STREAM]
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run([sys.executable, "-m", "kubectl_gpudoctor", "node", "gpu-1",
                            "--kubeconfig", str(kubeconfig), "-o", "jsonl"], stdout=w,
                           stderr=subprocess.PIPE, text=True, env=cli_env(), cwd=str(REPO),
                           timeout=60)
    finally:
        os.close(w)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr

"""`local` starts its probe child before the CLI's imports (issue 41.4): launch.py reads a
plain `local` command line without click (localproc.early_args), and `local` adopts that child
only when click's reading gives the same probe arguments. These tests hold early_args to what
click and commands/local.py compute, show that it starts nothing on any doubt (--help, unknown
flags, values click refuses), and run the real executable path to see the child adopted, started
before click or the CLI were imported."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kubectl_gpudoctor import cli
from kubectl_gpudoctor.reach import localproc

from .conftest import REPO, cli_env

PLAIN = [
    [],
    ["--trace-seconds", "0"],
    ["--trace-seconds=0", "-o", "jsonl"],
    ["--timeout=90s", "--trace-seconds", "1m", "--fail-on", "critical", "--only", "kmsg",
     "--only", "memory", "--skip", "trace", "--host-root", "/x", "--kmsg-file", "k.log",
     "--details", "-o", "json"],
    ["--bug-report", "b.log.gz", "--host-root", "/a", "--host-root", "/b", "--lspci-file",
     "l.txt", "--nvidia-smi-file", "q.xml", "--cgroup-root", "/c", "--kubelet-dir", "/k",
     "--plugin-log", "p.log", "--timeout", "1m30s", "--trace-seconds", "500ms"],
    ["--host-root", "", "--fail-on", "never"],
]


class _Seen(Exception):
    pass


@pytest.mark.parametrize("argv", PLAIN, ids=lambda a: " ".join(a) or "bare")
def test_early_args_are_the_ones_local_computes(argv, monkeypatch):
    seen = []

    def take(args):
        seen.append(list(args))
        raise _Seen

    monkeypatch.setattr(localproc, "take_early", take)
    cli.main(["local", *argv])
    assert seen and seen[0] == localproc.early_args(argv)


@pytest.mark.parametrize("argv", [
    ["--help"], ["-h"], ["--list-checks"], ["--bogus"], ["-o=json"], ["-ojson"],
    ["--timeout", "0.5"], ["--timeout", "1s", "--trace-seconds", "2s"],
    ["--timeout", "soon"], ["--fail-on", "bogus"], ["--fail-on", "info"], ["--only"], ["--details=1"],
    ["--host-root", "--only", "kmsg"], ["--", "x"], ["extra"],
], ids=lambda a: " ".join(a))
def test_nothing_starts_early_on_any_doubt(argv):
    assert localproc.early_args(argv) is None


def test_take_early_stops_a_child_whose_arguments_differ():
    class Child:
        stopped = False

        def stop(self):
            self.stopped = True

    child = Child()
    localproc._early = (["--target-name", "h"], child)
    assert localproc.take_early(["--target-name", "other"]) is None and child.stopped
    assert localproc._early is None


SPY = """
import sys
from kubectl_gpudoctor.reach import localproc
start, take = localproc.start_early, localproc.take_early
def start_early(argv):
    print("imported at start:", sorted(m for m in ("click", "kubectl_gpudoctor.cli")
                                       if m in sys.modules), file=sys.stderr)
    start(argv)
    print("started:", localproc._early is not None, file=sys.stderr)
def take_early(args):
    p = take(args)
    print("taken:", p is not None, file=sys.stderr)
    return p
localproc.start_early, localproc.take_early = start_early, take_early
sys.argv = ["kubectl-gpu_doctor", *sys.argv[1:]]
from kubectl_gpudoctor.launch import entrypoint
entrypoint()
"""


def test_the_executable_adopts_the_child_it_started_before_its_imports(tmp_path):
    (tmp_path / "root").mkdir()
    log = tmp_path / "kern.log"
    log.write_text("[ 1021.339512] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', "
                   "name=<unknown>, GPU has fallen off the bus.\n")
    r = subprocess.run([sys.executable, "-c", SPY, "local", "--host-root",
                        str(tmp_path / "root"), "--kmsg-file", str(log), "--only", "kmsg",
                        "--trace-seconds", "0", "-o", "jsonl"],
                       capture_output=True, text=True, env=cli_env(), cwd=str(REPO), timeout=120)
    assert "imported at start: []" in r.stderr and "started: True" in r.stderr
    assert "taken: True" in r.stderr, r.stderr
    recs = [json.loads(line) for line in r.stdout.splitlines()]
    xid79 = [x for x in recs if x.get("kind") == "finding" and x.get("id") == "gpu.xid"]
    assert r.returncode == 1 and xid79 and recs[-1]["kind"] == "summary"


def test_a_refused_command_line_stops_the_early_child(tmp_path):
    """`local -o bogus`: the child starts (click alone knows the formats), click refuses the
    line (exit 2, one line), and the child is stopped before the CLI exits."""
    r = subprocess.run([sys.executable, "-c", SPY, "local", "-o", "bogus", "--only", "kmsg",
                        "--host-root", str(tmp_path), "--trace-seconds", "0"],
                       capture_output=True, text=True, env=cli_env(), cwd=str(REPO), timeout=120)
    spied = ("imported at start:", "started:", "taken:")
    lines = [x for x in r.stderr.splitlines() if not x.startswith(spied)]
    # started, then not taken: entrypoint's drop_early asked for it, and stopped it
    assert r.returncode == 2 and "started: True" in r.stderr and "taken: False" in r.stderr
    assert len(lines) == 1 and "'bogus' is not one of" in lines[0], r.stderr

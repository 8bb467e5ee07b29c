"""Bundle files (issue 21 items 2, 7, 8 bundle part): `--save` never replaces a device, FIFO or
symlink with a regular file (refused with one line, exit 2), Ctrl-C while saving stops the save;
`replay` of a FIFO does not hang, nothing raw from a bundle reaches the terminal, and a hostile
bundle (exit code 42, wrong types, deep nesting, a million objects, too big) exits 2 with one
line, never 70. Through the real CLI (`python -m kubectl_gpudoctor`) where the exit code is
the point."""
from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading

import pytest

from kubectl_gpudoctor import errors
from kubectl_gpudoctor.report import bundle, bundle_io

from tests.kubectl.conftest import run_cli

ESC = "\x1b]0;pwned\x07\x1b[2J\x1b[31m"


def good_report(**over) -> dict:
    rep = {"target": {"kind": "node", "name": "gpu-1", "node": "gpu-1"}, "version": "0.1.0",
           "started_at": 1.0, "duration_s": 0.5, "fail_on": "warning",
           "findings": [{"id": "nvml.init_hang", "severity": "critical", "subject": "node/gpu-1",
                         "title": "nvmlInit did not return", "evidence": {},
                         "remediation": "", "refs": []}],
           "checks": [{"id": "nvml", "status": "error", "duration_s": 8.0, "message": "",
                       "reason": ""}],
           "summary_record": None, "incomplete_reason": "", "error": None, "exit_code": 1,
           "preamble": ""}
    rep.update(over)
    return rep


def write_bundle(path, report: dict | None = None, raw: bytes | None = None) -> str:
    data = raw if raw is not None else json.dumps(
        {"schema": bundle.SCHEMA, "report": report or good_report()}).encode()
    path.write_bytes(data)
    return str(path)


# -- replay -------------------------------------------------------------------------------------

def test_a_good_bundle_replays_with_its_exit_code(tmp_path):
    r = run_cli("replay", write_bundle(tmp_path / "b.json"))
    assert r.returncode == 1 and "nvml.init_hang" in r.stdout, r.stderr


HOSTILE = {
    "exit code 42": good_report(exit_code=42),
    "exit code a string": good_report(exit_code="1"),
    "error exit status 42": good_report(error={"type": "X", "message": "m", "exit_status": 42}),
    "error without message": good_report(error={"type": "X", "exit_status": 3}),
    "title a number": good_report(findings=[{"id": "a.b", "severity": "critical", "title": 5}]),
    "severity unknown": good_report(findings=[{"id": "a.b", "severity": "doom"}]),
    "finding a list": good_report(findings=[["x"]]),
    "check a string": good_report(checks=["x"]),
    "duration a string": good_report(checks=[{"id": "x", "status": "ok", "duration_s": "1"}]),
    "target a list": good_report(target=["x"]),
    "target name an object": good_report(target={"name": {"a": 1}}),
    "version an object": good_report(version={"a": 1}),
    "fail_on odd": good_report(fail_on="sometimes"),
    "started_at a string": good_report(started_at="yesterday"),
    "deep evidence": good_report(findings=[{"id": "a.b", "severity": "info",
                                            "evidence": json.loads("[" * 200 + "]" * 200)}]),
    "summary a list": good_report(summary_record=[1]),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_bundle_exits_2_with_one_line(tmp_path, name):
    r = run_cli("replay", write_bundle(tmp_path / "b.json", HOSTILE[name]))
    assert r.returncode == 2, (name, r.returncode, r.stdout[-500:], r.stderr[-2000:])
    assert r.stderr.count("\n") == 1 and "internal error" not in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("raw", [
    b"[" * 100000 + b"]" * 100000,               # deeper than the parser goes
    b"\xff\xfe not json",
], ids=["deep", "binary"])
def test_hostile_json_exits_2(tmp_path, raw):
    r = run_cli("replay", write_bundle(tmp_path / "b.json", raw=raw))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr[-500:]


def test_millions_of_objects_are_refused_within_the_memory_bound(tmp_path):
    """60 MiB of `[],`: 20 million lists, gigabytes as Python objects. Refused before parsing:
    the CLI's peak RSS (its own accounting, measured by a parent that runs only it) stays
    under the 512 MiB budget."""
    p = tmp_path / "b.json"
    with open(p, "wb") as f:
        f.write(b"[")
        for _ in range(20):
            f.write(b"[]," * (1024 * 1024))
        f.write(b"[]]")
    probe = ("import resource, subprocess, sys\n"
             "r = subprocess.run([sys.executable, '-m', 'kubectl_gpudoctor', 'replay', sys.argv[1]],"
             " capture_output=True, text=True)\n"
             "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
             "sys.stderr.write(r.stderr)\n")
    r = subprocess.run([sys.executable, "-c", probe, str(p)], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "PYTHONPATH": os.getcwd()})
    code, maxrss_kib = map(int, r.stdout.split())
    assert maxrss_kib < 512 * 1024, f"peak RSS {maxrss_kib // 1024} MiB"
    assert code == 2 and "JSON objects" in r.stderr, r.stderr


def test_a_huge_bundle_is_refused_without_reading_it_all(tmp_path):
    p = tmp_path / "huge.json"
    with open(p, "wb") as f:
        f.truncate(bundle_io.MAX_BUNDLE_BYTES + 10)   # sparse: no disk used
    r = run_cli("replay", str(p))
    assert r.returncode == 2 and "larger than 64 MiB" in r.stderr


def test_replay_of_a_fifo_does_not_hang(tmp_path):
    fifo = tmp_path / "b.fifo"
    os.mkfifo(fifo)
    r = run_cli("replay", str(fifo))     # run_cli's timeout is the hang guard
    assert r.returncode == 2 and "not a regular file" in r.stderr, r.stderr
    r = run_cli("replay", "/dev/zero")
    assert r.returncode == 2 and "not a regular file" in r.stderr


def test_replay_prints_nothing_raw_from_the_bundle(tmp_path):
    rep = good_report(version="0.1.0" + ESC, preamble="pre" + ESC + "\nline 2",
                      target={"kind": "node", "name": "gpu-1" + ESC, "node": "gpu-1"},
                      error={"type": "ClusterError" + ESC, "message": "boom" + ESC + "\nx",
                             "exit_status": 3}, exit_code=3)
    rep["findings"][0]["title"] = "t" + ESC
    rep["findings"][0].update(subject="node/gpu-1" + ESC, remediation="r" + ESC,
                              evidence={"k" + ESC: "v" + ESC}, refs=["https://x" + ESC])
    rep["findings"].append({"id": "x.unknown", "severity": "warning", "title": "w" + ESC,
                            "remediation": "do" + ESC})
    rep["checks"][0].update(message="m" + ESC, reason="r" + ESC, status="error")
    rep["incomplete_reason"] = "cut" + ESC
    rep["summary_record"] = {"kind": "summary", "complete": False,
                             "incomplete_reason": "s" + ESC, "checks": []}
    for fmt, details in (("table", False), ("table", True), ("json", False), ("yaml", False),
                         ("jsonl", False), ("markdown", False)):
        r = run_cli("replay", write_bundle(tmp_path / "b.json", rep), "-o", fmt,
                    *(["--details"] if details else []))
        assert r.returncode == 3, (fmt, r.stderr)
        for stream in (r.stdout, r.stderr):
            assert "\x1b" not in stream and "\x07" not in stream, (fmt, stream[-300:])
        assert r.stderr.count("\n") == 1 and "boom\\x1b" in r.stderr


# -- --save ----------------------------------------------------------------------------------

@pytest.fixture
def kubeconfig(tmp_path):
    from tests.kubectl.fakecluster import FakeCluster
    fc = FakeCluster()
    fc.add_node("gpu-1")
    fc.start()
    try:
        yield str(fc.kubeconfig(tmp_path / "kc"))
    finally:
        fc.stop()


@pytest.mark.parametrize("target", ["null device", "stdout symlink", "fifo", "symlink", "dir"])
def test_save_never_replaces_what_is_not_a_regular_file(tmp_path, kubeconfig, target):
    """Stand-ins made here, never the machine's own /dev/null or /dev/stdout (the code this
    guards against would replace them): a character device made with mknod (1, 3 is
    /dev/null's), the /dev/stdout symlink, a FIFO, a symlink to a file, a directory."""
    if target == "null device":
        if os.geteuid() != 0:
            pytest.skip("mknod needs root")
        path = tmp_path / "null"
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    elif target == "stdout symlink":
        path = tmp_path / "stdout"
        path.symlink_to("/proc/self/fd/1")
    elif target == "fifo":
        path = tmp_path / "f"
        os.mkfifo(path)
    elif target == "symlink":
        real = tmp_path / "real.json"
        real.write_text("keep me")
        path = tmp_path / "link.json"
        path.symlink_to(real)
    elif target == "dir":
        path = tmp_path / "d"
        path.mkdir()
    before = os.lstat(path)
    r = run_cli("node", "gpu-1", "--kubeconfig", kubeconfig, "--no-probe", "--save", str(path))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "--save" in r.stderr and str(path) in r.stderr
    after = os.lstat(path)
    assert (after.st_mode, after.st_ino, after.st_rdev) == \
        (before.st_mode, before.st_ino, before.st_rdev)
    if target == "symlink":
        assert (tmp_path / "real.json").read_text() == "keep me"


def test_write_refuses_a_target_that_changed_meanwhile(tmp_path):
    path = tmp_path / "b.json"
    bundle_io.check_target(str(path))         # fine at the start of the run
    path.symlink_to(tmp_path / "elsewhere")   # ... a symlink by the time it is written
    with pytest.raises(errors.UsageError, match="symbolic link"):
        bundle.write(str(path), {"schema": bundle.SCHEMA})
    assert os.path.islink(path) and not [p for p in os.listdir(tmp_path) if p.startswith(".")]
    regular = tmp_path / "r.json"
    regular.write_text("old")
    bundle.write(str(regular), {"schema": bundle.SCHEMA})
    assert json.loads(regular.read_text()) == {"schema": bundle.SCHEMA}
    assert oct(os.stat(regular).st_mode & 0o777) == "0o600"


SAVE_SCRIPT = r"""
import io, signal, sys, time
from kubectl_gpudoctor.report import bundle
from kubectl_gpudoctor.report.output import Output
signal.signal(signal.SIGINT, signal.SIG_IGN)    # as cli._end holds them while the run ends
signal.signal(signal.SIGTERM, signal.SIG_IGN)
class Kube:
    def get_json(self, path, query=None, timeout=None): return {}
    def get_text(self, path, query=None, timeout=None): return ""
out = Output("table", "warning", {"kind": "node", "name": "gpu-1", "node": "gpu-1"},
             out=io.StringIO(), err=io.StringIO(), progress=False)
saver = bundle.Saver(sys.argv[1], Kube(), out, None, argv=["kubectl-gpu_doctor"])
def preamble():          # part of the save: a slow one, as a huge bundle would be
    print("saving", flush=True)
    time.sleep(60)
    return ""
saver.save(0, None, preamble)
print("returned", flush=True)
assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN   # the run's end holds it again
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_while_saving_stops_the_save(tmp_path, sig):
    target = tmp_path / "b.json"
    p = subprocess.Popen([sys.executable, "-c", SAVE_SCRIPT, str(target)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": os.getcwd()})
    timer = threading.Timer(30, p.kill)        # hang guard: the save sleeps 60 s
    timer.start()
    try:
        assert p.stdout.readline() == "saving\n"
        p.send_signal(sig)
        out, err = p.communicate()
    finally:
        timer.cancel()
    assert p.returncode == 0, (p.returncode, err)
    assert out == "returned\n"
    assert err == f"kubectl gpu-doctor: warning: interrupted: the bundle {target} was not " \
                  f"written\n"
    assert not target.exists() and os.listdir(tmp_path) == []

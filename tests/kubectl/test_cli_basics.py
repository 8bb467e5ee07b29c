"""Fast paths and local mode: no kubernetes import for --help/version/local, the probe in a
child process (and through the frozen-build `__probe` re-entry), usage errors in one line."""
from __future__ import annotations

import json
import subprocess
import sys

from kubectl_gpudoctor.reach import localproc as local

from .conftest import REPO, cli_env, one_error_line, run_cli


def _imports_kubernetes(*argv: str) -> bool:
    code = ("import sys\nfrom kubectl_gpudoctor import cli\n"
            f"rc = cli.main({list(argv)!r})\n"
            "print('KUBERNETES' if 'kubernetes' in sys.modules else 'CLEAN', rc)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=cli_env(), cwd=str(REPO), timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().splitlines()[-1].startswith("KUBERNETES")


def test_help_version_completion_and_local_do_not_import_kubernetes():
    assert not _imports_kubernetes("--help")
    assert not _imports_kubernetes("version")
    assert not _imports_kubernetes("node", "--help")
    assert not _imports_kubernetes("completion", "bash")
    assert not _imports_kubernetes("local", "--only", "driver", "--trace-seconds", "0",
                                   "--timeout", "10", "-o", "json")


def test_version_names_pinned_image():
    from node_probe import __version__
    r = run_cli("version")
    assert r.returncode == 0 and __version__ in r.stdout
    assert f"gpu-doctor-probe:{__version__}" in r.stdout


def test_completion_script():
    r = run_cli("completion", "bash")
    assert r.returncode == 0 and "_KUBECTL_GPU_DOCTOR_COMPLETE" in r.stdout


def test_local_runs_the_real_probe_in_a_child_and_renders_json():
    r = run_cli("local", "--only", "driver", "--only", "kmsg", "--trace-seconds", "0",
                "--timeout", "15", "-o", "json", "--fail-on", "never")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["target"]["kind"] == "local"
    # --only runs the checks named plus the producers of facts they need (driver needs nvml's)
    assert {"driver", "kmsg"} <= {c["id"] for c in doc["checks"]} <= {"driver", "kmsg", "nvml"}
    assert doc["summary"]["complete"] is True


def test_local_usage_error_from_probe_is_exit_2():
    r = run_cli("local", "--only", "no-such-check", "--trace-seconds", "0")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr


def test_frozen_reentry_runs_the_probe():
    """A PyInstaller build has no interpreter: `kubectl-gpu_doctor __probe ...` is the probe."""
    r = subprocess.run([sys.executable, "-m", "kubectl_gpudoctor", "__probe", "--list-checks"],
                       capture_output=True, text=True, env=cli_env(), cwd=str(REPO), timeout=60)
    assert r.returncode == 0 and "driver" in r.stdout
    cmd = local.probe_command(["-o", "jsonl"])
    assert cmd[1:3] == ["-m", "node_probe"]


def test_local_probe_that_never_ends_is_stopped_at_its_deadline(monkeypatch):
    """A probe stuck past its --timeout (or a child of it holding stdout open) must not hang
    `local`: the stream ends after the grace, the process group is killed."""
    import threading
    stuck = ("import signal, sys, time\n"
             "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
             "sys.stdout.write('{\"schema\": \"gpu-doctor/v1\", \"kind\": \"log\"}\\n')\n"
             "sys.stdout.flush()\n"
             "time.sleep(600)\n")
    monkeypatch.setattr(local, "probe_command", lambda args: [sys.executable, "-c", stuck])
    monkeypatch.setattr(local, "GRACE_S", 0.5)
    monkeypatch.setattr(local, "TERM_GRACE_S", 0.5)
    p = local.ProbeProcess(["--timeout", "1"])
    # chunks() starts the deadline: begin once the stand-in ignores SIGTERM and has written
    # (its line waits in the pipe), not while a loaded machine still starts its interpreter
    import select
    import time
    ready_by = time.monotonic() + 60
    while not select.select([p.proc.stdout], [], [], 0.05)[0]:
        assert p.proc.poll() is None and time.monotonic() < ready_by, "the stand-in never wrote"
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.extend(p.chunks()), daemon=True)
    reader.start()
    reader.join(60)
    try:
        assert not reader.is_alive(), "chunks() did not end at the deadline"
        assert b"gpu-doctor/v1" in b"".join(got)
        assert p.proc.wait(timeout=10) == -9  # SIGTERM ignored: killed
    finally:
        if p.proc.poll() is None:
            p.proc.kill()
            p.proc.wait()


def test_bad_option_one_line():
    r = run_cli("nodes", "--concurrency", "0")
    assert r.returncode == 2 and "concurrency" in one_error_line(r.stderr)


def test_a_bug_is_its_own_exit_code_with_one_line(monkeypatch, capsys):
    """An internal error (a bug) is exit 70, not 3 ("cluster error"), one line, no traceback;
    and it goes through the one mapping, errors.exit_status_of."""
    from node_probe.protocol import ExitStatus

    from kubectl_gpudoctor import cli, errors
    from kubectl_gpudoctor.commands import version as programs

    def broken(session, *args):
        raise ZeroDivisionError("boom")
    monkeypatch.setattr(programs, "version", broken)
    monkeypatch.delenv("GPU_DOCTOR_DEBUG", raising=False)
    assert cli.main(["version"]) == ExitStatus.INTERNAL == 70
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error: ZeroDivisionError: boom" in err
    assert "Traceback" not in err
    assert errors.exit_status_of(ValueError()) == ExitStatus.INTERNAL
    assert errors.exit_status_of(errors.InternalError("x")) == ExitStatus.INTERNAL
    assert not hasattr(errors, "ProbeIncomplete")


def test_the_probe_cli_maps_its_own_bugs_to_the_same_code(monkeypatch, capsys):
    from node_probe import cli as probe_cli
    from node_probe.protocol import ExitStatus

    monkeypatch.setattr(probe_cli.registry, "select", lambda only, skip: 1 / 0)
    monkeypatch.delenv("GPU_DOCTOR_DEBUG", raising=False)
    assert probe_cli.main(["--trace-seconds", "0"]) == ExitStatus.INTERNAL
    err = capsys.readouterr().err
    assert err.startswith("gpu-doctor-probe: internal error: ZeroDivisionError")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_program_errors_keep_their_codes_through_main(monkeypatch, capsys):
    """Programs raise; main maps: usage 2, cluster 3, interrupted 130."""
    from kubectl_gpudoctor import cli, errors
    from kubectl_gpudoctor.commands import version as programs
    for exc, code in ((errors.UsageError("u"), 2), (errors.NotFound("node x not found"), 3),
                      (errors.api_error(503, "Unavailable", "", "/x"), 3),
                      (KeyboardInterrupt(), 130)):
        def raising(session, *args, exc=exc):
            raise exc
        monkeypatch.setattr(programs, "version", raising)
        assert cli.main(["version"]) == code, exc
        lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("kubectl gpu-doctor: "), lines

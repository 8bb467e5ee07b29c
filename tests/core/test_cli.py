"""The probe CLI as users and bots call it: output modes, exit codes, usage errors."""
import json
import subprocess
import sys

from tests.probe_run import REPO, run_probe


def test_jsonl_every_line_parses_and_summary_is_last():
    run = run_probe("--trace-seconds", "0")
    assert run.records[0]["kind"] == "progress"
    assert run.records[-1]["kind"] == "summary"
    assert all(r["schema"] == "gpu-doctor/v1" for r in run.records)
    assert sum(r["kind"] == "summary" for r in run.records) == 1


def test_json_is_one_document():
    run = run_probe("--trace-seconds", "0", output="json")
    doc = json.loads(run.stdout)
    assert doc["schema"] == "gpu-doctor/v1"
    assert doc["target"]["kind"] == "local"
    assert doc["summary"]["complete"] is True
    assert doc["exit_code"] == run.returncode
    assert not [f for f in doc["findings"] if f["severity"] in ("warning", "critical")
                and f["id"] != "memory.pressure"]
    assert {c["id"] for c in doc["checks"]} >= {"nvml", "driver", "kmsg"}


def test_table_is_human_readable_and_has_no_color_in_a_pipe():
    run = run_probe("--trace-seconds", "0", output="table")
    assert "nvml.unavailable" in run.stdout and "\033[" not in run.stdout
    assert "; exit " in run.stdout.splitlines()[-1]


def test_usage_errors_are_one_line_exit_2(tmp_path):
    for args in (["--timeout", "0"], ["--host-root", str(tmp_path / "nope")],
                 ["--only", "no.such.check"], ["-o", "xml"]):
        p = subprocess.run([sys.executable, "-m", "node_probe", *args], capture_output=True,
                           text=True, cwd=REPO, timeout=30)
        assert p.returncode == 2, (args, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr
        assert "Traceback" not in p.stderr


def test_fail_on_never_and_critical(tmp_path):
    log = tmp_path / "k.log"
    log.write_text("[ 1.0] NVRM: Xid (PCI:0000:01:00): 13, pid=1, name=x, Graphics Exception\n")
    base = ("--kmsg-file", str(log), "--only", "kmsg", "--trace-seconds", "0")
    assert run_probe(*base).returncode == 1
    assert run_probe(*base, "--fail-on", "critical").returncode == 0
    assert run_probe(*base, "--fail-on", "never").returncode == 0


def test_sigterm_ends_with_summary_and_130(tmp_path):
    import os, signal, time
    from tests.fakes.nvml import build_fake_nvml
    root = tmp_path / "host"
    build_fake_nvml(root / "usr/lib/x86_64-linux-gnu", init="block")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.Popen([sys.executable, "-m", "node_probe", "-o", "jsonl", "--host-root",
                          str(root), "--only", "nvml", "--trace-seconds", "0",
                          "--nvml-timeout", "20"], stdout=subprocess.PIPE, text=True,
                         cwd=REPO, env=env)

    def children() -> list[str]:   # this run's NVML children (the stand-in blocks in init)
        out = []
        for d in os.listdir("/proc"):
            try:
                cmd = open(f"/proc/{d}/cmdline", "rb").read().decode(errors="replace")
            except OSError:   # not a pid, or gone meanwhile
                continue
            if d.isdigit() and "nvml_child" in cmd and str(root) in cmd:
                out.append(d)
        return out
    # SIGTERM once the NVML child is blocked (not after a fixed pause a loaded machine may
    # still spend starting the interpreter)
    deadline = time.monotonic() + 60
    while not children():
        assert p.poll() is None and time.monotonic() < deadline, "no NVML child started"
        time.sleep(0.02)
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=30)
    recs = [json.loads(l) for l in out.splitlines()]
    assert p.returncode == 130
    assert recs[-1]["kind"] == "summary" and recs[-1]["complete"] is False
    assert recs[-1]["exit_code"] == 130
    # killed, it is gone once reaped (left alone it would block in init for good)
    deadline = time.monotonic() + 10
    while children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not children(), "the NVML child must be killed on SIGTERM"

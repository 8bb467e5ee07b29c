"""scripts/setup.sh on a fresh VM: another package manager (unattended-upgrades in the first
minutes) holds dpkg's lock, and setup.sh gave up at once with apt-get's exit 100 (audit
ux-round-4 section 1: `E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by
process 3452 (apt-get)`, the line apt-get printed on that machine). It now waits: apt-get
itself for dpkg's lock (DPkg::Lock::Timeout), setup.sh's apt_get for the other locks, and any
other failure still ends the setup at once.

apt-get is a stand-in on PATH (the test must not install anything); it prints apt's own
message while "the lock is held" and records the arguments it was called with."""
from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LOCKED = ("E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 3452 "
          "(apt-get)")


def _run(tmp_path: Path, fail_times: int, message: str) -> tuple[subprocess.CompletedProcess,
                                                                   list[str]]:
    calls = tmp_path / "calls"
    fake = tmp_path / "bin" / "apt-get"
    fake.parent.mkdir()
    fake.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo "$*" >> {calls}
        n=$(wc -l < {calls})
        if [ "$n" -le {fail_times} ]; then echo "{message}" >&2; exit 100; fi
        exit 0
        """))
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{fake.parent}:{os.environ['PATH']}", GPU_DOCTOR_SETUP_LIB="1",
               GPU_DOCTOR_APT_RETRY_S="0")
    r = subprocess.run(["bash", "-c", f". {REPO}/scripts/setup.sh && apt_get install -y -qq x"],
                       capture_output=True, text=True, env=env, timeout=60)
    return r, calls.read_text().splitlines() if calls.exists() else []


def test_setup_waits_for_the_dpkg_lock_instead_of_failing(tmp_path):
    r, calls = _run(tmp_path, 2, LOCKED)
    assert r.returncode == 0, r.stderr
    assert len(calls) == 3  # two refusals while the lock was held, then the install
    assert all(c.startswith("-o DPkg::Lock::Timeout=600 install -y -qq x") for c in calls)
    assert "waiting for another package manager" in r.stderr


def test_any_other_apt_failure_still_ends_the_setup(tmp_path):
    r, calls = _run(tmp_path, 5, "E: Unable to locate package x")
    assert r.returncode == 1 and len(calls) == 1
    assert "Unable to locate package x" in r.stderr

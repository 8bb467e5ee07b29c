"""Without BCC the probe still completes and says what is missing.

A Python without bcc now imports the host's python3-bpfcc (node_probe/tracing/hostbcc.py), so a
host without BCC is made here: a private mount namespace with an empty tmpfs over each bcc
package directory hostbcc would find (root, for the namespace)."""
from __future__ import annotations

import os
import subprocess
import time

import pytest

from node_probe.tracing import hostbcc
from tests.tracing.conftest import findings


def test_without_bcc_the_probe_completes_with_ebpf_unavailable(probe):
    py = "/root/.pyenv/versions/3.11.7/bin/python3"
    if not os.access(py, os.X_OK):
        pytest.skip(f"{py} (a Python without bcc) is not installed here")
    if subprocess.run([py, "-c", "import bcc"], capture_output=True).returncode == 0:
        pytest.skip(f"{py} has bcc, so it cannot show the missing-BCC path")
    if os.geteuid() != 0:
        pytest.skip("hiding the host's python3-bpfcc needs a mount namespace (root)")
    hide = " && ".join(f"mount -t tmpfs none {d}" for d in hostbcc.candidates()) or "true"
    wrapper = ["unshare", "-m", "--propagation", "private", "sh", "-c", f'{hide} && exec "$0" "$@"']
    t0 = time.monotonic()
    recs = probe("--only", "trace", "--trace-seconds", "3", python=py, wrapper=wrapper).finish()
    found = findings(recs, "probe.ebpf_unavailable")
    assert len(found) == 1
    assert "bcc" in found[0]["title"]
    assert "apt-get install python3-bpfcc" in found[0]["remediation"]
    summary = recs[-1]
    assert summary["kind"] == "summary" and summary["complete"] is True
    (trace,) = summary["checks"]                  # it could not look: skipped, with why
    assert trace["id"] == "trace" and trace["status"] == "skipped"
    assert trace["reason"].startswith("eBPF unavailable") and "bcc" in trace["reason"]
    assert time.monotonic() - t0 < 20

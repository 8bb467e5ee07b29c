"""The README's sample verdict is a real run's, so it cannot go stale: `kubectl gpu-doctor node
gpu-wedged` at 80 columns against the wedge through the agent (test_ux_round4's staging: the
fake API server, the agent's exec running the real `python -m node_probe` against a temp host
root, a real device-plugin process stuck in the stand-in NVML's nvmlInit_v2, the GPU Operator's
plugin pod). The run's output is compared with the README's block between the SAMPLE markers
after the values that change from run to run (time, pids, thread ids, the agent pod's suffix,
the elapsed time) are set to fixed ones. UPDATE_README=1 rewrites the block after a deliberate
change: review the diff."""
from __future__ import annotations

import os
import re

from tests.deviceplugin.conftest import host, start_plugin  # noqa: F401 - fixtures

from .conftest import REPO
from .test_agent_wedge import NODE, stuck_plugin  # noqa: F401 - fixture
from .test_ux_round4 import cli, wedged_full  # noqa: F401 - fixture

README = REPO / "README.md"
BEGIN = "<!-- SAMPLE: tests/kubectl/test_readme_sample.py writes it (UPDATE_README=1) -->\n```\n"
END = "```\n<!-- /SAMPLE -->"


def normalized(text: str, pid: int) -> str:
    """The run's output with the values of this run set to fixed ones."""
    text = re.sub(r"live \d{4}-\d\d-\d\d \d\d:\d\d UTC", "live 2026-11-27 03:12 UTC", text)
    text = re.sub(r"gpu-doctor-agent-[a-z0-9]{5}", "gpu-doctor-agent-7mx2q", text)
    text = text.replace(f"pid {pid}", "pid 28461")
    text = re.sub(r"thread \d+ of pid", "thread 28493 of pid", text)
    return re.sub(r"; [0-9.]+s; exit ", "; 3.1s; exit ", text)


def test_readme_sample_is_a_real_runs_output(wedged_full, stuck_plugin, host,  # noqa: F811
                                             tmp_path):
    from .fakeexec import local_probe_argv
    # the memory check reads this machine's own pressure (shared, busy): not a sample's
    wedged_full.exec_argv = local_probe_argv(str(host.root), ("--skip", "memory"))
    kc = str(wedged_full.kubeconfig(tmp_path / "kc"))
    r = cli("node", NODE, "--kubeconfig", kc, "--trace-seconds", "0", "--timeout", "20")
    assert r.returncode == 1, r.stderr
    sample = normalized(r.stdout, stuck_plugin.pid)
    # what the sample shows: the kubeconfig path of this run is nowhere in it
    assert kc not in sample and "live 2026-11-27 03:12 UTC" in sample
    text = README.read_text()
    assert BEGIN in text and END in text, "the README lost its SAMPLE markers"
    head, rest = text.split(BEGIN, 1)
    old, tail = rest.split(END, 1)
    if os.environ.get("UPDATE_README"):
        README.write_text(head + BEGIN + sample + END + tail)
        old = sample
    assert old == sample, "README's sample differs from a real run: UPDATE_README=1 and review"

"""A check that could not look says so (issue 12 item 14): status `skipped` with its reason,
in the probe's summary, in the JSON `checks` and in the table footer; never `ok` for a look
that did not happen (no cgroup hierarchy, no kubelet, no BCC, no NVML)."""
from __future__ import annotations

import io
import json

from node_probe.protocol import Report, render
from tests.probe_run import REPO, run_probe


def test_an_empty_host_root_gives_skipped_checks_with_reasons(tmp_path):
    root = tmp_path / "host"
    (root / "sys/fs/cgroup").mkdir(parents=True)        # a cgroup root with no hierarchy
    (root / "var/lib/kubelet").mkdir(parents=True)      # a kubelet dir, no kubelet
    nobcc = tmp_path / "nobcc" / "bcc"                  # `import bcc` fails, as without BCC
    nobcc.mkdir(parents=True)
    (nobcc / "__init__.py").write_text("raise ImportError('no BCC in this test')\n")
    run = run_probe("--host-root", str(root), "--trace-seconds", "1", "--timeout", "20",
                    "--only", "nvml", "--only", "trace", "--only", "cgroup.devices",
                    "--only", "deviceplugin", "--only", "kubelet", timeout=60,
                    env={"PYTHONPATH": f"{nobcc.parent}:{REPO}"})
    checks = {c["id"]: c for c in run.summary["checks"]}
    want = {"nvml": "libnvidia-ml.so.1", "trace": "eBPF unavailable",
            "cgroup.devices": "cgroup hierarchy", "deviceplugin": "not a Kubernetes node",
            "kubelet": "not a Kubernetes node"}
    for cid, why in want.items():
        assert checks[cid]["status"] == "skipped", (cid, checks[cid])
        assert why in checks[cid]["reason"], (cid, checks[cid])
    assert run.summary["complete"] is True


def _report() -> Report:
    r = Report({"kind": "node", "name": "n1"}, "0")
    r.add_record({"kind": "summary", "complete": True, "checks": [
        {"id": "nvml", "status": "skipped", "duration_s": 0.01,
         "reason": "no libnvidia-ml.so.1 under /host: NVML could not be asked"},
        {"id": "memory", "status": "ok", "duration_s": 0.5},
        {"id": "api.gpu_fit", "status": "skipped", "duration_s": 0.1,
         "message": "cannot list nodes and pods: 403 forbidden"}]})
    return r


def test_table_footer_lists_skipped_checks_and_why():
    """One line by default (audit ux-round-4 item 13: the list took 3-15 lines of every
    report); each check with its reason with --details."""
    out = io.StringIO()
    render.render_table(_report(), out, "warning", 0)
    text = out.getvalue()
    assert "2 checks could not look here (--details says why)\n" in text
    assert "nvml:" not in text and "api.gpu_fit" not in text
    out = io.StringIO()
    render.render_table(_report(), out, "warning", 0, details=True)
    text = out.getvalue()
    assert "Checks that could not look (2):" in text
    assert "  nvml: no libnvidia-ml.so.1 under /host: NVML could not be asked" in text
    assert "  api.gpu_fit: cannot list nodes and pods: 403 forbidden" in text
    assert "memory:" not in text.split("could not look")[1]


def test_json_checks_carry_the_reason():
    out = io.StringIO()
    render.render_json(_report(), out, "warning", 0)
    checks = {c["id"]: c for c in json.loads(out.getvalue())["checks"]}
    assert checks["nvml"]["status"] == "skipped" and "NVML could not be asked" in checks["nvml"]["reason"]

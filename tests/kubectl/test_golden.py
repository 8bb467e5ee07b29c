"""Golden output of the table and markdown renderings for the five scenarios of issue 22.

Each scenario is a Report built from the real analysis code on the 1.35 captures (the wedged
node, the healthy node, the captured node made NotReady), from the fit over the fake cluster's
nodes (a Pending pod that never fits), and, for the cgroup denial seen on a node, the
API-side kubelet finding from a real configz plus node-side findings shaped like the probe's.
The table is rendered at 80 and 200 columns and compared with tests/kubectl/data/golden/
(UPDATE_GOLDEN=1 rewrites them after a deliberate change; review the diff). The elapsed time
is the only part masked. The line counts are the report's size budget (issue 22: the wedged
node's whole table under 40 lines at 200 columns; its first 10 lines name the cause, the stuck
pods and the cordon command).
"""
from __future__ import annotations

import copy
import datetime as dt
import io
import json
import os
import re
from pathlib import Path

import pytest

from kubectl_gpudoctor.analysis.resources import kubelet_config
from kubectl_gpudoctor.analysis.stuck import readiness, wedge
from kubectl_gpudoctor.analysis import verdict
from kubectl_gpudoctor.report import markdown
from node_probe.protocol import CheckResult, Report, catalog, render

from .fakecluster import FakeCluster
from .test_captures import CAPTURES, NODE, Stage, with_gfd
from .test_fit import NOW, pending, run

GOLDEN = Path(__file__).with_name("data") / "golden"
VERSION = "0.0-golden"
WIDTHS = (80, 200)
_ELAPSED = re.compile(r"; [0-9.]+(ms|s|m\d\ds|m|h\d\dm)?; exit ")
_LIVE = re.compile(r"live \d{4}-\d\d-\d\d \d\d:\d\d UTC")  # when the run happened


def _report(target: dict, findings, checks=(), incomplete: str = "", logs=()) -> Report:
    r = Report(target, VERSION)
    for f in findings:
        r.add_finding(f)
    r.checks.extend(checks)
    r.summary_record = {"complete": not incomplete}
    r.extra_incomplete_reason = incomplete
    r.logs.extend({"kind": "log", "level": lvl, "message": m} for lvl, m in logs)
    return r


def wedged_node() -> Report:
    s = Stage("wedged-3m")
    fs = s.api_findings()
    fs += kubelet_config.analyze(NODE, kubelet_config.extract(
        json.loads((CAPTURES / "configz.json").read_text())))
    fs += wedge.known_bad_driver(with_gfd(s.node), fs)
    d = wedge.decide(NODE, fs, s.pods)
    fs.append(wedge.not_created_finding(NODE, d))
    return _report({"kind": "node", "name": NODE, "node": NODE}, fs,
                   [CheckResult("node.probe", "skipped", 0.0,
                                reason=f"no debug pod: {d.reason}")],
                   "the node-side checks did not run: the kubelet admits no pod, so no debug "
                   "pod was created")


def cgroup_denial() -> Report:
    cfg = dict(json.loads((CAPTURES / "configz.json").read_text())["kubeletconfig"],
               cpuManagerPolicy="static")
    fs = kubelet_config.analyze("gpu-7", kubelet_config.extract({"kubeletconfig": cfg}))
    subject = "container 4f1c2a9e0b7d3 (pod 0d6c1e52-9a1f-4d3e-8f0a-2b1c3d4e5f60)"
    fs += [
        catalog.make("kubelet.cpu_manager_static", "warning", "node",
                     "kubelet runs cpuManagerPolicy static and the NVIDIA plugin does not pass "
                     "device specs: GPU containers lose their devices after start",
                     {"cpuManagerPolicy": "static", "config": "/var/lib/kubelet/config.yaml",
                      "config_source": "file", "kubelet_pid": 1187, "flags": None,
                      "cgroupDriver": "cgroupfs", "reservedSystemCPUs": "0-1",
                      "nvidia_plugins_without_device_specs": [2210], "nvidia_plugins": [2210]},
                     "Make the NVIDIA device plugin pass device specs and recreate GPU pods."),
        catalog.make("cgroup.device_rules_rewritten", "critical", subject,
                     "runc (pid 48211) rewrote the device rules of /kubepods/burstable/pod0d6c/"
                     "4f1c2a9e0b7d3 without the NVIDIA devices (major 195)",
                     {"cgroup": "/kubepods/burstable/pod0d6c/4f1c2a9e0b7d3",
                      "writers": [{"pid": 48211, "comm": "runc"}],
                      "writes": [{"which": "deny", "text": "a", "pid": 48211, "comm": "runc",
                                  "ret": 1, "ts": 1795319201.2},
                                 {"which": "allow", "text": "c 1:3 rwm", "pid": 48211,
                                  "comm": "runc", "ret": 10, "ts": 1795319201.2}],
                      "gpu_evidence": ["the container opened /dev/nvidia0 earlier"],
                      "devices_list_now": ["c 1:3 rwm", "c 1:5 rwm"], "container": None},
                     "Make the device plugin pass device specs (PASS_DEVICE_SPECS=true), then "
                     "recreate the affected pods."),
        catalog.make("cgroup.device_denied", "critical", subject,
                     "Container train in pod team-a/train-0 cannot open /dev/nvidia0 (195:0), "
                     "/dev/nvidiactl (195:255): its device cgroup denies them",
                     {"pod": "team-a/train-0", "container": "train",
                      "denied": [{"path": "/dev/nvidia0", "majmin": "195:0"},
                                 {"path": "/dev/nvidiactl", "majmin": "195:255"}],
                      "since_s": 633, "cgroup_driver": "cgroupfs"},
                     "Cause: the CPU manager re-applied the container's device list. Fix: pass "
                     "device specs."),
        catalog.make("container.nvidia_eperm", "critical", "pid 48302 (python3)",
                     "python3 (pid 48302) in pod team-a/train-0 was denied /dev/nvidia0 by its "
                     "device cgroup (12 EPERM opens)",
                     {"pid": 48302, "comm": "python3", "errno": 1, "opens": 12,
                      "devices": [{"path": "/dev/nvidia0", "count": 12}]}),
    ]
    return _report({"kind": "pod", "name": "team-a/train-0", "node": "gpu-7"}, fs)


def pending_never_fits() -> Report:
    fc = FakeCluster()
    fc.add_node("gpu-1", gpus=2, allocatable_gpus=0, now=NOW)
    fc.add_node("gpu-2", gpus=1, now=NOW)
    fc.add_node("cpu-1", gpus=0, now=NOW)
    pod = pending(fc, gpus=4)
    fs = run(fc, pod)
    return _report({"kind": "pod", "name": "ml/trainer-0", "node": None}, fs)


def not_ready_node() -> Report:
    s = Stage("healthy")
    node = copy.deepcopy(s.node)
    for c in node["status"]["conditions"]:
        if c["type"] == "Ready":
            c.update(status="Unknown", reason="NodeStatusUnknown",
                     message="Kubelet stopped posting node status.",
                     lastHeartbeatTime="2026-11-20T10:00:00Z",
                     lastTransitionTime="2026-11-20T10:00:40Z")
    lease = copy.deepcopy(s.lease)
    lease["spec"]["renewTime"] = "2026-11-20T10:00:00.000000Z"
    now = dt.datetime(2026, 11, 20, 10, 10, 33, tzinfo=dt.timezone.utc)
    f = readiness.not_ready(node, lease, now, [f"ssh {NODE} and run `kubectl-gpu_doctor local`"])
    return _report({"kind": "node", "name": NODE, "node": NODE}, [f],
                   [CheckResult("node.probe", "skipped", 0.0,
                                reason=f"no debug pod: node {NODE} is NotReady")],
                   f"the node-side checks did not run: node {NODE} is NotReady",
                   logs=[("warning", f"{NODE}: node is NotReady; no debug pod was created")])


def healthy_node() -> Report:
    s = Stage("healthy")
    fs = s.api_findings()
    fs += kubelet_config.analyze(NODE, kubelet_config.extract(
        json.loads((CAPTURES / "configz.json").read_text())))
    return _report({"kind": "node", "name": NODE, "node": NODE}, fs,
                   [CheckResult("nvml", "ok", 0.4), CheckResult("deviceplugin", "ok", 0.2)])


SCENARIOS = {"wedged-node": wedged_node, "cgroup-denial": cgroup_denial,
             "pending-never-fits": pending_never_fits, "not-ready-node": not_ready_node,
             "healthy-node": healthy_node}


def table(r: Report, width: int, details: bool = False) -> str:
    v = verdict.decide(r.findings, r.target, complete=r.complete).to_dict()
    buf = io.StringIO()
    code = int(r.exit_status("warning"))
    render.render_table(r, buf, "warning", code, color=False, width=width, verdict=v,
                        details=details)
    return _LIVE.sub("live <time>", _ELAPSED.sub("; <elapsed>; exit ", buf.getvalue()))


def md(r: Report) -> str:
    v = verdict.decide(r.findings, r.target, complete=r.complete).to_dict()
    return _LIVE.sub("live <time>", markdown.render(r, "warning", int(r.exit_status("warning")),
                                                    v))


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with UPDATE_GOLDEN=1 and review it"
    assert text == path.read_text(), f"{name} differs from its golden file"


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_table_golden(scenario, width):
    text = table(SCENARIOS[scenario](), width)
    check_golden(f"{scenario}-{width}.txt", text)
    over = [ln for ln in text.splitlines() if len(ln) > width]
    # only an action's command may run past the width (it is copied whole, never cut)
    assert all(re.match(r"  \d\. \w+ +kubectl[ -]", ln) for ln in over), over


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_markdown_golden(scenario):
    check_golden(f"{scenario}.md", md(SCENARIOS[scenario]()))


def test_wedged_node_answer_first():
    text = table(wedged_node(), 200)
    lines = text.splitlines()
    assert len(lines) < 40, len(lines)
    top = "\n".join(lines[:10])
    assert "NVIDIA driver 570.158.01" in top and "device plugin" in top
    assert "2 pods stuck" in top
    assert "kubectl cordon 127.0.0.1" in top
    assert "…" not in text  # nothing cut
    # each finding once: a problem as one block, info ones folded into one line of ids
    for f in wedged_node().findings:
        if f.severity.value in ("critical", "warning"):
            assert sum(1 for ln in lines if re.match(rf"\S+\s\s+{re.escape(f.id)}\s", ln)) == 1
        else:
            assert sum(ln.count(f.id) for ln in lines) == 1, f.id
    assert "kubelet config in effect" not in text
    assert "INFO kubelet.config" in table(wedged_node(), 200, details=True)


def test_evidence_is_spelled_for_people():
    text = table(wedged_node(), 200, details=True)
    assert "oldest wait: 2m5" in text           # a duration, not oldest_wait_s: 177
    assert "node ready: true" in text and "created: false" in text
    # no Python spellings (memoryManagerPolicy's own value is the word None)
    assert not [ln for ln in text.splitlines() if "None" in ln and "memoryManagerPolicy" not in ln]
    assert "True" not in text and "False" not in text
    assert "{\"" not in text                     # no inline JSON objects
    assert re.search(r"POD\s+WAITING\s+GPU", text)  # the stuck pods as a small table


def test_healthy_node_is_quiet():
    text = table(healthy_node(), 200)
    # every check looked (no skipped one in this report): "No problem found", said plainly
    assert text.splitlines()[1] == f"OK        No problem found on node {NODE}"
    assert "CRITICAL" not in text and "WARNING" not in text


def test_incomplete_run_shows_its_last_warning():
    text = table(not_ready_node(), 80)
    assert "last warning: 127.0.0.1: node is NotReady" in text


def test_wedged_node_cli_answer_first_at_200_columns(cluster, kubeconfig):
    """The done-when of issue 22 on the real CLI (the captured wedge served by the fake API
    server, no debug pod created): under 40 lines at 200 columns, the first 10 naming the
    known-bad driver and the plugin, the stuck pods and the cordon command; the JSON carries
    the same verdict."""
    import subprocess
    import sys

    from .conftest import REPO, cli_env
    from .test_wedge_cli import load_stage
    load_stage(cluster, "wedged-3m")
    env = dict(cli_env(), COLUMNS="200")
    args = [sys.executable, "-m", "kubectl_gpudoctor", "node", NODE, "--kubeconfig",
            str(kubeconfig)]
    r = subprocess.run(args, capture_output=True, text=True, env=env, cwd=str(REPO),
                       timeout=60)
    assert r.returncode == 1, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) < 40, r.stdout
    top = "\n".join(lines[:10])
    # the labels say the driver and the layout, nothing on the node confirmed it: "Likely"
    assert "Likely: known-bad NVIDIA driver 570.158.01" in top and "device plugin" in top
    assert "2 pods stuck" in top and f"kubectl cordon {NODE}" in top
    doc = json.loads(subprocess.run(args + ["-o", "json"], capture_output=True, text=True,
                                    env=env, cwd=str(REPO), timeout=60).stdout)
    v = doc["verdict"]
    assert v["root_cause"] == "driver.known_bad" and v["impact"]["pods"] == 2
    assert v["actions"][0]["command"] == f"kubectl cordon {NODE}"
    assert doc["schema"] == "gpu-doctor/v1" and doc["findings"]  # additive

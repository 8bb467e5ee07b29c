"""deploy/examples/prometheus-rules.yaml: the alerts for Prometheus users (issue 32) are valid rules
(`promtool check rules`), behave as tests/prometheus/gpu_doctor_rules_test.yaml says on series
named as kube-state-metrics and the agent write them (`promtool test rules`: a black hole fires
after 10 minutes on the node that rejects its GPU pods, not on a cordoned one nor where a
workload fails everywhere; each condition after its `for:`; a stale heartbeat), and cover every
condition class the agent can set. promtool comes from Debian's prometheus package, installed
for the tests by scripts/setup.sh.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from node_probe.protocol import conditions

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "examples" / "prometheus-rules.yaml"
UNIT = Path(__file__).with_name("gpu_doctor_rules_test.yaml")


def _promtool() -> str:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.fail("promtool is missing: scripts/setup.sh installs Debian's prometheus "
                    "package for the tests (GPU_DOCTOR_SETUP_TESTS=1)")
    return exe


@pytest.fixture
def rules_dir(tmp_path: Path) -> Path:
    doc = yaml.safe_load(RULES.read_text())
    assert doc["kind"] == "PrometheusRule" and doc["apiVersion"] == "monitoring.coreos.com/v1"
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(doc["spec"], sort_keys=False))
    shutil.copy(UNIT, tmp_path / UNIT.name)
    return tmp_path


def test_promtool_checks_the_rules(rules_dir):
    r = subprocess.run([_promtool(), "check", "rules", str(rules_dir / "rules.yaml")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_promtool_unit_tests_pass(rules_dir):
    r = subprocess.run([_promtool(), "test", "rules", UNIT.name], capture_output=True,
                       text=True, timeout=120, cwd=rules_dir)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_condition_class_has_an_alert_with_a_for():
    spec = yaml.safe_load(RULES.read_text())["spec"]
    alerts = {r["alert"]: r for g in spec["groups"] for r in g["rules"] if "alert" in r}
    for ctype in conditions.CLASSES:
        rule = alerts.get(ctype)
        assert rule is not None, f"no alert for the agent's condition {ctype}"
        assert f'condition="{ctype}"' in rule["expr"] and rule.get("for"), ctype
        assert rule["labels"]["severity"] in ("critical", "warning")
    for name in ("GpuDoctorNodeBlackHole", "GpuDoctorAgentHeartbeatStale"):
        assert alerts[name].get("for"), name
    # the heartbeat the rules call stale is the one `nodes` calls stale
    assert f"> {conditions.STALE_AFTER_S}" in alerts["GpuDoctorAgentHeartbeatStale"]["expr"]

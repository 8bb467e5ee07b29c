"""`kubectl gpu-doctor explain ID` (issue 22 item 3): a finding's page, offline, plain text.

The CLI runs as a subprocess from a directory outside the checkout, with no kubeconfig and no
network configured: explain needs neither. The frozen (krew) build is tested in
tests/packaging/test_plugin_artifact.py, the wheel's data in tests/packaging/test_wheel_pages.py.
"""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from kubectl_gpudoctor.commands import explain
from node_probe.protocol.catalog import CATALOG

from .conftest import REPO, cli_env, one_error_line


def run_explain(*args: str, columns: int = 100, cwd=None) -> subprocess.CompletedProcess:
    env = dict(cli_env(), COLUMNS=str(columns), KUBECONFIG="/nonexistent/kubeconfig",
               HTTPS_PROXY="http://127.0.0.1:9", HTTP_PROXY="http://127.0.0.1:9")
    return subprocess.run([sys.executable, "-m", "kubectl_gpudoctor", "explain", *args],
                          capture_output=True, text=True, timeout=60, env=env,
                          cwd=str(cwd or "/"))


def test_explain_prints_the_page_as_plain_text():
    r = run_explain("kubelet.admission_stalled", columns=80)
    assert r.returncode == 0 and r.stderr == ""
    lines = r.stdout.splitlines()
    assert lines[0] == "kubelet.admission_stalled"
    for head in ("CAUSE", "EVIDENCE", "FIX", "REFS"):
        assert head in lines
    assert "https://github.com/kubernetes/kubernetes/issues/117435" in r.stdout
    assert "##" not in r.stdout and "**" not in r.stdout
    # wrapped for the terminal (URLs and code may run longer: they are not broken)
    assert all(len(ln) <= 80 for ln in lines if "://" not in ln and not ln.startswith("    "))


@pytest.mark.parametrize("fid", sorted(CATALOG))
def test_every_catalog_id_renders(fid):
    text = explain.render(explain.page_text(fid), 100)
    assert text.splitlines()[0] == fid
    assert "CAUSE" in text and "FIX" in text and "REFS" in text


def test_unknown_id_is_one_line_exit_2_with_close_matches():
    r = run_explain("not_ready")
    assert r.returncode == 2 and r.stdout == ""
    line = one_error_line(r.stderr)
    assert "unknown finding id 'not_ready'" in line
    assert "node.not_ready" in line and "fabric.not_ready" in line
    r = run_explain("kubelet.admision_stalled")                 # a typo
    assert r.returncode == 2 and "kubelet.admission_stalled" in one_error_line(r.stderr)
    r = run_explain("zzzz")
    assert r.returncode == 2 and "`kubectl gpu-doctor explain` lists every id" in \
        one_error_line(r.stderr)


def test_an_id_is_never_a_path(tmp_path):
    (tmp_path / "secret.md").write_text("# secret\n")
    for probe in ("../../../../etc/passwd", str(tmp_path / "secret"), "\x1b]52;c;x\x07"):
        r = run_explain(probe)
        assert r.returncode == 2 and "secret" not in r.stdout and "root:" not in r.stdout
        assert "\x1b" not in r.stderr


def test_without_an_id_lists_every_id_with_its_meaning():
    r = run_explain()
    assert r.returncode == 0
    listed = [ln.split()[0] for ln in r.stdout.splitlines() if ln and not ln.startswith(" ")]
    assert listed == sorted(CATALOG)


def test_render_keeps_code_blocks_and_wraps_list_items():
    md = ("# x.y\n\nSeverity: `warning`.\n\n## Fix\nDo this:\n\n```\nkubectl cordon "
          "node-with-a-very-long-name-that-must-not-wrap --dry-run=client\n```\n\n"
          "- a list item that is long enough to wrap at forty columns for sure\n"
          "  and continues\n")
    text = explain.render(md, 40)
    assert "    kubectl cordon node-with-a-very-long-name-that-must-not-wrap --dry-run=client" \
        in text.splitlines()
    item = [ln for ln in text.splitlines() if ln.startswith("  - ")]
    assert item and all(len(ln) <= 40 for ln in text.splitlines() if not ln.startswith("    "))
    assert "for sure and" in text and re.search(r"^FIX$", text, re.M)


def test_pages_are_found_beside_the_package_in_a_checkout():
    assert explain.pages_dirs()[0] == REPO / "docs" / "findings"

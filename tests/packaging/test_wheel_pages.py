"""A pip install carries the finding pages `explain` shows (pyproject data-files), as the
krew archive does (test_plugin_artifact.py): the wheel built from this tree holds every page
under <prefix>/share/gpu-doctor/findings, where commands/explain.py looks after the checkout."""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from node_probe.protocol.catalog import CATALOG
from tests.packaging.conftest import REPO

pytestmark = pytest.mark.slow


def test_wheel_carries_every_finding_page(tmp_path: Path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, src / name)
    for d in ("node_probe", "kubectl_gpudoctor", "bpf", "docs/findings"):
        shutil.copytree(REPO / d, src / d, ignore=shutil.ignore_patterns("__pycache__"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "--no-index", "-q", "-w", str(tmp_path / "dist"), str(src)],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0 and "No module named" in r.stderr:
        pytest.skip(f"cannot build a wheel here: {r.stderr.strip().splitlines()[-1]}")
    assert r.returncode == 0, r.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    pages = sorted(Path(n).stem for n in names
                   if ".data/data/share/gpu-doctor/findings/" in n and n.endswith(".md"))
    assert pages == sorted(CATALOG)
    # and the JSON Schema of -o json, as package data (issue 36.5)
    assert "kubectl_gpudoctor/schema/gpu-doctor-v1.schema.json" in names


def test_explain_finds_the_pages_a_wheel_installed(tmp_path: Path, monkeypatch):
    """Installed from a wheel there is no docs/ beside the package: the pages are read from
    sys.prefix/share/gpu-doctor/findings."""
    from kubectl_gpudoctor.commands import explain
    data = tmp_path / "share" / "gpu-doctor" / "findings"
    data.mkdir(parents=True)
    (data / "node.not_ready.md").write_text("# node.not_ready\n\nfrom the prefix\n")
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    dirs = explain.pages_dirs()
    assert dirs[1] == data
    monkeypatch.setattr(explain, "pages_dirs", lambda: [tmp_path / "nowhere", data])
    assert "from the prefix" in explain.page_text("node.not_ready")

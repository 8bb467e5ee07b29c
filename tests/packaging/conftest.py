"""Fixtures for the packaging tests: the plugin archive and the probe image, built once per
session by the real build scripts (both skip the work when their inputs are unchanged)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_script(argv: list[str], timeout_s: float) -> str:
    r = subprocess.run(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=timeout_s)
    if r.returncode != 0:
        pytest.fail(f"{' '.join(argv)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return r.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def plugin_archive() -> Path:
    """dist/kubectl-gpu_doctor-<version>-linux-<arch>.tar.gz from scripts/build-plugin.sh."""
    if not Path("/usr/bin/python3").exists():
        pytest.skip("scripts/build-plugin.sh builds with /usr/bin/python3, which is missing")
    return REPO / run_script(["bash", "scripts/build-plugin.sh"], timeout_s=600)


@pytest.fixture()
def unpacked_plugin(plugin_archive: Path, tmp_path: Path) -> Path:
    out = tmp_path / "archive"
    out.mkdir()
    subprocess.run(["tar", "-xzf", str(plugin_archive), "-C", str(out)], check=True, timeout=120)
    return out


@pytest.fixture(scope="session")
def probe_image_archive() -> Path:
    """dist/gpu-doctor-probe-<version>-<arch>.oci.tar from scripts/build-image.sh (needs root)."""
    if os.geteuid() != 0:
        pytest.skip("scripts/build-image.sh needs root (debootstrap, container storage)")
    if not shutil.which("apt-get") and not shutil.which("podman"):
        pytest.skip("no podman and no apt-get to install it")
    return REPO / run_script(["bash", "scripts/build-image.sh"], timeout_s=900)

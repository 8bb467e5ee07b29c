"""scripts/build-kheaders.py for both architectures, and where it gets the pinned packages.

The arm64 set is what the arm64 image, the arm64 krew archive and the wheel carry; it is built
on this amd64 machine from Debian's arm64 package (fetched through a private apt state for
arm64, so this machine's dpkg architectures stay as they are). A machine without Debian's apt
(an Ubuntu or macOS release runner) gets the .deb from a Debian mirror's pool path pinned in
the manifest, checked against the manifest's sha256: shown here with a file:// mirror and an
apt that has no sources, so no network is used for that part."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.packaging.conftest import REPO

SCRIPT = REPO / "scripts" / "build-kheaders.py"
pytestmark = pytest.mark.slow


def kheaders(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=600, env={**os.environ, **(env or {})})


def manifest(arch: str) -> tuple[dict, list[str]]:
    head, files = {}, []
    for line in (REPO / "packaging" / f"kheaders-{arch}.manifest").read_text().splitlines():
        if line.startswith("# deb: "):
            name, pool, digest = line[7:].split()
            head[name] = (pool, digest)
        elif line and not line.startswith("#"):
            files.append(line.split()[1])
    return head, files


@pytest.fixture(scope="module")
def arm64_set(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("kh") / "arm64"
    r = kheaders("build", "--arch", "arm64", str(dest))
    if r.returncode != 0 and "neither installed nor downloadable" in r.stderr:
        pytest.skip(f"the pinned arm64 headers cannot be fetched here: {r.stderr[-300:]}")
    assert r.returncode == 0, r.stderr
    return dest


def test_arm64_set_is_aarch64_headers_matching_its_manifest(arm64_set: Path):
    meta = json.loads((arm64_set / "metadata.json").read_text())
    assert (meta["arch"], meta["machine"]) == ("arm64", "aarch64")
    assert meta["packages"][0].startswith("linux-headers-") and "-arm64 " in meta["packages"][0]
    files = sorted(str(p.relative_to(arm64_set)) for p in arm64_set.rglob("*")
                   if p.is_file() and p.name != "metadata.json")
    assert files == sorted(manifest("arm64")[1])
    assert any(f.startswith("arch/arm64/include/") for f in files)
    assert not any(f.startswith("arch/x86/") for f in files)
    assert "GPL-2.0" in meta["license"] and meta["source"].startswith("https://snapshot.debian.org/")
    r = kheaders("check", str(arm64_set))
    assert r.returncode == 0, r.stderr


def test_a_set_for_one_arch_is_not_the_other_archs(arm64_set: Path, tmp_path: Path):
    """check reads the arch from the set: an arm64 set relabelled amd64 fails."""
    other = tmp_path / "relabelled"
    shutil.copytree(arm64_set, other)
    meta = json.loads((other / "metadata.json").read_text())
    (other / "metadata.json").write_text(json.dumps({**meta, "arch": "amd64"}))
    r = kheaders("check", str(other))
    assert r.returncode != 0 and "another manifest" in r.stderr


def _mirror_with(tmp_path: Path, cache: Path, arch: str, tamper: bool = False) -> Path:
    """A file:// Debian mirror holding the pinned .debs at their pool paths."""
    mirror = tmp_path / "mirror"
    for name, (pool, _digest) in manifest(arch)[0].items():
        found = list(cache.glob(f"{name}_*.deb"))
        if not found:          # -common is taken from /usr/src where it is installed
            continue
        src = found[0]
        dst = mirror / pool
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        if tamper:
            with open(dst, "r+b") as f:
                f.seek(4096)
                byte = f.read(1)
                f.seek(4096)
                f.write(bytes([byte[0] ^ 0xFF]))
    return mirror


@pytest.mark.parametrize("tamper", [False, True], ids=["pinned", "tampered"])
def test_without_debian_apt_the_pinned_deb_comes_from_a_mirror_pool(arm64_set, tmp_path, tamper):
    """No usable apt (its sources are empty) and an empty download cache: the .debs come from
    GPU_DOCTOR_DEBIAN_MIRRORS by the pool path the manifest pins, and one whose sha256 is not
    the pinned one is refused."""
    default_cache = Path(os.environ.get("GPU_DOCTOR_CACHE", "/var/cache/gpu-doctor"))
    cache = default_cache / "kheaders-debs"
    arm64_deb = [Path(pool).name for name, (pool, _) in manifest("arm64")[0].items()
                 if name.endswith("-arm64")]
    if not arm64_deb or not (cache / arm64_deb[0]).is_file():
        pytest.skip(f"the pinned arm64 .deb is not in {cache}")
    mirror = _mirror_with(tmp_path, cache, "arm64", tamper)
    apt_conf = tmp_path / "apt.conf"          # an apt with no sources at all
    (tmp_path / "sources.list.d").mkdir()
    apt_conf.write_text(f'Dir::Etc::sourcelist "{tmp_path}/none.list";\n'
                        f'Dir::Etc::sourceparts "{tmp_path}/sources.list.d";\n')
    env = {"GPU_DOCTOR_CACHE": str(tmp_path / "empty-cache"), "APT_CONFIG": str(apt_conf),
           "GPU_DOCTOR_DEBIAN_MIRRORS": f"file://{mirror}"}
    dest = tmp_path / "set"
    r = kheaders("build", "--arch", "arm64", str(dest), env=env)
    if tamper:
        assert r.returncode != 0 and "is not the pinned" in r.stderr, r.stderr
        assert not dest.exists()
        return
    assert r.returncode == 0, r.stderr
    assert kheaders("check", str(dest)).returncode == 0
    fetched = [p.name for p in (tmp_path / "empty-cache/kheaders-debs").glob("*.deb")]
    assert arm64_deb[0] in fetched       # from the mirror's pool, into the download cache

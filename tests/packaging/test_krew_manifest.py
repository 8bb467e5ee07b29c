"""The krew manifest against krew's rules (tests/packaging/krew_rules.py), the template as
committed and the manifest scripts/fill-krew-manifest.py fills from a real built archive."""
from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import yaml

from node_probe import __version__
from tests.packaging import krew_rules
from tests.packaging.conftest import REPO

TEMPLATE = REPO / "krew-manifest.yaml"
FILL = REPO / "scripts" / "fill-krew-manifest.py"
WANTED_PLATFORMS = {("linux", "amd64"), ("linux", "arm64"), ("darwin", "amd64"), ("darwin", "arm64")}


def template() -> dict:
    return yaml.safe_load(TEMPLATE.read_text())


def fill(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(FILL), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def test_template_follows_krew_rules():
    plugin = template()
    assert krew_rules.structural_errors(plugin, "gpu-doctor.yaml", filled=False) == []
    assert krew_rules.long_lines(plugin) == []


def test_template_version_is_the_project_version():
    assert template()["spec"]["version"] == f"v{__version__}"


def test_template_lists_linux_and_darwin_on_amd64_and_arm64():
    labels = {(p["selector"]["matchLabels"]["os"], p["selector"]["matchLabels"]["arch"])
              for p in template()["spec"]["platforms"]}
    assert labels == WANTED_PLATFORMS


def test_every_platform_installs_the_binary_and_the_license():
    assert (REPO / "LICENSE").read_text().lstrip().startswith("Apache License")
    for p in template()["spec"]["platforms"]:
        assert p["bin"] == "kubectl-gpu_doctor"  # kubectl maps `gpu-doctor` to kubectl-gpu_doctor
        assert {"from": "LICENSE", "to": "."} in p["files"]
        assert {"from": "kubectl-gpu_doctor", "to": "."} in p["files"]


def test_rules_catch_what_krew_rejects():
    """The checker itself must fail on the mistakes krew rejects (else the tests above prove nothing)."""
    bad = template()
    bad["metadata"]["name"] = "gpu doctor"
    bad["spec"]["version"] = "0.1.0"
    bad["spec"]["shortDescription"] = "x" * 51
    p0 = bad["spec"]["platforms"][0]
    p0["uri"], p0["sha256"] = "http://example.com/a.tar.gz", "ABC"
    p0["selector"]["matchLabels"]["distro"] = "debian"
    bad["spec"]["platforms"][1]["selector"] = {"matchLabels": {"os": "darwin"}}  # overlaps 2 and 3
    errs = "\n".join(krew_rules.structural_errors(bad, "gpu-doctor.yaml", filled=True))
    for needle in ("metadata.name", "not v-prefixed", "51 chars", "not https", "64 lowercase hex",
                   "'distro'", "overlap on darwin/amd64"):
        assert needle in errs


def test_filled_manifest_from_the_built_archive(plugin_archive: Path, unpacked_plugin: Path, tmp_path: Path):
    out = tmp_path / "gpu-doctor.yaml"
    dist = tmp_path / "dist"  # only the archive built here, whatever else dist/ holds
    dist.mkdir()
    os.link(plugin_archive, dist / plugin_archive.name)
    r = fill("--allow-missing", "--dist", str(dist), "--out", str(out))
    assert r.returncode == 0, r.stderr
    # the platforms that cannot be built on this machine are left out and named, never faked
    for missing in ("linux/arm64", "darwin/amd64", "darwin/arm64"):
        assert missing in r.stderr
    plugin = yaml.safe_load(out.read_text())
    assert krew_rules.structural_errors(plugin, out.name, filled=True) == []
    [platform] = plugin["spec"]["platforms"]
    assert platform["selector"]["matchLabels"] == {"os": "linux", "arch": "amd64"}
    assert platform["sha256"] == hashlib.sha256(plugin_archive.read_bytes()).hexdigest()
    assert platform["uri"] == (f"https://github.com/gpu-doctor/kubectl-gpu-doctor/releases/download/"
                               f"v{__version__}/{plugin_archive.name}")
    # what `kubectl krew install` does with the archive: apply files[], find bin and a LICENSE
    dest = tmp_path / "store" / "gpu-doctor" / plugin["spec"]["version"]
    binary = krew_rules.install_platform(unpacked_plugin, platform, dest)
    assert binary.stat().st_mode & 0o111
    assert dest / "LICENSE" in krew_rules.installed_license(dest)
    assert (dest / "LICENSE").read_bytes() == (REPO / "LICENSE").read_bytes()


def test_fill_refuses_missing_platforms_without_allow_missing(plugin_archive: Path, tmp_path: Path):
    dist = tmp_path / "dist"
    dist.mkdir()
    os.link(plugin_archive, dist / plugin_archive.name)
    r = fill("--dist", str(dist), "--out", str(tmp_path / "gpu-doctor.yaml"))
    assert r.returncode != 0
    assert "darwin/arm64" in r.stderr and not (tmp_path / "gpu-doctor.yaml").exists()


def test_fill_rejects_an_archive_without_the_binary(tmp_path: Path):
    dist = tmp_path / "dist"
    dist.mkdir()
    with tarfile.open(dist / f"kubectl-gpu_doctor-{__version__}-linux-amd64.tar.gz", "w:gz") as tar:
        data = (REPO / "LICENSE").read_bytes()
        info = tarfile.TarInfo("LICENSE")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    r = fill("--allow-missing", "--dist", str(dist), "--out", str(tmp_path / "gpu-doctor.yaml"))
    assert r.returncode != 0
    assert "bin 'kubectl-gpu_doctor' is not in the archive" in r.stderr


def test_fill_rejects_a_plain_http_base_url(tmp_path: Path):
    r = fill("--allow-missing", "--base-url", "http://example.com", "--out", str(tmp_path / "x.yaml"))
    assert r.returncode != 0 and "https" in r.stderr


def test_caveats_warn_about_the_privileged_pod_rbac_and_air_gap():
    caveats = template()["spec"]["caveats"]
    for needle in ("privileged", "nodes/proxy", "--image", "gpu-doctor-probe:<plugin version>",
                   "kubectl gpu-doctor rbac | kubectl apply -f -"):
        assert needle in caveats


def test_caveats_say_what_the_code_does_and_name_what_a_krew_user_has():
    """What users read at install time matches the pod spec and the RBAC the code uses: no
    host network (the spec says hostNetwork: false), nodes/proxy only as the opt-in it is, and
    no repository path (a krew install has no deploy/: the plugin prints its manifests)."""
    from kubectl_gpudoctor.commands import rbac
    from kubectl_gpudoctor.reach import podspec
    caveats = " ".join(template()["spec"]["caveats"].split())
    spec = podspec.node_pod_spec("img", ["true"])
    assert "hostNetwork" not in caveats and "no host network" in caveats
    assert spec["hostNetwork"] is False and spec["hostPID"] is True and "hostPID" in caveats
    assert "deploy/" not in caveats
    assert "Opt-in" in caveats and "nodes/proxy" in caveats
    base = rbac.manifest_text("base")
    assert "nodes/proxy" not in "".join(l for l in base.splitlines() if not l.startswith("#"))
    for part in ("nodes-proxy", "agent"):
        assert f"kubectl gpu-doctor rbac {part}" in caveats

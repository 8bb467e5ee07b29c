"""`kubectl gpu-doctor rbac` prints the manifests from the installed plugin, not from a checkout:
the packaged files are the repository's deploy/ files byte for byte, a wheel carries them as
files (kubectl_gpudoctor/manifests/ holds symlinks to deploy/), and `rbac | kubectl apply -f -`
gets valid objects."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from kubectl_gpudoctor.commands import rbac
from tests.kubectl.conftest import run_cli
from tests.packaging.conftest import REPO


@pytest.mark.parametrize("part", rbac.PARTS)
def test_packaged_manifest_is_the_deploy_file(part):
    assert rbac.manifest_text(part) == (REPO / "deploy" / rbac.FILES[part]).read_text()


def test_every_deploy_manifest_is_packaged():
    assert {p.name for p in (REPO / "deploy").glob("*.yaml")} == set(rbac.FILES.values())


def test_rbac_prints_base_by_default_and_valid_objects_for_all():
    r = run_cli("rbac")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == rbac.manifest_text("base").strip()
    r = run_cli("rbac", "all")
    docs = [d for d in yaml.safe_load_all(r.stdout) if d]
    kinds = {d["kind"] for d in docs}
    assert {"Namespace", "ClusterRole", "Role", "ValidatingAdmissionPolicy"} <= kinds
    for d in docs:
        kubernetes_validate.validate(d, kubernetes_validate.latest_version(), strict=True)
    r = run_cli("rbac", "nodes-proxy")
    assert [d["metadata"]["name"] for d in yaml.safe_load_all(r.stdout) if d][0] == \
        "gpu-doctor-nodes-proxy"
    assert run_cli("rbac", "everything").returncode == 2


def test_a_wheel_carries_the_manifests_as_files(tmp_path: Path):
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        "--no-build-isolation", "-w", str(tmp_path), str(REPO)],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    [wheel] = tmp_path.glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        for part, name in rbac.FILES.items():
            data = z.read(f"kubectl_gpudoctor/manifests/{name}").decode()
            assert data == rbac.manifest_text(part)


def _names(text: str) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(text) if d}


def test_all_never_grants_an_opt_in():
    """E-02 (round-4 audit): `rbac all | kubectl apply -f -` put the nodes-proxy ClusterRole and
    its binding (exec-equivalent on every kubelet, by its own comment) and the agent's exec Role
    in the cluster. `all` is base and the admission policy; an opt-in comes only when named."""
    everything = _names(run_cli("rbac", "all").stdout)
    for opt in rbac.OPT_IN:
        assert not _names(rbac.manifest_text(opt)) & everything, opt
    assert not any("nodes/proxy" in str(d) for d in yaml.safe_load_all(run_cli("rbac", "all")
                                                                       .stdout))
    assert everything == _names(rbac.manifest_text("base")) | \
        _names(rbac.manifest_text("admission-policy"))
    r = run_cli("rbac", "nodes-proxy", "all")
    assert r.stdout.startswith(rbac.manifest_text("base").strip("\n"))   # base first
    assert _names(r.stdout) == everything | _names(rbac.manifest_text("nodes-proxy"))


def test_rbac_help_says_what_all_is_and_how_to_get_an_opt_in():
    r = run_cli("rbac", "--help")
    text = " ".join(r.stdout.split())
    assert "all (base and admission-policy, never an opt-in" in text
    assert "rbac all nodes-proxy" in text

"""Release as code: the workflows are valid GitHub workflows that run the project's own scripts,
and every step this machine can run is run here for real: the image pushed to a registry (a real
`docker-registry` on 127.0.0.1) as a multi-arch index, its digest baked into a plugin build, the
krew manifest filled from that archive and installed as krew installs it, and the installed
plugin reporting the pinned image. macOS archives and the GitHub release itself need GitHub."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from kubectl_gpudoctor import build_info
from node_probe.protocol.version import __version__
from tests.packaging import krew_rules
from tests.packaging.conftest import REPO, run_script

WORKFLOWS = REPO / ".github" / "workflows"
DIGEST = "sha256:" + hashlib.sha256(b"gpu-doctor test").hexdigest()


def check_jsonschema(*paths: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("check-jsonschema")
    if not exe.exists():
        pytest.fail("check-jsonschema is a test dependency (pyproject [test]); run scripts/setup.sh")
    return subprocess.run([str(exe), "--builtin-schema", "vendor.github-workflows", *map(str, paths)],
                          capture_output=True, text=True, timeout=120)


def workflow(name: str) -> dict:
    doc = yaml.safe_load((WORKFLOWS / name).read_text())
    doc["on"] = doc.pop(True, doc.get("on"))  # YAML 1.1 reads the key `on` as True
    return doc


def run_lines(job: dict) -> str:
    return "\n".join(step.get("run", "") for step in job["steps"])


# --- the workflows ------------------------------------------------------------------------------

def test_workflows_validate_against_the_github_workflow_schema():
    r = check_jsonschema(*sorted(WORKFLOWS.glob("*.yml")))
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_schema_check_rejects_a_broken_workflow(tmp_path: Path):
    broken = workflow("release.yml")
    broken["jobs"]["plugin"]["runs-on"] = {"not": "a runner"}
    broken["jobs"]["check"]["steps"][0] = {"uses": "actions/checkout@v4", "run": "both is invalid"}
    path = tmp_path / "broken.yml"
    path.write_text(yaml.safe_dump(broken))
    r = check_jsonschema(path)
    assert r.returncode != 0


def test_release_runs_on_v_tags_and_builds_every_krew_platform_natively():
    wf = workflow("release.yml")
    assert wf["on"] == {"push": {"tags": ["v*"]}}
    matrix = wf["jobs"]["plugin"]["strategy"]["matrix"]["include"]
    built = {(m["os"], m["arch"]) for m in matrix}
    manifest = yaml.safe_load((REPO / "krew-manifest.yaml").read_text())
    wanted = {(p["selector"]["matchLabels"]["os"], p["selector"]["matchLabels"]["arch"])
              for p in manifest["spec"]["platforms"]}
    assert built == wanted
    runners = {(m["os"], m["arch"]): m["runner"] for m in matrix}
    assert runners[("darwin", "arm64")].startswith("macos") and runners[("darwin", "amd64")].startswith("macos")
    assert "arm" in runners[("linux", "arm64")]  # native, not qemu


def test_release_uses_the_project_scripts_and_pins_the_image_it_pushed():
    jobs = workflow("release.yml")["jobs"]
    image = run_lines(jobs["image"])
    assert "scripts/build-image.sh" in image and "GPU_DOCTOR_ARCH=arm64" in image
    assert "scripts/push-image.sh" in image and "reference=$ref" in image
    plugin = jobs["plugin"]
    assert plugin["needs"] == ["check", "image"]
    build = next(s for s in plugin["steps"] if "scripts/build-plugin.sh" in s.get("run", ""))
    assert build["env"]["GPU_DOCTOR_PROBE_IMAGE"] == "${{ needs.image.outputs.reference }}"
    publish = jobs["publish"]
    text = run_lines(publish)
    assert "scripts/fill-krew-manifest.py" in text and "--allow-missing" not in text
    assert "gh release create" in text and "SHA256SUMS" in text
    steps = [s.get("uses", "") for s in publish["steps"]]
    assert steps[-1].startswith("rajatjindal/krew-release-bot@")  # after the release exists
    assert "contents: write" not in yaml.safe_dump(jobs["plugin"])  # only publish may write


def test_ci_workflow_runs_what_ci_runs():
    wf = workflow("ci.yml")
    assert "pull_request" in wf["on"]
    assert "bash .ci/run" in run_lines(wf["jobs"]["test"])
    assert "scripts/test.sh" in (REPO / ".ci" / "run").read_text()


# --- krew-release-bot's template ----------------------------------------------------------------

def bot_render(template: str, tag: str, dist: Path) -> dict:
    """What krew-release-bot does with .krew.yaml for a tag (its Go template functions, for the
    forms our template uses): TagName, and addURIAndSha downloading the asset to hash it."""
    version = tag[1:]

    def add_uri_and_sha(m: re.Match) -> str:
        url = m.group("fmt").replace("%s", tag, 1).replace("%s", version, 1)
        asset = dist / url.rsplit("/", 1)[1]
        if not asset.exists():
            return ""  # the platform's asset was not built here: drop it below
        sha = hashlib.sha256(asset.read_bytes()).hexdigest()
        pad = " " * int(m.group("indent"))
        return f"{pad}uri: {url}\n{pad}sha256: {sha}"

    text = template.replace('"{{ .TagName }}"', tag)
    text = re.sub(r'\{\{ addURIAndSha \(printf "(?P<fmt>[^"]+)" \.TagName \(trimPrefix "v" \.TagName\)\) '
                  r'\.TagName \| indent (?P<indent>\d+) \}\}', add_uri_and_sha, text)
    assert "{{" not in text, "a template action the emulation does not know"
    doc = yaml.safe_load(text)
    doc["spec"]["platforms"] = [p for p in doc["spec"]["platforms"] if "uri" in p]
    return doc


def test_bot_template_is_generated_from_the_manifest():
    r = subprocess.run([sys.executable, "scripts/fill-krew-manifest.py", "--bot-template"], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (REPO / ".krew.yaml").read_text() == r.stdout, \
        "regenerate: python3 scripts/fill-krew-manifest.py --bot-template > .krew.yaml"


def test_bot_template_renders_to_the_manifest_fill_writes(plugin_archive: Path, tmp_path: Path):
    dist = tmp_path / "dist"
    dist.mkdir()
    os.link(plugin_archive, dist / plugin_archive.name)
    out = tmp_path / "gpu-doctor.yaml"
    r = subprocess.run([sys.executable, "scripts/fill-krew-manifest.py", "--allow-missing", "--dist", str(dist),
                        "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    filled = yaml.safe_load(out.read_text())
    rendered = bot_render((REPO / ".krew.yaml").read_text(), f"v{__version__}", dist)
    assert rendered == filled
    assert krew_rules.structural_errors(rendered, "gpu-doctor.yaml", filled=True) == []


# --- the pinned default image -------------------------------------------------------------------

def test_pinned_references_parse_and_tags_alone_are_refused():
    ref = f"ghcr.io/gpu-doctor/gpu-doctor-probe:{__version__}@{DIGEST}"
    img = build_info.parse_pinned(ref)
    assert (img.reference, img.tag, img.digest, img.pinned) == (ref, __version__, DIGEST, True)
    local = build_info.parse_pinned(f"127.0.0.1:5000/gpu-doctor/probe@{DIGEST}")
    assert local.digest == DIGEST
    for bad in (f"ghcr.io/gpu-doctor/gpu-doctor-probe:{__version__}", f"repo@sha256:{'A' * 64}",
                f"repo@sha256:{'a' * 63}", "repo@sha512:" + "a" * 128, f"Repo/x@{DIGEST}", ""):
        with pytest.raises(ValueError):
            build_info.parse_pinned(bad)


def test_source_builds_say_they_are_not_pinned_and_release_builds_are(tmp_path: Path):
    unpinned = build_info.probe_image(tmp_path)
    assert unpinned.reference == f"{build_info.DEFAULT_IMAGE_REPO}:{__version__}" and not unpinned.pinned
    assert "not pinned" in unpinned.describe()
    ref = f"{build_info.DEFAULT_IMAGE_REPO}:{__version__}@{DIGEST}"
    (tmp_path / build_info.BUILD_INFO_FILE).write_text(json.dumps({"probe_image": ref}))
    pinned = build_info.probe_image(tmp_path)
    assert pinned.reference == ref and DIGEST in pinned.describe()
    (tmp_path / build_info.BUILD_INFO_FILE).write_text(json.dumps({"probe_image": "repo:latest"}))
    with pytest.raises(build_info.BuildInfoError):
        build_info.probe_image(tmp_path)


@pytest.mark.parametrize("content", [b"{not json", b'{"other": 1}', b"\xff\xfe", b'{"probe_image": "repo:latest"}'])
def test_a_broken_build_info_is_one_line_and_exit_70(tmp_path: Path, capsys, content: bytes):
    (tmp_path / build_info.BUILD_INFO_FILE).write_bytes(content)
    with pytest.raises(SystemExit) as exc:
        build_info._default(tmp_path)
    assert exc.value.code == 70
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "broken" in err and "Traceback" not in err


@pytest.mark.slow
def test_build_plugin_refuses_a_reference_without_digest(plugin_archive: Path):
    r = subprocess.run(["bash", "scripts/build-plugin.sh"], cwd=REPO, capture_output=True, text=True,
                       timeout=300, env={**os.environ, "GPU_DOCTOR_PROBE_IMAGE": "ghcr.io/x/y:latest"})
    assert r.returncode == 2 and "pinned by digest" in r.stderr


# --- the release, dry run: registry, push, pinned build, manifest, install ------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def registry(tmp_path: Path):
    """A real OCI distribution registry (Debian's docker-registry) on 127.0.0.1, plain HTTP."""
    exe = shutil.which("docker-registry")
    if exe is None:
        pytest.fail("docker-registry is missing: scripts/setup.sh installs it for the tests")
    port = free_port()
    cfg = tmp_path / "registry.yml"
    cfg.write_text(yaml.safe_dump({"version": 0.1, "log": {"level": "error"},
                                   "storage": {"filesystem": {"rootdirectory": str(tmp_path / "store")}},
                                   "http": {"addr": f"127.0.0.1:{port}"}}))
    proc = subprocess.Popen([exe, "serve", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"docker-registry did not start: {proc.stderr.read().decode()[-500:]}")
                time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.slow
@pytest.mark.image
@pytest.mark.root
def test_release_dry_run_pushes_pins_fills_and_installs(probe_image_archive: Path, registry: str, tmp_path: Path):
    repo = f"{registry}/gpu-doctor/gpu-doctor-probe"
    env = {**os.environ, "GPU_DOCTOR_TLS_VERIFY": "false"}
    r = subprocess.run(["bash", "scripts/push-image.sh", repo, str(probe_image_archive)], cwd=REPO,
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    ref = r.stdout.strip().splitlines()[-1]
    pinned = build_info.parse_pinned(ref)
    assert pinned.tag == __version__
    # the registry serves that digest: an index whose amd64 entry is the archive's own manifest
    raw = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{repo}@{pinned.digest}"],
                         capture_output=True, timeout=120)
    assert raw.returncode == 0, raw.stderr
    assert "sha256:" + hashlib.sha256(raw.stdout).hexdigest() == pinned.digest
    index = json.loads(raw.stdout)
    archive_digest = subprocess.run(["skopeo", "inspect", "--format", "{{.Digest}}", f"oci-archive:{probe_image_archive}"],
                                    capture_output=True, text=True, timeout=120).stdout.strip()
    assert [(m["digest"], m["platform"]["architecture"]) for m in index["manifests"]] == [(archive_digest, "amd64")]

    # the plugin built with that reference baked in
    dist = tmp_path / "dist"
    archive = Path(run_script(["env", f"GPU_DOCTOR_PROBE_IMAGE={ref}", f"GPU_DOCTOR_DIST={dist}",
                               "bash", "scripts/build-plugin.sh"], timeout_s=900))
    archive = archive if archive.is_absolute() else REPO / archive
    assert archive.parent == dist
    out = tmp_path / "gpu-doctor.yaml"
    r = subprocess.run([sys.executable, "scripts/fill-krew-manifest.py", "--allow-missing", "--dist", str(dist),
                        "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    manifest = yaml.safe_load(out.read_text())
    assert krew_rules.structural_errors(manifest, out.name, filled=True) == []
    [platform] = manifest["spec"]["platforms"]

    # `kubectl krew install --manifest=gpu-doctor.yaml --archive=<archive>`: krew checks the sha256,
    # unpacks, applies files[] and links bin (krew is a Go binary not packaged here: emulated)
    assert hashlib.sha256(archive.read_bytes()).hexdigest() == platform["sha256"]
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    subprocess.run(["tar", "-xzf", str(archive), "-C", str(unpacked)], check=True, timeout=120)
    store = tmp_path / "krew" / "store" / "gpu-doctor" / manifest["spec"]["version"]
    binary = krew_rules.install_platform(unpacked, platform, store)
    v = subprocess.run([str(binary), "version"], capture_output=True, text=True, timeout=60)
    assert v.returncode == 0, v.stderr
    assert ref in v.stdout and pinned.digest in v.stdout

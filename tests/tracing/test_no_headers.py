"""eBPF on a node without kernel headers: the probe's bundled header set.

The real probe runs in a private mount namespace where tmpfs hides /lib/modules and /usr/src
(the host's own links stay untouched for everyone else), so BCC has no headers for the running
kernel and /sys/kernel/kheaders.tar.xz is absent. With the set built by
scripts/build-kheaders.py from the pinned Debian packages the trace still compiles and still
catches the EPERM open and the device-rule rewrite of the eBPF scenario; without it the same
run reports probe.ebpf_unavailable (what every such node got before).
"""
from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest

from node_probe.tracing import kheaders
from tests.tracing.conftest import HIDE_HEADERS, KHEADERS_SCRIPT, REPO, events, findings
from tests.tracing.test_probe_e2e import denied_opener

SCRIPT = KHEADERS_SCRIPT


# --- the set itself (no root) ---------------------------------------------------------------
def test_built_set_matches_the_manifest_and_says_what_it_is(header_set):
    meta = json.loads((header_set / "metadata.json").read_text())
    files = [p for p in header_set.rglob("*") if p.is_file() and p.name != "metadata.json"]
    assert meta["files"] == len(files) > 50
    assert meta["bytes"] == sum(p.stat().st_size for p in files) < 5 << 20
    assert meta["kernel_version"].startswith("6.1.") and meta["machine"] == "x86_64"
    r = subprocess.run([sys.executable, str(SCRIPT), "check", str(header_set)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    hs, why = kheaders.load(header_set)
    assert hs is not None, why
    assert hs.files == meta["files"] and "Linux 6.1." in hs.describe()


def test_a_set_for_another_machine_or_without_metadata_is_not_used(header_set, tmp_path):
    other = tmp_path / "other"
    subprocess.run(["cp", "-r", str(header_set), str(other)], check=True)
    meta = json.loads((other / "metadata.json").read_text())
    (other / "metadata.json").write_text(json.dumps({**meta, "machine": "aarch64"}))
    hs, why = kheaders.load(other)
    assert hs is None and "aarch64" in why
    (other / "metadata.json").write_text("{" + " " * (kheaders.MAX_META_BYTES + 10) + "}")
    assert kheaders.load(other)[0] is None
    (other / "metadata.json").unlink()
    hs, why = kheaders.load(other)
    assert hs is None and "metadata.json" in why


# --- the real probe with the host's headers hidden (root, BCC) ------------------------------
@pytest.mark.root
@pytest.mark.bcc
@pytest.mark.slow
@pytest.mark.parametrize("bundled", [True, False], ids=["with-set", "without-set"])
def test_no_host_headers_trace_still_catches_eperm_and_rewrite(
        bcc_ready, header_set, devices_cgroup, children, probe, tmp_path, bundled):
    victim, node, _cg = denied_opener(devices_cgroup, children, tmp_path, "nohdr-victim")
    gpu = devices_cgroup("nohdr-gpu")         # a GPU container's rules: deny all, allow 195
    (gpu / "devices.deny").write_text("a")
    for rule in ("c 1:3 rwm", "c 195:* rwm"):
        (gpu / "devices.allow").write_text(rule)

    env = {kheaders.ENV: str(header_set if bundled else tmp_path / "no-set")}
    # a 4 s window: the EPERM and both writes below must all land in it on a loaded machine
    run = probe("--only", "trace", "--trace-seconds", "4", "--dev-prefix",
                str(tmp_path / "nvidia"), wrapper=HIDE_HEADERS, env=env)
    if not bundled:    # the old behaviour: no headers, no eBPF at all
        recs = run.finish(timeout=60)
        (un,) = findings(recs, "probe.ebpf_unavailable")
        assert "no kernel headers" in un["title"]
        assert recs[-1]["checks"][0]["status"] == "skipped"
        return
    attached = run.wait_attached(timeout=40)
    hdr = attached["kernel_headers"]
    assert hdr["source"] == "bundled" and hdr["path"] == str(header_set)
    assert hdr["kernel_version"].startswith("6.1.") and hdr["files"] > 50
    assert "bundled Linux 6.1." in attached["message"]
    victim.send()
    assert victim.expect("errno") == f"errno {errno.EPERM}"
    w = subprocess.Popen(["sh", "-c", f"echo a > {gpu}/devices.deny; "
                                      f"echo 'c 1:3 rwm' > {gpu}/devices.allow"])
    assert w.wait(10) == 0
    recs = run.finish(timeout=60)

    assert not findings(recs, "probe.ebpf_unavailable")
    assert [c["status"] for c in recs[-1]["checks"] if c["id"] == "trace"] == ["ok"]
    (eperm,) = [f for f in findings(recs, "container.nvidia_eperm")
                if f["evidence"]["pid"] == victim.proc.pid]
    assert eperm["evidence"]["errno"] == errno.EPERM
    assert eperm["evidence"]["devices"][0]["path"] == str(node)
    rewritten = {f["evidence"]["cgroup"]: f for f in findings(recs, "cgroup.device_rules_rewritten")}
    ev = rewritten["/" + gpu.name]["evidence"]
    assert ev["writers"] == [{"pid": w.pid, "comm": "sh"}]
    assert [(x["which"], x["text"]) for x in ev["writes"]] == [("deny", "a"), ("allow", "c 1:3 rwm")]
    assert victim.proc.pid in [e["data"]["pid"] for e in events(recs, "nvidia.open_denied")]


@pytest.mark.root
@pytest.mark.bcc
@pytest.mark.slow
@pytest.mark.parametrize("arch", ["amd64", "arm64"])
def test_manifest_lists_exactly_what_a_compile_opens(bcc_ready, tmp_path, arch):
    """Re-trace the compile against the pinned headers: the committed manifest must be what it
    opens now (an #include added to bpf/ without re-tracing fails here). arm64's is traced
    with BCC's own cross switch (ARCH=arm64: clang's aarch64 target, arch/arm64 includes),
    from the pinned Debian arm64 package (downloaded once into the build cache)."""
    manifest = REPO / "packaging" / f"kheaders-{arch}.manifest"
    head = manifest.read_text()
    abi = next(line.split(":", 1)[1].strip() for line in head.splitlines()
               if line.startswith("# abi:"))
    if not Path(f"/usr/src/linux-headers-{abi}-common").is_dir():
        pytest.skip(f"linux-headers-{abi} is not installed here")
    out = tmp_path / "manifest"
    r = subprocess.run([sys.executable, str(SCRIPT), "trace", "--abi", abi, "--arch", arch,
                        "--python", sys.executable, "--output", str(out)],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0 and "neither installed nor downloadable" in r.stderr:
        pytest.skip(f"the pinned {arch} headers cannot be fetched here: {r.stderr[-300:]}")
    assert r.returncode == 0, r.stderr
    assert out.read_text() == head

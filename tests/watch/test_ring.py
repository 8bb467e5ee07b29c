"""The evidence ring: bounds by count and bytes, 0600 files, no symlink followed, and a flapping
fault through the real capture stays within the bounds."""
from __future__ import annotations

import json
import os
import stat
import time

import pytest

from node_probe.watch.capture import Capturer
from node_probe.watch.ring import Ring, RingError
from node_probe.watch.state import ConditionState, Problem


def _doc(size):
    return {"schema": "gpu-doctor-bundle/v1", "pad": "x" * size}


def test_count_and_bytes_bounds_drop_the_oldest(tmp_path):
    r = Ring(tmp_path / "ev", max_count=3, max_bytes=10_000)
    names = [r.add(_doc(100), "GpuDoctorXidErrors") for _ in range(5)]
    assert [e["name"] for e in r.entries()] == names[2:]
    big = r.add(_doc(4000), "GpuDoctorGpuLost")
    r.add(_doc(4000), "GpuDoctorGpuLost")
    es = r.entries()
    assert sum(e["bytes"] for e in es) <= 10_000 and len(es) <= 3
    assert big in [e["name"] for e in es]
    assert r.add(_doc(20_000), "X") is None  # larger than the ring: not kept
    st = os.stat(tmp_path / "ev")
    assert stat.S_IMODE(st.st_mode) == 0o700
    for e in es:
        assert stat.S_IMODE(os.stat(tmp_path / "ev" / e["name"]).st_mode) == 0o600


def test_symlinks_are_never_followed(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(RingError, match="symlink"):
        Ring(tmp_path / "link").entries()
    r = Ring(tmp_path / "ev")
    r.add(_doc(10), "A")
    secret = tmp_path / "secret"
    secret.write_text("do not read")
    planted = "bundle-9999999999999-001-Planted.json"
    os.symlink(secret, tmp_path / "ev" / planted)
    assert planted not in [e["name"] for e in r.entries()]
    with pytest.raises(RingError):
        r.read(planted, 1000)
    with pytest.raises(RingError, match="not a bundle name"):
        r.read("../secret", 1000)
    os.mkfifo(tmp_path / "ev" / "bundle-9999999999998-001-Fifo.json")
    with pytest.raises(RingError, match="not a regular file"):
        r.read("bundle-9999999999998-001-Fifo.json", 1000)  # no open that blocks


def test_a_flapping_fault_stays_within_the_bounds(tmp_path, monkeypatch):
    """A fault that comes and goes every pass, with no gap between captures: real captures
    (the probe in a child, kernel log only) keep at most max_count bundles and max_bytes."""
    kmsg = tmp_path / "kmsg.txt"
    kmsg.write_text("[ 10.0] NVRM: Xid (PCI:0000:3b:00): 95, pid=1, Uncontained ECC error\n")
    ring = Ring(tmp_path / "ev", max_count=3, max_bytes=200_000)
    cap = Capturer(ring, ["--only", "kmsg", "--kmsg-file", str(kmsg), "--trace-seconds", "0",
                          "--timeout", "10"], 30.0, "node-a", min_gap_s=0.0)
    state = ConditionState(clear_after=1)
    p = Problem("GpuDoctorXidErrors", "gpu.xid", "critical", "pci 0000:3b:00", "Xid 95")
    started = 0
    for i in range(16):
        for t in state.update({"GpuDoctorXidErrors": [p]} if i % 2 == 0 else {}):
            if t.status == "True":
                cap.wait(60)
                started += cap.trigger(t.ctype, {"findings": ["gpu.xid"]})
        es = ring.entries()
        assert len(es) <= 3 and sum(e["bytes"] for e in es) <= 200_000
    cap.wait(60)
    assert started == 8 and cap.captured == 8
    es = ring.entries()
    assert len(es) == 3
    doc = json.loads(ring.read(es[-1]["name"], 1 << 20))
    assert doc["schema"] == "gpu-doctor-bundle/v1"
    assert [f["id"] for f in doc["report"]["findings"]] == ["gpu.xid"]
    assert doc["agent"]["findings"] == ["gpu.xid"]


def test_min_gap_limits_captures_per_class(tmp_path):
    ring = Ring(tmp_path / "ev")
    cap = Capturer(ring, ["--only", "kmsg", "--kmsg-file", str(tmp_path / "none"),
                          "--trace-seconds", "0"], 30.0, "n", min_gap_s=3600)
    assert cap.trigger("GpuDoctorXidErrors", {})
    cap.wait(60)
    assert not cap.trigger("GpuDoctorXidErrors", {})
    assert cap.trigger("GpuDoctorGpuLost", {})
    cap.wait(60)
    assert cap.skipped == 1 and len(ring.entries()) == 2


def test_a_capture_in_flight_is_killed_with_its_process_group(tmp_path):
    ring = Ring(tmp_path / "ev")
    cap = Capturer(ring, ["--only", "memory", "--trace-seconds", "60", "--timeout", "90"],
                   120.0, "n", min_gap_s=0)
    assert cap.trigger("GpuDoctorMemoryThrash", {})
    deadline = time.monotonic() + 30
    while cap._proc is None and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = cap._proc.pid
    time.sleep(1.0)
    cap.kill()
    cap.wait(30)
    assert not cap.busy and cap._proc.poll() is not None
    assert not os.path.exists(f"/proc/{pid}/stat") or \
        open(f"/proc/{pid}/stat").read().split(")")[1].split()[0] == "Z"
    (e,) = ring.entries()
    doc = json.loads(ring.read(e["name"], 1 << 20))
    assert doc["report"]["incomplete_reason"]  # kept, and says it is incomplete


FULL_DISK = r"""
import json, os, sys
from node_probe.watch.ring import Ring
d = sys.argv[1]
doc = {"schema": "gpu-doctor-bundle/v1", "pad": "x" * 30000}
ring = Ring(os.path.join(d, "ev"), max_count=20)
failed = 0
for _ in range(40):
    try:
        ring.add(doc, "GpuDoctorXidErrors")
    except OSError as exc:
        failed += 1
        err = exc.errno
left = lambda: [n for n in os.listdir(os.path.join(d, "ev")) if n.startswith(".tmp-")]
out = {"failed": failed, "errno": err if failed else None, "tmp_after_fail": len(left())}
# a crash mid-write (the agent killed) leaves one; the next agent's sweep removes it
open(os.path.join(d, "ev", ".tmp-bundle-0000000000000-001-X.json"), "w").write("half")
out["swept"] = Ring(os.path.join(d, "ev")).sweep()
out["tmp_after_sweep"] = len(left())
print(json.dumps(out))
"""


def test_a_full_disk_leaves_no_temporary_files(tmp_path):
    """W-13 (security round 4, w02_ring.py): on a full disk (a 256 KiB tmpfs, in a private
    mount namespace) every failed write left its `.tmp-bundle-*` file, and nothing ever removed
    them. Now a failed write unlinks its own, and the start-up sweep removes a crash's."""
    import subprocess
    import sys
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = tmp_path / "full.py"
    script.write_text(FULL_DISK)
    d = tmp_path / "mnt"
    d.mkdir()
    r = subprocess.run(["unshare", "-m", "sh", "-c",
                        f"mount -t tmpfs -o size=256k none {d} && "
                        f"{sys.executable} {script} {d}"],
                       capture_output=True, text=True, timeout=120, cwd=repo,
                       env={**os.environ, "PYTHONPATH": repo})
    if r.returncode != 0 and "mount" in r.stderr:
        pytest.skip(f"no private mount namespace here: {r.stderr.strip()[:200]}")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["failed"] > 0 and out["errno"] == 28       # ENOSPC, really
    assert out["tmp_after_fail"] == 0
    assert out["swept"] == 1 and out["tmp_after_sweep"] == 0

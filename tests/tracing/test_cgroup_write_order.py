"""The cgroup-rule loader joins a write to its open whichever ring is drained first.

The fd tracker's opens and the rule writes arrive on two BPF ring buffers, drained in no fixed
order. A `sh -c 'echo a > devices.deny; echo ... > devices.allow'` exits right after its last
write, so when that write is read before its open, /proc no longer names the file: the write was
reported with no path and no cgroup, and the rewrite verdict lost it (seen once in CI).
These tests feed the loader's callbacks directly, in both orders, with a /proc where the writer
is already gone.
"""
from types import SimpleNamespace

from node_probe.tracing import cgroup_devices as cd
from node_probe.tracing.loader import TraceConfig

CG = "/sys/fs/cgroup/devices/kubepods/pod1/ctr"


class _Ring:
    def event(self, data):
        return data


def _loader(tmp_path):
    emitted = []
    fds = SimpleNamespace(subscribe=lambda kinds, cb: None)
    cfg = TraceConfig(proc=tmp_path / "proc", cgroup_dir=tmp_path / "cg")
    ld = cd.CgroupDevices(cfg, lambda kind, rec: emitted.append((kind, dict(rec))), fds)
    ld.b = {b"cgdev_events": _Ring()}
    return ld, emitted


def _open(pid, ts, name, kind):
    return SimpleNamespace(pid=pid, ts=ts, dfd=cd.C.FDT_AT_FDCWD, path=f"{CG}/{name}".encode(),
                           comm=b"sh", kind=kind, ret=3)


def _write(pid, open_id, kind, text, ts):
    raw = text.encode()
    return SimpleNamespace(kind=cd.C.CGDEV_EV_WRITE, pid=pid, tid=pid, comm=b"sh", ts=ts,
                           open_id=open_id, fd=1, which=kind, len=len(raw), text=raw, ret=len(raw))


def _run(tmp_path, opens_first: bool):
    ld, emitted = _loader(tmp_path)
    deny, allow = cd.C.FDT_KIND_CG_DENY, cd.C.FDT_KIND_CG_ALLOW
    opens = [_open(77, 100, "devices.deny", deny), _open(77, 200, "devices.allow", allow)]
    writes = [_write(77, 100, deny, "a\n", 150), _write(77, 200, allow, "c 1:3 rwm\n", 250)]
    events = opens + writes if opens_first else writes + opens
    for ev in events:
        if ev in opens:
            ld._on_open(ev)
        else:
            ld._on_ring(None, ev, 0)
    out = {}
    ld.collect(out, 0)
    return out["cgroup_writes"], emitted


def test_writes_read_before_their_opens_still_name_the_cgroup(tmp_path):
    for opens_first in (True, False):
        writes, emitted = _run(tmp_path, opens_first)
        assert [(w["which"], w["text"], w["cgroup"]) for w in writes] == [
            ("deny", "a", "/kubepods/pod1/ctr"), ("allow", "c 1:3 rwm", "/kubepods/pod1/ctr")]
        assert all(w["path"].startswith(CG) and "_fd_path" not in w for w in writes)
        assert [r["which"] for kind, r in emitted if kind == "write"] == ["deny", "allow"]


def test_a_write_whose_open_never_arrives_is_reported_at_collect(tmp_path):
    ld, emitted = _loader(tmp_path)
    ld._on_ring(None, _write(78, 999, cd.C.FDT_KIND_CG_ALLOW, "c 195:* rwm", 5), 0)
    assert emitted == []            # still waiting for its open
    out = {}
    ld.collect(out, 0)
    (w,) = out["cgroup_writes"]
    assert w["path"] == "" and w["cgroup"] is None and "_fd_path" not in w
    assert [k for k, _ in emitted] == ["write"] and not ld.waiting


def test_waiting_writes_are_bounded(tmp_path):
    ld, emitted = _loader(tmp_path)
    for i in range(cd.MAX_WAITING + 10):
        ld._on_ring(None, _write(79, i + 1, cd.C.FDT_KIND_CG_ALLOW, "a", i), 0)
    assert len(ld.waiting) == cd.MAX_WAITING
    assert len(emitted) == 10        # beyond the bound: reported at once, as before

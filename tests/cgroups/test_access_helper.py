"""The access helper without BCC: it joins real cgroups (v1 devices rules deny here), one
process for many containers, refuses cgroups it must not join, and leaves nothing behind."""
import errno
import os
import signal

import pytest

from node_probe.host import cgroup_rules
from tests.cgroups.conftest import (UVM_MAJOR, deny_all_then_allow, make_host_root, new_cid,
                                    new_uid)

pytestmark = pytest.mark.root


def test_one_helper_visits_each_cgroup_and_reports_per_cgroup(v1_tree, tmp_path):
    host = make_host_root(tmp_path)
    strict = v1_tree.container(new_uid(), new_cid())
    deny_all_then_allow(strict, ["c 195:255 rw", "c *:* m"])
    loose = v1_tree.container(new_uid(), new_cid())          # default allow
    devs = [(195, 255, [host / "dev/nvidiactl"]), (UVM_MAJOR, 0, [host / "dev/nvidia-uvm"])]
    gone = v1_tree.top / "vanished"
    res = cgroup_rules.check_access_many(
        [("strict", strict, devs), ("loose", loose, devs), ("gone", gone, devs)],
        timeout_s=10, mode="open")
    assert res["strict"].errnos == {"195:255": errno.ENXIO, f"{UVM_MAJOR}:0": errno.EPERM}
    assert res["loose"].errnos == {"195:255": errno.ENXIO, f"{UVM_MAJOR}:0": errno.ENXIO}
    assert res["strict"].helper_pid == res["loose"].helper_pid      # one process
    assert not res["gone"].ok and "gone" in res["gone"].reason
    for cg in (strict, loose):
        assert (cg / "cgroup.procs").read_text() == ""


def test_frozen_v2_cgroup_is_not_joined(v2_tree, tmp_path):
    host = make_host_root(tmp_path)
    cg = v2_tree.container(new_uid(), new_cid())
    if not (cg / "cgroup.freeze").exists():
        pytest.skip("this kernel's cgroup2 has no cgroup.freeze")
    p = v2_tree.spawn(cg, {})
    (cg / "cgroup.freeze").write_text("1")
    try:
        r = cgroup_rules.check_access(cg, [(195, 255, [host / "dev/nvidiactl"])], timeout_s=5)
        assert not r.ok and "frozen" in r.reason and r.helper_pid is None
        assert [int(x) for x in (cg / "cgroup.procs").read_text().split()] == [p.pid]
    finally:
        (cg / "cgroup.freeze").write_text("0")
        os.kill(p.pid, signal.SIGKILL)


def _nsdelegate() -> bool:
    with open("/proc/self/mountinfo") as f:
        return any(" /sys/fs/cgroup/unified " in l and "nsdelegate" in l for l in f)


def test_helper_from_a_private_cgroup_namespace(v2_tree, tmp_path):
    """A debug pod on cgroup v2 runs in its own cgroup namespace; the helper enters the host's
    (pid 1's) before joining a container's cgroup. Here the probe side runs under
    `unshare --cgroup` rooted at its own child cgroup, and the helper really calls setns."""
    import json
    import subprocess
    import sys

    from tests.probe_run import REPO
    host = make_host_root(tmp_path)
    home = v2_tree.top / "probe-home"
    home.mkdir()
    target = v2_tree.container(new_uid(), new_cid())
    code = ("import json, sys\nfrom node_probe.host import cgroup_rules as c\n"
            "t = [('t', sys.argv[1], [(195, 255, [sys.argv[2]])])]\n"
            "ns = c.foreign_cgroupns(host_pid=int(sys.argv[3]))\n"
            "a = c.check_access_many(t, 10, 'open', cgroupns=ns)['t']\n"
            "n = c.check_access_many(t, 10, 'open', cgroupns=None)['t']\n"
            "print(json.dumps({'foreign': ns, 'auto': [a.errnos, a.reason, a.setns_errno],"
            " 'none': [n.errnos, n.reason]}))\n")

    def join_home():
        with open(home / "cgroup.procs", "w") as f:
            f.write(str(os.getpid()))

    out = subprocess.run(["unshare", "--cgroup", sys.executable, "-c", code, str(target),
                          str(host / "dev/nvidiactl"), str(os.getpid())],
                         preexec_fn=join_home, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    # (pid 1's namespace is not readable in this sandbox; the test process stands in for it)
    assert r["foreign"] == f"/proc/{os.getpid()}/ns/cgroup"
    assert r["auto"] == [{"195:255": errno.ENXIO}, "", None]
    if _nsdelegate():   # the kernel hides cgroups outside the namespace: ENOENT
        assert "ENOENT" in r["none"][1]

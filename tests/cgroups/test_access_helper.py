"""The access helper without BCC: it joins real cgroups (v1 devices rules deny here), one
process for many containers, refuses cgroups it must not join, and leaves nothing behind."""
import errno
import os
import signal

import pytest

from node_probe import cgroup_rules
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

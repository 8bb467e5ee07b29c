"""cgroup v1 devices.list semantics, checked against the kernel itself.

The pure tests pin down the rules; the root tests write the same rules into a real v1 devices
cgroup, read devices.list back through the parser, and compare its verdict with what open(2)
from a process inside that cgroup really gets (EPERM = denied by the cgroup; ENXIO = the
cgroup let it through to a node with no driver behind it).
"""
import errno
import os
import subprocess
import sys

import pytest

from node_probe.host.cgroup_rules import Rule, RuleSet

SEED_002_LIST = """c 1:5 rwm
c 1:3 rwm
c 1:9 rwm
c 1:8 rwm
c 5:0 rwm
c 5:1 rwm
c 195:255 rw
c 195:1 rw
c *:* m
b *:* m
c 1:7 rwm
c 136:* rwm
c 5:2 rwm
c 10:200 rwm
"""


def test_seed_002_list_denies_uvm_allows_ctl_and_its_gpu():
    rs = RuleSet.parse(SEED_002_LIST)
    assert not rs.default_allow
    assert rs.allows("c", 195, 255, "rw")
    assert rs.allows("c", 195, 1, "rw")
    assert not rs.allows("c", 195, 0, "rw")        # another container's GPU
    assert not rs.allows("c", 237, 0, "rw")        # nvidia-uvm
    assert rs.allows("c", 237, 0, "m")             # mknod is allowed by c *:* m, open is not
    assert not rs.allows("b", 195, 255, "r")       # type matters
    assert rs.allows("c", 136, 7, "rw")            # per-major wildcard


def test_allow_all_and_empty():
    assert RuleSet.parse("a *:* rwm\n").allows("c", 237, 0, "rw")
    assert RuleSet.parse("a *:* rwm\n").default_allow
    assert not RuleSet.parse("").allows("c", 1, 3, "r")


def test_one_exception_must_cover_all_requested_access():
    rs = RuleSet.parse("c 195:* r\nc 195:0 w\n")
    assert rs.allows("c", 195, 0, "r") and rs.allows("c", 195, 0, "w")
    assert not rs.allows("c", 195, 0, "rw")


@pytest.mark.parametrize("line,text", [
    ("c 195:* rw", "c 195:* rw"), ("c *:* m", "c *:* m"), ("b 7:0 mwr", "b 7:0 rwm"),
    ("a", "a *:* rwm"),
])
def test_rule_roundtrip(line, text):
    assert str(Rule.parse(line)) == text


@pytest.mark.parametrize("bad", ["x 1:2 r", "c 1:2", "c 1:2 q", "c 12 r", ""])
def test_bad_rules_rejected(bad):
    with pytest.raises(ValueError):
        Rule.parse(bad)


# -- against the kernel -------------------------------------------------------------------------

OPEN_CODE = r"""
import os, sys
flags = {"r": os.O_RDONLY, "w": os.O_WRONLY, "rw": os.O_RDWR}
for spec in sys.argv[1:]:
    path, mode = spec.rsplit("=", 1)
    try:
        os.close(os.open(path, flags[mode] | os.O_NONBLOCK | os.O_NOCTTY))
        print(0)
    except OSError as e:
        print(e.errno)
"""

CASES = [
    # (rules written after `a` to devices.deny, [(major, minor, access)])
    (["c 195:255 rw", "c 195:0 rw", "c *:* m"],
     [(195, 255, "rw"), (195, 0, "rw"), (195, 1, "rw"), (237, 0, "rw"), (237, 0, "r")]),
    (["c 195:* r", "c 195:0 w"], [(195, 0, "r"), (195, 0, "w"), (195, 0, "rw"), (195, 3, "w")]),
    (["c 237:* rwm"], [(237, 0, "rw"), (237, 1, "w"), (195, 255, "r")]),
    ([], [(195, 255, "rw")]),
]


@pytest.mark.root
@pytest.mark.parametrize("rules,probes", CASES)
def test_parser_verdict_equals_kernel_verdict(v1_tree, tmp_path, rules, probes):
    from tests.cgroups.conftest import deny_all_then_allow, need_root
    need_root()
    cg = v1_tree.container("0dbd65af-6693-11eb-994b-246e9634b5c8", "c" * 64)
    deny_all_then_allow(cg, rules)
    rs = RuleSet.parse((cg / "devices.list").read_text())
    args = []
    for ma, mi, acc in probes:
        node = tmp_path / f"n{ma}_{mi}"
        if not node.exists():
            os.mknod(node, 0o666 | 0o020000, os.makedev(ma, mi))
        args.append(f"{node}={acc}")
    procs = str(cg / "cgroup.procs")

    def join():
        with open(procs, "w") as f:
            f.write(str(os.getpid()))

    out = subprocess.run([sys.executable, "-I", "-S", "-c", OPEN_CODE, *args], env={},
                         capture_output=True, text=True, timeout=20, preexec_fn=join)
    assert out.returncode == 0, out.stderr
    got = [int(x) for x in out.stdout.split()]
    for (ma, mi, acc), e in zip(probes, got):
        assert e in (errno.EPERM, errno.ENXIO), (ma, mi, acc, e)
        kernel_allows = e != errno.EPERM
        assert rs.allows("c", ma, mi, acc) == kernel_allows, (rules, ma, mi, acc, e)

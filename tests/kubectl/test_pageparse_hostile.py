"""A page-parser child that answers garbage, or claims a 1 GiB (or 2**63-byte) answer, costs
one BrokenChild and the page is parsed in the CLI: no thread traceback, no giant allocation
(issue 21, item 8). The scenario runs in a child Python process whose peak RSS comes from the
kernel's accounting (its own VmHWM: the peak RSS of its memory since exec, without the
high-water mark a forked child inherits from pytest); the hostile 'children' are real processes answering on the pipes.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from .conftest import REPO

# what a hostile child writes back after reading one request: (status, claimed length, bytes)
ANSWERS = {
    "claims 1 GiB": "HEAD.pack(0, 1 << 30) + b'x' * 1000",
    "claims 2**63 bytes": "HEAD.pack(0, (1 << 63) - 1)",
    "unknown status": "HEAD.pack(9, 4) + b'abcd'",
    "marshal garbage": "HEAD.pack(0, 6) + b'\\xff\\x00garb'",
    "wrong shape": "HEAD.pack(0, len(marshal.dumps(5))) + marshal.dumps(5)",
    "items not a list": "HEAD.pack(0, len(marshal.dumps(({'a': 1}, None)))) + "
                        "marshal.dumps(({'a': 1}, None))",
}

CHILD = """
import marshal, os, struct, sys
HEAD = struct.Struct("!BQ")
inp = os.fdopen(0, "rb", buffering=0)
kind, n = HEAD.unpack(inp.read(HEAD.size))
left = n
while left:
    left -= len(inp.read(min(left, 1 << 16)))
sys.stdout.buffer.write({answer}); sys.stdout.buffer.flush()
"""

DRIVER = """
import json, sys, threading
from kubectl_gpudoctor.api import pageparse, slim
hooked = []
threading.excepthook = lambda args: hooked.append(repr(args.exc_value))
pageparse.child_argv = lambda: [sys.executable, "-c", sys.argv[1]]
page = json.dumps({{"kind": "NodeList", "metadata": {{"continue": "t1"}},
                    "items": [{{"metadata": {{"name": "n%d" % i}}}} for i in range(50)]}}).encode()
with pageparse.ParsePool(1) as pp:
    fut = pp.submit(page, pageparse.KIND_SLIM)
    items, token, _ = pp.result(fut, lambda: page, slim.slim)
    broken = type(fut.exception(timeout=5)).__name__
rss = next(int(l.split()[1]) for l in open("/proc/self/status")
           if l.startswith("VmHWM:")) / 1024
print(json.dumps({{"items": len(items), "token": token, "broken": broken, "hooked": hooked,
                  "rss_mib": rss}}))
"""


@pytest.mark.parametrize("answer", list(ANSWERS), ids=list(ANSWERS))
def test_a_hostile_page_parser_child_costs_one_clean_fallback(answer):
    child = CHILD.format(answer=ANSWERS[answer])
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(DRIVER.format()), child],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=str(REPO))
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err.decode()[-3000:]
    assert b"Traceback" not in err, err.decode()[-3000:]
    doc = json.loads(out)
    print(f"page parser child that {answer}: peak RSS {doc['rss_mib']:.0f} MiB")
    assert doc.pop("rss_mib") < 200  # a 1 GiB buffer would show
    assert doc == {"items": 50, "token": "t1", "broken": "BrokenChild", "hooked": []}

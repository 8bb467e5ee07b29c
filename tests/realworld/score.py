"""How many corpus artifacts the tool answers right, per channel: `python -m tests.realworld.score`.

Why: the feeding tests stop at the first wrong answer of a parametrised case and say nothing of
the whole; a score (right / all, per channel, with the keys it gets wrong) is what measures a
change to the tool against the corpus. A kernel-log artifact counts as right only when both ways
of feeding it (/dev/kmsg records and a pasted file) are right.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path

from . import corpus
from .feed import API_CHANNELS, answers, diagnose, load_api, probe_kmsg_file, probe_kmsg_host_root


def score() -> tuple[Counter, Counter, list[str]]:
    right: Counter = Counter()
    total: Counter = Counter()
    wrong: list[str] = []
    with tempfile.TemporaryDirectory(prefix="realworld-score-") as tmp:
        for i, a in enumerate(corpus.artifacts({"kmsg"})):
            d1, d2 = Path(tmp, f"k{i}a"), Path(tmp, f"k{i}b")
            d1.mkdir(), d2.mkdir()
            ok = (answers(a, probe_kmsg_host_root(a, d1)) and answers(a, probe_kmsg_file(a, d2)))
            total[a.channel] += 1
            right[a.channel] += ok
            if not ok:
                wrong.append(a.key)
        api = corpus.artifacts(API_CHANNELS)
        if api:
            from tests.kubectl.fakecluster import FakeCluster
            fc = FakeCluster().start()
            try:
                where = {a.key: load_api(fc, a, i) for i, a in enumerate(api)}
                kubeconfig = fc.kubeconfig(Path(tmp, "kubeconfig"))
                for a in api:
                    ok = answers(a, diagnose(kubeconfig, *where[a.key]))
                    total[a.channel] += 1
                    right[a.channel] += ok
                    if not ok:
                        wrong.append(a.key)
            finally:
                fc.stop()
    return right, total, wrong


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    right, total, wrong = score()
    for ch in sorted(total):
        print(f"{ch:16} {right[ch]:3}/{total[ch]}")
    print(f"{'all':16} {sum(right.values()):3}/{sum(total.values())}")
    for k in wrong:
        print(f"wrong: {k}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Every kernel-log artifact of the corpus, fed to the probe's kmsg check the two ways it meets
a kernel log: /dev/kmsg records in a host root, and a pasted file (--kmsg-file). Each must name
the cause its source established (finding id, severity, a cause word not in the quote)."""
import pytest

from tests.realworld import corpus
from tests.realworld.feed import answers, probe_kmsg_file, probe_kmsg_host_root

KMSG = corpus.artifacts({"kmsg"})


@pytest.mark.parametrize("a", KMSG, ids=[a.key for a in KMSG])
def test_kmsg_artifact_as_dev_kmsg_records(a, tmp_path):
    found = probe_kmsg_host_root(a, tmp_path)
    assert answers(a, found), (a.source, a.diagnosis,
                               [(f.id, f.severity.value, f.title) for f in found])


@pytest.mark.parametrize("a", KMSG, ids=[a.key for a in KMSG])
def test_kmsg_artifact_as_pasted_file(a, tmp_path):
    found = probe_kmsg_file(a, tmp_path)
    assert answers(a, found), (a.source, a.diagnosis,
                               [(f.id, f.severity.value, f.title) for f in found])

"""Every API-side artifact of the corpus (pod status, pod events, a GPU plugin pod's container
status, node conditions), put into the fake API server the way the API server shows it and read
by `pod Y` / `node X` (API side, the real kubernetes client, in-process). Each must name the
cause its source established (finding id, severity, a cause word not in the quote)."""
import pytest

from tests.kubectl.fakecluster import FakeCluster
from tests.realworld import corpus_api
from tests.realworld.feed import answers, diagnose, load_api

API = corpus_api.ARTIFACTS


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    fc = FakeCluster().start()
    try:
        where = {a.key: load_api(fc, a, i) for i, a in enumerate(API)}
        yield fc.kubeconfig(tmp_path_factory.mktemp("kc") / "kubeconfig"), where
    finally:
        fc.stop()


@pytest.mark.parametrize("a", API, ids=[a.key for a in API])
def test_api_artifact(a, loaded):
    kubeconfig, where = loaded
    node, pod = where[a.key]
    found = diagnose(kubeconfig, node, pod)
    assert answers(a, found), (a.source, a.diagnosis,
                               [(f.id, f.severity.value, f.title) for f in found])

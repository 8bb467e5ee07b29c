"""The probe namespace (issue 12 item 1): the debug pod's namespace is gpu-doctor's own (flag,
env, default), never `-n`/the context's, and it must carry the probe-namespace label; checked
against the kmock fake API server with the real kubernetes client."""
from __future__ import annotations

import re

import pytest

from kubectl_gpudoctor import errors
from kubectl_gpudoctor.reach import probens
from kubectl_gpudoctor.api.kube import Kube
from tests.kubectl.conftest import cluster, kubeconfig  # noqa: F401 - fixtures

LABELS = {probens.LABEL: probens.LABEL_VALUE, "pod-security.kubernetes.io/enforce": "privileged"}


def test_choose_never_takes_the_pod_namespace():
    assert probens.choose(None, {}) == "gpu-doctor"
    assert probens.choose(None, {"GPU_DOCTOR_NAMESPACE": "gd-probe"}) == "gd-probe"
    assert probens.choose("gd-2", {"GPU_DOCTOR_NAMESPACE": "gd-probe"}) == "gd-2"
    for bad in ("../kube-system", "Team", "a" * 64, "ns?x=1", ""):
        if bad == "":
            continue  # empty means "not given": the default
        with pytest.raises(errors.UsageError):
            probens.choose(bad, {})


def test_labelled_namespace_is_accepted(cluster, kubeconfig):  # noqa: F811
    cluster.namespaces["gpu-doctor"] = dict(LABELS)
    ns = probens.verify(Kube(str(kubeconfig)), "gpu-doctor")
    assert ns["metadata"]["name"] == "gpu-doctor"


def test_unlabelled_namespace_is_refused_with_the_fix(cluster, kubeconfig):  # noqa: F811
    cluster.namespaces["team"] = {"pod-security.kubernetes.io/enforce": "privileged"}
    with pytest.raises(probens.NotProbeNamespace) as ei:
        probens.verify(Kube(str(kubeconfig)), "team")
    line = ei.value.one_line()
    assert "\n" not in line and "not a gpu-doctor probe namespace" in line
    assert "--probe-namespace gpu-doctor" in line and "gpu-doctor.io/probe-namespace=true" in line
    assert ei.value.exit_status == 3


def test_missing_namespace_says_how_to_create_it(cluster, kubeconfig):  # noqa: F811
    cluster.namespaces.pop("gpu-doctor")
    with pytest.raises(probens.NotProbeNamespace) as ei:
        probens.verify(Kube(str(kubeconfig)), "gpu-doctor")
    # what a krew user has: the plugin's own manifests, not a file of the repository
    assert re.search(r"does not exist.*kubectl gpu-doctor rbac \| kubectl apply -f -",
                     ei.value.one_line())


def test_unreadable_namespace_is_refused_not_assumed(cluster, kubeconfig):  # noqa: F811
    cluster.namespaces["gpu-doctor"] = dict(LABELS)
    cluster.forbid.append(("GET", re.compile(r"^/api/v1/namespaces/gpu-doctor$")))
    with pytest.raises(probens.NotProbeNamespace, match="cannot read namespace gpu-doctor"):
        probens.verify(Kube(str(kubeconfig)), "gpu-doctor")


def test_pod_security_hint_never_relaxes_a_tenant_namespace():
    hint = probens.pod_security_hint("gpu-doctor")
    assert "kubectl gpu-doctor rbac | kubectl apply -f -" in hint and "deploy/" not in hint
    assert "kubectl label" not in hint


# -- through the real CLI ------------------------------------------------------------------

def test_pod_in_team_namespace_runs_the_probe_in_gpu_doctor(cluster, kubeconfig):  # noqa: F811
    from tests.kubectl.conftest import DATA, run_cli
    from tests.kubectl.test_cli_cluster import healthy_node
    healthy_node(cluster)                               # pod ml/train-0 on gpu-1
    cluster.namespaces["ml"] = {"pod-security.kubernetes.io/enforce": "privileged"}
    cluster.log_chunks = [(DATA / "probe_stream.ndjson").read_bytes()]
    r = run_cli("pod", "train-0", "-n", "ml", "--kubeconfig", str(kubeconfig), "-o", "json")
    assert r.returncode == 1, r.stderr
    assert [b["metadata"]["namespace"] for b in cluster.created] == ["gpu-doctor"]
    assert cluster.count("GET", r"^/api/v1/namespaces/ml/pods/train-0$") >= 1
    assert cluster.deleted[0][0] == "gpu-doctor"


def test_context_namespace_is_not_where_the_probe_goes(cluster, kubeconfig, tmp_path):  # noqa: F811
    from tests.kubectl.conftest import DATA, run_cli
    from tests.kubectl.test_cli_cluster import healthy_node
    healthy_node(cluster)
    cluster.namespaces["team"] = {}
    kc = cluster.kubeconfig(tmp_path / "kc-team", namespace="team")
    cluster.log_chunks = [(DATA / "probe_stream.ndjson").read_bytes()]
    r = run_cli("node", "gpu-1", "--kubeconfig", str(kc), "-o", "json")
    assert r.returncode == 1, r.stderr
    assert [b["metadata"]["namespace"] for b in cluster.created] == ["gpu-doctor"]


def test_unlabelled_probe_namespace_is_refused_before_any_pod(cluster, kubeconfig):  # noqa: F811
    from tests.kubectl.conftest import one_error_line, run_cli
    from tests.kubectl.test_cli_cluster import healthy_node
    healthy_node(cluster)
    cluster.namespaces["team"] = {"pod-security.kubernetes.io/enforce": "privileged"}
    r = run_cli("node", "gpu-1", "--kubeconfig", str(kubeconfig), "--probe-namespace", "team")
    line = one_error_line(r.stderr)
    assert r.returncode == 3 and "not a gpu-doctor probe namespace" in line
    assert "--probe-namespace gpu-doctor" in line
    assert cluster.created == [] and "Traceback" not in r.stderr

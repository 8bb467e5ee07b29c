"""The agent cannot be impersonated (issue 21 item 6): exec -- root on the node -- goes only to
a pod whose controller is our DaemonSet (name, namespace, uid) and that runs the DaemonSet's
image (by digest when pinned). A lookalike is refused with one line and the run falls back to
the debug pod, as for any unusable agent. Against the exec fake (tests/kubectl/fakeexec.py)
with the real kubernetes client."""
from __future__ import annotations

import copy

import pytest

from kubectl_gpudoctor.reach import agent_exec, agent_manifests

from tests.kubectl.conftest import run_cli
from tests.kubectl.fakeexec import PROBE_NS
from tests.kubectl.test_exec import NODE, kube, xc  # noqa: F401 - fixtures: one node, labelled ns

NS = "gpu-doctor"
PINNED = "ghcr.io/gpu-doctor/gpu-doctor-probe:0.9.0@sha256:" + "ab" * 32
EVIL = "docker.io/attacker/tools@sha256:" + "ee" * 32


def lookalike(xc, image=EVIL, owner: dict | None = None, image_id: str | None = None) -> dict:
    """A pod a user with `pods create` in the namespace made: the agent's labels, Running."""
    real = xc.add_agent_pod(NODE, image=PINNED)
    fake = copy.deepcopy(real)
    del xc.pods[(NS, real["metadata"]["name"])]
    fake["metadata"]["name"] = "gpu-doctor-agent-zzzzz"
    fake["metadata"]["uid"] = "fake-uid"
    fake["spec"]["containers"][0]["image"] = image
    fake["status"]["containerStatuses"][0]["image"] = image
    if image_id is not None:
        fake["status"]["containerStatuses"][0]["imageID"] = image_id
    if owner is None:
        fake["metadata"].pop("ownerReferences")
    else:
        fake["metadata"]["ownerReferences"] = [owner]
    xc.pods[(NS, fake["metadata"]["name"])] = fake
    xc.list_cache.clear()
    return fake


def _owner(xc, **kw) -> dict:
    ds = xc.daemonsets.setdefault((NS, agent_manifests.AGENT_NAME),
                                  agent_manifests.daemonset(NS, PINNED))
    ds["metadata"].setdefault("uid", "d5-uid")
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": agent_manifests.AGENT_NAME,
            "uid": ds["metadata"]["uid"], "controller": True, **kw}


def test_the_real_agent_is_used(xc, kube):
    real = xc.add_agent_pod(NODE, image=PINNED)
    pod, why = agent_exec.find_agent_pod(kube, NS, NODE)
    assert why == "" and pod["metadata"]["name"] == real["metadata"]["name"]


@pytest.mark.parametrize("case", ["no owner", "forged owner uid", "other kind", "not controller",
                                  "other image", "other digest running", "tag-only imageID",
                                  "lookalike repository"])
def test_a_lookalike_is_refused(xc, kube, case):
    if case == "no owner":
        lookalike(xc)
    elif case == "forged owner uid":
        lookalike(xc, owner=_owner(xc, uid="0000-forged"))
    elif case == "other kind":
        lookalike(xc, owner=_owner(xc, kind="ReplicaSet"))
    elif case == "not controller":
        lookalike(xc, owner=_owner(xc, controller=False))
    elif case == "other image":  # right owner (a stale pod), another image
        lookalike(xc, owner=_owner(xc))
    elif case == "other digest running":  # the spec names our image, another one runs
        lookalike(xc, image=PINNED, owner=_owner(xc),
                  image_id="ghcr.io/gpu-doctor/gpu-doctor-probe@sha256:" + "ee" * 32)
    elif case == "tag-only imageID":  # a config digest: not comparable with the pinned one
        lookalike(xc, image=PINNED, owner=_owner(xc), image_id="sha256:" + "ab" * 32)
    else:
        lookalike(xc, image=PINNED.replace("gpu-doctor-probe:", "gpu-doctor-probe-x:"),
                  owner=_owner(xc))
    pod, why = agent_exec.find_agent_pod(kube, NS, NODE)
    assert pod is None
    assert why.startswith(f"pod {NS}/gpu-doctor-agent-zzzzz is not the gpu-doctor agent (")
    assert why.endswith(agent_exec.REFUSED) and "\n" not in why


def test_without_the_daemonset_nothing_is_exec(xc, kube):
    lookalike(xc, owner={"apiVersion": "apps/v1", "kind": "DaemonSet", "controller": True,
                         "name": agent_manifests.AGENT_NAME, "uid": "x"})
    xc.daemonsets.clear()
    pod, why = agent_exec.find_agent_pod(kube, NS, NODE)
    assert pod is None and "no daemonset gpu-doctor/gpu-doctor-agent owns it" in why


def test_a_pod_of_an_earlier_revision_is_still_the_agent(xc, kube):
    """Mid rolling update the DaemonSet's older pods run the previous image of the same
    repository: still ours (owner uid), exec'd when its running image has its digest."""
    old = PINNED.replace("0.9.0@sha256:" + "ab" * 32, "0.8.0@sha256:" + "01" * 32)
    lookalike(xc, image=old, owner=_owner(xc), image_id="ghcr.io/gpu-doctor/gpu-doctor-probe"
              "@sha256:" + "01" * 32)
    pod, why = agent_exec.find_agent_pod(kube, NS, NODE)
    assert why == "" and pod["spec"]["containers"][0]["image"] == old


def test_the_real_agent_is_chosen_beside_a_lookalike(xc, kube):
    lookalike(xc)
    real = xc.add_agent_pod(NODE, image=PINNED)
    pod, why = agent_exec.find_agent_pod(kube, NS, NODE)
    assert why == "" and pod["metadata"]["name"] == real["metadata"]["name"]


def test_node_falls_back_to_the_debug_pod_with_one_line(xc, tmp_path):
    """`node X` with only a lookalike agent: one warning line naming it, no exec at all, and
    the debug pod path runs as for any unusable agent."""
    lookalike(xc)
    xc.debug_pod_mode = "run"
    xc.log_chunks = [b'{"schema":"gpu-doctor/v1","kind":"summary","complete":true,'
                    b'"critical":0,"warning":0,"info":0,"exit_code":0,"duration_s":0.1}\n']
    kc = str(xc.kubeconfig(tmp_path / "kc"))
    r = run_cli("node", NODE, "--kubeconfig", kc, "--timeout", "20s", "-o", "jsonl")
    assert xc.execs == [], r.stderr  # never exec'd into it
    lines = [ln for ln in r.stdout.splitlines() if "is not the gpu-doctor agent" in ln]
    assert len(lines) == 1, (r.returncode, r.stdout, r.stderr)
    assert "using a debug pod instead" in lines[0]
    assert len(xc.created) == 1 and xc.created[0]["metadata"]["namespace"] == NS


def test_agent_install_refuses_a_tenant_namespace(xc, tmp_path):
    """`agent install -n team-a` into an existing namespace without the probe-namespace label:
    one line, exit 3, nothing created (the debug pod path refuses it the same way)."""
    xc.namespaces["team-a"] = {"team": "a"}
    kc = str(xc.kubeconfig(tmp_path / "kc"))
    r = run_cli("agent", "install", "-n", "team-a", "--kubeconfig", kc)
    assert r.returncode == 3, (r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and r.stdout == ""
    assert "not installing the agent into namespace team-a" in r.stderr
    assert "gpu-doctor.io/probe-namespace=true" in r.stderr
    assert xc.daemonsets == {} and xc.quotas == [] and xc.admission == {}
    # a labelled namespace, or one that does not exist yet (created labelled), is fine
    xc.namespaces["ops"] = {PROBE_NS: "true"}
    for ns in ("ops", "gpu-doctor-new"):
        r = run_cli("agent", "install", "-n", ns, "--kubeconfig", kc)
        assert r.returncode == 0, r.stderr
        assert (ns, agent_manifests.AGENT_NAME) in xc.daemonsets
        # one watching agent per cluster (its grant has one name): the next namespace's
        # install comes after this one's uninstall (audit round 5, AG-01)
        r = run_cli("agent", "uninstall", "-n", ns, "--kubeconfig", kc)
        assert r.returncode == 0, r.stderr
    assert xc.namespaces["gpu-doctor-new"][PROBE_NS] == "true"


def test_agent_status_does_not_count_a_lookalike(xc, kube):
    from kubectl_gpudoctor.commands import agent
    lookalike(xc)
    doc = agent.status(kube, NS, PINNED)
    (row,) = [r for r in doc["nodes"] if r["node"] == NODE]
    assert row["phase"] == "NotTheAgent" and not agent.status_ok(doc)
    real = xc.add_agent_pod(NODE, image=PINNED)    # the real one beside it is the one shown
    (row,) = [r for r in agent.status(kube, NS, PINNED)["nodes"] if r["node"] == NODE]
    assert (row["pod"], row["phase"]) == (real["metadata"]["name"], "Running")


def test_agent_install_on_an_api_server_without_admission_policies(xc, tmp_path):
    """Before 1.30 there is no ValidatingAdmissionPolicy v1: the agent is still installed, and
    the output says the namespace is not confined (no error, no half install)."""
    xc.serves_admission_v1 = False
    kc = str(xc.kubeconfig(tmp_path / "kc"))
    r = run_cli("agent", "install", "--kubeconfig", kc)
    assert r.returncode == 0, r.stderr
    assert "daemonset/gpu-doctor-agent created" in r.stdout or \
        "daemonset/gpu-doctor-agent configured" in r.stdout
    assert "validatingadmissionpolicy/gpu-doctor-probe-only not installed: this API server " \
           "does not serve ValidatingAdmissionPolicy" in r.stdout

"""`agent install` and `uninstall` on the fake API server answering as the real 1.35 one did
(tests/data/captures/k8s-1.35/admission-and-conditions, its README): idempotent, over objects a
user applied by hand, resumable, a server dry run, policies without type-checking warnings, and
a DaemonSet whose pods stay admitted (issue 31, items 1 and 4)."""
from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from kubectl_gpudoctor.commands.agent import install_documents
from kubectl_gpudoctor.reach import admission, agent_manifests
from tests.kubectl import apiwrites
from tests.kubectl.conftest import REPO, run_cli
from tests.kubectl.fakeexec import ExecCluster

CAP = Path(__file__).resolve().parents[1] / "data/captures/k8s-1.35/admission-and-conditions"
VAP = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
VAPB = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"


def cap(name: str):
    text = (CAP / name).read_text()
    return yaml.safe_load(text) if name.endswith(".yaml") else json.loads(text)


@pytest.fixture
def xc():
    fc = ExecCluster()
    fc.add_node("gpu-a")
    fc.start()
    try:
        yield fc
    finally:
        fc.stop()


@pytest.fixture
def kc(xc, tmp_path):
    return str(xc.kubeconfig(tmp_path / "kc"))


def http(xc, method: str, path: str, body=None, ctype="application/json",
         ua="kubectl-gpu_doctor/0.1.0 (capture)") -> tuple[int, dict]:
    data = None
    if body is not None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    req = urllib.request.Request(xc.url + path, data=data, method=method,
                                 headers={"Content-Type": ctype, "User-Agent": ua,
                                          "Authorization": "Bearer fake-token"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


# -- the fake is the real server, as far as the captures go --------------------------------

def _same_status(got: dict, want: dict) -> None:
    for k in ("reason", "message", "code", "status"):
        assert got.get(k) == want.get(k), k
    gd, wd = dict(got.get("details") or {}), dict(want.get("details") or {})
    gd.pop("uid", None), wd.pop("uid", None)
    assert gd == wd


def test_the_fake_answers_policy_writes_as_the_real_server(xc):
    """The sequence of the capture, request by request: create, create again (also as a dry
    run), PUT without and with a stale resourceVersion, apply without force over another
    manager's fields, with force, without a fieldManager, delete twice."""
    pol = cap("a01-create-policy.request.json")
    name = pol["metadata"]["name"]
    code, got = http(xc, "POST", VAP, pol)
    assert code == 201 and got["metadata"]["generation"] == 1 and "status" not in got
    for req, want in (("", "a02-create-policy-again.409.json"),
                      ("?dryRun=All", "a03-create-policy-again-dryrun.409.json")):
        code, got = http(xc, "POST", VAP + req, pol)
        assert code == 409
        _same_status(got, cap(want))
    code, got = http(xc, "PUT", f"{VAP}/{name}",
                     cap("a06-put-policy-no-resourceversion.request.json"))
    assert code == 422
    _same_status(got, cap("a06-put-policy-no-resourceversion.422.json"))
    # the type checker wrote status after the create (a08): the create's own rv is stale
    code, now = http(xc, "GET", f"{VAP}/{name}")
    assert now["status"]["typeChecking"]["expressionWarnings"]
    stale = dict(pol, metadata={**pol["metadata"], "resourceVersion": got.get("metadata", {})
                                .get("resourceVersion", "1")})
    code, got = http(xc, "PUT", f"{VAP}/{name}", stale)
    assert code == 409
    _same_status(got, cap("a12b-put-policy-stale-resourceversion.409.json"))
    fresh = dict(pol, metadata={**pol["metadata"],
                                "resourceVersion": now["metadata"]["resourceVersion"]})
    code, got = http(xc, "PUT", f"{VAP}/{name}", fresh)
    assert code == 200 and got["metadata"]["resourceVersion"] == now["metadata"][
        "resourceVersion"]  # a PUT that changes nothing does not move it (a11, a12)
    # a11: the content `agent install` had then, PUT with the current resourceVersion
    a11 = cap("a11-put-policy-with-resourceversion.request.json")
    a11["metadata"]["resourceVersion"] = got["metadata"]["resourceVersion"]
    code, put = http(xc, "PUT", f"{VAP}/{name}", a11)
    assert code == 200
    apply = f"{VAP}/{name}?fieldManager=kubectl-gpu-doctor"
    body = (CAP / "a14-apply-policy-same-content-no-force.request.yaml").read_text()
    code, got = http(xc, "PATCH", apply, body, apiwrites.APPLY)
    assert code == 409
    _same_status(got, cap("a14-apply-policy-same-content-no-force.409.json"))
    body = (CAP / "a15-apply-policy-changed-no-force.request.yaml").read_text()
    code, got = http(xc, "PATCH", apply, body, apiwrites.APPLY)
    assert code == 409
    _same_status(got, cap("a15-apply-policy-changed-no-force.409.json"))
    code, got = http(xc, "PATCH", apply + "&force=true", body, apiwrites.APPLY)
    assert code == 200 and got["metadata"]["generation"] == put["metadata"]["generation"] + 1
    code, again = http(xc, "PATCH", apply + "&force=true", body, apiwrites.APPLY)
    assert code == 200 and again["metadata"]["resourceVersion"] != got["metadata"][
        "resourceVersion"] or again == got  # a17: unchanged unless the type checker moved it
    code, got = http(xc, "PATCH", f"{VAP}/gpu-doctor-agent-own-events?force=true",
                     (CAP / "a18-apply-policy-absent-creates.request.yaml").read_text(),
                     apiwrites.APPLY)
    assert code == 422
    _same_status(got, cap("a20-apply-without-fieldmanager.422.json"))
    code, got = http(xc, "PATCH", f"{VAP}/gpu-doctor-agent-own-events?fieldManager=m&force=true",
                     (CAP / "a18-apply-policy-absent-creates.request.yaml").read_text(),
                     apiwrites.APPLY)
    assert code == 201
    code, got = http(xc, "DELETE", f"{VAP}/gpu-doctor-agent-own-events")
    assert code == 200 and got["status"] == "Success"
    assert got["details"]["kind"] == cap("e01-delete-policy.200.json")["details"]["kind"]
    code, got = http(xc, "DELETE", f"{VAP}/gpu-doctor-agent-own-events")
    assert code == 404
    _same_status(got, cap("e02-delete-policy-absent.404.json"))


def test_the_fakes_type_checker_words_warnings_as_the_real_one():
    """b-expression-warnings.json: the real server's warnings on the policies we shipped, and
    on the ResourceQuota probe; the fake's emulation says exactly the same, byte for byte."""
    for what, v in cap("b-expression-warnings.json").items():
        assert apiwrites.type_check(cap(v["file"])) == \
            v["status"]["typeChecking"]["expressionWarnings"], what


# -- item 4: no warnings ------------------------------------------------------------------

def test_our_policies_type_check_without_warnings(xc, kc):
    """Before: `overhead` (probe-only), `capacity`/`allocatable` (own-node, 10 errors) and
    `involvedObject`/`source` checked against events.k8s.io/v1 (own-events). Now each policy
    `agent install` writes comes back from the type checker with no warning."""
    r = run_cli("agent", "install", "--kubeconfig", kc)
    assert r.returncode == 0, r.stderr
    pols = {n: o for (res, n), o in xc.admission.items() if res == "validatingadmissionpolicies"}
    assert set(pols) == {"gpu-doctor-probe-only", "gpu-doctor-agent-own-node",
                         "gpu-doctor-agent-own-events", "gpu-doctor-agent-own-events-k8s-io",
                         "gpu-doctor-conditions-agent-only"}
    for name, o in pols.items():
        assert o["status"]["typeChecking"] == {"expressionWarnings": []}, name


# -- item 1: idempotent, over hand-applied objects, resumable, dry run --------------------------

def test_install_twice_then_upgrade_converges(xc, kc):
    """A second install failed on the real server with 422 (a PUT without resourceVersion);
    now every object is server-side applied: the second run changes nothing."""
    r = run_cli("agent", "install", "--kubeconfig", kc)
    assert r.returncode == 0, r.stderr
    assert "validatingadmissionpolicy/gpu-doctor-probe-only created" in r.stdout
    r = run_cli("agent", "install", "--kubeconfig", kc)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines and all(line.endswith(" unchanged") for line in lines), r.stdout
    r = run_cli("agent", "install", "--kubeconfig", kc, "--interval", "60s")  # an upgrade
    assert r.returncode == 0, r.stderr
    assert "daemonset/gpu-doctor-agent configured" in r.stdout
    [ds] = xc.daemonsets.values()
    assert "60s" in ds["spec"]["template"]["spec"]["containers"][0]["command"]


def _kubectl_apply(xc, docs) -> None:
    """What `kubectl apply -f -` (client-side) does to absent objects: a POST, its field
    manager kubectl-client-side-apply."""
    for d in docs:
        if d["kind"] == "ValidatingAdmissionPolicy":
            path = VAP
        elif d["kind"] == "ValidatingAdmissionPolicyBinding":
            path = VAPB
        else:
            continue
        code, _ = http(xc, "POST", path, d, ua="kubectl-client-side-apply/v1.35.6")
        assert code == 201


def test_install_over_the_hand_applied_rbac_policy_and_its_pods_stay_admitted(xc, kc):
    """The documented order: `rbac admission-policy | kubectl apply -f -`, then `agent
    install` (its default image is tag-only in this build, as in the capture d01). Before:
    the install's PUT failed (422), and once the `rbac` policy was re-applied by hand the
    DaemonSet's pods were denied (d02: FailedCreate, no pods). Now the install applies the
    same policy, names its image on the namespace, and the controller keeps creating pods."""
    hand = list(yaml.safe_load_all((REPO / "deploy/admission-policy.yaml").read_text()))
    _kubectl_apply(xc, hand)
    r = run_cli("agent", "install", "--kubeconfig", kc)
    assert r.returncode == 0, r.stderr
    assert "validatingadmissionpolicy/gpu-doctor-probe-only unchanged" in r.stdout
    image = agent_manifests.default_image()
    assert admission.needs_annotation(image)  # tag-only: admitted through the namespace
    agents = [p for (ns, _), p in xc.pods.items() if ns == "gpu-doctor"]
    assert len(agents) == 1 and not [e for e in xc.events if e["reason"] == "FailedCreate"]
    # GitOps re-applies the rbac output; the controller recreates the pod (a node came back)
    for d in hand:
        key = ("validatingadmissionpolicies" if d["kind"] == "ValidatingAdmissionPolicy"
               else "validatingadmissionpolicybindings", d["metadata"]["name"])
        cur = xc.admission[key]
        code, _ = http(xc, "PUT", f"{VAP if key[0].endswith('policies') else VAPB}/{key[1]}",
                       {**d, "metadata": {**d["metadata"], "resourceVersion":
                                          cur["metadata"]["resourceVersion"]}},
                       ua="kubectl-client-side-apply/v1.35.6")
        assert code == 200
    for k in [k for k in xc.pods if k[0] == "gpu-doctor"]:
        del xc.pods[k]
    xc.resync_daemonsets()
    assert [p for (ns, _), p in xc.pods.items() if ns == "gpu-doctor"]
    assert not [e for e in xc.events if e["reason"] == "FailedCreate"]


def test_a_foreign_image_is_still_denied_by_the_fakes_controller(xc, kc):
    """The fake's controller does deny (d02's FailedCreate, word for word but the pod name):
    an image neither pinned by digest nor named on the namespace."""
    _kubectl_apply(xc, list(yaml.safe_load_all(
        (REPO / "deploy/admission-policy.yaml").read_text())))
    ds = agent_manifests.daemonset("gpu-doctor", "registry.example/evil:1")
    ds["metadata"]["uid"] = "u"
    xc.daemonsets[("gpu-doctor", ds["metadata"]["name"])] = ds
    xc.resync_daemonsets()
    assert not [p for (ns, _), p in xc.pods.items() if ns == "gpu-doctor"]
    [ev] = [e for e in xc.events if e["reason"] == "FailedCreate"]
    want = cap("d02-events-failedcreate.200.json")["items"][0]["message"]
    pat = re.escape(want).replace(re.escape("gpu-doctor-agent-6j4ks"),
                                  r"gpu-doctor-agent-[a-z0-9]+")
    assert re.fullmatch(pat.replace(re.escape("pinned by digest"), "pinned by digest.*"),
                        ev["message"])


def test_a_failed_install_says_how_far_it_got_and_the_next_run_resumes(xc, kc):
    xc.forbid.append(("PATCH", re.compile(r"/daemonsets/")))
    r = run_cli("agent", "install", "--kubeconfig", kc)
    assert r.returncode == 3
    assert re.search(r"\d+ of \d+ objects were applied before it; `kubectl gpu-doctor agent "
                     r"install` again applies the rest", r.stderr), r.stderr
    assert not xc.daemonsets
    xc.forbid.clear()
    r = run_cli("agent", "install", "--kubeconfig", kc)
    assert r.returncode == 0, r.stderr
    assert "daemonset/gpu-doctor-agent created" in r.stdout
    assert "serviceaccount/gpu-doctor-agent unchanged" in r.stdout


def test_server_dry_run_over_an_install_persists_nothing(xc, kc):
    assert run_cli("agent", "install", "--kubeconfig", kc).returncode == 0
    before = repr([xc.admission, xc.daemonsets, xc.objects])
    r = run_cli("agent", "install", "--kubeconfig", kc, "--dry-run=server", "--interval", "90s")
    assert r.returncode == 0, r.stderr
    assert "daemonset/gpu-doctor-agent applied (server dry run)" in r.stdout
    assert repr([xc.admission, xc.daemonsets, xc.objects]) == before


def test_install_documents_are_one_policy_whatever_the_image():
    a = install_documents("gpu-doctor", agent_manifests.default_image(), None)
    b = install_documents("gpu-doctor", "registry.corp/mirror:2", None)
    pick = lambda docs: [d for d in docs if d["kind"].startswith("ValidatingAdmission")]  # noqa
    assert pick(a) == pick(b) == admission.manifests()


# -- audit round 5, AG-01: one cluster-wide grant, never taken from another namespace's agent --

def test_a_second_namespace_neither_takes_nor_removes_the_first_agents_grant(xc, kc):
    """`agent install -n B` after `-n A` rebound A's grant to B's ServiceAccount (A's agent
    could no longer write, silently), and `agent uninstall -n B` deleted A's grant and
    policies and cleared A's conditions (ag01_two_installs.py). Now install -n B is refused
    in one line before anything is applied, and uninstall -n B removes only B's own."""
    import datetime as dt
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    xc.nodes["gpu-a"]["status"]["conditions"].append({
        "type": "GpuDoctorWatching", "status": "True", "reason": "AgentWatching",
        "message": "agent of namespace gpu-doctor", "lastHeartbeatTime": now,
        "lastTransitionTime": now})
    r = run_cli("agent", "install", "-n", "gpu-doctor", "--kubeconfig", kc)
    assert r.returncode == 0, r.stderr
    crb = "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/gpu-doctor-agent-node-status"
    before = json.dumps(xc.objects[crb], sort_keys=True)
    r = run_cli("agent", "install", "-n", "team-b-doctor", "--kubeconfig", kc)
    assert r.returncode == 3 and r.stdout == "", (r.returncode, r.stdout)
    [line] = r.stderr.strip().splitlines()
    assert "namespace gpu-doctor holds its cluster-wide grant" in line
    assert "agent uninstall -n gpu-doctor" in line
    assert json.dumps(xc.objects[crb], sort_keys=True) == before
    assert not [k for k in xc.daemonsets if k[0] == "team-b-doctor"]
    r = run_cli("agent", "uninstall", "-n", "team-b-doctor", "--kubeconfig", kc)
    assert r.returncode == 0, r.stderr
    assert "clusterrolebinding/gpu-doctor-agent-node-status left" in r.stdout
    assert json.dumps(xc.objects[crb], sort_keys=True) == before
    assert ("validatingadmissionpolicies", "gpu-doctor-agent-own-node") in xc.admission
    assert [c["type"] for c in xc.nodes["gpu-a"]["status"]["conditions"]
            if c["type"].startswith("GpuDoctor")] == ["GpuDoctorWatching"]
    # the namespace that has it uninstalls it all
    r = run_cli("agent", "uninstall", "-n", "gpu-doctor", "--kubeconfig", kc)
    assert r.returncode == 0, r.stderr
    assert crb not in xc.objects
    assert not [c for c in xc.nodes["gpu-a"]["status"]["conditions"]
                if c["type"].startswith("GpuDoctor")]

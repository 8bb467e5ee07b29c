"""The standing agent: its manifests (schema-valid, the debug pod's privileges and no more),
install/status/uninstall against the fake API server, and the idle process itself."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import kubernetes_validate
import pytest

from kubectl_gpudoctor import errors
from kubectl_gpudoctor.commands import agent
from kubectl_gpudoctor.reach import agent_exec
from kubectl_gpudoctor.reach import agent_manifests
from kubectl_gpudoctor.reach import debugpod
from kubectl_gpudoctor.reach import podspec
from kubectl_gpudoctor.api.kube import Kube
from node_probe import __version__

from .fakeexec import PROBE_NS  # noqa: E402
from .fakeexec import ExecCluster

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PINNED = "registry.local/gpu-doctor-probe:0.1.0@sha256:" + "0123456789abcdef" * 4


@pytest.mark.parametrize("k8s", ["1.27", "1.30", kubernetes_validate.latest_version()])
@pytest.mark.parametrize("selector", [None, {"nvidia.com/gpu.present": "true"}])
def test_manifests_are_schema_valid(k8s, selector):
    docs = agent_manifests.manifests("gpu-doctor", PINNED, selector)
    assert [d["kind"] for d in docs] == ["Namespace", "ResourceQuota", "DaemonSet"]
    for d in docs:
        kubernetes_validate.validate(d, k8s, strict=True)


def test_agent_has_the_debug_pods_privileges_and_nothing_more():
    ds = agent_manifests.daemonset("gpu-doctor", PINNED)
    spec = ds["spec"]["template"]["spec"]
    dbg = debugpod.manifest("gpu-1", "gpu-doctor", "abcd1234", image=PINNED)["spec"]
    for key in ("hostPID", "hostNetwork", "automountServiceAccountToken", "enableServiceLinks",
                "tolerations", "volumes", "dnsPolicy"):
        assert spec[key] == dbg[key], key
    c, dc = spec["containers"][0], dbg["containers"][0]
    for key in ("securityContext", "volumeMounts", "image", "name", "env"):
        assert c[key] == dc[key], key
    assert c["resources"]["limits"] == dc["resources"]["limits"]
    # what only a daemon needs
    assert set(spec) - set(dbg) == {"priorityClassName"}
    assert set(dbg) - set(spec) == {"nodeName", "activeDeadlineSeconds"}
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["restartPolicy"] == "Always"
    assert spec["tolerations"] == [{"operator": "Exists"}]  # every taint
    assert c["command"] == ["python3", "-m", "node_probe", "agent-idle"]
    assert c["image"] == PINNED  # --image and the digest pin apply
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert labels[podspec.APP_LABEL] == "gpu-doctor" and labels[agent_manifests.COMPONENT_LABEL] == "agent"
    assert debugpod.RUN_LABEL not in labels  # `cleanup` deletes debug pods, never the agent
    assert labels[agent_manifests.VERSION_LABEL] == __version__
    assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items()
    q = agent_manifests.quota_manifest("gpu-doctor")["spec"]["scopeSelector"]["matchExpressions"][0]
    assert q["values"] == ["system-node-critical"]


@pytest.mark.parametrize("k8s", ["1.30", kubernetes_validate.latest_version()])
def test_watch_manifests_are_schema_valid(k8s):
    docs = agent_manifests.manifests("gpu-doctor", PINNED, None,
                                     agent_manifests.Watch(30, 9400))
    for d in docs:
        kubernetes_validate.validate(d, k8s, strict=True)


def test_watching_adds_exactly_its_identity_token_node_name_evidence_and_port():
    """The pod-spec fields watch mode adds to the sleeping agent (the probe namespace's
    admission policy must admit exactly these): serviceAccountName, the projected token +
    CA volume and its mount, the evidence hostPath and its mount, NODE_NAME, the port."""
    idle = agent_manifests.daemonset("gpu-doctor", PINNED)["spec"]["template"]["spec"]
    w = agent_manifests.daemonset("gpu-doctor", PINNED, None,
                                  agent_manifests.Watch(30, 9400))["spec"]["template"]["spec"]
    assert set(w) - set(idle) == {"serviceAccountName"}
    assert w["serviceAccountName"] == "gpu-doctor-agent"
    assert w["automountServiceAccountToken"] is False  # only the projected, bound token
    new_vols = [v for v in w["volumes"] if v not in idle["volumes"]]
    assert [v["name"] for v in new_vols] == ["agent-token", "evidence"]
    srcs = new_vols[0]["projected"]["sources"]
    assert srcs[0] == {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}}
    assert new_vols[1]["hostPath"] == {"path": "/var/lib/gpu-doctor/evidence",
                                       "type": "DirectoryOrCreate"}
    c, ci = w["containers"][0], idle["containers"][0]
    assert set(c) - set(ci) == {"ports"}
    assert [m for m in c["volumeMounts"] if m not in ci["volumeMounts"]] == [
        {"name": "agent-token", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
         "readOnly": True},
        {"name": "evidence", "mountPath": "/var/lib/gpu-doctor/evidence", "readOnly": False}]
    assert [e for e in c["env"] if e not in ci["env"]] == [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        # the metrics port binds the pod IP (M-01)
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    for key in ("securityContext", "image", "name"):
        assert c[key] == ci[key]
    assert c["resources"]["limits"] == ci["resources"]["limits"]
    assert c["command"][:4] == ["python3", "-m", "node_probe", "agent-watch"]
    # the flags the command passes exist in the agent's parser
    from node_probe.watch.loop import build_parser
    a = build_parser().parse_args(c["command"][4:])
    assert (a.interval, a.metrics_port, str(a.evidence_dir)) == (
        30.0, 9400, "/var/lib/gpu-doctor/evidence")
    from node_probe.watch.ring import DEFAULT_RING
    assert str(DEFAULT_RING) == agent_manifests.EVIDENCE_DIR  # agent-history's default


def test_node_selector_parsing():
    assert agent_manifests.parse_selector("a=b, c=d") == {"a": "b", "c": "d"}
    with pytest.raises(errors.UsageError):
        agent_manifests.parse_selector("a!=b")
    with pytest.raises(errors.UsageError):
        agent_manifests.parse_selector("justakey")


@pytest.fixture
def xc():
    fc = ExecCluster()
    for n in ("gpu-a", "gpu-b", "gpu-c"):
        fc.add_node(n)
    fc.add_node("cpu-a", gpus=0)
    fc.start()
    try:
        yield fc
    finally:
        fc.stop()


@pytest.fixture
def kube(xc, tmp_path):
    return Kube(str(xc.kubeconfig(tmp_path / "kc")))


def test_install_status_uninstall(xc, kube):
    xc.namespaces.pop("gpu-doctor", None)  # a cluster without deploy/rbac.yaml applied
    img = agent_manifests.default_image()
    before = agent.status(kube, "gpu-doctor", img)
    assert before["installed"] is False and not agent.status_ok(before)
    assert "not installed" in agent.status_table(before)
    assert agent_manifests.INSTALL_COMMAND in agent.status_table(before)

    docs = agent_manifests.manifests("gpu-doctor", img, {"nvidia.com/gpu.present": "true"})
    assert agent.install(kube, docs) == ["namespace/gpu-doctor created",
                                         f"resourcequota/{agent_manifests.QUOTA_NAME} created",
                                         f"daemonset/{agent_manifests.AGENT_NAME} created"]
    assert xc.namespaces["gpu-doctor"]["pod-security.kubernetes.io/enforce"] == "privileged"
    st = agent.status(kube, "gpu-doctor", img)
    assert st["installed"] and agent.status_ok(st)
    assert [r["node"] for r in st["nodes"]] == ["gpu-a", "gpu-b", "gpu-c"]  # the DS selector
    assert all(r["phase"] == "Running" and r["skew"] is None for r in st["nodes"])
    pod, why = agent_exec.find_agent_pod(kube, "gpu-doctor", "gpu-b")
    assert pod["spec"]["nodeName"] == "gpu-b" and why == ""
    assert ("GET", "/api/v1/namespaces/gpu-doctor/pods") in kube.calls

    # a second install is a server-side apply of the same objects: nothing changes (on a
    # real API server the old create-then-PUT failed here with 422, issue 31)
    assert agent.install(kube, docs) == ["namespace/gpu-doctor unchanged",
                                         f"resourcequota/{agent_manifests.QUOTA_NAME} unchanged",
                                         f"daemonset/{agent_manifests.AGENT_NAME} unchanged"]

    # skew: one node runs an older agent, one has none
    for key, p in list(xc.pods.items()):
        if p["spec"].get("nodeName") in ("gpu-b", "gpu-c") and key[0] == "gpu-doctor":
            del xc.pods[key]
    xc.add_agent_pod("gpu-b", version="0.0.9", image="ghcr.io/gpu-doctor/gpu-doctor-probe:0.0.9")
    st = agent.status(kube, "gpu-doctor", img)
    rows = {r["node"]: r for r in st["nodes"]}
    assert rows["gpu-a"]["skew"] is None
    assert "agent 0.0.9, plugin" in rows["gpu-b"]["skew"] and "image" in rows["gpu-b"]["skew"]
    assert rows["gpu-c"]["phase"] == "missing" and rows["gpu-c"]["pod"] is None
    assert not agent.status_ok(st)
    table = agent.status_table(st)
    assert table.startswith("3 node(s): 1 with a Running agent of this version, 1 with an "
                            "agent pod that needs a look, 1 without an agent pod")
    assert "gpu-b" in table and "no agent pod on: gpu-c;" in table
    assert "gpu-a" not in table  # a healthy node is counted, not listed
    assert agent_exec.find_agent_pod(kube, "gpu-doctor", "gpu-c") == (None, "no agent pod on this node")

    gone = agent.uninstall(kube, "gpu-doctor")
    # the watching agent's grant goes first (a stopping agent can no longer write)
    assert gone[0] == "clusterrolebinding/gpu-doctor-agent-node-status not found"
    assert gone[1:3] == [f"daemonset/{agent_manifests.AGENT_NAME} deleted",
                         f"resourcequota/{agent_manifests.QUOTA_NAME} deleted"]
    assert all(x.endswith(" not found") for x in gone[3:-1])  # a sleeping agent: no identity
    assert gone[-1] == "no node carries a GpuDoctor condition"
    assert not [k for k, p in xc.pods.items() if k[0] == "gpu-doctor"
                and p["metadata"].get("ownerReferences")]
    assert agent.uninstall(kube, "gpu-doctor")[1] == f"daemonset/{agent_manifests.AGENT_NAME} not found"


def test_agent_pod_not_running_is_not_used(xc, kube):
    xc.namespaces["gpu-doctor"] = {PROBE_NS: "true"}
    xc.add_agent_pod("gpu-a", phase="Pending")
    assert agent_exec.find_agent_pod(kube, "gpu-doctor", "gpu-a") == (
        None, "the agent pod on gpu-a is Pending")
    assert agent_exec.find_agent_pod(kube, "nowhere", "gpu-a")[0] is None


def test_install_forbidden_says_who_may(xc, kube):
    xc.forbid.append(("PATCH", re.compile(r"/daemonsets/")))
    xc.namespaces["gpu-doctor"] = {PROBE_NS: "true"}
    with pytest.raises(errors.Forbidden) as ei:
        agent.install(kube, agent_manifests.manifests("gpu-doctor", PINNED))
    assert "cluster admin" in ei.value.one_line() and "--dry-run=client -o yaml" in ei.value.one_line()


def test_idle_agent_sleeps_cheaply_and_stops_on_sigterm():
    """The agent's main process: measured here (RSS from /proc, CPU ticks over 1 s)."""
    p = subprocess.Popen([sys.executable, "-m", "node_probe", "agent-idle"], cwd=REPO,
                         env={**os.environ, "PYTHONPATH": REPO})
    try:
        # measure from when it idles (its handlers are installed and it sleeps), not after a
        # fixed pause: interpreter start-up takes longer than that on a loaded machine
        want = (1 << (signal.SIGTERM - 1)) | (1 << (signal.SIGHUP - 1))
        deadline = time.monotonic() + 60
        while True:
            assert p.poll() is None, p.returncode
            with open(f"/proc/{p.pid}/status") as f:
                st = f.read()
            caught = int(re.search(r"SigCgt:\s+([0-9a-f]+)", st).group(1), 16)
            if caught & want == want and re.search(r"State:\s+S", st):
                break  # handlers in place and asleep: nothing but pause() is left
            assert time.monotonic() < deadline, "the agent never reached its idle wait"
            time.sleep(0.02)
        with open(f"/proc/{p.pid}/stat") as f:
            t1 = sum(int(x) for x in f.read().rsplit(")", 1)[1].split()[11:13])
        time.sleep(1.0)
        with open(f"/proc/{p.pid}/stat") as f:
            t2 = sum(int(x) for x in f.read().rsplit(")", 1)[1].split()[11:13])
        with open(f"/proc/{p.pid}/status") as f:
            rss_kib = int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))
        assert p.poll() is None
        assert t2 - t1 == 0, "the idle agent used CPU while idle"
        assert rss_kib < 30 * 1024, rss_kib
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_agent_rbac_grants_exec_only_in_the_agent_namespace():
    import yaml
    docs = list(yaml.safe_load_all(open(os.path.join(REPO, "deploy", "agent-rbac.yaml"))))
    for d in docs:
        kubernetes_validate.validate(d, kubernetes_validate.latest_version(), strict=True)
        assert d["kind"] in ("Role", "RoleBinding")  # no cluster-wide grant
        assert d["metadata"]["namespace"] == agent_manifests.DEFAULT_NAMESPACE
    (role,) = [d for d in docs if d["kind"] == "Role"]
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
               for r in rule["resources"] for v in rule["verbs"]}
    assert ("", "pods/exec", "create") in granted and ("", "pods/exec", "get") in granted
    assert not {v for _, r, v in granted if r in ("pods", "daemonsets")} - {"get", "list"}
    # the base RBAC does not grant exec anywhere
    base = list(yaml.safe_load_all(open(os.path.join(REPO, "deploy", "rbac.yaml"))))
    for d in base:
        for rule in (d or {}).get("rules") or ():
            assert "pods/exec" not in rule["resources"]


def test_example_podmonitor_selects_the_agent_and_its_metrics_port():
    import yaml
    with open(os.path.join(REPO, "deploy", "examples", "agent-podmonitor.yaml")) as f:
        pm = yaml.safe_load(f)
    assert pm["kind"] == "PodMonitor" and pm["apiVersion"] == "monitoring.coreos.com/v1"
    assert pm["spec"]["selector"]["matchLabels"] == agent_manifests.SELECTOR
    assert pm["spec"]["namespaceSelector"]["matchNames"] == [agent_manifests.DEFAULT_NAMESPACE]
    ds = agent_manifests.daemonset("gpu-doctor", PINNED, None, agent_manifests.Watch(30, 9400))
    ports = ds["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert [e["port"] for e in pm["spec"]["podMetricsEndpoints"]] == [p["name"] for p in ports]


def test_agent_history_reads_at_most_its_limit(xc, kube):
    import sys
    xc.namespaces["gpu-doctor"] = {PROBE_NS: "true"}
    pod = xc.add_agent_pod("gpu-a")
    xc.exec_argv = lambda cmd: [sys.executable, "-c", "print('x' * 5000)"]
    with pytest.raises(errors.StreamBroken, match="more than 1000 bytes"):
        agent_exec.agent_history(kube, pod, ["list"], 1000)
    assert agent_exec.agent_history(kube, pod, ["list"], 10000).strip() == b"x" * 5000
    xc.exec_argv = lambda cmd: [sys.executable, "-c",
                                "import sys; sys.stderr.write('error: no bundle 3\\x1b[31m\\n');"
                                " sys.exit(2)"]
    with pytest.raises(errors.UsageError) as ei:
        agent_exec.agent_history(kube, pod, ["get", "3"], 1000)
    assert "no bundle 3" in ei.value.one_line() and "\x1b" not in ei.value.one_line()

"""The debug pod manifest: schema-valid for the Kubernetes versions we support, and safe."""
from __future__ import annotations

import kubernetes_validate
import pytest

from kubectl_gpudoctor import debugpod
from node_probe import __version__


@pytest.mark.parametrize("k8s", ["1.27", "1.30", kubernetes_validate.latest_version()])
@pytest.mark.parametrize("node", ["gpu-1", "ip-10-0-1-23.ec2.internal",
                                  "a-very-long-node-name-" + "x" * 50])
def test_manifest_is_schema_valid(k8s, node):
    m = debugpod.manifest(node, "gpu-doctor", debugpod.new_run_id(), focus_pods=("uid-1",))
    kubernetes_validate.validate(m, k8s, strict=True)
    assert len(m["metadata"]["name"]) <= 63
    for v in m["metadata"]["labels"].values():
        assert len(v) <= 63


def test_manifest_safety_properties():
    m = debugpod.manifest("gpu-1", "ns1", "abcd1234", timeout_s=40, trace_s=3)
    spec = m["spec"]
    c = spec["containers"][0]
    assert spec["nodeName"] == "gpu-1"
    assert spec["hostPID"] and spec["hostNetwork"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["restartPolicy"] == "Never"
    assert spec["activeDeadlineSeconds"] >= 40
    assert spec["tolerations"] == [{"operator": "Exists"}]
    assert c["securityContext"]["privileged"] is True
    assert c["image"] == f"{debugpod.DEFAULT_IMAGE_REPO}:{__version__}"
    mounts = {mt["mountPath"]: mt for mt in c["volumeMounts"]}
    assert mounts["/host"]["readOnly"] is True
    assert {"/lib/modules", "/usr/src", "/sys/fs/cgroup", "/dev", "/sys/kernel/debug"} <= set(mounts)
    assert mounts["/lib/modules"]["readOnly"] and mounts["/usr/src"]["readOnly"]
    lim = c["resources"]["limits"]["memory"]
    assert lim.endswith("Mi") and 300 <= int(lim[:-2]) <= 512
    labels = m["metadata"]["labels"]
    assert labels[debugpod.APP_LABEL] == "gpu-doctor" and labels[debugpod.RUN_LABEL] == "abcd1234"
    assert labels[debugpod.NODE_LABEL] == "gpu-1"
    cmd = c["command"]
    assert cmd[:4] == ["python3", "-m", "node_probe", "-o"] and "jsonl" in cmd
    assert cmd[cmd.index("--host-root") + 1] == "/host"
    assert cmd[cmd.index("--timeout") + 1] == "40"
    assert cmd[cmd.index("--trace-seconds") + 1] == "3"


def test_probe_args_are_understood_by_the_probe():
    """The command line we put in the pod must parse with the probe's own parser."""
    from node_probe.cli import build_parser
    cmd = debugpod.probe_args(30, 5, "gpu-1", focus_pods=("u1", "u2"))
    args = build_parser().parse_args(cmd[3:])
    assert args.output == "jsonl" and args.focus_pod == ["u1", "u2"]
    assert args.target_name == "gpu-1"

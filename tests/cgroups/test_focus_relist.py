"""`pod Y` right after the pod started: its container runs, but the kubelet's pod-resources List
does not name it yet. With no checkpoint entry and no NVIDIA_* environment (CDI or
volume-mounts device lists) nothing else says it has a GPU, so the audit used to report nothing
(flaky, depending on which came first). The containers check asks pod-resources again, bounded,
until it lists the focused pod's containers. Real cgroups and a real pod-resources gRPC server
whose answer changes while the probe waits."""
import json
import shutil
import tempfile
import threading
from pathlib import Path

import pytest

from node_probe.checks.cgroup_devices import cgroup_devices
from node_probe.checks.containers import RELIST_WAIT_S, containers_check
from node_probe.engine import facts as F
from node_probe.engine.context import ProbeContext, ProbeOptions
from tests.cgroups.conftest import GPU0_UUID, deny_all_then_allow, make_host_root, new_cid, new_uid
from tests.cgroups.test_audit_v1 import BASE

pytestmark = pytest.mark.root


@pytest.mark.parametrize("listed_after_s", [0.8, None], ids=["listed-late", "never-listed"])
def test_focused_pod_waits_for_pod_resources_to_list_it(v1_tree, tmp_path, listed_after_s):
    from tests.fakes.fake_podresources import serve
    host = make_host_root(tmp_path)
    uid, cid = new_uid(), new_cid()
    cg = v1_tree.container(uid, cid)
    deny_all_then_allow(cg, BASE)                 # the GPU was allowed, then lost: denied now
    v1_tree.spawn(cg, {})                         # no NVIDIA_* in its environment
    d = host / f"run/containerd/io.containerd.runtime.v2.task/k8s.io/{cid}"
    d.mkdir(parents=True)
    d.joinpath("config.json").write_text(json.dumps({
        "annotations": {"io.kubernetes.cri.sandbox-name": "new-0",
                        "io.kubernetes.cri.sandbox-namespace": "ml",
                        "io.kubernetes.cri.container-name": "main"},
        "linux": {"resources": {"devices": [{"allow": False, "access": "rwm"}] + [
            {"allow": True, "type": "c", "major": 195, "minor": m, "access": "rw"}
            for m in (255, 0)]}}}))
    kdir = Path(tempfile.mkdtemp(prefix="gdk-", dir="/tmp"))   # short: unix socket path
    rows: list[dict] = [{"namespace": "other", "pod": "old-0", "container": "c",
                         "resource": "nvidia.com/gpu", "device_ids": ["GPU-other"]}]
    server = serve(kdir / "pod-resources/kubelet.sock", rows)
    mine = {"namespace": "ml", "pod": "new-0", "container": "main",
            "resource": "nvidia.com/gpu", "device_ids": [GPU0_UUID]}
    timer = threading.Timer(listed_after_s or 0, lambda: rows.append(mine))
    if listed_after_s is not None:
        timer.start()
    try:
        opts = ProbeOptions(host_root=host, kubelet_dir=kdir, trace_s=0.0,
                            cgroup_root=Path("/sys/fs/cgroup"), focus_pods=(uid,),
                            only=("cgroup.devices",), timeout_s=15)
        records: list[dict] = []
        ctx = ProbeContext(opts, records.append)
        ctx.publish(F.PODRESOURCES, tuple(dict(r) for r in rows))   # the first List: not yet
        for key in F.declared():
            if key not in (F.CONTAINERS, F.PODRESOURCES):
                ctx.facts.fail(key, "not given by the test")
        containers_check(ctx)
        findings = list(cgroup_devices(ctx))
    finally:
        timer.cancel()
        server.stop(0)
        shutil.rmtree(kdir, ignore_errors=True)
    (c,) = [c for c in ctx.fact(F.CONTAINERS, timeout=0) if c.ref.pod_uid == uid]
    logs = [r["message"] for r in records if r.get("kind") == "log"]
    if listed_after_s is None:     # bounded: it gives up and says so, no GPU invented
        assert not c.is_gpu and findings == []
        assert any(f"within {RELIST_WAIT_S:.0f}s" in m for m in logs), logs
        return
    assert (c.gpu_source, c.gpu_ids) == ("podresources", [GPU0_UUID])
    assert [f.id for f in findings] == ["cgroup.device_denied"]
    assert {x["device"] for x in findings[0].evidence["denied"]} >= {"/dev/nvidiactl",
                                                                     "/dev/nvidia0"}
    assert any("re-list" in m for m in logs), logs

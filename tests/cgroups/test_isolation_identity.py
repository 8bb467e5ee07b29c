"""Who may hold GPUs it was not given, and a scan that could not read everything (round-4 audit
I-01 and I-02), end to end.

The suite's intruder scenario (test_gpu_isolation.py: real processes in real kubepods cgroups
holding real mknod'ed GPU nodes, the real pod-resources gRPC fake), with the intruder changed
the way a tenant can change it:

- I-01: a GPU agent used to be recognised by its process name, which a tenant sets (prctl, or
  exec through a symlink: the kernel's comm is the name execve was given). What exempts a
  container now is what a tenant cannot set: its pod's namespace being one the operator trusts
  (the GPU Operator installs into `gpu-operator`:
  https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/getting-started.html,
  "kubectl create ns gpu-operator"), or serving a device-plugin socket in the kubelet's
  device-plugins directory (the NVIDIA device plugin's Helm chart installs into its own
  `nvidia-device-plugin` namespace: https://github.com/NVIDIA/k8s-device-plugin#deployment-via-helm,
  "--namespace nvidia-device-plugin").
- I-02: descriptors opened before the GPU ones (4,100: past the old per-process cap of 4096,
  where the scan stopped silently and the check said ok), and processes past the 64 that
  container discovery keeps per container.
"""
from __future__ import annotations

import dataclasses
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from node_probe.engine import registry
from node_probe.engine.context import ProbeOptions
from node_probe.engine.runner import Runner
from node_probe.host import containers, gpu_holders
from tests.cgroups.conftest import GPU0_UUID, GPU1_UUID, new_cid, new_uid
from tests.cgroups.test_gpu_isolation import (MAJOR, MINORS, bundle, host_root,  # noqa: F401
                                              short_tmp)
from tests.fakes.fake_podresources import serve
from tests.probe_run import REPO, run_probe

pytestmark = pytest.mark.root

# a process that opens `filler` descriptors on /dev/null, then the given paths, and execs
# /bin/sleep through a symlink named `comm` (its comm is then `comm`), keeping them all open
HOLDER = r"""
import os, resource, sys, tempfile
filler, comm, paths = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, filler + 64), max(hard, filler + 64)))
fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(filler)]
fds += [os.open(p, os.O_RDONLY) for p in paths]
for fd in fds:
    os.set_inheritable(fd, True)
exe = "/bin/sleep"
if comm != "-":
    d = tempfile.mkdtemp(prefix="gdiso-comm-")
    exe = os.path.join(d, comm)
    os.symlink("/bin/sleep", exe)
os.execv(exe, [exe, "120"])
"""


def holder(tree, cgroup, paths, comm="-", filler=0):
    return tree.spawn_script(cgroup, [sys.executable, "-c", HOLDER, str(filler), comm,
                                      *map(str, paths)], {"PATH": "/bin:/usr/bin"}, "holder")


def device_plugin(tree, cgroup, socket_path, paths):
    """The suite's real gRPC device plugin (tests/fakes/fake_device_plugin.py) serving
    `socket_path`, started in `cgroup` with `paths` open: the NVIDIA plugin keeps NVML, and with
    it the GPU nodes, open."""
    opens = " && ".join(f'exec {3 + i}<"{p}"' for i, p in enumerate(paths))
    procs_file = str(cgroup / "cgroup.procs")

    def join():
        fd = os.open(procs_file, os.O_WRONLY)
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)

    p = subprocess.Popen(
        ["/bin/sh", "-c", f'{opens} && exec "$0" "$1" --socket "$2"', sys.executable,
         str(REPO / "tests/fakes/fake_device_plugin.py"), str(socket_path)],
        env={"PATH": "/bin:/usr/bin", "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, preexec_fn=join)
    tree.procs.append(p)
    ready, _, _ = select.select([p.stdout], [], [], 60)
    assert ready and p.stdout.readline().startswith(b"READY"), "the fake plugin did not start"
    return p


@dataclasses.dataclass
class Pod:
    ns: str
    name: str
    container: str
    given: list          # GPU uuids pod-resources gives it
    opens: list          # GPU uuids its process holds open
    comm: str = "-"
    filler: int = 0
    plugin: bool = False     # its process serves the device-plugin socket


def node(tree, tmp, pods):
    root = host_root(tmp)
    dev = {u: root / f"dev/nvidia{m}" for u, m in MINORS.items()}
    rows, uids = [], []
    for p in pods:
        uid, cid = new_uid(), new_cid()
        cg = tree.container(uid, cid)
        bundle(root, cid, p.ns, p.name, uid, p.container)
        paths = [dev[u] for u in p.opens]
        if p.plugin:
            device_plugin(tree, cg, root / "var/lib/kubelet/device-plugins/nvidia-gpu.sock",
                          paths)
        else:
            holder(tree, cg, paths, p.comm, p.filler)
        uids.append(uid)
        rows.append({"namespace": p.ns, "pod": p.name, "container": p.container,
                     "resource": "nvidia.com/gpu" if p.given else "example.com/nic",
                     "device_ids": p.given or ["nic-0"]})
    return root, rows, uids


def probe(root, rows, uids, *extra, env=None):
    server = serve(root / "var/lib/kubelet/pod-resources/kubelet.sock", rows)
    try:
        args = ["--host-root", str(root), "--cgroup-root", "/sys/fs/cgroup",
                "--only", "gpu.isolation", "--only", "deviceplugin", "--trace-seconds", "0",
                *extra]
        for u in uids:
            args += ["--focus-pod", u]
        return run_probe(*args, env=env)
    finally:
        server.stop(0)


def scan_record(run) -> dict:
    """The isolation check's progress record: what it read, whom it exempted and why."""
    (rec,) = [r for r in run.records if r.get("kind") == "progress" and "exempt" in r]
    return rec


def status(run) -> dict:
    return {c["id"]: c for c in run.summary["checks"]}["gpu.isolation"]


TRAINERS = [Pod("ml", "train-0", "main", [GPU0_UUID], [GPU0_UUID]),
            Pod("ml", "train-1", "main", [GPU1_UUID], [GPU1_UUID])]


@pytest.mark.parametrize("comm", ["nvidia-smi", "dcgm-exporter", "nvidia-device-plugin"])
def test_a_tenant_named_like_a_gpu_agent_is_still_a_breach(v1_tree, short_tmp, comm):
    """Fails on the comm match: the process, its pod and its container all carry the agent's
    names (the GPU Operator's `nvidia-dcgm-exporter` DaemonSet's), in a tenant namespace."""
    root, rows, uids = node(v1_tree, short_tmp, TRAINERS + [
        Pod("tenant-b", "nvidia-dcgm-exporter-7xkq2", "nvidia-dcgm-exporter", [],
            [GPU0_UUID, GPU1_UUID], comm=comm)])
    run = probe(root, rows, uids)
    (f,) = run.findings("gpu.isolation_breach")
    assert f["subject"] == "pod tenant-b/nvidia-dcgm-exporter-7xkq2 container nvidia-dcgm-exporter"
    assert {p["comm"] for p in f["evidence"]["processes"]} == {comm[:15]}
    assert scan_record(run)["exempt"] == []
    assert status(run)["status"] == "ok" and run.returncode == 1


def test_gpu_agents_in_the_gpu_operator_namespace_are_exempt_and_say_why(v1_tree, short_tmp):
    """The healthy control: the device plugin and dcgm-exporter as the GPU Operator runs them
    (its DaemonSets' pod and container names) hold every GPU with no allocation; the node stays
    quiet and the scan says whom it exempted and on what ground."""
    root, rows, uids = node(v1_tree, short_tmp, TRAINERS + [
        Pod("gpu-operator", "nvidia-device-plugin-daemonset-4bljq", "nvidia-device-plugin", [],
            [GPU0_UUID, GPU1_UUID], plugin=True),
        Pod("gpu-operator", "nvidia-dcgm-exporter-7xkq2", "nvidia-dcgm-exporter", [],
            [GPU0_UUID, GPU1_UUID], comm="dcgm-exporter")])
    run = probe(root, rows, uids)
    # (the fake plugin's /dev is this machine's, not the temp host root's: the deviceplugin
    # check's stale_dev_view about that is not this test's business)
    assert [f for f in run.findings() if f["check"] == "gpu.isolation"] == [], run.stdout
    assert status(run)["status"] == "ok", run.stdout
    rec = scan_record(run)
    sock = root / "var/lib/kubelet/device-plugins/nvidia-gpu.sock"
    assert sorted(rec["exempt"], key=lambda e: e["subject"]) == [
        {"subject": "pod gpu-operator/nvidia-dcgm-exporter-7xkq2 container nvidia-dcgm-exporter",
         "why": "its pod's namespace gpu-operator is trusted (the default list)"},
        {"subject": "pod gpu-operator/nvidia-device-plugin-daemonset-4bljq container "
                    "nvidia-device-plugin",
         "why": f"it serves the device-plugin socket {sock} (matched by inode)"}]
    assert "gpu-operator" in rec["trusted_namespaces"]


def test_the_device_plugin_is_exempt_by_the_socket_it_serves(v1_tree, short_tmp):
    """The NVIDIA device plugin installed by its own Helm chart (namespace nvidia-device-plugin,
    not trusted by default) is known by the socket it serves in the kubelet's dir; a tenant in
    the same namespace holding GPUs without serving it is not."""
    root, rows, uids = node(v1_tree, short_tmp, TRAINERS + [
        Pod("nvidia-device-plugin", "nvdp-nvidia-device-plugin-5x2kq", "nvidia-device-plugin-ctr",
            [], [GPU0_UUID, GPU1_UUID], plugin=True),
        Pod("nvidia-device-plugin", "nvidia-device-plugin-impostor", "nvidia-device-plugin-ctr",
            [], [GPU0_UUID], comm="nvidia-device-plugin")])
    run = probe(root, rows, uids)
    (f,) = run.findings("gpu.isolation_breach")
    assert f["subject"] == ("pod nvidia-device-plugin/nvidia-device-plugin-impostor container "
                            "nvidia-device-plugin-ctr")
    (ex,) = scan_record(run)["exempt"]
    assert ex["subject"] == ("pod nvidia-device-plugin/nvdp-nvidia-device-plugin-5x2kq container "
                             "nvidia-device-plugin-ctr")
    sock = root / "var/lib/kubelet/device-plugins/nvidia-gpu.sock"
    assert ex["why"] == f"it serves the device-plugin socket {sock} (matched by inode)"


@pytest.mark.parametrize("how", ["flag", "env"])
def test_the_operator_chooses_the_trusted_namespaces(v1_tree, short_tmp, how):
    """--trusted-namespace (or GPU_DOCTOR_TRUSTED_NAMESPACES) replaces the default list: the
    operator's monitoring namespace is trusted, gpu-operator no longer is."""
    root, rows, uids = node(v1_tree, short_tmp, TRAINERS + [
        Pod("monitoring", "dcgm-exporter-abcde", "exporter", [], [GPU0_UUID]),
        Pod("gpu-operator", "nvidia-dcgm-exporter-7xkq2", "nvidia-dcgm-exporter", [],
            [GPU1_UUID])])
    if how == "flag":
        run = probe(root, rows, uids, "--trusted-namespace", "monitoring")
        source = "--trusted-namespace"
    else:
        run = probe(root, rows, uids, env={"GPU_DOCTOR_TRUSTED_NAMESPACES": " monitoring, "})
        source = "$GPU_DOCTOR_TRUSTED_NAMESPACES"
    (f,) = run.findings("gpu.isolation_breach")
    assert f["subject"].startswith("pod gpu-operator/")
    rec = scan_record(run)
    assert rec["trusted_namespaces"] == ["monitoring"] and rec["trusted_namespaces_from"] == source
    assert [e["why"] for e in rec["exempt"]] == [
        f"its pod's namespace monitoring is trusted ({source})"]


def test_descriptors_opened_before_the_gpu_ones_do_not_hide_a_breach(v1_tree, short_tmp):
    """I-02: 4,100 descriptors before the GPU ones (the old per-process cap was 4096 and cut
    silently: 0 breaches, status ok)."""
    root, rows, uids = node(v1_tree, short_tmp, TRAINERS + [
        Pod("tenant-b", "notebook-1", "jupyter", [], [GPU0_UUID, GPU1_UUID], filler=4100)])
    run = probe(root, rows, uids)
    (f,) = run.findings("gpu.isolation_breach")
    assert f["subject"] == "pod tenant-b/notebook-1 container jupyter"
    assert status(run)["status"] == "ok"


def test_a_gpu_holder_past_the_first_64_processes_is_found(v1_tree, short_tmp):
    """Container discovery keeps 64 pids per container (containers.MAX_PIDS); 70 idle
    processes started first used to hide the one holding the GPUs."""
    root, rows, uids = node(v1_tree, short_tmp, TRAINERS)
    uid, cid = new_uid(), new_cid()
    cg = v1_tree.container(uid, cid)
    bundle(root, cid, "tenant-b", "notebook-1", uid, "jupyter")
    for _ in range(containers.MAX_PIDS + 6):
        v1_tree.spawn(cg)
    intruder = holder(v1_tree, cg, [root / f"dev/nvidia{MINORS[GPU0_UUID]}"])
    rows.append({"namespace": "tenant-b", "pod": "notebook-1", "container": "jupyter",
                 "resource": "example.com/nic", "device_ids": ["nic-0"]})
    run = probe(root, rows, uids + [uid])
    (f,) = run.findings("gpu.isolation_breach")
    assert [p["pid"] for p in f["evidence"]["processes"]] == [intruder.pid]


def _in_process(root, uids, **kw):
    opts = ProbeOptions(host_root=root, cgroup_root=Path("/sys/fs/cgroup"),
                        kubelet_dir=root / "var/lib/kubelet", trace_s=0.0, timeout_s=20.0,
                        focus_pods=tuple(uids), only=("gpu.isolation", "deviceplugin"), **kw)
    records = []
    res = Runner(registry.select(opts.only, ()), opts, records.append, fail_on="never").run()
    return res, records


def test_a_descriptor_table_cut_by_the_cap_is_could_not_look_never_ok(v1_tree, short_tmp,
                                                                      monkeypatch):
    """Past the per-process cap the check is `skipped` with the container, the process and
    what was read, never `ok` (before: the cut was silent and the status ok). The cap is made
    small here; the real one is gpu_holders.MAX_FDS."""
    monkeypatch.setattr(gpu_holders, "MAX_FDS", 64)
    root, rows, uids = node(v1_tree, short_tmp, TRAINERS + [
        Pod("tenant-b", "notebook-1", "jupyter", [], [GPU0_UUID], filler=100)])
    server = serve(root / "var/lib/kubelet/pod-resources/kubelet.sock", rows)
    try:
        res, records = _in_process(root, uids)
    finally:
        server.stop(0)
    assert [f for f in res.findings if f.id == "gpu.isolation_breach"] == []
    (r,) = [c for c in res.checks if c.id == "gpu.isolation"]
    assert r.status == "skipped"
    assert "pod tenant-b/notebook-1 container jupyter" in r.reason
    assert "64 descriptors read, stopped by the per-process cap of 64 descriptors" in r.reason
    (rec,) = [x for x in records if x.get("kind") == "progress" and "not_scanned" in x]
    (cut,) = rec["not_scanned"]
    assert cut["subject"] == "pod tenant-b/notebook-1 container jupyter"
    assert cut["processes"][0]["fds_read"] == 64


def test_scan_stops_at_its_deadline_and_says_so():
    """The shared deadline cuts a scan of this very process (it has descriptors open: the test
    runner's own) and the cut names the process."""
    budget = gpu_holders.Budget(deadline=time.monotonic() - 1.0)
    s = gpu_holders.scan([os.getpid()], MAJOR, budget=budget)
    assert not s.complete
    (cut,) = s.cuts
    assert (cut.pid, cut.read, cut.why) == (os.getpid(), 0, "the run's deadline")


def test_a_full_scan_within_the_caps_is_complete():
    s = gpu_holders.scan([os.getpid()], MAJOR)
    assert s.complete and s.cuts == ()


def test_the_watching_agent_marks_a_tenant_named_like_an_agent(v1_tree, short_tmp):
    """The agent's pass (watch/detect.run_pass, the same check) sees the same breach: a tenant
    process named nvidia-smi no longer keeps GpuDoctorIsolationBreach False."""
    from node_probe.watch import detect
    root, rows, uids = node(v1_tree, short_tmp, TRAINERS + [
        Pod("tenant-b", "notebook-1", "jupyter", [], [GPU0_UUID], comm="nvidia-smi")])
    server = serve(root / "var/lib/kubelet/pod-resources/kubelet.sock", rows)
    try:
        res = detect.run_pass(ProbeOptions(host_root=root, cgroup_root=Path("/sys/fs/cgroup"),
                                           kubelet_dir=root / "var/lib/kubelet"), 20.0)
    finally:
        server.stop(0)
    mine = [p for p in res.problems.get("GpuDoctorIsolationBreach", ())
            if p.subject.startswith("pod tenant-b/notebook-1 ")]
    assert [p.finding_id for p in mine] == ["gpu.isolation_breach"]


def test_the_agent_passes_its_trusted_namespaces_to_its_passes_and_captures():
    from node_probe.watch import loop
    a = loop.build_parser().parse_args(["--trusted-namespace", "monitoring",
                                        "--trusted-namespace", "gpu-operator"])
    assert loop._probe_args(a)[-4:] == ["--trusted-namespace", "monitoring",
                                        "--trusted-namespace", "gpu-operator"]
    assert "--trusted-namespace" not in loop._probe_args(loop.build_parser().parse_args([]))

"""NVML: is the driver library there, does it initialise, and what GPUs does it report.

Why: "NVML does not answer" is the first branch of every GPU incident. The host's own
libnvidia-ml.so.1 is found under --host-root by host.layout's driver-root resolver (the one
answer every check shares: the device plugin's driver root, the host, the GPU Operator's
run/nvidia/driver, GKE's and Bottlerocket's paths) and loaded by absolute path in a killable child with a deadline, because
init can hang forever (seed 000). Publishes the "nvml" fact (engine.facts.NvmlInventory, with
the typed GPU list) for the driver, device-plugin and cgroup checks.
"""
from __future__ import annotations

import re
import sys
import time
from pathlib import Path

from node_probe.protocol import catalog
from node_probe.host import hostfs, layout, nvml_forkserver, subproc
from node_probe.engine.context import Skipped
from node_probe.engine.facts import NVML, NvmlInventory
from node_probe.engine.registry import check

LIB = layout.LIB
SEED_REFS = ("https://github.com/NVIDIA/go-nvml/issues/152",
             "https://github.com/kubernetes/kubernetes/issues/117435")
_VERSION_RE = re.compile(r"libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)?)$")


def library_version(path: Path | None) -> str | None:
    """The driver version encoded in the real file name (libnvidia-ml.so.570.158.01)."""
    if path is None:
        return None
    m = _VERSION_RE.search(path.name)
    return m.group(1) if m else None


def kernel_module_version(root: Path) -> str | None:
    text = hostfs.read_text(root, "proc/driver/nvidia/version")
    if not text:
        return None
    m = re.search(r"Kernel Module(?: for [\w-]+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return m.group(1) if m else None


def child_python() -> list[str]:
    """The interpreter part of the NVML child's argv: isolated and without `site` (-I -S), the
    probe's package and this process's import path (absolute directories: where pynvml is)
    given by hand. The watching agent starts this child every pass: `site` (and what an
    image's .pth files import) cost it ~15-30 ms of CPU of its ~60 (bench/watch_pass_cost.py),
    and -I keeps PYTHON* variables and the working directory out of a child that loads a
    library as root. A frozen build runs its own executable as before."""
    if getattr(sys, "frozen", False):
        return subproc.python_module_argv("node_probe.host.nvml_child")
    import node_probe
    path = [str(Path(node_probe.__file__).resolve().parent.parent)]
    for d in sys.path[:64]:
        if d and Path(d).is_absolute() and d not in path and Path(d).is_dir():
            path.append(d)
    return [sys.executable, "-I", "-S", "-c",
            f"import sys; sys.path[:0] = {path!r}; "
            "from node_probe.host.nvml_child import main; sys.exit(main(sys.argv[1:]))"]


def child_args(lib: Path, host_root: Path, proc: Path = Path("/proc")) -> list[str]:
    """nvml_child's arguments for `lib`: it re-checks that the library is the host's own, with
    this node's kubelet dir and runtime dirs among the areas tenants write."""
    argv = ["--host-root", str(host_root)]
    kdir = layout.kubelet_dir(host_root, proc).path
    try:
        argv += ["--kubelet-dir", str(Path(kdir).relative_to(host_root))]
    except ValueError:
        pass
    rt = layout.runtime(host_root, proc)
    for d in (rt.state_dir, rt.root_dir):
        if d:
            argv += ["--runtime-dir", d]
    return [*argv, str(lib)]


def child_argv(lib: Path, host_root: Path, proc: Path = Path("/proc")) -> list[str]:
    """argv of the NVML child started as its own interpreter (`local`, the debug pod)."""
    return [*child_python(), *child_args(lib, host_root, proc)]


def run_child(lib: Path, timeout_s: float, host_root: Path = Path("/"),
              proc: Path = Path("/proc")) -> tuple[dict | None, str, subproc.ChildResult]:
    """Run nvml_child; returns (result or None, last stage reached, raw child result). In the
    watching agent's passes the child is forked by the agent's NVML forkserver (a fresh
    process each pass, no interpreter start: host.nvml_forkserver); elsewhere, or when that
    does not answer, it is started as its own interpreter."""
    args = child_args(lib, host_root, proc)
    t0 = time.monotonic()
    res = nvml_forkserver.run(args, timeout_s)
    if res is None:   # one deadline in all: what asking the forkserver took is spent
        res = subproc.run([*child_python(), *args],
                          max(0.5, timeout_s - (time.monotonic() - t0)))
    result, stage = None, "start"
    for obj in res.json_lines():
        if "stage" in obj:
            stage = obj["stage"]
        if "result" in obj:
            result = obj["result"]
    return result, stage, res


@check("nvml", title="NVML: driver library, init, GPU inventory and health",
       timeout_s=12.0, provides=(NVML,))
def nvml_check(ctx):
    root = ctx.options.host_root
    drv = layout.driver_root(root, ctx.options.proc_root)
    lib, searched, how = drv.library, list(drv.tried), drv.how
    kmod = kernel_module_version(root)
    if lib is not None:
        ctx.log("info", f"NVIDIA driver: {how}", check="nvml")
    fact = {"status": "unavailable", "library": str(lib) if lib else None,
            "library_version": library_version(lib), "kernel_module_version": kmod,
            "driver_version": None, "cuda_version": None, "gpus": []}
    if lib is None and drv.refused:
        ctx.publish(NVML, NvmlInventory.from_record(fact))
        yield _refused(drv.refused, searched, how, root, kmod)
        return Skipped(f"no {LIB} that is the host's own under {root}: NVML was not asked")
    if lib is None:
        ctx.publish(NVML, NvmlInventory.from_record(fact))
        loaded = kmod is not None
        yield catalog.make(
            "nvml.unavailable", "warning" if loaded else "info", "node",
            ("NVIDIA kernel module is loaded but libnvidia-ml.so.1 was not found on the host"
             if loaded else "No NVIDIA driver on the node (libnvidia-ml.so.1 not found)"),
            {"searched": searched, "how": how, "host_root": str(root),
             "kernel_module_version": kmod},
            ("The driver's user-space libraries are missing or not where the host keeps them. "
             "With the GPU Operator, check the driver daemonset (run/nvidia/driver)."
             if loaded else "Nothing to do on a node without GPUs. On a GPU node, install the "
             "NVIDIA driver or check that the GPU Operator driver pod is running."))
        return Skipped(f"no libnvidia-ml.so.1 under {root}: NVML could not be asked")

    timeout = ctx.budget(ctx.options.nvml_timeout_s, reserve=1.0)
    ctx.progress(message=f"NVML init via {lib} (deadline {timeout:.1f}s)")
    result, stage, raw = run_child(lib, timeout, root, ctx.options.proc_root)
    subject = "node"
    if raw.timed_out:
        fact["status"] = "hang"
        fact["driver_version"] = fact["library_version"] or kmod
        ctx.publish(NVML, NvmlInventory.from_record(fact))
        hung_in = "nvmlInit" if stage == "init" else ("loading the library" if stage == "load"
                                                      else "an NVML query")
        yield catalog.make(
            "nvml.init_hang", "critical", subject,
            f"NVML did not answer within {timeout:.1f}s (stuck in {hung_in})",
            {"wait_s": round(raw.duration_s, 2), "stage": stage, "library": str(lib),
             "driver_version": fact["driver_version"], "kernel_module_version": kmod},
            ("Any process calling nvmlInit on this node (the device plugin, DCGM, nvidia-smi) "
             "will hang the same way; the device plugin's GetPreferredAllocation then blocks "
             "kubelet admission for the whole node. Check driver.known_bad below; upgrade the "
             "driver; as a stopgap remove the trigger (e.g. mixed MIG layout) and restart the "
             "device plugin."),
            SEED_REFS)
        return
    if result is None:
        fact["status"] = "error"
        ctx.publish(NVML, NvmlInventory.from_record(fact))
        err = raw.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
        yield catalog.make("nvml.init_error", "warning", subject,
                           "The NVML helper process failed", {"exit_code": raw.returncode,
                           "stderr": err[0], "library": str(lib)},
                           "Run with the probe image's python3 and nvidia-ml-py installed.")
        return Skipped(f"the NVML helper process failed (exit {raw.returncode}): NVML could "
                       "not be asked")
    status = result.get("status")
    if status == "refused":
        ctx.publish(NVML, NvmlInventory.from_record(fact))
        yield _refused(((str(lib), str(result.get("error"))),), searched, how, root, kmod)
        return Skipped(f"the NVML child refused {lib}: NVML was not asked")
    if status == "no_client":
        ctx.publish(NVML, NvmlInventory.from_record(fact))
        yield catalog.make("nvml.unavailable", "warning", subject,
                           "NVML client (nvidia-ml-py) is missing from the probe environment",
                           {"library": str(lib), "error": result.get("error")},
                           "pip install nvidia-ml-py (the probe image includes it).")
        return Skipped("nvidia-ml-py is missing from the probe: NVML could not be asked")
    if status in ("load_error", "error"):
        fact["status"] = "error"
        fact["driver_version"] = fact["library_version"] or kmod
        ctx.publish(NVML, NvmlInventory.from_record(fact))
        code = result.get("code")
        msg = result.get("error") or "unknown"
        fix = ("The user-space library and the loaded kernel module are different driver "
               "versions: reboot the node (or reload the nvidia modules) so they match, or "
               "reinstall the driver." if code == 18 else
               "nvidia-smi on the node will show the same error; check the driver install "
               "and the kernel log (gpu.xid).")
        yield catalog.make("nvml.init_error", "critical", subject,
                           f"NVML init failed: {msg}",
                           {"nvml_return": code, "error": msg, "library": str(lib),
                            "stage": stage, "library_version": fact["library_version"],
                            "kernel_module_version": kmod},
                           fix, ("https://docs.nvidia.com/deploy/nvml-api/group__nvmlDeviceEnumvs.html",))
        return

    fact.update(status="ok", driver_version=result.get("driver_version"),
                cuda_version=result.get("cuda_version"), nvml_version=result.get("nvml_version"),
                gpus=result.get("gpus") or [], lost_gpus=result.get("lost_gpus") or [],
                p2p=result.get("p2p") or [])
    ctx.publish(NVML, NvmlInventory.from_record(fact))
    gpus = fact["gpus"]
    yield catalog.make(
        "nvml.inventory", "info", subject,
        f"Driver {fact['driver_version']}, CUDA {fact['cuda_version']}, {len(gpus)} GPU(s)",
        {"driver_version": fact["driver_version"], "cuda_version": fact["cuda_version"],
         "library": str(lib), "gpus": [{k: g.get(k) for k in ("index", "uuid", "name", "minor",
                                                              "mig_mode")} for g in gpus]})
    yield from _health(gpus)
    yield from _mig(gpus)


def _refused(refused, searched, how, root, kmod):
    """A libnvidia-ml.so.1 found only where a tenant can write: never loaded, and said."""
    return catalog.make(
        "nvml.unavailable", "warning", "node",
        f"{LIB} was found only where a pod or container can write it: not loaded, NVML not asked",
        {"refused": [{"library": lib, "why": why} for lib, why in refused],
         "searched": searched, "how": how, "host_root": str(root),
         "kernel_module_version": kmod},
        "The probe loads the driver's library only from the host's own directories (root-owned "
        "and not writable by others from / down; never a pod volume, a container's root or a "
        "container runtime's dir), because it runs that library's code as root. If the driver "
        "lives elsewhere on purpose, check where its installer put it; a library planted by a "
        "pod (under /var/lib/kubelet/pods) is a sign of an attempted escalation: find that pod.")


MEM_ERR_DOC = "https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/"


def _health(gpus: list[dict]):
    for g in gpus:
        rows = g.get("remapped_rows") or {}
        ecc = g.get("ecc_uncorrected_volatile") or 0
        subject = g.get("uuid", f"gpu{g.get('index')}")
        if rows.get("failure") or rows.get("pending"):
            yield _row_remap(g, rows, ecc, subject)
        elif ecc:
            ev = {"index": g.get("index"), "name": g.get("name"),
                  "ecc_uncorrected_volatile": ecc, "remapped_rows": rows}
            yield catalog.make("gpu.health", "warning", subject,
                               f"{ecc} uncorrected ECC error(s) since the driver loaded", ev,
                               "Check gpu.xid (Xid 48/63/64/94/95) and the workload; if the "
                               "count grows, drain the node and reset or replace the GPU.",
                               (MEM_ERR_DOC,))


def _row_remap(g: dict, rows: dict, ecc: int, subject: str):
    """A remapping NVML reports while the GPU otherwise answers normally: it stays allocatable
    and keeps running pods (nothing in Kubernetes looks at remapped rows), so say it here."""
    hist = rows.get("histogram") or {}
    bus = g.get("pci_bus_id")
    ev = {"index": g.get("index"), "name": g.get("name"), "pci_bus_id": bus,
          "rows_remapped_correctable": rows.get("correctable"),
          "rows_remapped_uncorrectable": rows.get("uncorrectable"),
          "remapping_pending": bool(rows.get("pending")),
          "remapping_failed": bool(rows.get("failure")),
          "banks_without_spare_rows": hist.get("none"), "remapper_histogram": hist or None,
          "ecc_uncorrected_volatile": ecc, "gpu_lost": bool(g.get("lost")),
          "persistence_mode": g.get("persistence_mode")}
    gpu = f"GPU {g.get('index')} ({g.get('name') or 'NVIDIA GPU'}, {subject})"
    if rows.get("failure"):
        return catalog.make(
            "gpu.row_remap_failed", "critical", subject,
            f"{gpu}: row remapping failed: it has bad memory rows it can no longer retire, "
            "though NVML still answers and pods still land on it", ev,
            "Drain the node (kubectl drain), take the GPU out of service and have it replaced "
            "(RMA with nvidia-bug-report.sh output). A reset does not fix a failed remapping; "
            "workloads on it can hit uncorrectable errors again at the same addresses.",
            (MEM_ERR_DOC,))
    return catalog.make(
        "gpu.row_remap_pending", "warning", subject,
        f"{gpu}: a memory row remapping is pending: the GPU must be reset before the bad "
        "row is retired, though NVML still answers and pods still land on it", ev,
        "Drain the GPU's pods (cordon the node, then delete or wait for them), reset the GPU "
        f"(nvidia-smi -r -i {bus or '<bus id>'}) or reboot the node, then uncordon. Until then "
        "the bad row is still in use and the application can hit the same error again. Risk: "
        "the reset kills every process on that GPU.",
        (MEM_ERR_DOC, "https://docs.nvidia.com/deploy/nvml-api/group__nvmlDeviceQueries.html"))


def _mig(gpus: list[dict]):
    mig = [g for g in gpus if g.get("mig_mode")]
    if not mig:
        return
    full = [g for g in gpus if not g.get("mig_mode")]
    layout = [{"uuid": g.get("uuid"), "index": g.get("index"),
               "instances": [m.get("profile") for m in g.get("mig_devices") or []]}
              for g in mig]
    empty = [g for g in mig if not g.get("mig_devices")]
    ev = {"mig_gpus": layout, "full_gpus": [g.get("uuid") for g in full],
          "mixed": bool(full)}
    if empty:
        yield catalog.make("mig.layout", "warning", "node",
                           f"{len(empty)} MIG-enabled GPU(s) have no MIG instances "
                           "(nothing allocatable on them)", ev,
                           "Create the instances (nvidia-mig-parted / GPU Operator MIG manager "
                           "config) or disable MIG on those GPUs.",
                           ("https://docs.nvidia.com/datacenter/tesla/mig-user-guide/",))
    else:
        yield catalog.make("mig.layout", "info", "node",
                           f"MIG on {len(mig)} GPU(s)" +
                           (f", beside {len(full)} full GPU(s)" if full else ""), ev)

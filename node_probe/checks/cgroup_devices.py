"""Device cgroup audit: can every GPU container still open the NVIDIA devices it needs?

Why: seeds 001 and 002. A container whose device cgroup lost `/dev/nvidiactl` or
`/dev/nvidia-uvm` fails with "NVML: Unknown Error" or CUDA error 30, and no log says why. This
check finds the kubelet's containers from their cgroups (containers.py), decides which have
GPUs (pod-resources, else NVIDIA_VISIBLE_DEVICES), computes the devices each needs with their
real major:minor (nvidia_devices.py) and asks what its cgroup allows (cgroup_rules.py: v1 rules,
v2 helper). A denial is reported with the remediation that fits the cause it can see: the
plugin's stale /dev (seed 002), cpuManagerPolicy static without device specs (seed 001), the
systemd driver without /dev/char links (nvidia-container-toolkit #48), and, when the eBPF trace
ran, who wrote the rules. Needs the "containers" fact (checks/containers.py).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from node_probe.protocol import catalog
from node_probe.host import cgroup_rules, containers, kubeletconfig, layout, nvidia_devices
from ..deviceplugin import devview
from node_probe.engine.facts import (CONTAINERS, DEVICEPLUGIN_TARGETS, KUBELET_CONFIG, NVML,
                                     TRACE_READY, TRACE_RESULTS, PluginTargetInfo)
from node_probe.engine.registry import check
from . import _not_wired
from .containers import containers_or_skip
from .kubelet import device_specs_setting

REFS_SPECS = ("https://github.com/kubernetes/kubernetes/issues/77073",
              "https://github.com/NVIDIA/k8s-device-plugin#configuration-option-details")
REFS_SYSTEMD = ("https://github.com/NVIDIA/nvidia-container-toolkit/issues/48",
                "https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/"
                "troubleshooting.html#containers-losing-access-to-gpus-with-error-failed-to-"
                "initialize-nvml-unknown-error")
REFS_STALE = ("https://github.com/NVIDIA/k8s-device-plugin/issues/222",)

MAX_WRITES = 24


def _soon(ctx, want: float) -> float:
    """A wait of at most `want` seconds that leaves a second for the verdicts."""
    return min(want, max(0.0, ctx.remaining() - 1.0))


def _kubelet_config(ctx) -> dict | None:
    cfg = ctx.fact(KUBELET_CONFIG, timeout=_soon(ctx, 1.0), default=None)
    if cfg is None:   # nobody published it: read it ourselves (files and /proc only)
        try:
            cfg = kubeletconfig.load(ctx.options.host_root, ctx.options.kubelet_path,
                                     ctx.options.proc_root)
        except Exception as exc:  # noqa: BLE001 - context for a remediation, never fatal
            ctx.log("debug", f"kubelet config unreadable: {exc}")
            return None
    return dict(cfg) if isinstance(cfg, Mapping) else None


def _stale_dev_view(ctx, targets: Sequence[PluginTargetInfo] | None) -> list | None:
    """Device names missing from the NVIDIA device plugin's /dev (None: no plugin to ask)."""
    missing, seen = [], False
    for t in targets or ():
        if not isinstance(t.pid, int) or not t.is_nvidia_resource:
            continue
        seen = True
        res = devview.compare(ctx.options.host("dev"), t.pid, ctx.options.proc_root)
        if res:
            missing.extend(res.get("missing") or ())
    return missing if seen else None


# -- per-container audit ------------------------------------------------------------------------

def _host_node_candidates(host_root: Path, d: nvidia_devices.Device) -> list[Path]:
    return [Path(host_root) / "dev" / d.name]


def audit_v1(c: containers.Container, exp: nvidia_devices.Expectation) -> dict:
    """{'denied': [Device], 'allowed': [...], 'untested': [...], 'rules': [...], ...}"""
    out: dict[str, Any] = {"denied": [], "allowed": [], "untested": [], "method": "devices.list"}
    rules = cgroup_rules.read_rules(c.cgroup_path)
    if rules is None:
        out["untested"] = list(exp.devices)
        out["reason"] = "devices.list unreadable (container gone?)"
        return out
    out["rules"] = list(rules.lines)
    out["default_allow"] = rules.default_allow
    for d in exp.devices:
        (out["allowed"] if rules.allows(d.kind, d.major, d.minor, "rw")
         else out["denied"]).append(d)
    return out


def audit_v2(items: Sequence[tuple[containers.Container, nvidia_devices.Expectation]],
             host_root: Path, timeout_s: float = 3.0) -> dict[str, dict]:
    """One access helper visits every container's cgroup; container_id -> audit dict."""
    results = cgroup_rules.check_access_many(
        [(c.ref.container_id, c.cgroup_path,
          [(d.major, d.minor, _host_node_candidates(host_root, d)) for d in exp.devices])
         for c, exp in items], timeout_s=timeout_s)
    audits = {}
    for c, exp in items:
        res = results[c.ref.container_id]
        out: dict[str, Any] = {"denied": [], "allowed": [], "untested": [],
                               "method": "access helper in the container's cgroup"}
        out["helper"] = {"pid": res.helper_pid, "duration_s": round(res.duration_s, 3),
                         "left_behind": res.left_behind,
                         **({"reason": res.reason} if res.reason else {})}
        out["errnos"] = dict(res.errnos)
        for d in exp.devices:
            verdict = res.allowed(d.majmin)
            (out["untested"] if verdict is None else out["allowed"] if verdict
             else out["denied"]).append(d)
        audits[c.ref.container_id] = out
    return audits


# -- cause and remediation -----------------------------------------------------------------------

def _names(items: Iterable) -> set[str]:
    out = set()
    for it in items or ():
        if isinstance(it, dict):
            it = it.get("device") or it.get("name") or it.get("path") or ""
        s = str(it)
        out.add(s[5:] if s.startswith("/dev/") else s)
    return out


def plugin_passes_specs(targets: Sequence[PluginTargetInfo] | None, proc: Path) -> bool | None:
    """Whether the NVIDIA device plugin process runs with device specs (None: unknown).
    The flag/env/config-file reading is the kubelet check's (one reader for both checks)."""
    seen = None
    for t in targets or ():
        if not t.is_nvidia_resource or not isinstance(t.pid, int):
            continue
        on = bool(device_specs_setting(t.pid, proc)["pass_device_specs"])
        seen = on if seen is None else (seen and on)
    return seen


def causes_for(denied_names: set[str], stale: set[str] | None, kubelet_cfg: dict | None,
               driver: str, passes_specs: bool | None,
               alloc_devices: list[str] | None = None) -> list[dict]:
    """The causes we can see for a denial, most specific first, each with its fix.
    `alloc_devices`: host paths of the device specs the plugin's Allocate returned for this
    container (kubelet checkpoint); [] = none at all; None = unknown."""
    out = []
    omitted = sorted(n for n in denied_names if alloc_devices and f"/dev/{n}" not in alloc_devices)
    if omitted and not (stale and set(omitted) <= stale):
        out.append({
            "cause": "plugin_omitted_device",
            "why": f"the device plugin's Allocate answer for this container (kept in the "
                   f"kubelet checkpoint) lists {', '.join(alloc_devices)} but not "
                   f"{', '.join('/dev/' + n for n in omitted)}; the runtime allows only what "
                   "the spec lists (a known failure: a plugin whose own /dev lacked the node)",
            "fix": "Check the plugin's view (`kubectl -n <plugin-namespace> exec <plugin-pod> "
                   "-- ls -l /dev/nvidia*`); once the node exists on the host, restart the "
                   "device plugin pod on this node (risk: no new GPU pods are admitted on the "
                   "node until it re-registers) and recreate the affected pods.",
            "refs": REFS_STALE})
    if stale and denied_names & stale:
        miss = sorted(denied_names & stale)
        out.append({
            "cause": "plugin_stale_dev_view",
            "why": f"the device plugin's own /dev lacks {', '.join(miss)} (it started before "
                   "the module created the node), so its Allocate device specs leave them out "
                   "and the runtime never allows them",
            "fix": "Make nvidia-uvm load at boot before the plugin starts (`nvidia-modprobe -u "
                   "-c=0` or `modprobe nvidia-uvm` in the driver setup), then restart the device "
                   "plugin pod on this node (`kubectl -n <plugin-namespace> delete pod "
                   "<plugin-pod>`; risk: no new GPU pods are admitted on this node until it "
                   "re-registers, running pods are not affected) and recreate the affected pods.",
            "refs": REFS_STALE})
    policy = (kubelet_cfg or {}).get("cpuManagerPolicy")
    if policy == "static" and passes_specs is not True:
        out.append({
            "cause": "cpu_manager_static_without_device_specs",
            "why": "kubelet runs cpuManagerPolicy: static; its CPU manager updates the "
                   "container's cgroups and the runtime rewrites the device allow-list from the "
                   "container spec, which lacks the NVIDIA devices nvidia-container-runtime "
                   "added outside it"
                   + ("" if passes_specs is None else "; the NVIDIA device plugin runs without "
                      "PASS_DEVICE_SPECS"),
            "fix": "Have the NVIDIA device plugin return device specs in Allocate: "
                   "`--pass-device-specs=true` or env PASS_DEVICE_SPECS=true on the plugin "
                   "(Helm: `--set passDeviceSpecs=true`), restart it, then recreate the GPU "
                   "pods on this node.",
            "refs": REFS_SPECS})
    cg_driver = (kubelet_cfg or {}).get("cgroupDriver") or driver
    if cg_driver == "systemd":
        out.append({
            "cause": "systemd_driver_device_reset",
            "why": "the systemd cgroup driver re-applies each unit's DeviceAllow= list on "
                   "`systemctl daemon-reload`; systemd resolves entries through "
                   "/dev/char/<major>:<minor> and drops NVIDIA devices that have no such link, "
                   "or that the container spec never listed (nvidia-container-toolkit #48)",
            "fix": "Create the /dev/char links (`nvidia-ctk system create-dev-char-symlinks "
                   "--create-all`, or the toolkit's udev rule) and pass device specs from the "
                   "plugin, or move to CDI (`nvidia-ctk cdi generate`, device-plugin "
                   "`--device-list-strategy=cdi-annotations`); then recreate the affected pods.",
            "refs": REFS_SYSTEMD})
    if not out:
        out.append({
            "cause": "unknown_rewrite",
            "why": "the container's device rules do not include the device; something rewrote "
                   "them after the NVIDIA runtime hook added it, or it was never in the spec",
            "fix": "Recreate the pod to restore its rules; run the probe with --trace-seconds "
                   "to catch who writes devices.allow/devices.deny, and make the device plugin "
                   "pass device specs so every rewrite keeps the NVIDIA devices.",
            "refs": REFS_SPECS})
    return out


def _spec_mentions(meta: dict, d: nvidia_devices.Device) -> bool | None:
    """Whether the runtime's spec (what it re-applies on every update) allows the device."""
    rules = meta.get("spec_device_rules")
    devs = meta.get("spec_devices")
    if rules is None and devs is None:
        return None
    for r in rules or ():
        if not r.get("allow"):
            continue
        if r.get("type") not in ("c", "a", None):
            continue
        if r.get("major") not in (None, -1, d.major) or r.get("minor") not in (None, -1, d.minor):
            continue
        if {"r", "w"} <= set(r.get("access") or "rwm"):
            return True
    return False


def _writes_for(c: containers.Container, writes: Sequence[dict]) -> list[dict]:
    keys = {c.ref.container_id, c.ref.pod_uid, c.ref.pod_uid.replace("-", "_")}
    out = []
    for w in writes or ():
        path = f'{w.get("path") or ""} {w.get("cgroup") or ""}'
        if any(k and k in path for k in keys):
            out.append({k: w.get(k) for k in ("pid", "comm", "path", "text", "ts")})
    return out


# -- the check ------------------------------------------------------------------------------------

@check("cgroup.devices", title="Device cgroups: GPU containers can open their NVIDIA devices",
       timeout_s=10.0, needs=(CONTAINERS,),
       uses=(KUBELET_CONFIG, NVML, TRACE_READY, TRACE_RESULTS, DEVICEPLUGIN_TARGETS),
       uses_trace_window=True)
def cgroup_devices(ctx):
    opts = ctx.options
    host_root = opts.host_root
    found = containers_or_skip(ctx)
    ctrs = list(found)
    gpu = list(found.gpu)
    kubelet_cfg = _kubelet_config(ctx)
    layout_driver = next((c.ref.driver for c in ctrs), None)
    driver = layout.resolve_cgroups(opts.cgroup_dir, kubelet_cfg, layout_driver).driver
    yield from _dev_char_links(ctx, host_root, driver, kubelet_cfg, layout_driver)
    if not gpu:
        return

    nvml = ctx.fact(NVML, timeout=_soon(ctx, 1.5), default=None)
    inv = nvidia_devices.inventory(host_root, nvml.to_dict() if nvml else None)
    plans = [(c, nvidia_devices.expected_devices(c.gpu_ids, inv, c.env)) for c in gpu]
    audits = _audit(ctx, plans)
    for c, exp in plans:
        res = audits.get(c.ref.container_id)
        if res and res["denied"]:
            names = ", ".join(f"{d.path} ({d.majmin})" for d in res["denied"])
            ctx.event("cgroup.device_denied", c.subject,
                      f"device cgroup denies {names}", cgroup=str(c.cgroup_path))

    # With eBPF tracing, wait for the window: who wrote device rules, and re-audit the
    # containers whose rules changed meanwhile (seed 001: the CPU manager's update rewrites
    # them every reconcile; the state after the window is the verdict).
    writes = None
    # the tracer publishes trace.ready once its programs are compiled and attached (seconds)
    ready = ctx.fact(TRACE_READY, timeout=_soon(ctx, ctx.budget(opts.trace_s + 4.0, reserve=1.5)),
                     default=None) if opts.trace_s > 0 else None
    if ready is not None and ready.get("available"):
        results = ctx.fact(TRACE_RESULTS, timeout=ctx.budget(opts.trace_s + 2.0, reserve=1.5),
                           default=None)
        writes = None if results is None else (results.get("cgroup_writes") or [])
        touched = [(c, exp) for c, exp in plans if _writes_for(c, writes or ())]
        if touched:
            ctx.progress(message=f"device rules of {len(touched)} GPU container(s) were "
                                 f"written during the trace window: auditing them again")
            audits.update(_audit(ctx, touched))
    denials = [(c, exp, audits[c.ref.container_id]) for c, exp in plans
               if c.ref.container_id in audits and audits[c.ref.container_id]["denied"]]
    if not denials:
        return
    targets = ctx.fact(DEVICEPLUGIN_TARGETS, timeout=_soon(ctx, 1.0), default=None)
    stale = _stale_dev_view(ctx, targets)
    passes = plugin_passes_specs(targets, opts.proc_root)
    for c, exp, res in denials:
        if _not_wired.never_wired(c, exp):   # never given, not taken away: no rewrite claimed
            yield _not_wired.finding(c, exp, res["denied"], host_root, opts.proc_root, passes)
            continue
        yield _finding(c, exp, res, inv, _names(stale) if stale is not None else None,
                       kubelet_cfg, driver or c.ref.driver, passes, writes)


def _audit(ctx, plans) -> dict[str, dict]:
    """v1 rules / one v2 helper for these (container, expectation) pairs; logs what could
    not be tested and any helper left behind."""
    audits = {c.ref.container_id: audit_v1(c, exp) for c, exp in plans if c.cgroup_version == 1}
    v2 = [(c, exp) for c, exp in plans if c.cgroup_version != 1]
    if v2 and not ctx.cancelled.is_set():
        audits.update(audit_v2(v2, ctx.options.host_root, timeout_s=ctx.budget(3.0, reserve=1.0)))
    for c, exp in plans:
        res = audits.get(c.ref.container_id)
        if res is None:
            continue
        if res.get("helper", {}).get("left_behind"):
            ctx.log("error", f"access helper pid {res['helper']['pid']} still in "
                             f"{c.cgroup_path} after it ended")
        if res["untested"]:
            ctx.log("warning", f"{c.subject}: could not test "
                    f"{', '.join(d.path for d in res['untested'])}: "
                    f"{res.get('reason') or res.get('helper', {}).get('reason', '?')}")
    return audits


def _finding(c, exp, res, inv, stale, kubelet_cfg, driver, passes, writes):
    denied: list[nvidia_devices.Device] = res["denied"]
    names = {d.name for d in denied}
    if c.alloc_devices is not None:   # what the plugin really answered for this container
        passes = bool(c.alloc_devices)
    causes = causes_for(names, stale, kubelet_cfg, driver, passes, c.alloc_devices)
    critical = any(d.required for d in denied)
    first = denied[0]
    evidence: dict[str, Any] = {
        "pod_uid": c.ref.pod_uid, "namespace": c.meta.get("namespace"),
        "pod": c.meta.get("pod"), "container": c.meta.get("container"),
        "container_id": c.ref.container_id, "cgroup_path": str(c.cgroup_path),
        "cgroup_version": c.cgroup_version, "cgroup_driver": driver, "qos": c.ref.qos,
        "device": first.path, "major": first.major, "minor": first.minor,
        "denied": [dict(d.to_dict(), required=d.required,
                        in_runtime_spec=_spec_mentions(c.meta, d),
                        in_allocate_specs=(None if c.alloc_devices is None
                                           else d.path in c.alloc_devices)) for d in denied],
        "allocate_device_specs": c.alloc_devices,
        "allowed": [d.to_dict() for d in res["allowed"]],
        "check_method": res["method"],
        "gpu_source": c.gpu_source, "gpu_ids": list(c.gpu_ids), "gpus_resolved": exp.gpus,
        "inventory_source": inv.source, "pids": c.pids[:8],
        "causes": [x["cause"] for x in causes],
    }
    if "rules" in res:
        evidence["rules"] = res["rules"]
    if "errnos" in res:
        evidence["errno_by_device"] = res["errnos"]
        evidence["helper"] = res.get("helper")
    if exp.notes:
        evidence["notes"] = exp.notes
    if stale is not None:
        evidence["plugin_dev_missing"] = sorted(stale)
    if kubelet_cfg:
        evidence["cpu_manager_policy"] = kubelet_cfg.get("cpuManagerPolicy")
    if passes is not None:
        evidence["plugin_passes_device_specs"] = passes
    if writes is not None:
        mine = _writes_for(c, writes)
        evidence["rewritten_by"] = [
            {"pid": w.get("pid"), "comm": w.get("comm"),
             "file": str(w.get("path") or "").rsplit("/", 1)[-1] or None, "text": w.get("text"),
             "ts": w.get("ts")} for w in mine[:MAX_WRITES]]
        if len(mine) > MAX_WRITES:
            evidence["rewrites_not_shown"] = len(mine) - MAX_WRITES
        if mine:
            who = ", ".join(sorted({f"{w.get('comm')}[{w.get('pid')}]" for w in mine}))
            reset = any(str(w.get("text", "")).strip().startswith("a") and
                        str(w.get("path", "")).endswith("devices.deny") for w in mine)
            seen = (f"during the trace window {who} rewrote its device rules"
                    + (" (denied all with `a`, then allowed a list without "
                       f"{', '.join(d.path for d in denied)})" if reset else ""))
            if causes[0]["cause"] == "unknown_rewrite":
                causes[0]["why"] = seen
                causes[0]["fix"] = (
                    f"{who} re-applies a device list that lacks the NVIDIA devices. If it is "
                    "the runtime (runc, containerd-shim, conmon) applying a container update "
                    "(the kubelet CPU manager does this every reconcile), make the device "
                    "plugin pass device specs (`--pass-device-specs=true` / "
                    "PASS_DEVICE_SPECS=true); if it is systemd, create the /dev/char links. "
                    "Then recreate the pod.")
            else:
                causes[0]["why"] += f"; {seen}"
    paths = ", ".join(f"{d.path} ({d.majmin})" for d in denied)
    title = (f"Container {c.container_label} in pod {c.pod_label} cannot open {paths}: "
             f"its device cgroup denies {'them' if len(denied) > 1 else 'it'}")
    remediation = " ".join(f"Cause: {x['why']}. Fix: {x['fix']}" for x in causes)
    refs = tuple(dict.fromkeys(r for x in causes for r in x["refs"]))
    return catalog.make("cgroup.device_denied", "critical" if critical else "warning",
                        c.subject, title, evidence, remediation, refs)


def _dev_char_links(ctx, host_root: Path, driver: str | None, kubelet_cfg, layout_driver):
    if driver != "systemd":
        return
    nodes = nvidia_devices.host_nvidia_nodes(host_root)
    if not nodes:
        return
    missing = nvidia_devices.missing_dev_char_links(host_root, nodes)
    if not missing:
        return
    src = "kubelet config" if (kubelet_cfg or {}).get("cgroupDriver") else "cgroup layout"
    yield catalog.make(
        "cgroup.dev_char_symlinks_missing", "warning", "node",
        f"{len(missing)} NVIDIA device node(s) have no /dev/char/<major>:<minor> link on a "
        f"systemd cgroup driver node",
        {"missing": [dict(d.to_dict(), link=f"/dev/char/{d.majmin}") for d in missing],
         "present": len(nodes) - len(missing), "cgroup_driver": driver,
         "cgroup_driver_from": src, "dev_char_dir": str(Path(host_root) / "dev/char")},
        "systemd re-applies each container unit's DeviceAllow= list on `systemctl "
        "daemon-reload` and resolves entries through /dev/char; without these links GPU "
        "containers lose their NVIDIA devices (\"NVML: Unknown Error\"). Create them with "
        "`nvidia-ctk system create-dev-char-symlinks --create-all` (GPU Operator: leave "
        "DISABLE_DEV_CHAR_SYMLINK_CREATION unset), or use CDI.",
        REFS_SYSTEMD)

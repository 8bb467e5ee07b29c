"""HAMi vGPU, node side: is the vGPU isolation really in each HAMi container, and what does the
HAMi device plugin's log say?

Why (seed 003): HAMi enforces a pod's GPU memory and SM limits only through `libvgpu.so`,
which its device plugin mounts into the container (`<HOOK_PATH>/vgpu/libvgpu.so`, default
/usr/local/vgpu) and preloads through a bind-mounted `/etc/ld.so.preload`, with a per-container
shared cache (`CUDA_DEVICE_MEMORY_SHARED_CACHE`). If the preload file is missing, does not name
the library, or names a library that is not there, or `CUDA_DISABLE_CONTROL=true` is set, the
container sees the whole GPU and the limits silently do nothing. Only the container's own root
(`/proc/PID/root`) shows this, so it is checked here, for containers that HAMi manages (their
environment carries CUDA_DEVICE_MEMORY_LIMIT_* / CUDA_DEVICE_SM_LIMIT / the shared cache): a
plain NVIDIA container has none of these and is never flagged.

The plugin log (`--plugin-log`) is scanned for the error patterns of HAMi's Allocate, node lock
and registration paths. `scan_plugin_log` is pure so the client can run it on `kubectl logs`.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from node_probe.protocol import catalog
from node_probe.host import containers, hostfs, procfs
from node_probe.engine.facts import CONTAINERS
from ..protocol import Finding
from node_probe.engine.context import Skipped
from node_probe.engine.registry import check

HAMI_ENV_PREFIXES = ("CUDA_DEVICE_MEMORY_LIMIT",)
HAMI_ENV_KEYS = ("CUDA_DEVICE_SM_LIMIT", "CUDA_DEVICE_MEMORY_SHARED_CACHE", "CUDA_OVERSUBSCRIBE")
DEFAULT_HOOK_PATH = "/usr/local"
LEGACY_CACHE_DIRS = ("/usr/local/vgpu", "/tmp/vgpu")
CONTAINERS_WAIT_S = 2.0
LOG_TAIL_BYTES = 8 << 20
PRELOAD_CAP = 64 << 10  # /etc/ld.so.preload names a few libraries; a bigger one is read in part
_TRUE = {"1", "t", "T", "TRUE", "true", "True"}

REFS_ISOLATION = (
    "https://github.com/Project-HAMi/HAMi/blob/master/pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go",
    "https://github.com/Project-HAMi/HAMi-core",
    "https://github.com/Project-HAMi/HAMi/blob/master/docs/develop/protocol.md",
)
REFS_LOG = (
    "https://github.com/Project-HAMi/HAMi/blob/master/pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go",
    "https://github.com/Project-HAMi/HAMi/blob/master/pkg/util/nodelock/nodelock.go",
    "https://github.com/Project-HAMi/HAMi/issues/1130",
)


# -- plugin log -----------------------------------------------------------------------------

# (key, pattern, severity, meaning, fix)
LOG_PATTERNS: tuple[tuple[str, re.Pattern, str, str, str], ...] = (
    ("device_number_not_matched", re.compile(r"device number not matched", re.I), "critical",
     "Allocate: the scheduler's hami.io/vgpu-devices-to-allocate for the pod lists a different "
     "number of devices than kubelet asked for; the pod fails admission",
     "Compare the pod's hami.io/vgpu-devices-to-allocate with its nvidia.com/gpu request "
     "(`kubectl gpu-doctor pod P`); run the same HAMi version for hami-scheduler and the device "
     "plugin; delete the pod so it is scheduled again."),
    ("pending_pod_not_found", re.compile(
        r"no binding pod found on node|failed to get pending pod|getpendingpod", re.I), "critical",
     "Allocate could not find the pod being bound to this node (hami.io/bind-phase=allocating "
     "and hami.io/vgpu-node): the node lock or the pod annotations are out of sync",
     "Check hami.io/mutex.lock on the node and the pending pods' hami.io/bind-phase "
     "(`kubectl gpu-doctor node N`)."),
    ("device_request_not_found", re.compile(
        r"device request not found|get device from annotation failed|failed to decode pod "
        r"devices|erase annotation failed", re.I), "critical",
     "Allocate could not read the pod's device annotations (missing, already erased, or "
     "written by a different HAMi version)",
     "Run the same HAMi version for hami-scheduler and the device plugin; delete the pod so it "
     "is scheduled again."),
    ("unknown_device", re.compile(r"unknown device", re.I), "warning",
     "kubelet asked for a device the plugin does not have (GPU gone or unhealthy)",
     "Check GPU health (`kubectl gpu-doctor node N`, `nvidia-smi -q -d HEALTH`)."),
    ("node_lock", re.compile(
        r"has been locked within|node \S+ is locked|failed to (?:set|release|get) node lock|"
        r"release lock failed|failed to lock node|failed to release node lock", re.I), "warning",
     "node lock (hami.io/mutex.lock) contention or a lock that could not be released",
     "Check the lock's age and owner (`kubectl gpu-doctor node N`); remove it only when its "
     "owner pod is gone or finished: `kubectl annotate node N hami.io/mutex.lock-`."),
    ("register_failed", re.compile(
        r"patch node error|get node error|failed to register annotation|register error|"
        r"failed to patch node", re.I), "warning",
     "the plugin cannot write hami.io/node-nvidia-register / hami.io/node-handshake: the "
     "handshake goes stale and the scheduler drops the node's vGPUs",
     "Check the plugin's RBAC (patch nodes), its NODE_NAME env (must equal the node name) and "
     "API server reachability."),
    ("nvml_failed", re.compile(
        r"nvml \w*\s*(?:init|getdevicecount|get memory)\w*\s*err|failed to initialize nvml|"
        r"nvml init failed", re.I), "critical",
     "the plugin cannot talk to the driver through NVML; it registers no (or stale) devices",
     "Check the driver on the node (`kubectl gpu-doctor node N`) and that the plugin container "
     "sees /dev/nvidia* and libnvidia-ml."),
    ("grpc_failed", re.compile(
        r"has repeatedly crashed|could not (?:start|register) device plugin", re.I), "critical",
     "the plugin's gRPC server could not start or register with kubelet",
     "Check /var/lib/kubelet/device-plugins/ (socket permissions, kubelet.sock) and restart "
     "the plugin pod."),
)
KLOG_RE = re.compile(r"^(?:\S+Z\s+)?([IWEF])(\d{4} \d{2}:\d{2}:\d{2}\.\d+)\s+\d+\s+(\S+:\d+)\]\s?")


def scan_plugin_log(lines: Iterable[str], source: str = "plugin log") -> list[Finding]:
    """One finding per known error pattern present, with counts and the first/last line."""
    hits: dict[str, dict[str, Any]] = {}
    fatal: list[str] = []
    for raw in lines:
        line = raw.rstrip("\r\n")
        if not line.strip():
            continue
        m = KLOG_RE.match(line)
        if m and m.group(1) == "F":
            fatal.append(line)
        for key, pat, *_ in LOG_PATTERNS:
            if pat.search(line):
                h = hits.setdefault(key, {"count": 0, "first": line, "last": line, "last_ts": None})
                h["count"] += 1
                h["last"] = line
                if m:
                    h["last_ts"] = m.group(2)
                break
    out = []
    for key, pat, sev, meaning, fix in LOG_PATTERNS:
        h = hits.get(key)
        if not h:
            continue
        ev = {"pattern": key, "count": h["count"], "first_line": h["first"][:300],
              "last_line": h["last"][:300], "last_klog_time": h["last_ts"], "source": source,
              "meaning": meaning}
        out.append(catalog.make("hami.plugin_log_error", sev, f"hami-device-plugin:{key}",
                                f"HAMi device plugin log: {meaning.split(';')[0]} "
                                f"({h['count']}x)", ev, fix, REFS_LOG))
    if fatal:
        out.append(catalog.make(
            "hami.plugin_log_error", "critical", "hami-device-plugin:fatal",
            f"HAMi device plugin log has {len(fatal)} fatal line(s): the plugin exited",
            {"pattern": "fatal", "count": len(fatal), "last_line": fatal[-1][:300],
             "source": source}, "Read the fatal line; fix its cause and restart the plugin pod.",
            REFS_LOG))
    return out


def read_log_tail(path: Path, limit: int = LOG_TAIL_BYTES) -> list[str]:
    """The last `limit` bytes of a regular file as lines (a FIFO or device such as /dev/zero
    raises hostfs.NotRegularFile instead of being read forever)."""
    blob = hostfs.read_tail(path, limit)
    data = blob.data
    if blob.truncated:  # drop the partial first line
        data = data.split(b"\n", 1)[-1]
    return data.decode("utf-8", "replace").splitlines()


# -- containers -----------------------------------------------------------------------------

def is_hami_env(env: Mapping[str, str]) -> bool:
    return any(k.startswith(HAMI_ENV_PREFIXES) or k in HAMI_ENV_KEYS for k in env)


def hook_path(env: Mapping[str, str]) -> str:
    """HOOK_PATH as the plugin used it: the shared cache is `<HOOK_PATH>/vgpu/<uuid>.cache`."""
    cache = env.get("CUDA_DEVICE_MEMORY_SHARED_CACHE", "")
    parent = os.path.dirname(cache)
    if parent.endswith("/vgpu"):
        return parent[: -len("/vgpu")] or "/"
    return DEFAULT_HOOK_PATH


def _preload_entries(text: str) -> list[str]:
    """ld.so.preload: paths separated by whitespace or ':'; '#' starts a comment (glibc)."""
    out = []
    for line in text.splitlines():
        line = line.split("#", 1)[0]
        out += [p for p in re.split(r"[\s:]+", line) if p]
    return out


def audit_root(root: Path, env: Mapping[str, str]) -> dict:
    """What a HAMi container's root holds: the preload file, the library, the shared cache.
    `root` is the container's / (`/proc/PID/root`, or any directory laid out the same way);
    absolute symlinks inside it are resolved inside it."""
    hook = hook_path(env)
    expected_lib = f"{hook.rstrip('/')}/vgpu/libvgpu.so"
    res: dict[str, Any] = {"root": str(root), "hook_path": hook, "expected_lib": expected_lib,
                           "cuda_disable_control": env.get("CUDA_DISABLE_CONTROL"),
                           "problems": []}
    probs: list[str] = res["problems"]
    disabled = env.get("CUDA_DISABLE_CONTROL", "") in _TRUE
    res["control_disabled"] = disabled
    res["ld_so_preload"] = None
    libs: list[str] = []
    try:  # the tenant owns this file: one safe, capped, non-blocking read inside its root
        preload = hostfs.read_under(root, "etc/ld.so.preload", PRELOAD_CAP)
    except FileNotFoundError:
        preload = None
        if not disabled:
            probs.append("/etc/ld.so.preload is missing")
    except OSError as exc:
        preload = None
        probs.append(f"/etc/ld.so.preload unreadable: {exc.strerror}")
    if preload is not None:
        text = preload.text
        if preload.truncated:
            res["ld_so_preload_truncated_at"] = PRELOAD_CAP
        res["ld_so_preload"] = text.strip()[:300]
        libs = [p for p in _preload_entries(text) if "libvgpu" in os.path.basename(p)]
        if not libs and not disabled:
            probs.append("/etc/ld.so.preload does not name libvgpu.so")
    res["preloaded_libs"] = libs
    present = {}
    for lib in libs or [expected_lib]:
        present[lib] = hostfs.exists_under(root, lib, "file")
    res["lib_present"] = present
    if libs and not any(present.values()):
        probs.append(f"{libs[0]} (named in /etc/ld.so.preload) is not in the container")
    cache = env.get("CUDA_DEVICE_MEMORY_SHARED_CACHE")
    dirs = [os.path.dirname(cache)] if cache else list(LEGACY_CACHE_DIRS)
    found = [d for d in dirs if hostfs.exists_under(root, d, "dir")]
    res["shared_cache"] = cache
    res["shared_cache_dir"] = found[0] if found else dirs[0]
    res["shared_cache_dir_present"] = bool(found)
    res["shared_cache_file_present"] = bool(cache and hostfs.exists_under(root, cache))
    if not found and not disabled:
        probs.append(f"shared cache dir {dirs[0]} is missing")
    return res


def verdict(res: Mapping[str, Any]) -> tuple[str, str] | None:
    """(severity, title) or None when the isolation is in place."""
    probs = res["problems"]
    if res["control_disabled"]:
        return ("warning", "HAMi vGPU isolation disabled by CUDA_DISABLE_CONTROL=true: the "
                "container's GPU memory/SM limits are not enforced")
    if not probs:
        return None
    hard = [p for p in probs if not p.startswith("shared cache")]
    sev = "critical" if hard else "warning"
    return sev, ("HAMi vGPU isolation missing: " + "; ".join(probs)
                 + ("" if not hard else " (GPU memory/SM limits not enforced)"))


def can_read_environs(proc: Path) -> bool:
    """Whether the probe may read other processes' /proc/PID/environ (HAMi containers are found
    by theirs): stops at the first readable one, so a root run costs one or two reads."""
    me, denied = os.getpid(), 0
    for pid in procfs.pids(proc):
        if pid == me:
            continue
        if procfs.read_bytes(proc / str(pid) / "environ", 1) is not None:
            return True
        denied += 1
    return denied == 0   # nothing else runs: nothing was kept from us


def discover(proc: Path, known: Iterable[containers.Container] | None,
             focus_pods: Sequence[str] = ()) -> list[dict]:
    """HAMi-managed containers: processes whose environment has HAMi's keys, grouped by their
    root directory (one container = one root), labelled from the containers fact if any."""
    by_pid: dict[int, Mapping[str, Any]] = {}
    for c in known or ():
        rec = c.to_fact()
        for pid in c.pids:
            by_pid[int(pid)] = rec
    groups: dict[tuple, dict] = {}
    for pid in procfs.pids(proc):
        env = procfs.read_environ(pid, proc)
        if not env or not is_hami_env(env):
            continue
        try:
            st = os.stat(proc / str(pid) / "root")
        except OSError:
            continue
        key = (st.st_dev, st.st_ino)
        g = groups.get(key)
        if g is None:
            meta = by_pid.get(pid)
            uid = (meta or {}).get("pod_uid")
            if uid is None:
                ref = containers.pod_of_pid(pid, proc)
                uid = ref.pod_uid if ref else None
            g = groups[key] = {"pids": [], "env": env, "meta": dict(meta) if meta else None,
                               "pod_uid": uid}
        g["pids"].append(pid)
        if g["meta"] is None and pid in by_pid:   # the first pid seen joined after the fact
            g["meta"] = dict(by_pid[pid])
            g["pod_uid"] = g["meta"].get("pod_uid") or g["pod_uid"]
    out = list(groups.values())
    if focus_pods:
        out = [g for g in out if g["pod_uid"] in set(focus_pods)]
    return out


def _subject(g: Mapping[str, Any], proc: Path) -> str:
    meta = g.get("meta") or {}
    if meta.get("pod"):
        return f"pod {meta.get('namespace')}/{meta.get('pod')} container {meta.get('container')}"
    pid = g["pids"][0]
    return f"pid {pid} ({procfs.read_comm(pid, proc)})" + (
        f" pod_uid {g['pod_uid']}" if g.get("pod_uid") else "")


REMEDIATION = (
    "The HAMi device plugin's Allocate mounts <HOOK_PATH>/vgpu/libvgpu.so, the cache dir "
    "<HOOK_PATH>/vgpu and /etc/ld.so.preload into the container (unless the container sets "
    "CUDA_DISABLE_CONTROL=true). Check on the node that <HOOK_PATH>/vgpu/libvgpu.so and "
    "<HOOK_PATH>/vgpu/ld.so.preload exist (HOOK_PATH is the plugin's env, default /usr/local), "
    "that the pod was allocated by the HAMi plugin (not another nvidia plugin on the same "
    "resource), and that the image does not replace /etc/ld.so.preload; then recreate the pod "
    "(`kubectl delete pod` - risk: its containers restart, a bare pod is gone for good). If "
    "CUDA_DISABLE_CONTROL=true is set on purpose, the limits are off by design.")


@check("hami", title="HAMi vGPU: libvgpu.so preload in HAMi containers, device plugin log",
       timeout_s=8.0, needs=(CONTAINERS,))
def hami_check(ctx) -> Iterable[Finding]:
    opts = ctx.options
    proc = Path(opts.proc_root)
    if opts.plugin_log is not None:
        try:
            lines = read_log_tail(Path(opts.plugin_log))
        except OSError as exc:
            ctx.log("warning", f"cannot read plugin log {opts.plugin_log}: {exc.strerror}")
        else:
            yield from scan_plugin_log(lines, source=str(opts.plugin_log))
    if not can_read_environs(proc):
        return Skipped(f"cannot read other processes' environments under {proc} (needs root "
                       "in the host's pid namespace): HAMi containers could not be found")
    known = ctx.fact(CONTAINERS, timeout=ctx.budget(CONTAINERS_WAIT_S), default=None)
    groups = discover(proc, known, opts.focus_pods)
    unread: list[str] = []
    if groups:
        ctx.progress(message=f"{len(groups)} HAMi-managed container(s)")
    for g in groups:
        if ctx.cancelled.is_set():
            return
        root = None
        for pid in g["pids"]:
            cand = proc / str(pid) / "root"
            if cand.exists():
                root = cand
                break
        if root is None:   # exited since discovery: nothing left to audit
            continue
        try:
            res = audit_root(root, g["env"])
        except PermissionError as exc:
            unread.append(f"{_subject(g, proc)}: {exc.strerror} (needs root)")
            continue
        v = verdict(res)
        if v is None:
            continue
        sev, title = v
        ev = dict(res, pids=g["pids"][:8], pod_uid=g.get("pod_uid"),
                  hami_env={k: g["env"][k] for k in sorted(g["env"])
                            if is_hami_env({k: ""}) or k == "CUDA_DISABLE_CONTROL"})
        meta = g.get("meta") or {}
        for k in ("namespace", "pod", "container", "container_id"):
            if meta.get(k):
                ev[k] = meta[k]
        yield catalog.make("hami.isolation_missing", sev, _subject(g, proc), title, ev,
                           REMEDIATION, REFS_ISOLATION)
    if unread and len(unread) == len(groups):
        return Skipped(f"could not read the root of any of {len(groups)} HAMi container(s): "
                       + "; ".join(unread[:3]))
    for why in unread:
        ctx.log("warning", f"HAMi container not audited: {why}")

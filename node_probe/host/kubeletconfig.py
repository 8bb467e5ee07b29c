"""The kubelet's configuration as the node has it: config file plus command-line flags.

Why: two of the seed causes are kubelet settings (cpuManagerPolicy: static rewriting device
cgroups, seed 001; the systemd cgroup driver in the same family), and the node side must read
them without the API server (which may be the thing that is down). The running kubelet is
the process serving the kubelet dir's sockets (found in /proc by socket inode, never by name),
its --config file is read under --host-root, and its flags override the file as they do in the
kubelet. The probe image has no PyYAML, so KubeletConfiguration is read with a
small reader for the block-mapping YAML kubelets are configured with (or JSON).
"""
from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

from node_probe.host import host_owned
from node_probe.host.unix_sockets import find_owners
from node_probe.host import hostfs, procfs

KUBELET_SOCKETS = ("device-plugins/kubelet.sock", "pod-resources/kubelet.sock")
CONFIG_CAP = 1 << 20  # a kubelet config is a few KiB; a bigger file is read in part
# flag -> config key (flags override the file in the kubelet)
FLAG_KEYS = {
    "--cpu-manager-policy": "cpuManagerPolicy",
    "--cgroup-driver": "cgroupDriver",
    "--topology-manager-policy": "topologyManagerPolicy",
    "--topology-manager-scope": "topologyManagerScope",
    "--memory-manager-policy": "memoryManagerPolicy",
    "--feature-gates": "featureGates",
}
KEYS = ("cpuManagerPolicy", "cgroupDriver", "topologyManagerPolicy", "topologyManagerScope",
        "memoryManagerPolicy",
        "systemReserved", "kubeReserved", "evictionHard", "featureGates", "cpuManagerPolicyOptions",
        "reservedSystemCPUs", "maxPods", "containerRuntimeEndpoint")


class YamlError(ValueError):
    pass


def _scalar(text: str):
    s = text.strip()
    if not s:
        return None
    if s[0] in "\"'":
        q = s[0]
        end = s.find(q, 1)
        if end < 0:
            raise YamlError(f"unterminated quote in {text!r}")
        return s[1:end]
    s = re.sub(r"\s+#.*$", "", s)
    if s.startswith("{") and s.endswith("}"):
        body = s[1:-1].strip()
        out = {}
        for item in filter(None, (x.strip() for x in body.split(","))):
            k, sep, v = item.partition(":")
            if not sep:
                raise YamlError(f"bad flow mapping item {item!r}")
            out[k.strip().strip("\"'")] = _scalar(v)
        return out
    if s.startswith("[") and s.endswith("]"):
        return [_scalar(x) for x in s[1:-1].split(",") if x.strip()]
    low = s.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "~"):
        return None
    if re.fullmatch(r"-?\d+", s):
        return int(s)
    return s


_MAP_ITEM = re.compile(r"^[A-Za-z_][\w.\-/]*\s*:(?:\s|$)")


def parse_yaml(text: str) -> dict:
    """Block mappings (nested by indentation), `- item` lists of scalars or of mappings
    (`- name: x` with the item's other keys indented under `name`), flow {..}/[..] on
    one line, quotes and comments. Anything else (anchors, multi-line strings) raises."""
    lines = []
    for raw in text.splitlines():
        if not raw.strip() or raw.lstrip().startswith("#") or raw.strip() in ("---", "..."):
            continue
        if "\t" in raw[: len(raw) - len(raw.lstrip())]:
            raise YamlError("tabs in indentation")
        lines.append((len(raw) - len(raw.lstrip(" ")), raw.strip()))
    pos = 0

    def block(indent: int):
        nonlocal pos
        if pos < len(lines) and lines[pos][1].startswith("- "):
            items = []
            while pos < len(lines) and lines[pos][0] == indent and lines[pos][1].startswith("- "):
                body = lines[pos][1][2:].lstrip(" ")
                if _MAP_ITEM.match(body):   # "- name: x" starts a mapping item
                    lines[pos] = (indent + 2 + len(lines[pos][1][2:]) - len(body), body)
                    items.append(block(lines[pos][0]))
                else:
                    items.append(_scalar(body))
                    pos += 1
            return items
        out: dict = {}
        while pos < len(lines):
            ind, s = lines[pos]
            if ind < indent:
                break
            if ind > indent:
                raise YamlError(f"unexpected indentation at {s!r}")
            key, sep, rest = s.partition(":")
            if not sep or (rest and not rest.startswith((" ", "\t"))):
                raise YamlError(f"not a mapping entry: {s!r}")
            if rest.strip().startswith(("&", "*", "!")):
                raise YamlError(f"unsupported YAML construct in {s!r}")
            key = key.strip().strip("\"'")
            pos += 1
            if rest.strip()[:1] in ("|", ">"):  # block scalar: the more-indented lines
                text = []
                while pos < len(lines) and lines[pos][0] > indent:
                    text.append(lines[pos][1])
                    pos += 1
                out[key] = "\n".join(text)
                continue
            value = _scalar(rest)
            if value is None and pos < len(lines) and (
                    lines[pos][0] > indent or (lines[pos][0] == indent
                                               and lines[pos][1].startswith("- "))):
                value = block(lines[pos][0])
            out[key] = value
        return out

    if not lines:
        return {}
    result = block(lines[0][0])
    if pos != len(lines):
        raise YamlError(f"unexpected content at {lines[pos][1]!r}")
    if not isinstance(result, dict):
        raise YamlError("top level is not a mapping")
    return result


_FLAT_RE = re.compile(r"^([A-Za-z][A-Za-z0-9]*)\s*:\s*(\S[^#]*?)\s*(?:#.*)?$", re.M)


def parse_config(text: str) -> dict:
    """KubeletConfiguration from YAML or JSON text. YAML this reader does not understand
    falls back to the top-level `key: scalar` lines (enough for the policy keys), with the
    reason under "_parse_error"."""
    if text.lstrip().startswith("{"):
        doc = json.loads(text)
        if not isinstance(doc, dict):
            raise YamlError("top level is not an object")
        return doc
    try:
        return parse_yaml(text)
    except YamlError as exc:
        flat = {k: _flat_scalar(v) for k, v in _FLAT_RE.findall(text)}
        flat["_parse_error"] = str(exc)
        return flat


def _flat_scalar(text: str):
    """_scalar for the fallback: a value it cannot read stays raw text, so one odd line does
    not lose the policy keys on the others."""
    try:
        return _scalar(text)
    except YamlError:
        return text.strip()


def flag_value(argv: list[str], flag: str) -> str | None:
    """Value of --flag=value or --flag value (last one wins, as in the kubelet)."""
    val = None
    for i, a in enumerate(argv):
        if a.startswith(flag + "="):
            val = a[len(flag) + 1:]
        elif a == flag and i + 1 < len(argv):
            val = argv[i + 1]
    return val


def find_kubelets(proc: Path = procfs.PROC) -> list[tuple[int, list[str]]]:
    out = []
    for pid in procfs.pids(proc):
        if procfs.read_comm(pid, proc) != "kubelet":
            continue
        out.append((pid, procfs.read_cmdline(pid, proc)))
    return out


def kubelet_pid(kubelet_dir: Path, proc: Path = procfs.PROC) -> int | None:
    """The kubelet serving this kubelet dir: the process listening on its registration or
    pod-resources socket, matched by socket inode (host.unix_sockets.find_owners). Never by
    process name: a tenant process named `kubelet` with `--root-dir` and `--config` flags would
    otherwise hand the probe a config of its choosing. None when nobody serves them (the
    kubelet is down): the kubelet dir's config.yaml is read instead."""
    files = []
    for rel in KUBELET_SOCKETS:
        p = Path(kubelet_dir) / rel
        try:
            if stat.S_ISSOCK(os.lstat(p).st_mode):
                files.append(p)
        except OSError:
            continue
    owners = find_owners(files, proc)
    return next((owners[f][0] for f in files if f in owners), None)


def presence(kubelet_dir: Path, proc: Path = procfs.PROC, host_root: Path | None = None) -> dict:
    """Whether this host runs a kubelet at all: its registration socket
    (<kubelet-dir>/device-plugins/kubelet.sock, a stale one counts: the node's kubelet is down)
    or a process named kubelet that is the host's own (host.host_owned; with `host_root`): a
    container's process called kubelet (a tenant's decoy, a kind node) neither makes a host a
    node nor hides that the node's kubelet is down. Without either, the host is not a
    Kubernetes node and the kubelet-facing checks have nothing to judge (a workstation)."""
    sock = Path(kubelet_dir) / "device-plugins" / "kubelet.sock"
    try:
        has_sock = stat.S_ISSOCK(os.lstat(sock).st_mode)
    except OSError:
        has_sock = False
    pids = [pid for pid, _ in find_kubelets(proc)
            if host_root is None or host_owned.process_refusal(pid, proc, host_root) is None]
    return {"kubelet": bool(has_sock or pids), "kubelet_sock": str(sock) if has_sock else None,
            "kubelet_pids": pids, "kubelet_dir": str(kubelet_dir)}


def _feature_gates(text: str) -> dict:
    out = {}
    for item in text.split(","):
        k, sep, v = item.partition("=")
        if sep:
            out[k.strip()] = v.strip().lower() == "true"
    return out


def load(host_root: Path, kubelet_dir: Path, proc: Path = procfs.PROC) -> dict:
    """The "kubelet.config" fact: {"path", "source", "pid", <KEYS>..., "flags": {...},
    "error"}. Picks the kubelet whose --root-dir is our kubelet dir (several may run in
    tests/kind), else the only one; falls back to <kubelet-dir>/config.yaml."""
    host_root = Path(host_root)
    kdir = Path(kubelet_dir)
    pid = kubelet_pid(kdir, proc)
    chosen = (pid, procfs.read_cmdline(pid, proc)) if pid is not None else None
    fact: dict = {"path": None, "source": None, "pid": None, "flags": {}, "error": None,
                  "kubelets_found": [p for p, _ in find_kubelets(proc)]}
    for k in KEYS:
        fact[k] = None
    argv: list[str] = []
    cfg_path: Path | None = None
    cfg_where: tuple[Path, str] | None = None  # (root, path inside it) for the safe open
    if chosen:
        fact["pid"], argv = chosen
        rel = flag_value(argv, "--config")
        if rel:
            p = hostfs.resolve(host_root, rel) if rel.startswith("/") else None
            fact["path"] = rel
            fact["source"] = "kubelet --config"
            cfg_path = p
            cfg_where = (Path(host_root), rel)
            if p is None:
                fact["error"] = f"--config {rel} not found under {host_root}"
    if cfg_path is None and fact["error"] is None:
        p = kdir / "config.yaml"
        if p.is_file():
            cfg_path, fact["path"], fact["source"] = p, str(p), "kubelet dir"
            cfg_where = (Path(kdir), "config.yaml")
    if cfg_path is not None and cfg_where is not None:
        try:
            blob = hostfs.read_under(cfg_where[0], cfg_where[1], CONFIG_CAP)
            doc = parse_config(blob.text)
            if blob.truncated:
                doc.setdefault("_parse_error", f"larger than {CONFIG_CAP} bytes")
            for k in KEYS:
                if k in doc:
                    fact[k] = doc[k]
            if "_parse_error" in doc:
                fact["error"] = f"{cfg_path}: read partially ({doc['_parse_error']})"
        except (OSError, ValueError, RecursionError) as exc:
            fact["error"] = f"{cfg_path}: {exc}"
    for flag, key in FLAG_KEYS.items():
        v = flag_value(argv, flag)
        if v is not None:
            fact["flags"][flag] = v
            fact[key] = _feature_gates(v) if key == "featureGates" else v
    return fact

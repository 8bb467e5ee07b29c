"""Pod and container names for a container found by its cgroup, without the runtime's bundle.

Why (issue 13): the cgroup path gives a container's pod UID and container id, and names came
only from the runtime's OCI bundle (config.json annotations). Where that is unreadable (another
runtime state directory, a runtime we do not know) a finding said `pod uid <uid> container
<id>` with namespace, pod and container null. Two sources the kubelet itself keeps fill that in:

- the container's own mounts: the kubelet bind-mounts each container's termination-message
  file from `<kubelet-dir>/pods/<pod-uid>/containers/<container-name>/<id>`, so the root of
  that mount in /proc/PID/mountinfo names the pod UID and the container (any runtime);
- the kubelet's pod-resources API names pods (namespace/name/container + device ids) but not
  their UIDs, and the kubelet's device checkpoint has UID + container + the same device ids:
  where both list the same devices for the same container, the UID is that namespace/name.

Pure parsing plus a bounded read of /proc/PID/mountinfo; stdlib only.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from node_probe.host import procfs

MOUNTINFO_MAX = 1 << 20
_KUBELET_CONTAINER_DIR = re.compile(
    r"/pods/([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})"
    r"/containers/([^/]+)/[^/]+$")


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (\\040 ...)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def names_from_mountinfo(text: str) -> tuple[str, str] | None:
    """(pod uid, container name) from a container process's mountinfo, or None."""
    for line in text.splitlines():
        parts = line.split(" ")
        if len(parts) < 5:
            continue
        root = _unescape(parts[3])
        m = _KUBELET_CONTAINER_DIR.search(root)
        if m:
            return m.group(1).lower(), m.group(2)
    return None


def _read_mountinfo(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(MOUNTINFO_MAX).decode("utf-8", "replace")
    except OSError:
        return None


def read_names(pids: Sequence[int], proc: Path = procfs.PROC) -> tuple[str, str] | None:
    """(pod uid, container name) from the first of `pids` whose mounts show it."""
    for pid in list(pids)[:4]:
        text = _read_mountinfo(Path(proc) / str(pid) / "mountinfo")
        if text:
            hit = names_from_mountinfo(text)
            if hit:
                return hit
    return None


def pods_by_uid(checkpoint: Iterable[Any] | None,
                podres: Iterable[Mapping[str, Any]] | None) -> dict[str, tuple[str, str]]:
    """{pod uid: (namespace, pod)} where a checkpoint entry (uid, container, resource, device
    ids) and a pod-resources row (namespace, pod, container, resource, device ids) agree."""
    rows: dict[tuple[str, str, frozenset], set[tuple[str, str]]] = {}
    for r in podres or ():
        try:
            key = (str(r["container"]), str(r["resource"]), frozenset(map(str, r["device_ids"])))
            rows.setdefault(key, set()).add((str(r["namespace"]), str(r["pod"])))
        except (KeyError, TypeError):
            continue
    out: dict[str, tuple[str, str]] = {}
    ambiguous: set[str] = set()
    for e in checkpoint or ():
        ids = frozenset(map(str, getattr(e, "device_ids", ()) or ()))
        if not ids:
            continue
        hits = rows.get((str(e.container), str(e.resource), ids)) or set()
        if len(hits) != 1:
            continue
        (hit,) = hits
        uid = str(e.pod_uid).lower()
        if out.get(uid, hit) != hit:
            ambiguous.add(uid)
        out[uid] = hit
    for uid in ambiguous:
        del out[uid]
    return out


def fill(meta: Mapping[str, Any], pod_uid: str, pids: Sequence[int],
         uid_names: Mapping[str, tuple[str, str]], proc: Path = procfs.PROC) -> dict:
    """`meta` (from the runtime's bundle, maybe empty) with namespace/pod/container filled in
    from the kubelet's own records where it lacks them; `names_from` says where they came
    from. Never overrides what the bundle said."""
    out = dict(meta)
    if out.get("pod") and out.get("container"):
        return out
    sources = []
    if not out.get("container"):
        hit = read_names(pids, proc)
        if hit and hit[0] == pod_uid.lower():
            out["container"] = hit[1]
            sources.append("mountinfo")
    if not out.get("pod"):
        ns_pod = uid_names.get(pod_uid.lower())
        if ns_pod:
            out["namespace"], out["pod"] = ns_pod
            sources.append("podresources+checkpoint")
    if sources:
        out["names_from"] = "+".join(sources)
    return out

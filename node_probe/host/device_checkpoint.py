"""The kubelet's device-manager checkpoint: which container got which devices, and exactly what
the device plugin answered to Allocate for it.

Why: seeds 001 and 002 both come down to the device specs the plugin returned from Allocate
(none at all: every cgroup rewrite drops the NVIDIA devices; a list without /dev/nvidia-uvm:
the container never gets it). The kubelet keeps that answer, per pod UID and container name, in
<kubelet-dir>/device-plugins/kubelet_internal_checkpoint (JSON; `AllocResp` is the
ContainerAllocateResponse protobuf, base64). Reading it is a file read, no RPC, and it survives
a plugin restart, so the evidence is still there after someone "fixed" the plugin. The protobuf
is decoded by a few lines of wire-format parsing (the probe must not need protobuf for this);
of the envs only NVIDIA_* and the other allowed keys are kept (procfs.env_key_allowed).
"""
from __future__ import annotations

import base64
import dataclasses
import json
from pathlib import Path

from node_probe.host import hostfs, procfs
from node_probe.host.protowire import fields as _fields

CHECKPOINT = "device-plugins/kubelet_internal_checkpoint"
MAX_BYTES = 16 << 20


@dataclasses.dataclass(frozen=True)
class Entry:
    pod_uid: str
    container: str
    resource: str
    device_ids: tuple[str, ...]
    alloc: dict | None          # decoded ContainerAllocateResponse (None if absent/bad)


def _strings(buf: bytes) -> dict[int, str]:
    return {n: v.decode("utf-8", "replace") for n, wt, v in _fields(buf) if wt == 2}


def decode_allocate_response(raw: bytes) -> dict:
    """ContainerAllocateResponse (deviceplugin v1beta1): envs=1 (map), mounts=2, devices=3
    (DeviceSpec: container_path=1, host_path=2, permissions=3), annotations=4 (map),
    cdi_devices=5 (CDIDevice: name=1)."""
    out: dict = {"envs": {}, "mounts": [], "devices": [], "annotations": {}, "cdi_devices": []}
    for num, wt, v in _fields(raw):
        if wt != 2:
            continue
        if num == 1:
            kv = _strings(v)
            k = kv.get(1, "")
            if procfs.env_key_allowed(k):
                out["envs"][k] = kv.get(2, "")
        elif num == 2:
            kv = _strings(v)
            out["mounts"].append({"container_path": kv.get(1), "host_path": kv.get(2)})
        elif num == 3:
            kv = _strings(v)
            out["devices"].append({"container_path": kv.get(1), "host_path": kv.get(2),
                                   "permissions": kv.get(3)})
        elif num == 4:
            kv = _strings(v)
            if kv.get(1, "").startswith("cdi.k8s.io/"):
                out["annotations"][kv[1]] = kv.get(2, "")
        elif num == 5:
            out["cdi_devices"].append(_strings(v).get(1))
    return out


def _device_ids(raw) -> tuple[str, ...]:
    """DeviceIDs: a list (before k8s 1.20) or {numa node: [ids]}."""
    if isinstance(raw, list):
        return tuple(str(x) for x in raw)
    if isinstance(raw, dict):
        return tuple(str(x) for ids in raw.values() if isinstance(ids, list) for x in ids)
    return ()


class Unreadable(ValueError):
    """The checkpoint exists but cannot be read as one (the message says why)."""


def parse_doc(text: str) -> tuple[list[Entry], dict[str, list[str]]]:
    """(entries, registered devices {resource: [ids]}) of the checkpoint's JSON text.
    Raises Unreadable (a ValueError) for text that is not such a document: not JSON, nested
    deeper than the JSON parser goes (a 200,000-deep array raised RecursionError through the
    checks: round-3 audit H-51), or of another shape."""
    try:
        doc = json.loads(text)
    except RecursionError:
        raise Unreadable("its JSON is nested deeper than the parser's limit") from None
    except ValueError as exc:
        raise Unreadable(f"it is not JSON ({str(exc)[:80]})") from None
    try:
        return _entries(doc)
    except (AttributeError, TypeError) as exc:
        raise Unreadable(f"it is not a kubelet checkpoint ({str(exc)[:80]})") from None


def _entries(doc) -> tuple[list[Entry], dict[str, list[str]]]:
    data = (doc or {}).get("Data") or {}
    out = []
    for e in data.get("PodDeviceEntries") or ():
        if not isinstance(e, dict):
            continue
        alloc = None
        if e.get("AllocResp"):
            try:
                alloc = decode_allocate_response(base64.b64decode(e["AllocResp"]))
            except (ValueError, TypeError):
                alloc = None
        out.append(Entry(pod_uid=str(e.get("PodUID", "")).lower(),
                         container=str(e.get("ContainerName", "")),
                         resource=str(e.get("ResourceName", "")),
                         device_ids=_device_ids(e.get("DeviceIDs")), alloc=alloc))
    registered = {str(res): [str(i) for i in ids]
                  for res, ids in (data.get("RegisteredDevices") or {}).items()
                  if isinstance(ids, list)}
    return out, registered


def parse(text: str) -> list[Entry]:
    return parse_doc(text)[0]


def state(kubelet_dir: Path) -> tuple[tuple[list[Entry], dict[str, list[str]]] | None,
                                       str | None]:
    """((entries, registered devices) or None, why the checkpoint that is there could not be
    read, or None when it was read or is absent)."""
    try:
        blob = hostfs.read_under(kubelet_dir, CHECKPOINT, MAX_BYTES)
    except (FileNotFoundError, NotADirectoryError):
        return None, None
    except OSError as exc:
        return None, f"the kubelet's device checkpoint could not be read: {exc.strerror or exc}"
    if blob.truncated:   # a cut JSON document would parse to nothing useful
        return None, (f"the kubelet's device checkpoint is larger than {MAX_BYTES >> 20} MiB: "
                      f"not read")
    try:
        return parse_doc(blob.text), None
    except Unreadable as exc:
        return None, f"the kubelet's device checkpoint is unreadable: {exc}"


def read(kubelet_dir: Path) -> tuple[list[Entry], dict[str, list[str]]] | None:
    """(entries, registered devices) of the checkpoint, or None when absent or unreadable."""
    return state(kubelet_dir)[0]


def load(kubelet_dir: Path) -> list[Entry] | None:
    """Entries of the checkpoint, or None when it is absent or unreadable."""
    got = read(kubelet_dir)
    return None if got is None else got[0]


def index(entries: list[Entry] | None) -> dict[tuple[str, str], list[Entry]]:
    idx: dict[tuple[str, str], list[Entry]] = {}
    for e in entries or ():
        idx.setdefault((e.pod_uid, e.container), []).append(e)
    return idx

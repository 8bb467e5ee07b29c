"""Names for node-side subjects the node could only identify by pod UID and container id.

Why (issue 13): on a real kubelet the probe reported `pod uid a69928a8-... container
efe143260eee9` although the client had just read that pod from the API. The node side names
what it can (pod-resources, the runtime's bundle); whatever is left as a UID is resolved here
from the client's own pod list: metadata.uid gives namespace/name, and
status.containerStatuses[].containerID (`containerd://<id>`) gives the container's name.

Pure functions over raw API pods and probe records (dicts); no I/O.
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

_UID_IN_TEXT = re.compile(r"\buid ([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
                          r"[0-9a-fA-F]{4}-[0-9a-fA-F]{12})\b")


class PodIndex:
    """uid -> (namespace, name) and container id -> (uid, container name) from API pods."""

    def __init__(self, pods: Iterable[Mapping[str, Any]] = ()) -> None:
        self.by_uid: dict[str, tuple[str, str]] = {}
        self.by_container: dict[str, tuple[str, str]] = {}
        for p in pods:
            self.add(p)

    def add(self, pod: Mapping[str, Any]) -> None:
        md = pod.get("metadata") or {}
        uid = str(md.get("uid") or "")
        if not uid:
            return
        self.by_uid[uid] = (str(md.get("namespace") or ""), str(md.get("name") or ""))
        st = pod.get("status") or {}
        for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
            for cs in st.get(key) or ():
                cid = str(cs.get("containerID") or "").split("://", 1)[-1]
                if cid and cs.get("name"):
                    self.by_container[cid] = (uid, str(cs["name"]))

    def container(self, container_id: str | None) -> tuple[str, str] | None:
        if not container_id:
            return None
        hit = self.by_container.get(container_id)
        if hit:
            return hit
        if len(container_id) >= 12:   # a short id (docker/crictl print 12 or 13 characters)
            found = [v for k, v in self.by_container.items() if k.startswith(container_id)]
            if len(found) == 1:
                return found[0]
        return None


def name_record(rec: Mapping[str, Any], index: PodIndex) -> Mapping[str, Any]:
    """The record with pod/container names filled in where the node left UIDs. Returns the
    record itself when there is nothing to name (or nothing known)."""
    if rec.get("kind") not in ("finding", "event") or not index.by_uid:
        return rec
    ev = rec.get("evidence")
    ev = dict(ev) if isinstance(ev, Mapping) else None
    subject, title = str(rec.get("subject") or ""), str(rec.get("title") or "")
    changed = False
    if ev is not None and not ev.get("pod"):
        uid = str(ev.get("pod_uid") or "")
        cid = str(ev.get("container_id") or "")
        by_c = index.container(cid)
        if not uid and by_c:
            uid = by_c[0]
        if uid in index.by_uid:
            ns, name = index.by_uid[uid]
            ev.update({"namespace": ns, "pod": name, "pod_uid": uid})
            changed = True
            if by_c and by_c[0] == uid and not ev.get("container"):
                ev["container"] = by_c[1]
                short = cid[:13]
                subject = subject.replace(f"container {short}", f"container {by_c[1]}")
                title = title.replace(f"Container {short} ", f"Container {by_c[1]} ")
            ev["names_from"] = "the API's pod list (resolved by the client)"

    def by_name(m: re.Match) -> str:
        hit = index.by_uid.get(m.group(1))
        return f"{hit[0]}/{hit[1]}" if hit else m.group(0)

    new_subject, new_title = _UID_IN_TEXT.sub(by_name, subject), _UID_IN_TEXT.sub(by_name, title)
    if not changed and (new_subject, new_title) == (subject, title):
        return rec
    out = dict(rec)
    out["subject"], out["title"] = new_subject, new_title
    if ev is not None:
        out["evidence"] = ev
    return out

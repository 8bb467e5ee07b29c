"""Builders for raw API objects (camelCase dicts as the API server returns them) carrying the
annotation values HAMi writes; values are copied from HAMi's docs, tests and source formats."""
from __future__ import annotations

import datetime as dt

import pytest

UUID_A = "GPU-03f69c50-207a-2038-9b45-23cac89cb67d"
UUID_B = "GPU-1afede84-4e70-2174-49af-f07ebb94d1ae"
NOW = dt.datetime(2024, 5, 14, 7, 10, 0, tzinfo=dt.timezone.utc)

# hami <= 2.4: 7 fields per device, ':'-terminated (docs/develop/protocol.md)
REG_LEGACY7 = (f"{UUID_A},10,46068,100,NVIDIA-NVIDIA A40,0,true:"
               f"{UUID_B},10,46068,100,NVIDIA-NVIDIA A40,0,true:")
# later string encoding: ,index,mode appended (EncodeNodeDevices)
REG_LEGACY9 = (f"{UUID_A},10,46068,100,NVIDIA-NVIDIA A40,0,true,0,hami-core:"
               f"{UUID_B},10,46068,100,NVIDIA-NVIDIA A40,0,true,1,hami-core:")
# JSON list (MarshalNodeDevices, omitempty: index 0 and health false are left out)
REG_JSON = ('[{"id":"%s","count":10,"devmem":46068,"devcore":100,"type":"NVIDIA-NVIDIA A40",'
            '"mode":"hami-core","health":true},'
            '{"id":"%s","index":1,"count":10,"devmem":46068,"devcore":100,'
            '"type":"NVIDIA-NVIDIA A40","mode":"hami-core","health":true}]' % (UUID_A, UUID_B))


def node(name="gpu-1", annotations=None, allocatable=None):
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": dict(annotations or {})},
            "status": {"allocatable": dict(allocatable or {}), "capacity": dict(allocatable or {})}}


def pod(name, ns="default", node_name="gpu-1", annotations=None, phase="Pending", gpus=1,
        uid=None, owner=True, image="pytorch:latest", extra_containers=()):
    md = {"name": name, "namespace": ns, "uid": uid or f"uid-{name}",
          "annotations": dict(annotations or {})}
    if owner:
        md["ownerReferences"] = [{"kind": "ReplicaSet", "name": f"{name}-rs"}]
    containers = [{"name": "main", "image": image,
                   "resources": {"limits": {"nvidia.com/gpu": str(gpus)} if gpus else {}}}]
    containers += list(extra_containers)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": md,
            "spec": {"nodeName": node_name, "containers": containers},
            "status": {"phase": phase}}


def plugin_pod(node_name="gpu-1"):
    return pod("hami-device-plugin-x7k2p", ns="kube-system", node_name=node_name, gpus=0,
               phase="Running", image="projecthami/hami:v2.5.0")


def event(pod_obj, reason, message, ts="2024-05-14T07:09:30Z"):
    md = pod_obj["metadata"]
    return {"kind": "Event", "reason": reason, "message": message, "type": "Warning",
            "involvedObject": {"kind": "Pod", "name": md["name"], "namespace": md["namespace"],
                               "uid": md["uid"]},
            "lastTimestamp": ts}


@pytest.fixture
def now():
    return NOW

"""Builders of resource.k8s.io/v1 objects (DeviceClass, ResourceSlice, ResourceClaim) and pods
using them, in the shapes a 1.34+ API server returns."""
from __future__ import annotations

DRIVER = "gpu.nvidia.com"
T0 = "2026-11-23T07:00:00Z"


def device_class(name="gpu.nvidia.com", driver=DRIVER, extra=None) -> dict:
    sels = [{"cel": {"expression": f'device.driver == "{driver}"'}}]
    if extra:
        sels.append({"cel": {"expression": extra}})
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": name}, "spec": {"selectors": sels}}


def gpu_device(i, product="NVIDIA H100 80GB HBM3", taints=None) -> dict:
    d = {"name": f"gpu-{i}", "attributes": {
        "productName": {"string": product}, "type": {"string": "gpu"},
        "uuid": {"string": f"GPU-{i:08d}"}, "driverVersion": {"version": "570.172.8"}},
        "capacity": {"memory": {"value": "80Gi"}}}
    if taints:
        d["taints"] = taints
    return d


def resource_slice(node, n=2, generation=1, count=1, pool=None, driver=DRIVER, idx=0,
                   devices=None) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{driver}-g{generation}-{idx}"},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": pool or node, "generation": generation,
                              "resourceSliceCount": count},
                     "devices": devices if devices is not None
                     else [gpu_device(i) for i in range(n)]}}


def claim(name, ns="ml", cls="gpu.nvidia.com", count=1, selectors=(), allocated=None,
          tolerations=None) -> dict:
    exactly = {"deviceClassName": cls, "allocationMode": "ExactCount", "count": count}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    if tolerations:
        exactly["tolerations"] = tolerations
    c = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
         "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}"},
         "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
         "status": {}}
    if allocated:
        node, devs = allocated
        c["status"] = {"allocation": {
            "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": node,
                                     "device": d} for d in devs]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}
    return c


def pod(name, ns="ml", claim_name=None, node=None, phase="Pending", template=False,
        container_statuses=None, runtime_class=None) -> dict:
    spec = {"containers": [{"name": "main", "image": "cuda",
                            "resources": {"claims": [{"name": "gpu"}]} if claim_name else {}}]}
    if claim_name:
        spec["resourceClaims"] = [{"name": "gpu", **({"resourceClaimTemplateName": "gpu-tmpl"}
                                                     if template else
                                                     {"resourceClaimName": claim_name})}]
    if node:
        spec["nodeName"] = node
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    status = {"phase": phase}
    if claim_name and template:
        status["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": claim_name}]
    if container_statuses:
        status["containerStatuses"] = container_statuses
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "uid": f"uid-pod-{name}",
                         "creationTimestamp": T0},
            "spec": spec, "status": status}


def event(pod_obj, reason, message, component="kubelet", type_="Warning", count=1) -> dict:
    md = pod_obj["metadata"]
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{md['name']}.{reason}", "namespace": md["namespace"]},
            "involvedObject": {"kind": "Pod", "name": md["name"], "namespace": md["namespace"],
                               "uid": md["uid"]},
            "reason": reason, "message": message, "type": type_, "count": count,
            "source": {"component": component}, "lastTimestamp": "2026-11-23T07:59:00Z"}

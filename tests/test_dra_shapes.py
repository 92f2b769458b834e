"""Real-shaped DRA objects (resource.k8s.io/v1 as the API returns them, NVIDIA driver v25.x, v0.4) for tests."""

from __future__ import annotations

import zlib
from typing import Any

DRIVER = "gpu.nvidia.com"


def gpu_device(minor: int, uuid: str | None, *, bus: str = "", version: str = "v0.4") -> dict[str, Any]:
    """A full GPU as the driver announces it; ``version`` picks the attribute names of that release."""
    attrs: dict[str, Any] = {"type": {"string": "gpu"}, "productName": {"string": "NVIDIA A100-SXM4-40GB"},
                             "driverVersion": {"version": "570.124.6"}}
    if uuid is not None:
        attrs["uuid"] = {"string": uuid}
    if version == "v25.3":
        attrs |= {"minor": {"int": minor}, "index": {"int": minor}, "pcieBusID": {"string": bus}}
    elif bus:
        attrs["resource.kubernetes.io/pciBusID"] = {"string": bus}
    return {"name": f"gpu-{minor}", "attributes": attrs, "capacity": {"memory": {"value": "40Gi"}}}


def mig_device(name: str, uuid: str | None, parent_uuid: str, profile: str) -> dict[str, Any]:
    attrs: dict[str, Any] = {"type": {"string": "mig"}, "parentUUID": {"string": parent_uuid},
                             "profile": {"string": profile}}
    if uuid is not None:
        attrs["uuid"] = {"string": uuid}
    return {"name": name, "attributes": attrs, "capacity": {"memory": {"value": "9984Mi"}}}


def resource_slice(node: str, devices: list[dict[str, Any]], *, generation: int = 1,
                   driver: str = DRIVER, suffix: str = "x7k2p") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}-{suffix}", "generateName": f"{node}-{driver}-",
                     "ownerReferences": [{"apiVersion": "v1", "controller": True, "kind": "Node", "name": node,
                                          "uid": "5a1e0c1e-0000-4000-8000-000000000001"}]},
        "spec": {"driver": driver, "nodeName": node,
                 "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                 "devices": devices},
    }


def claim(namespace: str, name: str, results: list[tuple[str, str, str]], reserved: list[tuple[str, str]],
          *, admin: bool = False, driver: str = DRIVER) -> dict[str, Any]:
    """An allocated claim: results (request, pool, device), reserved for (pod name, pod uid)."""
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace,
                     "uid": f"c1a1e000-0000-4000-8000-{zlib.crc32(name.encode()):012d}",
                     "finalizers": ["resource.kubernetes.io/delete-protection"]},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                       "allocationMode": "ExactCount", "count": 1,
                                                                       **({"adminAccess": True} if admin else {})}}]}},
        "status": {
            "allocation": {
                "devices": {"results": [{"request": r, "driver": driver, "pool": p, "device": d,
                                         **({"adminAccess": True} if admin else {})} for r, p, d in results]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [results[0][1] if results else ""]}]}]},
            },
            "reservedFor": [{"resource": "pods", "name": n, "uid": u} for n, u in reserved],
        },
    }


def pod(namespace: str, name: str, uid: str, node: str, containers: dict[str, list[tuple[str, str]]],
        claims: dict[str, tuple[str, str]], *, container_ids: dict[str, str] | None = None) -> dict[str, Any]:
    """A Pod with DRA references: containers name -> [(pod claim, request)], claims: pod claim -> (kind, name).

    kind ``claim`` is a direct ``resourceClaimName``; ``template`` a template whose generated claim
    is ``name`` in the status (an empty name: not generated yet).
    """
    spec_claims, statuses = [], []
    for local, (kind, claim_name) in claims.items():
        if kind == "claim":
            spec_claims.append({"name": local, "resourceClaimName": claim_name})
        else:
            spec_claims.append({"name": local, "resourceClaimTemplateName": f"{local}-template"})
            statuses.append({"name": local, **({"resourceClaimName": claim_name} if claim_name else {})})
    ids = container_ids or {}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": "100"},
        "spec": {"nodeName": node, "resourceClaims": spec_claims,
                 "containers": [{"name": c, "image": "cuda",
                                 "resources": {"claims": [{"name": n, **({"request": r} if r else {})}
                                                          for n, r in refs]}}
                                for c, refs in containers.items()]},
        "status": {"phase": "Running", "resourceClaimStatuses": statuses,
                   "containerStatuses": [{"name": c, "containerID": f"containerd://{ids[c]}"}
                                         for c in containers if c in ids]},
    }

"""Builders for complete API objects, shaped exactly as the API server returns them (camelCase JSON).

The 37.x ``kubernetes`` client validates typed responses with pydantic, so objects served to it must
carry every required field (e.g. ``spec.containers[].name``); these builders make that the default.
"""

from __future__ import annotations

import uuid as _uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any


def now_rfc3339() -> str:
    """metav1.Time wire format (seconds, Z)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    """metav1.MicroTime wire format (microseconds, Z), as eventTime uses."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def container_id(seed: str, runtime: str = "containerd") -> str:
    """A deterministic ``<runtime>://<64hex>`` container ID."""
    digest = _uuid.uuid5(_uuid.NAMESPACE_OID, seed).hex
    return f"{runtime}://{(digest * 2)[:64]}"


def make_container(
    name: str,
    *,
    limits: Mapping[str, str] | None = None,
    requests: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    image: str = "registry.example/app:1",
) -> dict[str, Any]:
    """A ``spec.containers[]`` entry."""
    resources: dict[str, Any] = {}
    if limits:
        resources["limits"] = dict(limits)
    if requests:
        resources["requests"] = dict(requests)
    out: dict[str, Any] = {"name": name, "image": image, "resources": resources}
    if env:
        out["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return out


def make_pod(
    name: str,
    *,
    namespace: str = "default",
    node: str = "gpu-node-1",
    uid: str | None = None,
    phase: str = "Running",
    containers: Sequence[Mapping[str, Any]] | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    owner: tuple[str, str] | None = None,
    started: bool = True,
    runtime: str = "containerd",
) -> dict[str, Any]:
    """A complete Pod. ``owner`` = (kind, name) of the controller ownerReference.

    With ``started`` each container gets a deterministic containerID in ``status.containerStatuses``.
    """
    uid = uid or str(_uuid.uuid5(_uuid.NAMESPACE_URL, f"{namespace}/{name}"))
    conts = [dict(c) for c in (containers or [make_container("main")])]
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": uid,
        "creationTimestamp": now_rfc3339(),
        "labels": dict(labels or {}),
        "annotations": dict(annotations or {}),
    }
    if owner:
        kind, owner_name = owner
        api = {"ReplicaSet": "apps/v1", "StatefulSet": "apps/v1", "DaemonSet": "apps/v1", "Job": "batch/v1"}
        metadata["ownerReferences"] = [
            {
                "apiVersion": api.get(kind, "v1"),
                "kind": kind,
                "name": owner_name,
                "uid": str(_uuid.uuid5(_uuid.NAMESPACE_URL, f"{kind}/{namespace}/{owner_name}")),
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    statuses = [
        {
            "name": c["name"],
            "image": c.get("image", ""),
            "imageID": "",
            "ready": phase == "Running",
            "restartCount": 0,
            "started": started,
            "state": {"running": {"startedAt": now_rfc3339()}}
            if started
            else {"waiting": {"reason": "Pending"}},
            **({"containerID": container_id(f"{uid}/{c['name']}", runtime)} if started else {}),
        }
        for c in conts
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"nodeName": node, "containers": conts, "restartPolicy": "Always"},
        "status": {"phase": phase, "containerStatuses": statuses},
    }


def make_node(
    name: str, *, labels: Mapping[str, str] | None = None, uid: str | None = None,
    capacity: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A complete Node."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": uid or str(_uuid.uuid5(_uuid.NAMESPACE_URL, f"node/{name}")),
            "creationTimestamp": now_rfc3339(),
            "labels": {"kubernetes.io/hostname": name, **dict(labels or {})},
        },
        "spec": {},
        "status": {"capacity": dict(capacity)} if capacity else {},
    }

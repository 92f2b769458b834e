"""NVIDIA device plugin: whole GPUs and MIG devices, time-slicing and MPS replicas.

``nvidia.com/gpu`` / ``nvidia.com/mig-*``; time-slicing and MPS on a node whose
``nvidia.com/gpu.sharing-strategy`` label says so, the renamed ``nvidia.com/gpu.shared``
resource, or pod-resources device ids ``GPU-<uuid>::<replica>``. Under MPS each client is
capped at 1/``nvidia.com/gpu.replicas`` of the card's compute and memory.
"""

from __future__ import annotations

from collections.abc import Mapping

from exporter.attribution.schemes.base import (
    Allocation,
    NodeContext,
    Scheme,
    amount,
    parse_quantity,
    plugin_allocations,
    within,
)
from exporter.model import ContainerInfo, PodInfo

SCHEME_NVIDIA = "nvidia"
SCHEME_TIME_SLICING = "nvidia-time-slicing"
SCHEME_MPS = "nvidia-mps"

NVIDIA_GPU = "nvidia.com/gpu"
NVIDIA_GPU_SHARED = "nvidia.com/gpu.shared"
NVIDIA_MIG = "nvidia.com/mig-"  # prefix: nvidia.com/mig-1g.10gb, ...
SHARING_STRATEGY_LABEL = "nvidia.com/gpu.sharing-strategy"
REPLICAS_LABEL = "nvidia.com/gpu.replicas"


def node_sharing_strategy(node_labels: Mapping[str, str]) -> str:
    """``none`` / ``time-slicing`` / ``mps`` from the GPU feature discovery label."""
    value = node_labels.get(SHARING_STRATEGY_LABEL, "none").strip().lower()
    return value if value in ("time-slicing", "mps") else "none"


def _mig_resources(c: ContainerInfo) -> set[str]:
    return {r for r in (*c.limits, *c.requests) if r.startswith(NVIDIA_MIG)}  # a set: limits repeat requests


def claims(node: NodeContext, pod: PodInfo, c: ContainerInfo) -> bool:
    if c.init:
        return False  # the scheme's indices and the kubelet's device reuse cover regular containers only
    return bool(amount(c, NVIDIA_GPU) or amount(c, NVIDIA_GPU_SHARED) or _mig_resources(c))


def allocate(node: NodeContext, pod: PodInfo, c: ContainerInfo) -> list[Allocation]:
    strategy = node_sharing_strategy(node.node_labels)
    replicas = parse_quantity(node.node_labels.get(REPLICAS_LABEL, "")) or 0
    shared_resource = bool(amount(c, NVIDIA_GPU_SHARED))
    count = int(amount(c, NVIDIA_GPU) or amount(c, NVIDIA_GPU_SHARED) or 0)
    mig = _mig_resources(c)
    # MIG resources list MIG device UUIDs, which the backend reports as devices of their own.
    ids = [i for r, v in node.device_ids(pod, c).items()
           if r in (NVIDIA_GPU, NVIDIA_GPU_SHARED) or r.startswith(NVIDIA_MIG) for i in v]
    replicated = any("::" in i for i in ids)
    if strategy == "mps":
        sharing, scheme = "mps", SCHEME_MPS
    elif strategy == "time-slicing" or shared_resource or replicated:
        sharing, scheme = "time-slicing", SCHEME_TIME_SLICING
    else:
        sharing, scheme = "none", SCHEME_NVIDIA
    placed: list[str] = []
    for i in ids:
        u = i.split("::", 1)[0]
        if u in node.uuids and u not in placed:
            placed.append(u)
        elif u not in node.uuids:
            node.skip("pod_resources_unknown_device")
    if mig:
        # Without pod-resources: count them, place them where the container's processes run.
        count = max(count, int(sum(amount(c, r) or 0 for r in mig)))
    if not within(node, count, len(node.devices) * max(1.0, replicas)):
        return []  # more GPUs (or replicas) than this node has: a hostile or broken quantity
    return plugin_allocations(pod, c, scheme, sharing, replicas, placed, count)


SCHEME = Scheme("nvidia device plugin (whole, MIG, time-slicing, MPS)", claims, allocate)

"""GKE's own NVIDIA device plugin: ``nvidia.com/gpu`` with device ids named by minor number.

The kubelet's device ids are ``nvidia<minor>`` for a whole GPU, ``nvidia<minor>/gi<id>`` for a MIG
partition (GPU instance ``id`` of that card), and ``.../vgpu<k>`` for one of the shared clients.
Sharing is announced on the node by ``cloud.google.com/gke-gpu-sharing-strategy``
(``time-sharing`` / ``mps``) with ``cloud.google.com/gke-max-shared-clients-per-gpu``; under MPS
each client is capped at 1/clients of the card's compute and memory. A node is a GKE GPU node when it carries
``cloud.google.com/gke-accelerator`` or the sharing label, or when the ids have GKE's form.
"""

from __future__ import annotations

import re

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

SCHEME_GKE = "gke"
SCHEME_GKE_TIME_SHARING = "gke-time-sharing"
SCHEME_GKE_MPS = "gke-mps"

NVIDIA_GPU = "nvidia.com/gpu"
ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"
SHARING_STRATEGY_LABEL = "cloud.google.com/gke-gpu-sharing-strategy"
MAX_CLIENTS_LABEL = "cloud.google.com/gke-max-shared-clients-per-gpu"

# nvidia<minor>, a MIG partition nvidia<minor>/gi<GPU instance>, either time-shared: .../vgpu<k>
MAX_CLIENTS = 48  # GKE's documented maximum of shared clients per GPU
_DEVICE_ID = re.compile(r"nvidia(?P<minor>[0-9]{1,4})(?:/gi(?P<gi>[0-9]{1,3}))?(?P<shared>/vgpu[0-9]{1,4})?")


def _gke_ids(node: NodeContext, pod: PodInfo, c: ContainerInfo) -> list[re.Match[str]] | None:
    """The container's GKE-form device ids; None when some id has another form."""
    ids = node.device_ids(pod, c).get(NVIDIA_GPU, ())
    matches = [_DEVICE_ID.fullmatch(i) for i in ids]
    return None if any(m is None for m in matches) else [m for m in matches if m is not None]


def _device(node: NodeContext, minor: int, gpu_instance: int | None) -> str | None:
    """The GPU with this minor, or its MIG device with this GPU instance (MIG devices carry the card's minor)."""
    if gpu_instance is None:
        return node.by_minor.get(minor)
    return next((d.uuid for d in node.devices if d.parent_uuid is not None and d.minor_number == minor
                 and d.gpu_instance_id == gpu_instance), None)


def claims(node: NodeContext, pod: PodInfo, c: ContainerInfo) -> bool:
    if c.init:
        return False  # the scheme's indices and the kubelet's device reuse cover regular containers only
    if not amount(c, NVIDIA_GPU):
        return False
    if ACCELERATOR_LABEL in node.node_labels or SHARING_STRATEGY_LABEL in node.node_labels:
        return True
    ids = _gke_ids(node, pod, c)
    return bool(ids)


def allocate(node: NodeContext, pod: PodInfo, c: ContainerInfo) -> list[Allocation]:
    strategy = node.node_labels.get(SHARING_STRATEGY_LABEL, "").strip().lower()
    clients = parse_quantity(node.node_labels.get(MAX_CLIENTS_LABEL, "")) or 0
    ids = _gke_ids(node, pod, c)
    if ids is None:
        node.skip("pod_resources_unknown_device")
        ids = []
    shared_ids = any(m.group("shared") for m in ids)
    if strategy == "mps":
        sharing, scheme = "mps", SCHEME_GKE_MPS
    elif strategy == "time-sharing" or shared_ids:
        sharing, scheme = "time-slicing", SCHEME_GKE_TIME_SHARING
    else:
        sharing, scheme = "none", SCHEME_GKE
    placed: list[str] = []
    for m in ids:
        uuid = _device(node, int(m.group("minor")), None if m.group("gi") is None else int(m.group("gi")))
        if uuid is None:
            node.skip("pod_resources_unknown_device")
        elif uuid not in placed:
            placed.append(uuid)
    count = int(amount(c, NVIDIA_GPU) or 0)
    if not within(node, clients, MAX_CLIENTS) or not within(node, count, len(node.devices) * max(1.0, clients)):
        return []  # more GPUs than this node has, or absurd sharing: hostile or broken
    return plugin_allocations(pod, c, scheme, sharing, clients, placed, count)


SCHEME = Scheme("GKE device plugin (whole, time-sharing, MPS)", claims, allocate)

"""NVIDIA device plugin: whole GPUs and MIG devices, time-slicing and MPS replicas.

``nvidia.com/gpu`` / ``nvidia.com/mig-<profile>``, each possibly renamed ``<resource>.shared``.
gpu-feature-discovery labels every resource on its own (``<resource>.sharing-strategy``,
``<resource>.replicas``: ``nvidia.com/gpu.*`` and ``nvidia.com/mig-<profile>.*`` on a mixed-strategy
node), so each resource a container asks for is read with its own labels. Under MPS each client is
capped at 1/replicas of the device's compute and memory. A container holds one allocation per
distinct device the kubelet named: several replicas of one GPU are access to one shared GPU (the
plugin's README). Where the plugin shares (replica ids ``<uuid>::<n>``, a ``.shared`` resource, more
advertised than NVML lists) but no label says how, the sharing is ``nvidia-shared``: known shared,
mode unknown, no grant claimed.
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
SCHEME_SHARED = "nvidia-shared"  # shared by the plugin, the node does not say how

NVIDIA_GPU = "nvidia.com/gpu"
NVIDIA_GPU_SHARED = "nvidia.com/gpu.shared"
NVIDIA_MIG = "nvidia.com/mig-"  # prefix: nvidia.com/mig-1g.10gb, ...
SHARED_SUFFIX = ".shared"  # renameByDefault: <resource>.shared, labelled under <resource>
SHARING_STRATEGY_LABEL = "nvidia.com/gpu.sharing-strategy"
REPLICAS_LABEL = "nvidia.com/gpu.replicas"
MAX_UNKNOWN_REPLICAS = 1024  # bounds a quantity where nothing says how many replicas a device has
_SCHEMES = {"none": SCHEME_NVIDIA, "time-slicing": SCHEME_TIME_SLICING, "mps": SCHEME_MPS, "unknown": SCHEME_SHARED}


def label_base(resource: str) -> str:
    """The resource GFD labels a (possibly renamed) resource under: ``nvidia.com/gpu.shared`` -> ``nvidia.com/gpu``."""
    return resource.removesuffix(SHARED_SUFFIX)


def resource_sharing(labels: Mapping[str, str], resource: str, shared_evidence: bool) -> tuple[str, float]:
    """(``none`` | ``time-slicing`` | ``mps`` | ``unknown``, replicas) of ``resource`` from GFD's labels.

    ``shared_evidence``: the kubelet or the node says the plugin replicates this resource (replica ids,
    more advertised than NVML lists). GFD before v0.15.0 wrote ``replicas`` without ``sharing-strategy``;
    time-slicing was the only sharing then. A ``none`` label contradicted by replicas, a value GFD never
    writes, or no label at all where the plugin shares, is ``unknown``: never a guessed mode.
    """
    base = label_base(resource)
    replicas = parse_quantity(labels.get(f"{base}.replicas", "")) or 0.0
    shared = shared_evidence or resource != base
    raw = labels.get(f"{base}.sharing-strategy")
    # GFD writes "" when it cannot label (an invalid MIG layout): that says no more than no label.
    strategy = (raw.strip().lower() if len(raw) <= 63 else "?") if isinstance(raw, str) and raw.strip() else None
    if strategy in ("time-slicing", "mps"):
        return strategy, replicas
    if strategy is None and replicas > 1:
        return "time-slicing", replicas
    if shared or strategy not in (None, "none"):
        return "unknown", replicas
    return "none", replicas


def _resources(c: ContainerInfo) -> list[str]:
    """The device plugin's resources the container asks for, sorted (limits repeat requests)."""
    return sorted({r for r in (*c.limits, *c.requests)
                   if r in (NVIDIA_GPU, NVIDIA_GPU_SHARED) or r.startswith(NVIDIA_MIG)})


def claims(node: NodeContext, pod: PodInfo, c: ContainerInfo) -> bool:
    if c.init:
        return False  # the scheme's indices and the kubelet's device reuse cover regular containers only
    return any(amount(c, r) for r in _resources(c))


def allocate(node: NodeContext, pod: PodInfo, c: ContainerInfo) -> list[Allocation]:
    ids = node.device_ids(pod, c)
    out: list[Allocation] = []
    for r in _resources(c):
        out.extend(_allocate_resource(node, pod, c, r, ids.get(r, ())))
    return out


def _allocate_resource(node: NodeContext, pod: PodInfo, c: ContainerInfo, resource: str,
                       ids: tuple[str, ...]) -> list[Allocation]:
    """One resource's allocations: one per distinct device the kubelet named, else up to the quantity."""
    quantity = int(amount(c, resource) or 0)
    devices = len(node.devices)
    capacity = parse_quantity(node.node_capacity.get(resource, "")) or 0.0
    named = list(dict.fromkeys(i.split("::", 1)[0] for i in ids))  # the kubelet's order, replicas folded
    mode, replicas = resource_sharing(node.node_labels, resource,
                                      any("::" in i for i in ids) or capacity > max(devices, 1))
    if mode == "unknown":
        node.skip("nvidia_sharing_mode_unknown")
    limit = devices * (MAX_UNKNOWN_REPLICAS if mode == "unknown" else max(1.0, replicas))
    if not within(node, quantity, max(limit, capacity)):
        return []  # more devices (or replicas) than this node has: a hostile or broken quantity
    placed = [u for u in named if u in node.uuids]
    for _ in range(len(named) - len(placed)):
        node.skip("pod_resources_unknown_device")
    # The kubelet's answer is the truth; without it a shared request holds at most every device once.
    count = len(named) if ids else (quantity if mode == "none" else min(quantity, devices))
    # Unknown sharing grants nothing fixed, as time-slicing: the rows say shared, never a guessed MPS limit.
    sharing = "time-slicing" if mode == "unknown" else mode
    return plugin_allocations(pod, c, _SCHEMES[mode], sharing, replicas, placed, count)


SCHEME = Scheme("nvidia device plugin (whole, MIG, time-slicing, MPS)", claims, allocate)

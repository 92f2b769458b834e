"""Allocations: what each container was allocated, and on which GPU, under every sharing scheme.

Pure functions over pod objects, node labels, the device list and (when available) the
kubelet pod-resources answer. The result feeds :mod:`exporter.attribution.attribute`, which
decides ``allocate_mode``. Each scheme is a module of :mod:`exporter.attribution.schemes`;
:data:`SCHEMES` is the one registry (see docs/metrics.md for the table).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from exporter.attribution.dra import device_uuids, dra_allocations, index_dynamic_resources
from exporter.attribution.dra_objects import PodClaims, parse_claims, parse_slices
from exporter.attribution.schemes import dra, gke, gpushare, hami, nvidia, vcuda
from exporter.attribution.schemes.base import Allocation, NodeContext, Scheme, index_pod_resources
from exporter.model import ContainerInfo, DeviceSample, PodInfo, PodResources

# The first scheme that claims a container allocates it. DRA comes first: it claims only containers
# a ResourceClaim gave a GPU of this node, whose nvidia.com/gpu (DRA's extended resource) must not
# count twice. HAMi comes next because its pods also request nvidia.com/gpu; GKE's plugin serves
# nvidia.com/gpu too, but only on GKE nodes or with its own device ids; the NVIDIA device plugin,
# the most generic claim, comes last.
SCHEMES: tuple[Scheme, ...] = (dra.SCHEME, hami.SCHEME, gpushare.SCHEME, vcuda.SCHEME, gke.SCHEME, nvidia.SCHEME)


@dataclass(frozen=True, slots=True)
class AllocationResult:
    allocations: tuple[Allocation, ...]
    skips: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class AllocationInputs:
    """Everything the sharing schemes read in one cycle. A scheme needing a new input adds a field here.

    ``resource_slices`` and ``resource_claims`` are raw API objects (untrusted, parsed here);
    ``pod_claims`` the pods' claim references by pod uid; ``node_name`` selects this node's slices.
    ``pod_resources`` is the kubelet's answer, None when there is none.
    """

    pods: Sequence[PodInfo]
    devices: Sequence[DeviceSample]
    node_labels: Mapping[str, str] = field(default_factory=dict)
    pod_resources: Sequence[PodResources] | None = None
    node_capacity: Mapping[str, str] = field(default_factory=dict)
    resource_slices: Sequence[Any] = ()
    resource_claims: Sequence[Any] = ()
    pod_claims: Mapping[str, PodClaims] = field(default_factory=dict)
    node_name: str = ""


def compute_allocations(inputs: AllocationInputs) -> AllocationResult:
    """Every container's GPU allocations on this node, placed on a GPU where known."""
    skips: dict[str, int] = {}

    def skip(reason: str) -> None:
        skips[reason] = skips.get(reason, 0) + 1

    pods, devices, node_name, pod_claims = list(inputs.pods), inputs.devices, inputs.node_name, inputs.pod_claims
    pod_resources = tuple(inputs.pod_resources or ())
    dynamic = index_dynamic_resources(pod_resources)
    dra_allocs: dict[tuple[str, str], tuple[Allocation, ...]] = {}
    if dynamic or pod_claims:
        try:
            mapping = device_uuids(parse_slices(inputs.resource_slices or (), node_name, skip), devices, skip)
            dra_allocs = dra_allocations(pods, mapping, dynamic, parse_claims(inputs.resource_claims or (), skip),
                                         pod_claims or {}, skip, devices)
        except Exception:  # hostile DRA objects must never fail the cycle for the other schemes
            skip("dra_allocation_failed")
    node = NodeContext(devices, inputs.node_labels or {}, index_pod_resources(pod_resources), skip,
                       inputs.node_capacity or {}, dra_allocs)
    out: list[Allocation] = []
    for pod in pods:
        if pod.phase in ("Succeeded", "Failed"):
            continue  # a finished pod releases its devices
        try:
            out.extend(_pod_allocations(node, pod))
        except Exception:  # one pod's input must never fail the cycle for every other pod
            skip("pod_allocation_failed")
    return AllocationResult(tuple(out), skips)


def _pod_allocations(node: NodeContext, pod: PodInfo) -> list[Allocation]:
    """One pod's allocations; a scheme's annotations on a pod it claims no container of are ignored."""
    out: list[Allocation] = []
    claimed: set[str] = set()
    for c in (*pod.containers, *(ic for ic in pod.init_containers if _may_run(pod, ic))):
        scheme = next((s for s in SCHEMES if s.claims(node, pod, c)), None)
        if scheme is not None:
            claimed.add(scheme.name)
            out.extend(scheme.allocate(node, pod, c))
    for s in SCHEMES:
        if s.name not in claimed and s.annotated(pod):
            node.skip("annotation_without_request")  # no container asks for the scheme's resources
    return out


def _may_run(pod: PodInfo, c: ContainerInfo) -> bool:
    """An init container holds what it was allocated while it may run: a sidecar, or during init."""
    return c.sidecar or (pod.phase == "Pending" and not c.terminated)

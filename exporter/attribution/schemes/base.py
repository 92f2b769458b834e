"""What every sharing scheme shares: the allocation record, the node context, quantities.

A scheme is two pure functions over one pod container on this node: ``claims`` (does this
container use the scheme?) and ``allocate`` (what it was allocated, and on which GPU when that
is known).

Everything a scheme reads from a pod (quantities, annotations) is written by the pod's author
or a scheduler: hostile input. Numbers are parsed with explicit bounds (finite, non-negative, at
most what this node can physically hold); an out-of-range value drops that container's
allocation and is counted, never raised and never used.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from exporter.model import ContainerInfo, DeviceSample, PodInfo, PodResources

GIB = 1 << 30
MIB = 1 << 20

_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")
_SUFFIX = {
    "": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
    "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "m": 1e-3,
}


@dataclass(frozen=True, slots=True)
class Allocation:
    """What one container was allocated on one GPU (``uuid=None``: GPU not known yet).

    ``whole`` means the container got the card to itself. ``compute_percent`` is percent
    of one GPU; ``memory_bytes`` None means the scheme grants no fixed memory: a whole GPU's
    memory is filled in as the card's total once the GPU is known, and a scheme that caps each
    client at a share of the card (MPS replicas) says which in ``memory_fraction``.
    """

    pod_uid: str
    container: str
    scheme: str
    whole: bool
    uuid: str | None
    compute_percent: float | None
    memory_bytes: int | None
    memory_fraction: float | None = None
    # The GPU comes from an annotation (a scheduler extender's, or the pod author's), not the kubelet:
    # when the container's processes run elsewhere, attribution believes the processes for usage.
    from_annotation: bool = False


@dataclass(frozen=True, slots=True)
class NodeContext:
    """What a scheme may consult besides the pod: this node's devices, labels, capacity, kubelet answer."""

    devices: Sequence[DeviceSample]
    node_labels: Mapping[str, str]
    pod_resources: Mapping[tuple[str, str, str], tuple[tuple[str, tuple[str, ...]], ...]]
    skip: Callable[[str], None]
    node_capacity: Mapping[str, str] = field(default_factory=dict)  # the Node's status.capacity
    # DRA: each container's allocations, worked out for the whole node at once (a shared claim's
    # grant is split among all its holders): (pod uid, container) -> allocations. See attribution/dra.py.
    dra: Mapping[tuple[str, str], tuple[Allocation, ...]] = field(default_factory=dict)
    by_index: Mapping[int, str] = field(init=False)  # NVML index -> uuid
    by_minor: Mapping[int, str] = field(init=False)  # /dev/nvidia<minor> -> uuid of the whole GPU
    uuids: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_index", {d.index: d.uuid for d in self.devices})
        # MIG devices carry their card's minor number; the card's own entry, when listed, wins.
        by_minor: dict[int, str] = {}
        for d in sorted(self.devices, key=lambda d: d.parent_uuid is not None):
            if d.minor_number is not None:
                by_minor.setdefault(d.minor_number, d.uuid)
        object.__setattr__(self, "by_minor", by_minor)
        object.__setattr__(self, "uuids", frozenset(d.uuid for d in self.devices))

    def device_ids(self, pod: PodInfo, c: ContainerInfo) -> dict[str, tuple[str, ...]]:
        """The kubelet's device ids for this container, by resource name ({} without the socket)."""
        return dict(self.pod_resources.get((pod.namespace, pod.name, c.name), ()))


@dataclass(frozen=True, slots=True)
class Scheme:
    """One sharing scheme: a name for the docs, and its two pure functions."""

    name: str
    claims: Callable[[NodeContext, PodInfo, ContainerInfo], bool]
    allocate: Callable[[NodeContext, PodInfo, ContainerInfo], list[Allocation]]
    # Pod annotations the scheme reads: on a pod none of whose containers it claims they are ignored (counted).
    annotations: tuple[str, ...] = ()
    annotation_prefixes: tuple[str, ...] = ()

    def annotated(self, pod: PodInfo) -> bool:
        """Whether ``pod`` carries an annotation this scheme reads."""
        return any(k in pod.annotations for k in self.annotations) or (
            bool(self.annotation_prefixes) and any(k.startswith(self.annotation_prefixes) for k in pod.annotations))


def index_pod_resources(pod_resources: Iterable[PodResources]) -> dict:
    """Index the kubelet answer by (namespace, pod, container)."""
    out: dict[tuple[str, str, str], tuple[tuple[str, tuple[str, ...]], ...]] = {}
    for p in pod_resources:
        for c in p.containers:
            out[(p.namespace, p.name, c.name)] = c.devices
    return out


MAX_QUANTITY = 2.0**53  # beyond exact float integers no real quantity lies; larger is hostile
MAX_QUANTITY_TEXT = 64  # characters: the API server's own quantities are far shorter


def parse_quantity(value: object) -> float | None:
    """Parse a Kubernetes quantity (``"2"``, ``"500m"``, ``"4Gi"``); None when malformed or absurd."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        number = float(value) if not isinstance(value, int) or abs(value) <= MAX_QUANTITY else math.inf
    elif isinstance(value, str) and len(value) <= MAX_QUANTITY_TEXT:
        m = _QUANTITY.match(value)
        if not m or m.group(2) not in _SUFFIX:
            return None
        number = float(m.group(1)) * _SUFFIX[m.group(2)]
    else:
        return None
    return number if math.isfinite(number) and 0 <= number <= MAX_QUANTITY else None


def within(node: NodeContext, value: float, limit: float) -> bool:
    """``0 <= value <= limit``; otherwise the container's allocation is dropped: count it."""
    if 0 <= value <= limit:
        return True
    node.skip("quantity_out_of_range")
    return False


def card_memory_limit(node: NodeContext) -> int:
    """The most memory one device of this node has (bytes); 1 TiB when NVML does not say."""
    return max((d.memory_total_bytes or 0 for d in node.devices), default=0) or (1 << 40)


def amount(c: ContainerInfo, resource: str) -> float | None:
    """A container's quantity of one resource (limits first, as the kubelet does), None if absent."""
    raw = c.limits.get(resource, c.requests.get(resource))
    return None if raw is None else parse_quantity(raw)


MAX_INDEX_LIST = 64  # more GPUs than any node has


def index_list(value: str) -> list[int] | None:
    """``"0,1"`` -> [0, 1]; None when malformed (or longer, or larger, than any node could mean)."""
    parts = [x for x in value.split(",", MAX_INDEX_LIST) if x.strip()]
    if len(parts) > MAX_INDEX_LIST or any(len(x.strip()) > 4 or not x.strip().isascii() for x in parts):
        return None
    try:
        return [int(x) for x in parts]
    except ValueError:
        return None


def plugin_allocations(pod: PodInfo, c: ContainerInfo, scheme: str, sharing: str, clients: float,
                       placed: Sequence[str], count: int) -> list[Allocation]:
    """A device plugin's allocations: one per GPU placed, and unplaced ones up to ``count``.

    ``sharing`` is ``none`` (whole GPUs), ``time-slicing`` (no share granted) or ``mps``: the MPS
    daemon caps each of ``clients`` at 1/clients of the card's threads and memory.
    """
    whole = sharing == "none"
    mps = sharing == "mps" and clients >= 1
    compute = 100.0 if whole else (100.0 / clients if mps else None)
    fraction = 1.0 / clients if mps else None
    allocs = [Allocation(pod.uid, c.name, scheme, whole, u, compute, None, fraction) for u in placed]
    allocs += [Allocation(pod.uid, c.name, scheme, whole, None, compute, None, fraction)
               for _ in range(max(0, count - len(placed)))]
    return allocs

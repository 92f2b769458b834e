"""Alibaba gpushare / cGPU: ``aliyun.com/gpu-mem`` and ``aliyun.com/gpu-core.percentage``.

The GPU comes from the scheduler's ``scheduler.framework.gpushare.allocation`` annotation
(per container index: GPU index -> memory), else ``ALIYUN_COM_GPU_MEM_IDX``.

Memory is in GiB unless the device plugin runs with ``--memory-unit=MiB``. The unit is not on
the pod, so it is read as the ecosystem's own tools read it: the node's ``aliyun.com/gpu-mem``
capacity per GPU (capacity / ``aliyun.com/gpu-count``) against the cards' memory; the unit that
makes the two agree wins. Without the capacity, GiB is assumed unless it would exceed the card,
and no allocation is ever reported larger than its card (each correction is a counted skip).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

from exporter.attribution.schemes.base import (
    GIB,
    MIB,
    Allocation,
    NodeContext,
    Scheme,
    amount,
    index_list,
    parse_quantity,
    within,
)
from exporter.model import ContainerInfo, DeviceSample, PodInfo

SCHEME_GPUSHARE = "aliyun-gpushare"
ALIYUN_MEM = "aliyun.com/gpu-mem"
ALIYUN_CORE = "aliyun.com/gpu-core.percentage"
ALIYUN_COUNT = "aliyun.com/gpu-count"
ALIYUN_IDX = "ALIYUN_COM_GPU_MEM_IDX"
ALIYUN_ALLOCATION = "scheduler.framework.gpushare.allocation"
MAX_ANNOTATION_BYTES = 64 * 1024  # written by the pod's author or the extender: bound what is parsed


def claims(node: NodeContext, pod: PodInfo, c: ContainerInfo) -> bool:
    if c.init:
        return False  # the scheme's indices and the kubelet's device reuse cover regular containers only
    return bool(amount(c, ALIYUN_MEM))


def _cards(devices: Sequence[DeviceSample]) -> list[DeviceSample]:
    """Whole GPUs with a known memory size (gpushare shares cards, never MIG devices)."""
    return [d for d in devices if d.parent_uuid is None and d.memory_total_bytes]


def memory_unit(node: NodeContext) -> int | None:
    """Bytes per ``aliyun.com/gpu-mem`` unit from the node's capacity, or None when it cannot tell."""
    capacity = parse_quantity(node.node_capacity.get(ALIYUN_MEM))
    cards = _cards(node.devices)
    count = parse_quantity(node.node_capacity.get(ALIYUN_COUNT)) or len(cards)
    if not capacity or not count or not cards:
        return None
    per_gpu = capacity / count
    card = sum(d.memory_total_bytes or 0 for d in cards) / len(cards)
    # GiB and MiB readings differ 1024-fold: the nearer one (in log scale) is the plugin's unit.
    return min((GIB, MIB), key=lambda unit: abs(math.log(per_gpu * unit / card)))


def _placement(node: NodeContext, pod: PodInfo, c: ContainerInfo, units: float) -> dict[int, float]:
    """GPU index -> memory units for this container, from the annotations ({} when not placed yet)."""
    placed: dict[int, float] = {}
    raw = pod.annotations.get(ALIYUN_ALLOCATION)
    if raw:
        try:
            per_container = json.loads(raw[:MAX_ANNOTATION_BYTES]).get(str(c.index), {})
            placed = {int(k): float(v) for k, v in per_container.items()}
        except (ValueError, TypeError, AttributeError, OverflowError, RecursionError):
            node.skip("malformed_gpushare_annotation")
        if any(not math.isfinite(v) or v < 0 for v in placed.values()) or len(placed) > len(node.devices):
            node.skip("malformed_gpushare_annotation")  # inf, NaN, negative, more GPUs than the node has
            placed = {}
    if not placed and ALIYUN_IDX in pod.annotations:
        idx = index_list(pod.annotations[ALIYUN_IDX])
        if idx is None:
            node.skip("malformed_gpushare_annotation")
        elif idx:
            placed = {i: units / len(idx) for i in idx}
    return placed


def _bytes(node: NodeContext, units: float, unit: int | None, card: int | None) -> int:
    """``units`` of gpu-mem in bytes, never more than ``card`` (the placed card, or the largest)."""
    if unit is None:
        unit = GIB
        if card is not None and units * GIB > card and units * MIB <= card:
            node.skip("gpushare_memory_unit_mib_by_size")  # no capacity to tell; GiB cannot fit the card
            unit = MIB
    memory = int(units * unit)
    if card is not None and memory > card:
        node.skip("gpushare_allocation_exceeds_card")
        memory = card
    return memory


def allocate(node: NodeContext, pod: PodInfo, c: ContainerInfo) -> list[Allocation]:
    units = amount(c, ALIYUN_MEM) or 0.0
    core = amount(c, ALIYUN_CORE)
    if core is not None and not within(node, core, 100 * max(1, len(node.devices))):
        return []  # more compute than the node's GPUs have
    unit = memory_unit(node)
    totals = {d.uuid: d.memory_total_bytes for d in node.devices}
    largest = max((d.memory_total_bytes or 0 for d in _cards(node.devices)), default=0) or None
    placed = _placement(node, pod, c, units)
    if not placed:
        return [Allocation(pod.uid, c.name, SCHEME_GPUSHARE, False, None, core, _bytes(node, units, unit, largest))]
    out = []
    for i, share in placed.items():
        uuid = node.by_index.get(i)
        if uuid is None:
            node.skip("annotation_unknown_gpu_index")
        card = totals.get(uuid) if uuid is not None else largest
        out.append(Allocation(pod.uid, c.name, SCHEME_GPUSHARE, False, uuid,
                              None if core is None else core / len(placed), _bytes(node, share, unit, card),
                              from_annotation=True))
    return out


SCHEME = Scheme("Alibaba gpushare / cGPU", claims, allocate, annotations=(ALIYUN_ALLOCATION, ALIYUN_IDX))

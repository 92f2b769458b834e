"""Alibaba gpushare / cGPU: ``aliyun.com/gpu-mem`` (GiB) and ``aliyun.com/gpu-core.percentage``.

The GPU comes from the scheduler's ``scheduler.framework.gpushare.allocation`` annotation
(per container index: GPU index -> GiB), else ``ALIYUN_COM_GPU_MEM_IDX``.
"""

from __future__ import annotations

import json

from exporter.attribution.schemes.base import GIB, Allocation, NodeContext, Scheme, amount, index_list
from exporter.model import ContainerInfo, PodInfo

SCHEME_GPUSHARE = "aliyun-gpushare"
ALIYUN_MEM = "aliyun.com/gpu-mem"
ALIYUN_CORE = "aliyun.com/gpu-core.percentage"
ALIYUN_IDX = "ALIYUN_COM_GPU_MEM_IDX"
ALIYUN_ALLOCATION = "scheduler.framework.gpushare.allocation"


def claims(node: NodeContext, pod: PodInfo, c: ContainerInfo) -> bool:
    return bool(amount(c, ALIYUN_MEM))


def _placement(node: NodeContext, pod: PodInfo, c: ContainerInfo, gib: float) -> dict[int, float]:
    """GPU index -> GiB for this container, from the annotations ({} when not placed yet)."""
    placed: dict[int, float] = {}
    raw = pod.annotations.get(ALIYUN_ALLOCATION)
    if raw:
        try:
            per_container = json.loads(raw).get(str(c.index), {})
            placed = {int(k): float(v) for k, v in per_container.items()}
        except (ValueError, TypeError, AttributeError):
            node.skip("malformed_gpushare_annotation")
    if not placed and ALIYUN_IDX in pod.annotations:
        idx = index_list(pod.annotations[ALIYUN_IDX])
        if idx is None:
            node.skip("malformed_gpushare_annotation")
        elif idx:
            placed = {i: gib / len(idx) for i in idx}
    return placed


def allocate(node: NodeContext, pod: PodInfo, c: ContainerInfo) -> list[Allocation]:
    gib = amount(c, ALIYUN_MEM) or 0.0
    core = amount(c, ALIYUN_CORE)
    placed = _placement(node, pod, c, gib)
    if not placed:
        return [Allocation(pod.uid, c.name, SCHEME_GPUSHARE, False, None, core, int(gib * GIB))]
    out = []
    for i, g in placed.items():
        if i not in node.by_index:
            node.skip("annotation_unknown_gpu_index")
        out.append(Allocation(pod.uid, c.name, SCHEME_GPUSHARE, False, node.by_index.get(i),
                              None if core is None else core / len(placed), int(g * GIB)))
    return out


SCHEME = Scheme("Alibaba gpushare / cGPU", claims, allocate)

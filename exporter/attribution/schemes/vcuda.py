"""Tencent GPU Manager (vcuda): ``tencent.com/vcuda-core`` (100 = one GPU) and
``tencent.com/vcuda-memory`` (units of 256 MiB), placed by ``tencent.com/predicate-gpu-idx-<n>``.

The annotation holds device **minor** numbers (``/dev/nvidia<minor>``, what gpu-manager's
allocator hands out), not NVML indices; on many nodes the two differ, so the GPU is found
through the minor number NVML reports for it.
"""

from __future__ import annotations

from exporter.attribution.schemes.base import (
    MIB,
    Allocation,
    NodeContext,
    Scheme,
    amount,
    card_memory_limit,
    index_list,
)
from exporter.model import ContainerInfo, PodInfo

SCHEME_VCUDA = "tencent-vcuda"
VCUDA_MEMORY_UNIT = 256 * MIB
VCUDA_CORE = "tencent.com/vcuda-core"
VCUDA_MEM = "tencent.com/vcuda-memory"
VCUDA_IDX_PREFIX = "tencent.com/predicate-gpu-idx-"


def claims(node: NodeContext, pod: PodInfo, c: ContainerInfo) -> bool:
    """A container gpu-manager hands a GPU: ``vcuda-core`` above 0 (pkg/utils/util.go IsGPURequiredContainer).

    ``vcuda-core: "0"`` (gpu-manager's tests give every GPU-less container that limit) or memory without cores
    holds nothing. An absurd quantity is still claimed, so that ``allocate`` drops and counts it.
    """
    if c.init:
        return False  # the scheme's indices and the kubelet's device reuse cover regular containers only
    core, mem_units = amount(c, VCUDA_CORE) or 0.0, amount(c, VCUDA_MEM) or 0.0
    return core > 0 or not _in_range(node, core, mem_units)


def _in_range(node: NodeContext, core: float, mem_units: float) -> bool:
    """At most what this node's GPUs hold: 100 cores and a card's memory per GPU."""
    return core <= 100 * len(node.devices) and (
        mem_units * VCUDA_MEMORY_UNIT <= card_memory_limit(node) * max(1, len(node.devices)))


def allocate(node: NodeContext, pod: PodInfo, c: ContainerInfo) -> list[Allocation]:
    core = amount(c, VCUDA_CORE) or 0.0
    mem_units = amount(c, VCUDA_MEM) or 0.0
    if not _in_range(node, core, mem_units):
        node.skip("quantity_out_of_range")
        return []  # more than the node's GPUs hold: a hostile or broken quantity
    memory = int(mem_units * VCUDA_MEMORY_UNIT) if mem_units else None
    idx = index_list(pod.annotations.get(f"{VCUDA_IDX_PREFIX}{c.index}", ""))
    if idx is None:
        node.skip("malformed_vcuda_annotation")
        idx = []
    whole = core >= 100
    count = max(1, int(core // 100)) if whole else 1
    if whole:
        targets: list[int | None] = [*idx[:count]] + [None] * max(0, count - len(idx))
        return [Allocation(pod.uid, c.name, SCHEME_VCUDA, True,
                           None if i is None else node.by_minor.get(i), 100.0, None, from_annotation=True)
                for i in targets]
    gpu = node.by_minor.get(idx[0]) if idx else None
    if idx and gpu is None:
        node.skip("annotation_unknown_gpu_minor")
    return [Allocation(pod.uid, c.name, SCHEME_VCUDA, False, gpu, core or None, memory, from_annotation=True)]


SCHEME = Scheme("Tencent GPU Manager (vcuda)", claims, allocate, annotation_prefixes=(VCUDA_IDX_PREFIX,))
